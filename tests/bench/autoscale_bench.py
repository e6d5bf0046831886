"""Data servers that follow a load step, against the same fleet started by
hand (`sluicectl up --autoscale`).

    autoscale_bench.py [BIN_DIR] [--rounds=2] [--max=2] [--seconds=12]

Shards of noisy 320x240 JPEGs; every data server decodes on one thread, so
one server is the bottleneck of a trainer with no step (`sluicectl read
--decode`). Each round, alternating:

1. Autoscaled: `sluicectl up --autoscale=1:MAX` (the coordinator
   re-estimating every second over 4 s of history). At t=0 the trainer
   starts reading: the time until the fleet has MAX servers (the
   autoscaler's "starting" line and each new server's registration), the
   trainers' input-wait share the coordinator measured before that, and
   the samples/s the trainer reaches over --seconds once the fleet is
   complete.
2. By hand: `sluicectl up --data_servers=MAX`, the same trainer, the same
   --seconds: its samples/s and wait share.

On this 2-core machine the trainer with no step waits for input with any
number of servers (the servers share the cores with it), so the wait share
falls but does not reach 0: what is compared is the throughput the
autoscaled fleet reaches against the fleet an operator would start.
Prints a line per round, a summary, and one JSON line last.
"""
import argparse
import importlib.util
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# The launchers tests' shards: the closed-loop test's load, benchmarked.
launchers = _load("sluice_launchers_fixtures", os.path.join(HERE, "..", "launchers", "conftest.py"))

FLEET = ["--fleet_interval=1s", "--fleet_window=4s", "--fleet_up_cooldown=1s",
         "--fleet_down_stabilization=5s"]


class Up:
    """`sluicectl up` with `args`; its stdout lines with their arrival times."""

    def __init__(self, bin_dir, work, shards, args):
        self.proc = subprocess.Popen(
            [os.path.join(bin_dir, "sluicectl"), "up", f"--dir={work}", f"--shards={shards}",
             "--coordinator=127.0.0.1:0", "--data_server_flags=--decode_threads=1", *args,
             "--", *FLEET],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.lines = []
        threading.Thread(target=self._read, daemon=True).start()
        try:
            self.coordinator = self.wait(r"^coordinator (\S+)", 60)[0].group(1)
        except BaseException:
            self.stop()
            raise

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append((time.monotonic(), line.rstrip("\n")))

    def wait(self, pattern, timeout):
        """(match, index of its line) of the first line matching `pattern`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for i, (_, line) in enumerate(self.lines):
                m = re.search(pattern, line)
                if m:
                    return m, i
            time.sleep(0.05)  # polling with a deadline
        raise TimeoutError(f"sluicectl up never printed {pattern!r}")

    def stop(self):
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait(timeout=60)


def ctl(bin_dir, *args):
    return subprocess.run([os.path.join(bin_dir, "sluicectl"), *args], capture_output=True,
                          text=True, check=True).stdout


def wait_share(bin_dir, coordinator):
    m = re.search(r"waiting for input (\d+)%", ctl(bin_dir, "status",
                                                   f"--coordinator={coordinator}"))
    return int(m.group(1)) / 100 if m else None


class Trainer:
    """`sluicectl read --decode` with no step; the arrival time of each sample."""

    def __init__(self, bin_dir, coordinator, job):
        self.proc = subprocess.Popen(
            [os.path.join(bin_dir, "sluicectl"), "read", f"--coordinator={coordinator}",
             f"--job={job}", "--rank=0", "--decode"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.times = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for _ in self.proc.stdout:
            self.times.append(time.monotonic())

    def rate(self, start, end):
        return sum(1 for t in self.times if start <= t < end) / (end - start)

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=60)


def run(bin_dir, tmp, shards, manifest, name, autoscale, servers, seconds):
    args = [f"--autoscale=1:{servers}"] if autoscale else [f"--data_servers={servers}"]
    up = Up(bin_dir, os.path.join(tmp, name), shards, args)
    try:
        ctl(bin_dir, "job", "create", f"--coordinator={up.coordinator}", "--name=load",
            f"--manifest={manifest}", "--world_size=1", "--epochs=0", "--mode=dynamic",
            "--max_samples_per_lease=20")
        trainer = Trainer(bin_dir, up.coordinator, "load")
        start = time.monotonic()
        scaled_after = None
        before = None
        if autoscale:
            time.sleep(3)  # the first estimate's window
            before = wait_share(bin_dir, up.coordinator)
            # The servers started after the autoscaler's first line.
            mark = up.wait(r"^autoscale: 1 to", 10)[1] + 1
            deadline = time.monotonic() + 120
            while True:
                added = [at for at, line in up.lines[mark:] if re.match(r"^data server \S+$", line)]
                if len(added) >= servers - 1:
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError("the fleet did not grow")
                time.sleep(0.05)  # polling with a deadline
            scaled_after = added[servers - 2] - start
            measure_from = added[servers - 2] + 2  # registered and serving
        else:
            measure_from = start + 2
        time.sleep(max(0.0, measure_from + seconds - time.monotonic()))
        rate = trainer.rate(measure_from, measure_from + seconds)
        after = wait_share(bin_dir, up.coordinator)
        trainer.stop()
        return {"rate": rate, "scaled_after_s": scaled_after, "wait_before": before,
                "wait_after": after}
    finally:
        up.stop()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("bin_dir", nargs="?", default=os.environ.get("SLUICE_BIN_DIR", "build/bin"))
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--max", type=int, default=2)
    p.add_argument("--seconds", type=float, default=12)
    a = p.parse_args()
    bin_dir = os.path.abspath(a.bin_dir)
    with tempfile.TemporaryDirectory(prefix="sluice-autoscale-bench-") as tmp:
        shards = os.path.join(tmp, "shards")
        launchers.write_jpeg_shards(shards, 8, 60)
        manifest = os.path.join(tmp, "manifest.json")
        ctl(bin_dir, "index", shards, "-o", manifest)
        auto, hand = [], []
        for r in range(a.rounds):
            auto.append(run(bin_dir, tmp, shards, manifest, f"auto{r}", True, a.max, a.seconds))
            hand.append(run(bin_dir, tmp, shards, manifest, f"hand{r}", False, a.max,
                            a.seconds))
            print(f"round {r}: autoscaled to {a.max} servers {auto[-1]['scaled_after_s']:.1f} s "
                  f"after the load step (input wait before {auto[-1]['wait_before']}, after "
                  f"{auto[-1]['wait_after']}), then {auto[-1]['rate']:.0f} samples/s; "
                  f"{a.max} started by hand: {hand[-1]['rate']:.0f} samples/s "
                  f"(input wait {hand[-1]['wait_after']})", file=sys.stderr, flush=True)
    scaled = statistics.median(x["scaled_after_s"] for x in auto)
    auto_rate = statistics.median(x["rate"] for x in auto)
    hand_rate = statistics.median(x["rate"] for x in hand)
    print(f"load step: the fleet grew from 1 to {a.max} data servers {scaled:.1f} s after the "
          f"trainer started (median of {a.rounds}); it then served {auto_rate:.0f} samples/s "
          f"against {hand_rate:.0f} from {a.max} servers started by hand: ratio "
          f"{auto_rate / hand_rate:.2f}")
    print(json.dumps({"bench": "autoscale", "max_servers": a.max, "scaled_after_s": round(scaled, 2),
                      "samples_per_s": round(auto_rate), "by_hand_samples_per_s": round(hand_rate),
                      "ratio": round(auto_rate / hand_rate, 2),
                      "wait_before": [x["wait_before"] for x in auto],
                      "wait_after": [x["wait_after"] for x in auto],
                      "by_hand_wait": [x["wait_after"] for x in hand]}))


if __name__ == "__main__":
    main()
