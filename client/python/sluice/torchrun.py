"""`torchrun` that works on Python 3.11 with torch 1.13 (Debian bookworm).

    python3 -m sluice.torchrun --standalone --nproc_per_node=4 --max_restarts=3 \\
        train.py --job imagenet ...

takes exactly torchrun's (torch.distributed.run's) arguments. torch 1.13's
elastic launcher parses its --redirects/--tee values with
`Std.from_str`, which looks the value up by iterating over the `Std` flag
enum; Python 3.11 no longer yields the zero-valued and multi-bit members
when iterating a flag enum, so "0" maps to None and every launch fails
before starting a worker (`AttributeError: 'NoneType' object has no
attribute 'get'` in elastic/multiprocessing/api.py). This module replaces
`Std.from_str` with one that converts by value, then runs torchrun's main.
With a torch whose parser works it changes nothing.
"""
import re
import sys

from torch.distributed.elastic.multiprocessing import api


def _from_str_by_value(vm):
    """"0".."3" -> Std; "0:3,1:0" -> {local_rank: Std}; as torch documents."""
    if re.match(api._VALUE_REGEX, vm):
        return api.Std(int(vm))
    if re.match(api._MAPPING_REGEX, vm):
        return {int(i): api.Std(int(v)) for i, v in (m.split(":") for m in vm.split(","))}
    raise ValueError(f"{vm} does not match: <{api._VALUE_REGEX}> or <{api._MAPPING_REGEX}>")


def patch():
    """Fixes Std.from_str when it is broken; returns whether it was."""
    if api.Std.from_str("0") is not None:
        return False
    api.Std.from_str = staticmethod(_from_str_by_value)
    return True


def main(argv=None):
    patch()
    from torch.distributed import run
    run.main(argv if argv is not None else sys.argv[1:])


if __name__ == "__main__":
    main()
