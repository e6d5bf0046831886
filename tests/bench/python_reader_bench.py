#!/usr/bin/python3
"""Python client benchmark (make bench; not a test).

Starts a coordinator and a data server over JPEG shards (~85 KB samples) and
an endless job, then measures in the same run: the C++ sluice::Reader
(reader_bench --coordinator) and the Python sluice.Reader (the same Reader
through sluice._core, plus building each Sample in Python) raw (alternating
rounds, medians compared) and decoded, a torch DataLoader with 2 workers
producing tensors from ShardLeaseDataset, and the webdataset-style baseline
of reading the same tars with Python's tarfile + PIL in one process.
Target: Python raw >= 0.9x the C++ Reader.
Ends with one JSON line.

usage: python_reader_bench.py BIN_DIR [--seconds S] [--rounds N]
"""
import argparse
import faulthandler
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time

import numpy as np
from PIL import Image

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
from sample_data import photo_like_jpegs, write_jpeg_shards as write_shards  # noqa: E402


def make_jpegs(n=16):
    return photo_like_jpegs(n)


def timed(seconds, items):
    """(samples/s, bytes/s) over an iterator of byte counts."""
    n = nbytes = 0
    start = time.monotonic()
    for b in items:
        n += 1
        nbytes += b
        if time.monotonic() - start >= seconds:
            break
    t = time.monotonic() - start
    return n / t, nbytes / t


def field_bytes(v):
    return v.nbytes if hasattr(v, "nbytes") else len(v) if isinstance(v, (bytes, str)) else 8


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("bin_dir")
    parser.add_argument("--seconds", type=float, default=3)
    parser.add_argument("--rounds", type=int, default=3,
                        help="alternating C++/Python raw rounds; medians are compared")
    parser.add_argument("--tune_malloc", action="store_true",
                        help="both clients call the malloc tuning first (sluice.tune_malloc(), "
                             "reader_bench --tune_malloc); the servers always do")
    args = parser.parse_args()
    # Never hang `make bench`: a stuck step dumps every thread's stack and
    # exits. Armed for the set-up here, then again for each phase (a slow
    # machine makes the whole run long, not any one phase).
    watchdog_s = 60 + 10 * args.seconds
    faulthandler.dump_traceback_later(watchdog_s, exit=True)
    os.environ["SLUICE_BIN_DIR"] = args.bin_dir
    sys.path.insert(0, os.path.join(args.bin_dir, "..", "python"))
    import conftest  # the test suite's cluster helpers
    import sluice
    if args.tune_malloc:
        if not sluice.tune_malloc():
            sys.exit("--tune_malloc: the allocator refused glibc's mallopt settings")
        os.environ["SLUICE_TUNE_MALLOC"] = "1"  # the DataLoader's workers
    from torch.utils.data import DataLoader
    from sluice.torch import ShardLeaseDataset

    with tempfile.TemporaryDirectory() as tmp:
        urls = write_shards(os.path.join(tmp, "shards"), 8, 250, make_jpegs())
        coordinator = conftest.Server("sluice-coordinator", tmp,
                                      [f"--journal_dir={tmp}/journal"])
        data = conftest.Server("sluice-dataserver", tmp,
                               [f"--roots={tmp}/shards", f"--coordinator={coordinator.address}"])
        try:
            conftest._wait_for(lambda: "sluice_coordinator_data_servers 1"
                               in coordinator.metric_text(), 30, "registration")
            manifest = os.path.join(tmp, "m.json")
            json.dump({"shards": [{"url": u, "num_samples": n} for u, n in urls]},
                      open(manifest, "w"))
            for job in ("bench", "bench-loader"):  # the DataLoader starts on a fresh epoch
                subprocess.run([os.path.join(args.bin_dir, "sluicectl"), "job", "create",
                                f"--coordinator={coordinator.address}", f"--name={job}",
                                f"--manifest={manifest}", "--world_size=1", "--epochs=0"],
                               check=True, capture_output=True)
            address = coordinator.address

            def cpp(decode):
                out = subprocess.run(
                    [os.path.join(args.bin_dir, "reader_bench"), f"--coordinator={address}",
                     "--job=bench", f"--seconds={args.seconds}"] + (["--decode"] if decode else []) +
                    (["--tune_malloc"] if args.tune_malloc else []),
                    check=True, capture_output=True, text=True).stdout
                return json.loads(out.strip().splitlines()[-1])["samples_per_s"]

            def python_reader(decode):
                with sluice.Reader(address, "bench", decode=decode) as r:
                    timed(0.5, (1 for _ in r))  # warm-up
                    return timed(args.seconds, (sum(field_bytes(v) for v in s.fields.values())
                                                for s in r))

            def dataloader():
                ds = ShardLeaseDataset(coordinator=address, job="bench-loader", decode=True)
                # Batches collated in the workers (one shared-memory tensor per
                # batch, as training does; per-sample tensors would measure
                # PyTorch's IPC instead).
                loader = DataLoader(ds, batch_size=32, num_workers=2, persistent_workers=True)

                def items(loader):  # DataLoader epoch after epoch (each is the rank's share)
                    while True:
                        for batch in loader:
                            per_sample = batch["jpg"].numel() // len(batch["__key__"])
                            for _ in batch["__key__"]:
                                yield per_sample
                it = items(loader)
                timed(1.0, it)  # workers up and streaming
                rate = timed(args.seconds, it)
                it.close()
                del loader
                ds.close()
                return rate

            def tar_pil():
                def items():
                    while True:
                        for path, _ in urls:
                            with tarfile.open(path) as tar:
                                for m in tar:
                                    if m.name.endswith(".jpg"):
                                        a = np.asarray(Image.open(tar.extractfile(m)).convert("RGB"))
                                        yield a.nbytes
                return timed(args.seconds, items())

            def phase(name, fn, *a):
                print(f"measuring {name} ...", file=sys.stderr, flush=True)
                faulthandler.dump_traceback_later(watchdog_s, exit=True)
                return fn(*a)
            # Raw: alternating rounds, medians compared (as reader_bench), so
            # machine noise hits both.
            cpp_rounds, py_rounds = [], []
            for r in range(args.rounds):
                cpp_rounds.append(phase(f"C++ Reader raw, round {r + 1}", cpp, False))
                py_rounds.append(phase(f"Python Reader raw, round {r + 1}", python_reader, False))
                print(f"round {r + 1}: C++ {cpp_rounds[-1]:.0f} samples/s, "
                      f"Python {py_rounds[-1][0]:.0f} samples/s",
                      file=sys.stderr, flush=True)
            cpp_raw = sorted(cpp_rounds)[len(cpp_rounds) // 2]
            py_raw, py_raw_bytes = sorted(py_rounds)[len(py_rounds) // 2]
            cpp_dec = phase("C++ Reader decoded", cpp, True)
            py_dec, _ = phase("Python Reader decoded", python_reader, True)
            dl, _ = phase("DataLoader, 2 workers", dataloader)
            pil, _ = phase("tarfile + PIL", tar_pil)
        finally:
            faulthandler.cancel_dump_traceback_later()
            data.stop()
            coordinator.stop()
    ratio = py_raw / cpp_raw
    print(f"python Reader raw: {py_raw:.0f} samples/s ({py_raw_bytes / 1e6:.0f} MB/s)   "
          f"C++ Reader raw: {cpp_raw:.0f} samples/s   ratio {ratio:.2f} (target >= 0.9)")
    print(f"python Reader decoded: {py_dec:.0f} samples/s   C++ Reader decoded: {cpp_dec:.0f}   "
          f"ratio {py_dec / cpp_dec:.2f}")
    print(f"DataLoader (2 workers, batches of 32 decoded tensors): {dl:.0f} samples/s   "
          f"tarfile + PIL in one process: {pil:.0f} samples/s")
    print(json.dumps({"bench": "python_reader", "tune_malloc": args.tune_malloc,
                      "samples_per_s": round(py_raw),
                      "baseline_samples_per_s": round(cpp_raw), "ratio": round(ratio, 2),
                      "decoded_samples_per_s": round(py_dec),
                      "cpp_decoded_samples_per_s": round(cpp_dec),
                      "dataloader_2_workers_samples_per_s": round(dl),
                      "tarfile_pil_samples_per_s": round(pil)}))


if __name__ == "__main__":
    main()
