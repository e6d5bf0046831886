#!/usr/bin/python3
"""Dataset preparation for the examples: writes WebDataset shards.

    prepare.py DATA_DIR [--shards N] [--per_shard M]

Stands in for the step users run once per dataset: download, decode,
preprocess, write shards. Here it writes N tar shards of M synthetic samples
(key s{S}_{I}: .cls holding the index, .bin 64 bytes) into DATA_DIR/shards,
and appends one line to DATA_DIR/prepare.log per run, so that how often the
step ran is visible. Run it through `sluicectl once` (or `sluice.once`) from
every rank: exactly one rank runs it, the others wait for it and continue.
"""
import argparse
import io
import os
import socket
import tarfile
import time


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("data_dir")
    p.add_argument("--shards", type=int, default=8)
    p.add_argument("--per_shard", type=int, default=50)
    a = p.parse_args(argv)
    shards = os.path.join(a.data_dir, "shards")
    os.makedirs(shards, exist_ok=True)
    with open(os.path.join(a.data_dir, "prepare.log"), "a") as log:
        log.write(f"prepared by pid {os.getpid()} on {socket.gethostname()} at {time.time():.3f}\n")
    for s in range(a.shards):
        final = os.path.join(shards, f"shard-{s:04d}.tar")
        tmp = f"{final}.{os.getpid()}.tmp"
        with tarfile.open(tmp, "w", format=tarfile.USTAR_FORMAT) as tar:
            for i in range(a.per_shard):
                for ext, data in (("cls", str(i).encode()), ("bin", bytes([s % 256, i % 256]) * 32)):
                    info = tarfile.TarInfo(f"s{s}_{i}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
        os.replace(tmp, final)  # readers never see half a shard


if __name__ == "__main__":
    main()
