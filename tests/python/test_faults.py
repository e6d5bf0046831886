"""Faults as users' clusters cause them, on real processes. Pauses (GC,
swapping, a VM or NFS stall) with SIGSTOP/SIGCONT: a trainer or the
coordinator stopped for three lease TTLs mid-epoch costs a pause, never a
sample delivered twice or per-rank counts that differ (which would hang
DDP). A journal disk that fills up: the coordinator exits 74 for its
supervisor, and the next one loses nothing that was acknowledged.

Two ranks of a dynamic job with a 2 s lease TTL: rank 0 is `sluicectl read`
(the C++ Reader), rank 1 a Python Reader; both print every sample they
deliver, with a training step of 10 ms.
"""
import collections
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from conftest import (BIN, Cluster, Server, _wait_for, free_port, ready, start_etcd,
                      write_shards)

SHARDS, PER_SHARD = 10, 30  # 300 samples, 150 per rank
PAUSE = 6.0  # seconds: three lease TTLs
# Runs of each pause test (SLUICE_FAULT_REPEATS=10 for a soak; tests/README.md).
REPEATS = int(os.environ.get("SLUICE_FAULT_REPEATS", "1"))
TRAIN_LOOP = os.path.join(os.path.dirname(__file__), "train_loop.py")

PY_READER = textwrap.dedent("""
    import sys, time
    import sluice
    address, job, rank = sys.argv[1], sys.argv[2], int(sys.argv[3])
    with sluice.Reader(address, job, rank=rank, progress_interval=0.1) as r:
        for s in r:
            print(s.epoch, s.shard_index, s.index, flush=True)
            time.sleep(0.01)
""")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("pauses"), shards=SHARDS, per_shard=PER_SHARD)
    yield c
    c.stop()


class _Lines:
    """A child's stdout lines, read as they come (and its stderr)."""

    def __init__(self, proc, parse):
        self.proc, self.lines, self.err = proc, [], []
        self._threads = [
            threading.Thread(target=self._read, args=(proc.stdout, parse, self.lines),
                             daemon=True),
            threading.Thread(target=self._read, args=(proc.stderr, str, self.err),
                             daemon=True)]
        for t in self._threads:
            t.start()

    @staticmethod
    def _read(stream, parse, out):
        for line in stream:
            out.append(parse(line))

    def finish(self, timeout):
        code = self.proc.wait(timeout=timeout)
        for t in self._threads:
            t.join(timeout=10)
        assert code == 0, "".join(self.err)[-3000:]
        return self.lines


def _cpp(line):
    d = json.loads(line)
    return d["epoch"], d["shard"], d["index"]


def _py(line):
    e, s, i = line.split()
    return int(e), int(s), int(i)


def _start_readers(address, job, stamp=False):
    """Rank 0 `sluicectl read`, rank 1 a Python Reader; with `stamp`, each
    line is (monotonic time of arrival, sample)."""
    cpp = subprocess.Popen(
        [os.path.join(BIN, "sluicectl"), "read", f"--coordinator={address}",
         f"--job={job}", "--rank=0", "--rate=100", "--read_epochs=2",
         "--progress_interval=100ms"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    py = subprocess.Popen([sys.executable, "-c", PY_READER, address, job, "1"],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wrap = (lambda parse: lambda line: (time.monotonic(), parse(line))) if stamp else (
        lambda parse: parse)
    return _Lines(cpp, wrap(_cpp)), _Lines(py, wrap(_py))


def _assert_exactly_once_and_balanced(ranks):
    for r, samples in enumerate(ranks):
        per_epoch = collections.Counter(e for e, _, _ in samples)
        assert per_epoch == {0: 150, 1: 150}, f"rank {r}: {dict(per_epoch)}"
    seen = collections.Counter(s for samples in ranks for s in samples)
    twice = sorted(s for s, n in seen.items() if n > 1)
    assert not twice, f"{len(twice)} delivered twice, e.g. {twice[:5]}"
    assert len(seen) == 2 * SHARDS * PER_SHARD


def _pause(pid, seconds):
    os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(seconds)  # the fault itself: a process stopped this long
    finally:
        os.kill(pid, signal.SIGCONT)


@pytest.mark.parametrize("run", range(REPEATS))
@pytest.mark.parametrize("paused", ["cpp", "python"])
def test_a_reader_paused_past_its_lease_ttl_delivers_nothing_twice(cluster, paused, run):
    job = f"paused-{paused}-{run}"
    cluster.create_job(job, world_size=2, epochs=2, mode="dynamic", lease_ttl="2s",
                       max_samples_per_lease=5)
    cpp, py = _start_readers(cluster.address, job)
    reader = cpp if paused == "cpp" else py
    _wait_for(lambda: len(reader.lines) >= 40, 60, "40 samples read")
    _pause(reader.proc.pid, PAUSE)
    ranks = [cpp.finish(180), py.finish(180)]
    _assert_exactly_once_and_balanced(ranks)
    assert cluster.lease_counts(job)["expired"] >= 1  # the pause did cost leases


# A worker's Complete may still be on its way when the pause starts: the
# lease expires, the Complete is rejected, and the unit comes back to the
# same worker, which skips what it had delivered (LostDeliveries); a
# worker's stream that breaks on waking keeps its slot's remainders for
# 5 s (CoordinatorExpiryTest).
@pytest.mark.parametrize("run", range(REPEATS))
def test_a_trainer_with_two_dataloader_workers_paused_past_the_ttl_trains_each_sample_once(
        cluster, tmp_path, run):
    # The README's loop (sluice.torch.DataLoader, 2 workers, a 50 ms step,
    # a checkpoint per step); the trainer and its workers stopped together
    # (a VM stall) for three TTLs after its first step.
    job = f"paused-workers-{run}"
    cluster.create_job(job, world_size=1, epochs=2, mode="dynamic", lease_ttl="2s",
                       max_samples_per_lease=5)
    checkpoint = tmp_path / "checkpoint.json"
    proc = subprocess.Popen(
        [sys.executable, TRAIN_LOOP, cluster.address, job, "--workers=2", "--step=0.05",
         "--epochs=2", f"--checkpoint={checkpoint}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _wait_for(checkpoint.exists, 120, "the first training step")
        os.killpg(proc.pid, signal.SIGSTOP)
        try:
            time.sleep(PAUSE)  # the fault itself
        finally:
            os.killpg(proc.pid, signal.SIGCONT)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err[-3000:]
    trained = [tuple(t) for t in json.loads(out.splitlines()[-1])["trained"]]
    assert collections.Counter(e for e, _, _ in trained) == {0: 300, 1: 300}
    assert len(set(trained)) == len(trained)
    assert cluster.lease_counts(job)["expired"] >= 1  # the pause did cost leases


@pytest.mark.parametrize("run", range(REPEATS))
def test_a_coordinator_paused_past_the_lease_ttl_twice_expires_nothing_held(cluster, run):
    job = f"coordinator-paused-{run}"
    cluster.create_job(job, world_size=2, epochs=2, mode="dynamic", lease_ttl="2s",
                       max_samples_per_lease=5)
    cpp, py = _start_readers(cluster.address, job)
    _wait_for(lambda: len(cpp.lines) >= 40, 60, "40 samples read")
    _pause(cluster.coordinator.pid, PAUSE)
    _wait_for(lambda: len(cpp.lines) >= 180, 60, "180 samples read")
    _pause(cluster.coordinator.pid, PAUSE)
    ranks = [cpp.finish(180), py.finish(180)]
    _assert_exactly_once_and_balanced(ranks)
    assert cluster.lease_counts(job)["expired"] == 0
    stalls = [line for line in cluster.coordinator.metric_text().splitlines()
              if line.startswith("sluice_coordinator_stalls_total ")]
    assert stalls and float(stalls[0].split()[1]) >= 2, stalls


@pytest.mark.parametrize("run", range(REPEATS))
def test_a_paused_ha_leader_is_left_within_twice_the_election_ttl(tmp_path, run):
    # Two coordinators on fixed ports share a journal in etcd (election TTL
    # 2 s); the data server and both readers are given both. The leader is
    # stopped for 10 s mid-epoch, twice: the standby takes over once the
    # leader's election lease lapses, the data server and the readers find
    # it (the readers' streams fail keepalive; the data server's heartbeats
    # go unanswered), and samples flow again within 2 x the TTL plus about a
    # heartbeat of the stop, never twice. On SIGCONT the deposed leader
    # exits 75 without writing; its supervisor (this test) starts it again
    # on its port, as the standby for the second stop.
    etcd, endpoint = start_etcd(str(tmp_path / "etcd"))
    servers = []
    try:
        urls = write_shards(str(tmp_path / "shards"), SHARDS, PER_SHARD)
        journal = [f"--journal=etcd://{endpoint}/sluice/paused", "--election_ttl=2s"]
        ports = [free_port(), free_port()]
        coordinators = [Server("sluice-coordinator", str(tmp_path / "c0"), journal, ports[0])]
        _wait_for(lambda: ready(coordinators[0].address), 30, "the first coordinator to lead")
        coordinators.append(Server("sluice-coordinator", str(tmp_path / "c1"), journal,
                                   ports[1]))
        servers += coordinators
        both = f"127.0.0.1:{ports[1]},127.0.0.1:{ports[0]}"
        servers.append(Server("sluice-dataserver", str(tmp_path / "d"),
                              [f"--roots={tmp_path / 'shards'}", f"--coordinator={both}"]))
        _wait_for(lambda: "sluice_coordinator_data_servers 1" in coordinators[0].metric_text(),
                  30, "the data server to register")
        manifest = tmp_path / "m.json"
        manifest.write_text(json.dumps(
            {"shards": [{"url": u, "num_samples": n} for u, n in urls]}))
        out = _sluicectl("job", "create", f"--coordinator={both}", "--name=ha-paused",
                         f"--manifest={manifest}", "--world_size=2", "--epochs=2",
                         "--mode=dynamic", "--lease_ttl=2s", "--max_samples_per_lease=5")
        assert out.returncode == 0, out.stdout + out.stderr
        cpp, py = _start_readers(both, "ha-paused", stamp=True)
        for leader, after in ((0, 40), (1, 180)):
            _wait_for(lambda: len(cpp.lines) >= after, 60, f"{after} samples read")
            assert ready(coordinators[leader].address)
            _pause(coordinators[leader].pid, 10.0)
            assert coordinators[leader].wait(timeout=30) == 75
            assert ready(coordinators[1 - leader].address)
            coordinators[leader] = Server("sluice-coordinator", str(tmp_path / f"c{leader}"),
                                          journal, ports[leader])
            servers.append(coordinators[leader])
        ranks = [cpp.finish(180), py.finish(180)]
        _assert_exactly_once_and_balanced([[s for _, s in r] for r in ranks])
        # The longest wait for a sample on each rank (the readers hand over
        # what they buffered for a while after each stop).
        gaps = [max(b - a for (a, _), (b, _) in zip(r, r[1:])) for r in ranks]
        print(f"longest gaps {gaps[0]:.2f} s / {gaps[1]:.2f} s in two 10 s stops")
        assert max(gaps) < 2 * 2.0 + 3.0, gaps
    finally:
        for server in reversed(servers):
            server.stop()
        etcd.terminate()
        etcd.wait()


def _sluicectl(*args):
    return subprocess.run([os.path.join(BIN, "sluicectl"), *args], capture_output=True,
                          text=True, timeout=60)


def test_a_full_journal_disk_exits_for_the_supervisor_and_loses_nothing_acknowledged(
        tmp_path):
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs for the journal needs root")
    journal = tmp_path / "journal"
    journal.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(journal)], check=True)
    servers = []
    try:
        manifest = tmp_path / "manifest.json"
        manifest.write_text(json.dumps({"shards": [{"url": f"/data/s{i}.tar",
                                                    "num_samples": 10} for i in range(4)]}))
        # Large enough (~100 KB) not to fit in the slack of the journal's
        # last page.
        big = tmp_path / "big.json"
        big.write_text(json.dumps({"shards": [{"url": f"/data/big-{i:05d}.tar",
                                               "num_samples": 10} for i in range(4000)]}))
        flags = [f"--journal_dir={journal}", "--wait_for_data_servers=false"]

        def create(name, coordinator, m=manifest):
            return _sluicectl("job", "create", f"--coordinator={coordinator.address}",
                              f"--name={name}", f"--manifest={m}", "--timeout=10s")

        first = Server("sluice-coordinator", str(tmp_path / "first"), flags)
        servers.append(first)
        kept = create("kept", first)
        assert kept.returncode == 0, kept.stderr
        # Fill the journal's disk to the last byte.
        fd = os.open(journal / "filler", os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            while True:
                os.write(fd, b"\0" * 4096)
        except OSError as e:
            assert e.errno == 28, e  # ENOSPC
        finally:
            os.close(fd)
        lost = create("lost", first, big)
        assert lost.returncode != 0, lost.stdout
        assert first.wait(timeout=30) == 74
        log = open(tmp_path / "first" / "sluice-coordinator.log").read()
        assert "No space left on device" in log and "exiting with status 74" in log, log[-2000:]
        # The supervisor's restart, once there is room again.
        os.unlink(journal / "filler")
        second = Server("sluice-coordinator", str(tmp_path / "second"), flags)
        servers.append(second)
        got = _sluicectl("job", "get", f"--coordinator={second.address}", "kept")
        assert got.returncode == 0, got.stderr
        missing = _sluicectl("job", "get", f"--coordinator={second.address}", "lost")
        assert missing.returncode != 0 and "not found" in missing.stderr, missing.stderr
    finally:
        for server in servers:
            server.stop()
        subprocess.run(["umount", str(journal)], check=True)


def _samples_served(server):
    for line in server.metric_text().splitlines():
        if line.startswith("sluice_dataserver_samples_served_total "):
            return float(line.split()[1])
    return 0.0


@pytest.fixture(scope="module")
def two_servers(tmp_path_factory):
    # 200 KB samples: more than the streams' flow-control windows hold, so
    # the stopped server still has units to send when it stops.
    # The default heartbeat interval (1 s): a stopped data server is
    # routed units for 3 s before the coordinator leaves it out.
    c = Cluster(tmp_path_factory.mktemp("hung"), shards=SHARDS, per_shard=PER_SHARD,
                data_servers=2, bin_repeat=100_000, heartbeat_interval="1s")
    yield c
    c.stop()


@pytest.mark.parametrize("reader", ["cpp", "python"])
def test_a_stopped_data_server_is_left_within_twice_the_stall_timeout(two_servers, reader):
    # One of two data servers is stopped for 25 s mid-epoch; the reader's
    # stall_timeout is 4 s. Its streams to the stopped server fail (keepalive
    # or the stall timeout, whichever comes first) and their units go to the
    # other server (re-routed: the coordinator counts them returned): no gap
    # between samples reaches 2 x 4 s, and the epoch is delivered exactly
    # once.
    job = f"hung-{reader}"
    two_servers.create_job(job, world_size=1, epochs=1, mode="dynamic", lease_ttl="10s",
                           max_samples_per_lease=10)
    served_before = [_samples_served(d) for d in two_servers.data]
    if reader == "cpp":
        proc = subprocess.Popen(
            [os.path.join(BIN, "sluicectl"), "read", f"--coordinator={two_servers.address}",
             f"--job={job}", "--rate=100", "--read_epochs=1", "--stall_timeout=4s"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        parse = _cpp
    else:
        script = PY_READER.replace("progress_interval=0.1", "progress_interval=0.1, "
                                   "stall_timeout=4.0")
        proc = subprocess.Popen([sys.executable, "-c", script, two_servers.address, job, "0"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        parse = _py
    lines = _Lines(proc, lambda line: (time.monotonic(), parse(line)))
    _wait_for(lambda: len(lines.lines) >= 40, 60, "40 samples read")
    # A server the job reads from: the coordinator routes it units until it
    # has missed its heartbeats for 3 s, longer than the rest of the epoch
    # takes to be granted, so the reader's streams of its next units stall.
    serving = [d for d, b in zip(two_servers.data, served_before) if _samples_served(d) > b]
    assert len(serving) >= 1
    stopped = serving[0].pid
    os.kill(stopped, signal.SIGSTOP)
    try:
        got = lines.finish(180)
    finally:
        os.kill(stopped, signal.SIGCONT)
    samples = [s for _, s in got]
    assert len(set(samples)) == len(samples) == SHARDS * PER_SHARD
    gaps = [b - a for (a, _), (b, _) in zip(got, got[1:])]
    assert max(gaps) < 8.0, f"a gap of {max(gaps):.1f} s"
    counts = two_servers.lease_counts(job)
    assert counts["returned"] >= 1, counts
    print(f"{reader}: longest gap {max(gaps):.2f} s of {got[-1][0] - got[0][0]:.2f} s", counts)
