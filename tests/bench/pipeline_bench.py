#!/usr/bin/python3
"""Training input pipeline benchmark (make bench; not a test).

A real input pipeline end to end into a PyTorch loop, on WebDataset shards
of photo-like JPEGs (500x375, ~100 KB): Sluice (ShardLeaseDataset with the
transform run on the data server; coordinator and one data server on this
machine) against the pipeline a user writes instead (tar iteration + PIL +
torchvision transforms in a DataLoader with one worker per core), for the
eval transform (Resize 256, CenterCrop 224) and the train transform
(RandomResizedCrop 224, RandomHorizontalFlip). Both produce uint8 [C, H, W]
batches of 64 and run the same step on each batch. The process first calls
sluice.tune_malloc(), as the client's README advises (it applies to both
pipelines).

Reports samples/s and CPU-seconds per 1,000 samples summed over every
process involved (the loop, DataLoader workers, coordinator, data server;
from /proc and getrusage), each process's minor page faults per sample (about
13 µs each on this VM), and the ratios Sluice / baseline; and the data
server's CPU per sample against the floor, a bare TurboJPEG decode of the
same images (`transform_bench --floor_dir`) measured just before each Sluice
round (this VM's speed drifts from minute to minute): the ratio of the
round with the best throughput, as the other figures, and of every round.
Ends with one JSON line.

With --loop_parts it also measures the Sluice loop's CPU per sample taking
the dataset's samples as they arrive (no DataLoader, no step) and collated
batches without the step: the parts of the loop's figure.

usage: pipeline_bench.py BIN_DIR [--samples N] [--rounds N] [--loop_parts]
"""
import argparse
import io
import json
import os
import resource
import subprocess
import sys
import tarfile
import tempfile
import time

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, IterableDataset, get_worker_info
import torchvision.transforms as TV

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
sys.path.insert(0, HERE)
from python_reader_bench import write_shards  # noqa: E402  (jpg + cls tars)

BATCH = 64
TICKS = os.sysconf("SC_CLK_TCK")


def photo_jpegs(n, seed=7):
    """Photo-like 500x375 JPEGs of ~100 KB: crops of a photograph at random
    scales and places, with sensor-like noise (quality 92)."""
    rng = np.random.default_rng(seed)
    src = Image.open("/usr/share/matplotlib/mpl-data/sample_data/grace_hopper.jpg").convert("RGB")
    out = []
    for _ in range(n):
        w = int(rng.integers(300, src.width))
        h = int(w * 375 / 500)
        h = min(h, src.height)
        x = int(rng.integers(0, src.width - w + 1))
        y = int(rng.integers(0, src.height - h + 1))
        img = np.asarray(src.crop((x, y, x + w, y + h)).resize((500, 375), Image.BILINEAR))
        img = (img.astype(np.int16) + rng.integers(-12, 13, img.shape)).clip(0, 255)
        buf = io.BytesIO()
        Image.fromarray(img.astype(np.uint8)).save(buf, format="JPEG", quality=92)
        out.append(buf.getvalue())
    return out


class TarPil(IterableDataset):
    """What a user writes: iterate the tars (split across workers), decode
    with PIL, apply torchvision transforms."""

    def __init__(self, paths, transform):
        self.paths, self.transform = paths, transform

    def __iter__(self):
        info = get_worker_info()
        paths = self.paths if info is None else self.paths[info.id::info.num_workers]
        for path in paths:
            with tarfile.open(path) as tar:
                sample = {}
                for member in tar:
                    key, ext = member.name.split(".", 1)
                    if sample and sample["__key__"] != key:
                        yield self._finish(sample)
                        sample = {}
                    sample["__key__"] = key
                    sample[ext] = tar.extractfile(member).read()
                if sample:
                    yield self._finish(sample)

    def _finish(self, sample):
        img = Image.open(io.BytesIO(sample["jpg"])).convert("RGB")
        return self.transform(img), int(sample["cls"])


class Step:
    """The same work per batch in both loops: moving a uint8 batch to the
    model's dtype, into one float buffer kept from batch to batch (as a
    trainer staging batches for its device does; a fresh 38 MB tensor per
    batch costs 9,400 page faults, which on this VM cost 0.2-1.9 ms per
    sample from day to day, in both loops alike)."""

    def __init__(self):
        self.buffer = None

    def __call__(self, images, labels):
        if self.buffer is None or self.buffer.shape != images.shape:
            self.buffer = torch.empty(images.shape, dtype=torch.float32)
        x = self.buffer.copy_(images).div_(255)
        return float(x.mean()) + float(labels.sum())


def proc_cpu(pid):
    """(CPU-seconds, minor page faults) of process `pid` so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS, int(fields[7])


def self_cpu():
    s = resource.getrusage(resource.RUSAGE_SELF)
    return s.ru_utime + s.ru_stime, s.ru_minflt


def measure(loader_fn, samples, server_pids, step=True):
    """(samples/s, CPU-seconds per 1,000 samples, {process: CPU-s per 1,000},
    {process: page faults per sample}) over `samples` samples after one
    warm-up batch, each batch through the step unless `step` is false
    (then `loader_fn` may give single samples instead of batches). DataLoader workers are
    read from /proc while they run."""
    loader = loader_fn()
    it = iter(loader)
    run = Step() if step else (lambda images, labels: None)
    images, labels = next(it)
    run(images, labels)
    workers = [w.pid for w in getattr(it, "_workers", [])]
    procs = {"loop": self_cpu}
    for i, pid in enumerate(server_pids):
        procs[("coordinator", "dataserver")[i]] = lambda pid=pid: proc_cpu(pid)
    for i, pid in enumerate(workers):
        procs[f"worker{i}"] = lambda pid=pid: proc_cpu(pid)
    before = {k: f() for k, f in procs.items()}
    t0 = time.monotonic()
    n = 0
    while n < samples:
        images, labels = next(it)
        run(images, labels)
        n += len(labels) if torch.is_tensor(labels) and labels.dim() else 1
    elapsed = time.monotonic() - t0
    after = {k: f() for k, f in procs.items()}
    per = {k: round(1000 * (after[k][0] - before[k][0]) / n, 3) for k in procs}
    faults = {k: round((after[k][1] - before[k][1]) / n, 1) for k in procs}
    del it
    return n / elapsed, sum(per.values()), per, faults


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("bin_dir")
    parser.add_argument("--samples", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--transform", choices=("eval", "train"), action="append",
                        help="only these transforms (default: both)")
    parser.add_argument("--loop_parts", action="store_true",
                        help="also measure the Sluice loop taking single samples without the "
                             "step, and collated batches without the step: what receiving, "
                             "collating and the step each cost the loop")
    parser.add_argument("--pipeline", choices=("sluice", "baseline"), action="append",
                        help="only these pipelines (default: both)")
    args = parser.parse_args()
    os.environ["SLUICE_BIN_DIR"] = os.path.abspath(args.bin_dir)
    sys.path.insert(0, os.path.join(args.bin_dir, "..", "python"))
    import conftest  # noqa: E402  (tests/python: Server, _wait_for)
    import sluice
    # What client/README.md advises for reading throughput. Process-wide:
    # the baseline's loop and its (forked) DataLoader workers run with it
    # too.
    if not sluice.tune_malloc():
        sys.exit("the allocator refused sluice.tune_malloc()'s mallopt settings")
    from sluice import transforms as T
    from sluice.torch import ShardLeaseDataset

    workers = os.cpu_count()
    with tempfile.TemporaryDirectory() as tmp:
        jpegs = photo_jpegs(64)
        urls = write_shards(os.path.join(tmp, "shards"), 8, 500, jpegs)
        paths = [u for u, _ in urls]
        mean_kb = sum(len(j) for j in jpegs) / len(jpegs) / 1024
        os.makedirs(os.path.join(tmp, "jpegs"))
        for i, j in enumerate(jpegs):
            with open(os.path.join(tmp, "jpegs", f"{i}.jpg"), "wb") as f:
                f.write(j)

        def floor_ms():
            out = subprocess.run([os.path.join(args.bin_dir, "transform_bench"),
                                  f"--floor_dir={tmp}/jpegs", "--seconds=2"],
                                 check=True, capture_output=True, text=True).stdout
            ms = json.loads(out.strip().splitlines()[-1])["cpu_ms_per_image"]
            print(f"floor: a bare TurboJPEG decode takes {ms:.3f} CPU-ms per image",
                  file=sys.stderr)
            return ms
        coordinator = conftest.Server("sluice-coordinator", tmp,
                                      [f"--journal_dir={tmp}/journal"])
        data = conftest.Server("sluice-dataserver", tmp,
                               [f"--roots={tmp}/shards", f"--coordinator={coordinator.address}"])
        results = {}
        try:
            conftest._wait_for(lambda: "sluice_coordinator_data_servers 1"
                               in coordinator.metric_text(), 30, "registration")
            manifest = os.path.join(tmp, "m.json")
            with open(manifest, "w") as f:
                json.dump({"shards": [{"url": u, "num_samples": n} for u, n in urls]}, f)
            pipelines = {
                "eval": (T.Compose([T.Resize(256), T.CenterCrop(224), T.PILToTensor()]),
                         TV.Compose([TV.Resize(256), TV.CenterCrop(224), TV.PILToTensor()])),
                "train": (T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(),
                                     T.PILToTensor()]),
                          TV.Compose([TV.RandomResizedCrop(224), TV.RandomHorizontalFlip(),
                                      TV.PILToTensor()])),
            }
            pids = [coordinator.pid, data.pid]
            opened = []
            for name, (sluice_tf, tv_tf) in pipelines.items():
                if args.transform and name not in args.transform:
                    continue
                jobs = iter(range(1000))

                def sluice_loader(name=name, tf=sluice_tf, batch_size=BATCH):
                    # A job per measurement: a reader left from the last one
                    # would hold leases, and epochs only end when every
                    # lease is done.
                    job = f"bench-{name}-{next(jobs)}"
                    out = subprocess.run(
                        [os.path.join(args.bin_dir, "sluicectl"), "job", "create",
                         f"--coordinator={coordinator.address}", f"--name={job}",
                         f"--manifest={manifest}", "--epochs=1000"],
                        capture_output=True, text=True)
                    assert out.returncode == 0, out.stderr
                    ds = ShardLeaseDataset(coordinator=coordinator.address, job=job,
                                           transform=tf, fields=("jpg", "cls"))
                    opened.append(ds)

                    class Batches(IterableDataset):
                        def __iter__(self):
                            while True:  # epoch after epoch
                                for item in ds:
                                    yield item["jpg"], item["cls"]
                    if batch_size is None:  # the samples as they arrive
                        return Batches()
                    return DataLoader(Batches(), batch_size=batch_size, num_workers=0)

                def baseline_loader(tf=tv_tf):
                    class Forever(IterableDataset):
                        def __iter__(self):
                            while True:
                                yield from TarPil(paths, tf)
                    # Each worker iterates every shard here; the samples are
                    # the same work either way.
                    return DataLoader(Forever(), batch_size=BATCH, num_workers=workers)

                best = {"sluice": (0, 0), "baseline": (0, 0)}
                # Per Sluice round: the data server's CPU-ms per sample and
                # the floor measured just before it (this VM's speed drifts
                # from minute to minute).
                against_floor = []
                server = None  # (CPU-ms per sample, floor) of the best Sluice round
                for _ in range(args.rounds):
                    for which, fn in (("baseline", baseline_loader), ("sluice", sluice_loader)):
                        if args.pipeline and which not in args.pipeline:
                            continue
                        floor = floor_ms() if which == "sluice" else None
                        rate, cpu, per, faults = measure(fn, args.samples, pids)
                        while opened:
                            opened.pop().close()
                        print(f"{name:5s} {which:8s} {rate:7.1f} samples/s "
                              f"{cpu:5.2f} CPU-s per 1,000 samples {per}; "
                              f"page faults per sample {faults}", file=sys.stderr)
                        if which == "sluice":
                            against_floor.append(per["dataserver"] / floor)
                            if rate > best[which][0]:
                                server = (per["dataserver"], floor)
                        if rate > best[which][0]:
                            best[which] = (rate, cpu)
                if args.loop_parts:
                    for part, size in (("received", None), ("collated", BATCH)):
                        _, _, per, _ = measure(lambda size=size: sluice_loader(batch_size=size),
                                               args.samples, pids, step=False)
                        while opened:
                            opened.pop().close()
                        print(f"{name:5s} sluice loop, {part} without the step: "
                              f"{per['loop']:.3f} CPU-ms per sample", file=sys.stderr)
                (s_rate, s_cpu), (b_rate, b_cpu) = best["sluice"], best["baseline"]
                if not s_rate or not b_rate:
                    continue
                server_ms, floor = server
                results[name] = {"sluice_samples_per_s": round(s_rate, 1),
                                 "baseline_samples_per_s": round(b_rate, 1),
                                 "sluice_cpu_s_per_1000": round(s_cpu, 3),
                                 "baseline_cpu_s_per_1000": round(b_cpu, 3),
                                 "throughput_ratio": round(s_rate / b_rate, 3),
                                 "cpu_ratio": round(s_cpu / b_cpu, 3),
                                 "dataserver_cpu_ms_per_sample": server_ms,
                                 "floor_cpu_ms_per_image": round(floor, 3),
                                 "dataserver_floor_ratio": round(server_ms / floor, 3),
                                 "dataserver_floor_ratios": [
                                     round(r, 3) for r in against_floor]}
        finally:
            data.stop()
            coordinator.stop()
    for name, r in results.items():
        print(f"{name}: Sluice {r['sluice_samples_per_s']} samples/s, "
              f"{r['sluice_cpu_s_per_1000']} CPU-s/1k; baseline {r['baseline_samples_per_s']}, "
              f"{r['baseline_cpu_s_per_1000']}; throughput x{r['throughput_ratio']}, "
              f"CPU x{r['cpu_ratio']} (targets >= 2, <= 0.45); data server "
              f"{r['dataserver_cpu_ms_per_sample']} CPU-ms per sample = "
              f"x{r['dataserver_floor_ratio']} of a bare TurboJPEG decode "
              f"({r['floor_cpu_ms_per_image']} ms just before; the best round's, "
              f"as the figures before; every round: {r['dataserver_floor_ratios']}; "
              f"target <= 1.0)")
    print(json.dumps({"bench": "pipeline", "cores": workers, "jpeg_kb": round(mean_kb, 1),
                      "samples": args.samples, **results}))


if __name__ == "__main__":
    main()
