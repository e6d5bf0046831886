"""`sluicectl up --autoscale`: local data servers follow the coordinator's
estimate of what the trainers need, starting when the trainers wait for
input and draining (SIGTERM) when they do not, without a failed stream and
with every epoch read exactly once."""
import collections
import io
import json
import os
import random
import re
import signal
import subprocess
import tarfile
import threading

from PIL import Image

from conftest import BIN, _wait_for


def write_jpeg_shards(directory, shards, per_shard):
    """Shards of noisy 320x240 JPEGs (slow to decode: a data server with one
    decode thread is the bottleneck of a trainer with no step)."""
    os.makedirs(directory, exist_ok=True)
    rng = random.Random(7)
    for s in range(shards):
        with tarfile.open(os.path.join(directory, f"shard-{s:03d}.tar"), "w") as tar:
            for i in range(per_shard):
                image = Image.effect_noise((320, 240), 30 + rng.randrange(20)).convert("RGB")
                jpeg = io.BytesIO()
                image.save(jpeg, "JPEG", quality=90)
                for ext, data in (("jpg", jpeg.getvalue()), ("cls", str(i).encode())):
                    info = tarfile.TarInfo(f"s{s}_{i}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))


class Up:
    """`sluicectl up` in the foreground; its stdout lines as they come."""

    def __init__(self, directory, shards, args):
        self.proc = subprocess.Popen(
            [os.path.join(BIN, "sluicectl"), "up", f"--dir={directory}", f"--shards={shards}",
             "--coordinator=127.0.0.1:0", *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines = []
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        first = _wait_for(lambda: self.find(r"^coordinator (\S+)"), 60, "sluicectl up to start")
        self.coordinator = first.group(1)

    def _read(self):
        for line in self.proc.stdout:
            with self._lock:
                self.lines.append(line.rstrip("\n"))

    def find(self, pattern, start=0):
        """The first match of `pattern` in the lines from `start` on."""
        with self._lock:
            for line in self.lines[start:]:
                m = re.search(pattern, line)
                if m:
                    return m
        return None

    def stop(self):
        self.proc.send_signal(signal.SIGINT)
        code = self.proc.wait(timeout=60)
        self._reader.join(timeout=10)
        return code


class Reading:
    """`sluicectl read` of decoded samples; (epoch, shard, index) of each."""

    def __init__(self, coordinator, job, epochs, rate):
        self.proc = subprocess.Popen(
            [os.path.join(BIN, "sluicectl"), "read", f"--coordinator={coordinator}",
             f"--job={job}", "--rank=0", f"--read_epochs={epochs}", f"--rate={rate}",
             "--decode"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.samples, self.err = [], []
        self._threads = [threading.Thread(target=self._read, daemon=True),
                         threading.Thread(target=self._errors, daemon=True)]
        for t in self._threads:
            t.start()

    def _read(self):
        for line in self.proc.stdout:
            d = json.loads(line)
            self.samples.append((d["epoch"], d["shard"], d["index"]))

    def _errors(self):
        for line in self.proc.stderr:
            self.err.append(line)

    def finish(self, timeout):
        """Waits for the exit; the closing summary line."""
        code = self.proc.wait(timeout=timeout)
        for t in self._threads:
            t.join(timeout=10)
        assert code == 0, "".join(self.err)[-3000:]
        return self.err[-1].strip()


def test_data_servers_follow_the_trainers_need(tmp_path):
    shards, per_shard = 8, 60
    write_jpeg_shards(tmp_path / "shards", shards, per_shard)
    # One decode thread per data server: each is about one core's worth.
    # The coordinator re-estimates every second over 4 s of history; its
    # estimate falls only after 5 s of lower recommendations.
    up = Up(tmp_path / "up", tmp_path / "shards",
            ["--autoscale=1:2", "--data_server_flags=--decode_threads=1", "--",
             "--fleet_interval=1s", "--fleet_window=4s", "--fleet_up_cooldown=1s",
             "--fleet_down_stabilization=5s"])
    try:
        ctl = [os.path.join(BIN, "sluicectl")]
        manifest = tmp_path / "manifest.json"
        subprocess.run([*ctl, "index", str(tmp_path / "shards"), "-o", str(manifest)],
                       check=True, capture_output=True)
        subprocess.run([*ctl, "job", "create", f"--coordinator={up.coordinator}", "--name=j",
                        f"--manifest={manifest}", "--world_size=1", "--epochs=0",
                        "--mode=dynamic", "--max_samples_per_lease=20"],
                       check=True, capture_output=True)
        assert up.find(r"^data server ") and len([x for x in up.lines
                                                  if x.startswith("data server ")]) == 1

        # A trainer with no step waits for input nearly all the time: the
        # coordinator asks for more, and the autoscaler starts the second.
        fast = Reading(up.coordinator, "j", epochs=24, rate=0)
        started = _wait_for(lambda: up.find(r"wants (\d+) data servers .*; starting 1"), 60,
                            "a second data server to be started")
        assert int(started.group(1)) >= 2
        assert fast.proc.poll() is None, "the trainer finished before the fleet grew"
        fast_summary = fast.finish(180)

        # The trainer slowed to a 10 ms step no longer waits: the estimate
        # falls back to one, and the autoscaler drains the second server
        # while the trainer reads on.
        mark = len(up.lines)
        slow = Reading(up.coordinator, "j", epochs=6, rate=100)
        drained = _wait_for(lambda: up.find(r"input wait (\d+)%\); draining 1", mark), 60,
                            "a data server to be drained")
        assert int(drained.group(1)) < 10
        leaving = _wait_for(lambda: up.find(r"^data server (\S+) draining", mark), 5,
                            "the drained server's address")
        assert slow.proc.poll() is None, "the trainer finished before the fleet shrank"
        slow_summary = slow.finish(180)

        # Every epoch exactly once across both fleet changes, and no stream
        # failed: nothing re-routed.
        seen = collections.Counter(fast.samples + slow.samples)
        assert max(seen.values()) == 1, [s for s, n in seen.items() if n > 1][:5]
        per_epoch = collections.Counter(e for e, _, _ in seen)
        assert per_epoch == {e: shards * per_shard for e in range(30)}, per_epoch
        for summary in (fast_summary, slow_summary):
            assert " 0 re-routed," in summary, summary
        # The drained server left by itself, cleanly.
        logs = tmp_path / "up" / "logs"
        stopped = [p for p in os.listdir(logs) if p.startswith("dataserver-")
                   and "stopped" in (logs / p).read_text()]
        assert len(stopped) == 1, (leaving.group(1), os.listdir(logs))
    finally:
        assert up.stop() == 0
