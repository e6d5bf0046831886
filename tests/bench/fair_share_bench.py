#!/usr/bin/python3
"""Fair shares benchmark (make bench; not a test).

One data server with one decoding thread (--decode_threads=1) over 384x384
JPEGs, endless jobs read through sluice.Reader in threads of this process
(resize_shorter_side=128). Measured in the same run:

  * two greedy jobs with weights 1:1 and then 3:1, each pair over
    --seconds (20 by default) after a warm-up: the samples each job
    received and the server's CPU seconds per job
    (sluice_dataserver_job_cpu_seconds_total), as a ratio to the weights
    (goal: within 10 %);
  * a light job (one paced reader asking for a quarter of the server's
    capacity, the 1:1 pair's total) alone, then beside a greedy job of the
    same weight whose two readers keep the server busy: the light job's
    samples/s with the greedy job over without it (goal: >= 0.95,
    unaffected).

Each greedy job reads with two readers (one cannot keep the server busy
from this process).

Ends with one JSON line.

usage: fair_share_bench.py BIN_DIR [--seconds S]
"""
import argparse
import faulthandler
import io
import json
import os
import re
import sys
import tempfile
import threading
import time

from PIL import Image

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
from sample_data import write_jpeg_shards  # noqa: E402

PHOTO = "/usr/share/matplotlib/mpl-data/sample_data/grace_hopper.jpg"
SHARDS = 4
PER_SHARD = 100


def photo_jpeg():
    """One 384x384 crop of a photograph: every sample costs the same."""
    buf = io.BytesIO()
    Image.open(PHOTO).convert("RGB").crop((0, 0, 384, 384)).save(buf, format="JPEG",
                                                                  quality=90)
    return buf.getvalue()


class Readers:
    """Endless readers of some jobs, each in threads, counting samples;
    `jobs` maps a job to (step, workers): seconds per sample (0 = greedy)
    pacing each reader, and how many readers (DataLoader-style workers)."""

    def __init__(self, sluice, address, jobs):
        self.counts = {job: 0 for job in jobs}
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self.read,
                                         args=(sluice, address, job, step, w, workers))
                        for job, (step, workers) in jobs.items() for w in range(workers)]
        for t in self.threads:
            t.start()

    def read(self, sluice, address, job, step, worker, workers):
        with sluice.Reader(address, job, worker=worker, num_workers=workers,
                           resize_shorter_side=128) as reader:
            next_at = time.monotonic()
            for _ in reader:
                with self.lock:
                    self.counts[job] += 1
                if self.stop.is_set():
                    return
                if step:
                    next_at += step
                    delay = next_at - time.monotonic()
                    if delay > 0:
                        time.sleep(delay)  # the trainer's step

    def close(self):
        self.stop.set()
        for t in self.threads:
            t.join(timeout=60)


def cpu_seconds(data, job):
    m = re.search(r'^sluice_dataserver_job_cpu_seconds_total\{sluice_job="%s"\} (\S+)' % job,
                  data.metric_text(), re.M)
    return float(m.group(1)) if m else 0.0


def measure(data, readers, jobs, warmup, seconds):
    """Samples/s and CPU seconds per job over `seconds` after `warmup`."""
    time.sleep(warmup)
    n0, c0, t0 = dict(readers.counts), {j: cpu_seconds(data, j) for j in jobs}, time.monotonic()
    time.sleep(seconds)
    n1, c1, t1 = dict(readers.counts), {j: cpu_seconds(data, j) for j in jobs}, time.monotonic()
    return ({j: (n1[j] - n0[j]) / (t1 - t0) for j in jobs},
            {j: c1[j] - c0[j] for j in jobs})


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("bin_dir")
    parser.add_argument("--seconds", type=float, default=20)
    args = parser.parse_args()
    faulthandler.dump_traceback_later(300 + 8 * args.seconds, exit=True)  # never hang
    os.environ["SLUICE_BIN_DIR"] = args.bin_dir
    sys.path.insert(0, os.path.join(args.bin_dir, "..", "python"))
    import conftest  # the test suite's cluster helpers
    import sluice

    with tempfile.TemporaryDirectory() as tmp:
        # Shared decoding off: the jobs read the same images, and a job whose
        # decodes another reuses would be charged for both.
        cluster = conftest.Cluster(tmp, shards=0,
                                   data_flags=["--decode_threads=1", "--shared_decode_bytes=0"])
        coordinator, data = cluster.coordinator, cluster.data[0]
        try:
            urls = write_jpeg_shards(os.path.join(tmp, "shards"), SHARDS, PER_SHARD,
                                     [photo_jpeg()])

            def create(name, weight):
                cluster.create_job(name, epochs=0, shards=urls, extra=[f"--weight={weight}"])

            shares = {}
            capacity = 0
            for heavy_weight in (1, 3):
                heavy, light = f"heavy{heavy_weight}", f"other{heavy_weight}"
                create(heavy, heavy_weight)
                create(light, 1)
                r = Readers(sluice, coordinator.address, {heavy: (0, 2), light: (0, 2)})
                rates, cpu = measure(data, r, [heavy, light], 2, args.seconds)
                r.close()
                if heavy_weight == 1:
                    capacity = rates[heavy] + rates[light]  # the server saturated
                samples_ratio = rates[heavy] / rates[light]
                cpu_ratio = cpu[heavy] / cpu[light]
                shares[heavy_weight] = (samples_ratio, cpu_ratio)
                print(f"weights {heavy_weight}:1 over {args.seconds:.0f} s: samples "
                      f"{rates[heavy]:.0f}/s : {rates[light]:.0f}/s = {samples_ratio:.2f}, "
                      f"server CPU {cpu[heavy]:.2f} s : {cpu[light]:.2f} s = {cpu_ratio:.2f}",
                      flush=True)

            # A light job (one reader) asking for a quarter of the capacity,
            # alone, then beside a greedy job of the same weight whose two
            # readers keep the server busy.
            step = 4.0 / capacity
            create("light-alone", 1)
            r = Readers(sluice, coordinator.address, {"light-alone": (step, 1)})
            rates, _ = measure(data, r, ["light-alone"], 2, args.seconds / 2)
            r.close()
            alone = rates["light-alone"]
            create("light", 1)
            create("greedy", 1)
            r = Readers(sluice, coordinator.address, {"light": (step, 1), "greedy": (0, 2)})
            t0 = time.monotonic()
            busy0 = cpu_seconds(data, "light") + cpu_seconds(data, "greedy")
            rates, _ = measure(data, r, ["light", "greedy"], 2, args.seconds / 2)
            busy = (cpu_seconds(data, "light") + cpu_seconds(data, "greedy") - busy0) / (
                time.monotonic() - t0)
            r.close()
            beside = rates["light"]
            print(f"capacity {capacity:.0f} samples/s (two greedy jobs, one server thread); "
                  f"light job ({1 / step:.0f} samples/s asked): alone {alone:.0f}/s, beside a "
                  f"greedy job {beside:.0f}/s (the greedy job got {rates['greedy']:.0f}/s; the "
                  f"server's thread busy {100 * busy:.0f} %): {beside / alone:.3f}", flush=True)
        finally:
            cluster.stop()

    def within(ratio, weight):
        return abs(ratio / weight - 1) <= 0.10

    print(json.dumps({
        "bench": "fair_share", "seconds": args.seconds, "capacity_per_s": round(capacity, 1),
        "share_1_1_samples": round(shares[1][0], 3), "share_1_1_cpu": round(shares[1][1], 3),
        "share_3_1_samples": round(shares[3][0], 3), "share_3_1_cpu": round(shares[3][1], 3),
        "shares_within_10pct": all(within(s, w) for w, pair in shares.items() for s in pair),
        "light_beside_greedy_over_alone": round(beside / alone, 3), "light_goal": 0.95}))


if __name__ == "__main__":
    main()
