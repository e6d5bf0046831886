#!/usr/bin/python3
"""Shared decoding benchmark (make bench; not a test).

A sweep of K = 4 trials over one dataset on one data server: four dynamic
jobs with different seeds, transforms (RandomResizedCrop + flip at three
sizes, Resize + CenterCrop) and step times read one epoch each, at once,
through sluice.Reader in four threads. Measured in the same run, in
alternating rounds on fresh servers: the data server's CPU seconds (utime +
stime from /proc) per sample delivered across the four jobs with sharing
on (--shared_decode_bytes=256 MiB, the server's default, or --cache_mib;
--steer_shared_shards on the coordinator) against sharing off
(--shared_decode_bytes=0, --nosteer_shared_shards). Each round's server is
first warmed by the same four trials over shards of their own, enough to
pass the cache's bound through it: a server that has run a while keeps the
memory its cache fills, while a fresh one takes it from the kernel a page
fault at a time (--cold measures without the warm-up). Also reported: the
data server's page faults per sample, the shared decodes' hit rate and the
decoded bytes held at the end against the bound. Goal: <= 0.4x (ideal
1/K = 0.25x). Ends with one JSON line.

usage: shared_decode_bench.py BIN_DIR [--rounds N] [--shards S] [--per_shard P]
       [--cache_mib M] [--cold]
"""
import argparse
import faulthandler
import json
import os
import re
import statistics
import sys
import tempfile
import threading
import time


HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
from sample_data import photo_like_jpegs, write_jpeg_shards  # noqa: E402

K = 4
STEPS = [0.0, 0.0005, 0.001, 0.0015]  # seconds per training step, per trial
DECODED_BYTES = 500 * 375 * 3  # one image decoded whole, as the cache holds it
# The data server's counters each round reads, by name.
COUNTERS = {
    "hits": r'sluice_dataserver_shared_decodes_total\{result="hit"\} (\S+)',
    "misses": r'sluice_dataserver_shared_decodes_total\{result="miss"\} (\S+)',
    # A field's decode with its transforms (thread time in DecodeField), and
    # the resize steps alone.
    "decode_s": r'^sluice_dataserver_decode_seconds_sum\{codec="jpeg"\} (\S+)',
    "resize_s": r'^sluice_dataserver_transform_seconds_sum\{op="resize"\} (\S+)',
    # Thread CPU time in libjpeg-turbo itself (a shared decode counted once).
    "decoder_cpu_s": r'^sluice_dataserver_decoder_cpu_seconds_total\{codec="jpeg"\} (\S+)',
}


def cpu_and_faults(pid):
    """A process's CPU seconds (utime + stime) and minor page faults."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), int(fields[7])


def metric(text, pattern):
    m = re.search(pattern, text, re.M)
    return float(m.group(1)) if m else 0.0


def one_round(conftest, sluice, T, tmp, urls, sharing, round_no, cache_bytes, warm_up_urls):
    """Fresh servers; the K jobs read one epoch each at once. Returns the
    data server's CPU seconds per sample delivered, and the cache figures."""
    work = os.path.join(tmp, f"round{round_no}-{'on' if sharing else 'off'}")
    os.makedirs(work)
    # The data server's root (the cluster's shards directory) is the dataset.
    os.symlink(os.path.join(tmp, "shards"), os.path.join(work, "shards"))
    cluster = conftest.Cluster(
        work, shards=0,
        data_flags=[f"--shared_decode_bytes={cache_bytes if sharing else 0}"],
        coordinator_flags=[] if sharing else ["--nosteer_shared_shards"])
    coordinator, data = cluster.coordinator, cluster.data[0]
    try:
        transforms = [
            T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip()]),
            T.Compose([T.RandomResizedCrop(160, scale=(0.3, 1.0)), T.RandomHorizontalFlip()]),
            T.Compose([T.Resize(256), T.CenterCrop(224)]),
            T.Compose([T.RandomResizedCrop(128), T.RandomHorizontalFlip()]),
        ]
        def run_trials(prefix, shards):
            """The K trials read `shards` once, at once. Returns their
            sample counts, the wall seconds and the data server's CPU
            seconds from the moment all four readers are open."""
            for n in range(K):
                cluster.create_job(f"{prefix}{n}", mode="dynamic", seed=100 + n,
                                   shuffle_window=1, shards=shards)
            counts = [0] * K
            start = threading.Barrier(K + 1)

            def read(n):
                with sluice.Reader(coordinator.address, f"{prefix}{n}",
                                   transform=transforms[n]) as reader:
                    start.wait()
                    for _ in reader:
                        counts[n] += 1
                        if STEPS[n]:
                            time.sleep(STEPS[n])

            threads = [threading.Thread(target=read, args=(n,)) for n in range(K)]
            for t in threads:
                t.start()
            start.wait()
            cpu0, faults0 = cpu_and_faults(data.pid)
            t0 = time.monotonic()
            for t in threads:
                t.join()
            cpu1, faults1 = cpu_and_faults(data.pid)
            return counts, time.monotonic() - t0, cpu1 - cpu0, faults1 - faults0

        if warm_up_urls:
            # A server that has run a while: its malloc arenas hold the
            # memory the cache fills (the servers keep freed memory), which
            # a fresh process first takes from the kernel a page fault at a
            # time. Warmed by the same trials over shards of their own
            # (other URLs: none of their cache entries is a measured hit).
            run_trials("warm-up", warm_up_urls)
            text = data.metric_text()
            before = {k: metric(text, p) for k, p in COUNTERS.items()}
        else:
            before = dict.fromkeys(COUNTERS, 0.0)
        counts, wall, cpu, faults = run_trials("trial", urls)
        text = data.metric_text()
        got = {k: metric(text, p) - before[k] for k, p in COUNTERS.items()}
        held = metric(text, r"^sluice_dataserver_shared_decode_bytes (\S+)")
        samples = sum(counts)
        expected = K * sum(n for _, n in urls)
        if samples != expected:
            sys.exit(f"round {round_no}: {samples} samples delivered, expected {expected}")
        return {"cpu_per_sample_ms": 1000 * cpu / samples, "wall_s": wall,
                "faults_per_sample": faults / samples,
                "decode_ms": 1000 * got["decode_s"] / samples,
                "resize_ms": 1000 * got["resize_s"] / samples,
                "decoder_cpu_ms": 1000 * got["decoder_cpu_s"] / samples,
                "hits": got["hits"], "misses": got["misses"], "held_bytes": held}
    finally:
        cluster.stop()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("bin_dir")
    parser.add_argument("--rounds", type=int, default=3,
                        help="alternating rounds with sharing on and off; medians compared")
    parser.add_argument("--shards", type=int, default=12)
    parser.add_argument("--per_shard", type=int, default=64)
    parser.add_argument("--cache_mib", type=int, default=256,
                        help="the data server's --shared_decode_bytes, in MiB, with sharing on "
                             "(default: the server's own default)")
    parser.add_argument("--cold", action="store_true",
                        help="measure fresh servers, without the warm-up trials over shards "
                             "of their own that each round runs first")
    args = parser.parse_args()
    faulthandler.dump_traceback_later(600, exit=True)  # never hang make bench
    os.environ["SLUICE_BIN_DIR"] = args.bin_dir
    sys.path.insert(0, os.path.join(args.bin_dir, "..", "python"))
    import conftest  # the test suite's cluster helpers
    import sluice
    from sluice import transforms as T

    with tempfile.TemporaryDirectory() as tmp:
        # Every sample its own image (~500x375, like ImageNet's median).
        jpegs = photo_like_jpegs(args.shards * args.per_shard)
        urls = write_jpeg_shards(os.path.join(tmp, "shards"), args.shards, args.per_shard, jpegs)
        # Warm-up shards whose images fill the cache's bound, and one more.
        warm_up_shards = 1 + -(-(args.cache_mib << 20) // (args.per_shard * DECODED_BYTES))
        warm_up_urls = [] if args.cold else write_jpeg_shards(
            os.path.join(tmp, "shards"), warm_up_shards, args.per_shard, jpegs, name="warm-up")
        on, off = [], []
        for r in range(args.rounds):
            for sharing in ((True, False) if r % 2 == 0 else (False, True)):
                result = one_round(conftest, sluice, T, tmp, urls, sharing, r,
                                   args.cache_mib << 20, warm_up_urls)
                (on if sharing else off).append(result)
                print(f"round {r} sharing {'on ' if sharing else 'off'}: "
                      f"{result['cpu_per_sample_ms']:.3f} ms CPU/sample, "
                      f"{result['wall_s']:.1f} s, {result['faults_per_sample']:.1f} page "
                      f"faults/sample, hits {result['hits']:.0f}, "
                      f"misses {result['misses']:.0f}; per sample: decoder CPU "
                      f"{result['decoder_cpu_ms']:.3f} ms, the rest of the CPU "
                      f"{result['cpu_per_sample_ms'] - result['decoder_cpu_ms']:.3f} ms; "
                      f"decode + transforms {result['decode_ms']:.3f} ms, of which resize "
                      f"{result['resize_ms']:.3f} ms",
                      flush=True)
    on_ms = statistics.median(r["cpu_per_sample_ms"] for r in on)
    off_ms = statistics.median(r["cpu_per_sample_ms"] for r in off)
    hits = sum(r["hits"] for r in on)
    decoded = sum(r["hits"] + r["misses"] for r in on)
    samples = args.rounds * K * args.shards * args.per_shard
    ratio = on_ms / off_ms
    decoder_on = statistics.median(r["decoder_cpu_ms"] for r in on)
    decoder_off = statistics.median(r["decoder_cpu_ms"] for r in off)
    rest_on = statistics.median(r["cpu_per_sample_ms"] - r["decoder_cpu_ms"] for r in on)
    rest_off = statistics.median(r["cpu_per_sample_ms"] - r["decoder_cpu_ms"] for r in off)
    print(f"data-server CPU per sample, {K} trials: sharing on {on_ms:.3f} ms, "
          f"off {off_ms:.3f} ms: {ratio:.2f}x (goal <= 0.4x, ideal {1 / K:.2f}x)")
    print(f"of which in the JPEG decoder: sharing on {decoder_on:.3f} ms, off "
          f"{decoder_off:.3f} ms: {decoder_on / decoder_off:.2f}x; the rest (reading, "
          f"transforms, framing, sending): on {rest_on:.3f} ms, off {rest_off:.3f} ms")
    print(f"shared decodes: {hits:.0f} of {decoded:.0f} hits "
          f"({100 * hits / max(decoded, 1):.0f} %), {100 * decoded / samples:.0f} % of "
          f"samples went through the cache; held at the end "
          f"{max(r['held_bytes'] for r in on) / 2**20:.0f} MiB of {args.cache_mib} MiB")
    print(json.dumps({
        "bench": "shared_decode", "trials": K, "samples_per_epoch": args.shards * args.per_shard,
        "cpu_ms_per_sample_shared": round(on_ms, 3), "cpu_ms_per_sample_alone": round(off_ms, 3),
        "ratio": round(ratio, 3), "goal": 0.4,
        "decoder_cpu_ms_per_sample_shared": round(decoder_on, 3),
        "decoder_cpu_ms_per_sample_alone": round(decoder_off, 3),
        "decoder_cpu_ratio": round(decoder_on / decoder_off, 3),
        "rest_cpu_ms_per_sample_shared": round(rest_on, 3),
        "rest_cpu_ms_per_sample_alone": round(rest_off, 3),
        "hit_rate": round(hits / max(decoded, 1), 3),
        "cache_bound_bytes": args.cache_mib << 20,
        "held_bytes": max(r["held_bytes"] for r in on)}))


if __name__ == "__main__":
    main()
