"""Exactly once and exact resume the way PyTorch users read: the README's loop
(tests/python/train_loop.py) in its own process, with DataLoader workers, a
training step that takes time, two data servers, DDP, SIGKILL and restart.

SLUICE_SOAK=N runs every configuration of the full matrix N times (workers
0/1/2/4 x fork/spawn x persistent x step 0/0.1 s x one/two data servers);
the default run covers a cross-section of it once.
"""
import collections
import itertools
import json
import os
import signal
import subprocess
import time

import pytest

import sluice
from sluice.torch import ShardLeaseDataset

from conftest import BIN, Cluster, _wait_for

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON = "/usr/bin/python3"
SHARDS, PER_SHARD = 10, 30  # 300 samples


@pytest.fixture(scope="module")
def two_servers(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("two-servers"), shards=SHARDS, per_shard=PER_SHARD,
                data_servers=2)
    yield c
    c.stop()


@pytest.fixture(scope="module")
def one_server(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("one-server"), shards=SHARDS, per_shard=PER_SHARD)
    yield c
    c.stop()


_jobs = itertools.count()


def _loop_args(cluster, job, checkpoint, workers, start, persistent, step, epochs, extra=()):
    return [PYTHON, os.path.join(HERE, "train_loop.py"), cluster.address, job,
            f"--workers={workers}", f"--start={start}", f"--step={step}", f"--epochs={epochs}",
            f"--checkpoint={checkpoint}", *(["--persistent"] if persistent else []), *extra]


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH", ""), HERE) if p)
    return env


def _run(args, timeout=120):
    out = subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=_env())
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1]), out.stderr


def _assert_each_epoch_exactly_once(trained, epochs, total):
    by_epoch = collections.defaultdict(collections.Counter)
    for e, shard, index in trained:
        by_epoch[e][(shard, index)] += 1
    assert sorted(by_epoch) == list(range(epochs))
    for e in range(epochs):
        twice = {k: n for k, n in by_epoch[e].items() if n > 1}
        assert not twice, f"epoch {e}: trained twice: {sorted(twice)[:5]}"
        assert len(by_epoch[e]) == total, f"epoch {e}: {len(by_epoch[e])} of {total} samples"


def _matrix():
    full = [(w, s, p, st, ds)
            for w in (0, 1, 2, 4) for s in ("fork", "spawn") for p in (False, True)
            for st in (0.0, 0.1) for ds in (1, 2)
            if w > 0 or (s == "fork" and not p)]
    soak = int(os.environ.get("SLUICE_SOAK", "0"))
    if soak:
        return [c + (i,) for c in full for i in range(soak)]
    # A cross-section: every value of every axis, and the configurations
    # that lost samples (2 workers, a real step, two data servers).
    return [c + (0,) for c in [
        (0, "fork", False, 0.1, 2),
        (1, "spawn", True, 0.0, 1),
        (2, "fork", False, 0.1, 2),
        (2, "spawn", False, 0.1, 2),
        (2, "fork", True, 0.1, 2),
        (4, "spawn", True, 0.0, 2),
        (4, "fork", False, 0.0, 1),
    ]]


@pytest.mark.parametrize("workers,start,persistent,step,servers,repeat", _matrix())
def test_readme_loop_trains_every_epoch_exactly_once(request, tmp_path, workers, start,
                                                     persistent, step, servers, repeat):
    cluster = request.getfixturevalue("two_servers" if servers == 2 else "one_server")
    job = f"loop-{next(_jobs)}"
    cluster.create_job(job, world_size=1, epochs=2, max_samples_per_lease=10)
    result, err = _run(_loop_args(cluster, job, tmp_path / "ckpt.json", workers, start,
                                  persistent, step, 2))
    _assert_each_epoch_exactly_once(result["trained"], 2, cluster.total)
    # Nothing failed, so nothing was re-routed (a forked worker's
    # connections work from the start).
    assert "re-routing" not in err, err[-2000:]
    # set_epoch reaches persistent workers too: no "set_epoch(0) but the
    # coordinator's next epoch is 1".
    assert "set_epoch(" not in err, err[-2000:]


def test_ddp_ranks_with_workers_train_the_epoch_once_in_equal_steps(two_servers, tmp_path):
    job = f"ddp-{next(_jobs)}"
    two_servers.create_job(job, world_size=2, epochs=2, mode="dynamic", max_samples_per_lease=7)
    init = tmp_path / "init"
    procs = [subprocess.Popen(
        _loop_args(two_servers, job, tmp_path / f"ckpt{r}.json", 2, "fork", True, 0.05, 2,
                   ["--world=2", f"--rank={r}", f"--init={init}"]),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env()) for r in range(2)]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=180)
        assert p.returncode == 0, err[-3000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert results[0]["steps_per_epoch"] == results[1]["steps_per_epoch"]
    _assert_each_epoch_exactly_once(results[0]["trained"] + results[1]["trained"], 2,
                                    two_servers.total)
    for r in results:  # 150 samples per rank each epoch
        assert collections.Counter(e for e, _, _ in r["trained"]) == {0: 150, 1: 150}


def _wait_for_trained(ckpt, samples):
    """Until the loop's checkpoint at `ckpt` holds at least `samples`."""
    def enough():
        try:
            with open(ckpt) as f:
                return len(json.load(f)["trained"]) >= samples
        except (FileNotFoundError, json.JSONDecodeError):
            return False
    _wait_for(enough, 60, f"{samples} samples trained")


def _children(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(c) for c in f.read().split()]
    except FileNotFoundError:
        return []


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("start", ["fork", "spawn"])
def test_sigkill_with_workers_then_resume_trains_the_epoch_exactly_once(two_servers, tmp_path,
                                                                         start):
    job = f"kill-{next(_jobs)}"
    two_servers.create_job(job, world_size=1, epochs=1, max_samples_per_lease=10)
    ckpt = tmp_path / "ckpt.json"
    args = _loop_args(two_servers, job, ckpt, 2, start, False, 0.05, 1)
    first = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=_env())
    _wait_for_trained(ckpt, 80)
    workers = _children(first.pid)
    assert workers, "the DataLoader's workers"
    first.send_signal(signal.SIGKILL)
    first.communicate()
    # The orphaned workers hand their leases back and exit by themselves.
    _wait_for(lambda: not any(_alive(w) for w in workers), 2.0, "orphaned workers to exit")
    with open(ckpt) as f:
        before = json.load(f)["trained"]
    result, err = _run(args + ["--attempt=restart-1"])
    assert "re-routing" not in err, err[-2000:]
    _assert_each_epoch_exactly_once(result["trained"], 1, two_servers.total)
    assert result["trained"][:len(before)] == before


@pytest.mark.parametrize("after", ["4 workers", "2 ranks x 2 workers"])
def test_resume_with_another_worker_count_or_world_size_is_exactly_once(two_servers, tmp_path,
                                                                        after):
    # A run with 2 workers is SIGKILLed mid-epoch; it resumes from its last
    # checkpoint with 4 workers (same job), or as 2 DDP ranks of 2 workers
    # (a new job over the same data with world size 2): the epoch's
    # remaining samples are re-planned over the new readers, and what both
    # runs trained is the epoch exactly once.
    job = f"regrow-{next(_jobs)}"
    two_servers.create_job(job, world_size=1, epochs=1, max_samples_per_lease=10)
    ckpt = tmp_path / "ckpt.json"
    first = subprocess.Popen(_loop_args(two_servers, job, ckpt, 2, "fork", False, 0.05, 1),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=_env())
    _wait_for_trained(ckpt, 80)
    first.send_signal(signal.SIGKILL)
    first.communicate()
    with open(ckpt) as f:
        before = json.load(f)["trained"]
    if after == "4 workers":
        result, _ = _run(_loop_args(two_servers, job, ckpt, 4, "fork", False, 0.0, 1,
                                    ["--attempt=regrow"]))
        _assert_each_epoch_exactly_once(result["trained"], 1, two_servers.total)
        assert result["trained"][:len(before)] == before
        return
    wider = f"{job}-w2"
    two_servers.create_job(wider, world_size=2, epochs=1, max_samples_per_lease=10)
    init = tmp_path / "init"
    procs = []
    for r in range(2):
        copy = tmp_path / f"ckpt{r}.json"
        copy.write_bytes(ckpt.read_bytes())
        procs.append(subprocess.Popen(
            _loop_args(two_servers, wider, copy, 2, "fork", False, 0.0, 1,
                       ["--world=2", f"--rank={r}", f"--init={init}", "--attempt=regrow"]),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env()))
    results = []
    for p in procs:
        out, err = p.communicate(timeout=180)
        assert p.returncode == 0, err[-3000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    after_kill = [results[r]["trained"][len(before):] for r in range(2)]
    assert len(after_kill[0]) == len(after_kill[1])  # re-balanced equally
    _assert_each_epoch_exactly_once(before + after_kill[0] + after_kill[1], 1,
                                    two_servers.total)


def test_state_dict_under_torchs_own_loader_with_workers_is_an_error(one_server):
    import torch.utils.data
    job = f"plain-{next(_jobs)}"
    one_server.create_job(job, world_size=1, epochs=1)
    ds = ShardLeaseDataset(one_server.address, job, decode=True)
    loader = torch.utils.data.DataLoader(ds, batch_size=8, num_workers=2,
                                         multiprocessing_context="fork")
    it = iter(loader)
    next(it)
    with pytest.raises(RuntimeError, match="sluice.torch.DataLoader"):
        ds.state_dict()
    del it


def test_a_finished_job_says_so_at_once(one_server):
    job = f"done-{next(_jobs)}"
    one_server.create_job(job, world_size=1, epochs=1)
    with sluice.Reader(one_server.address, job) as reader:
        assert sum(1 for _ in reader) == one_server.total
    message = f'job "{job}" is done: all 1 epochs were consumed'
    started = time.monotonic()
    with sluice.Reader(one_server.address, job) as reader:
        with pytest.raises(sluice.JobDoneError, match=message):
            next(iter(reader))
    ds = ShardLeaseDataset(one_server.address, job)
    ds.set_epoch(1)
    with pytest.raises(sluice.JobDoneError, match=r"set_epoch\(1\)"):
        next(iter(ds))
    ds.close()
    assert time.monotonic() - started < 2.0
    out = subprocess.run([os.path.join(BIN, "sluicectl"), "read", f"--job={job}",
                          f"--coordinator={one_server.address}"],
                         capture_output=True, text=True, timeout=10)
    assert out.returncode == 6, out.stderr  # documented: `read` on a done job
    assert message in out.stderr


class _RawSession:
    """A trainer session driven by hand: exactly the messages a test sends."""

    def __init__(self, channel, job, rank, trainer_id, credits):
        import queue
        import threading
        from sluice.v1 import coordinator_pb2, coordinator_pb2_grpc
        self.pb = coordinator_pb2
        self.out, self.inbox = queue.Queue(), queue.Queue()
        self.seen = set()
        self.send(hello=coordinator_pb2.Hello(job=job, rank=rank, trainer_id=trainer_id))
        self.send(want=coordinator_pb2.Want(credits=credits))
        self.call = coordinator_pb2_grpc.CoordinatorStub(channel).Session(iter(self.out.get, None))
        threading.Thread(target=self._receive, daemon=True).start()

    def _receive(self):
        import grpc
        try:
            for m in self.call:
                self.inbox.put(m)
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.CANCELLED:  # close() cancels
                raise

    def send(self, **message):
        self.out.put(self.pb.TrainerMessage(**message))

    def grants(self, n):
        """The next n leases granted; a grant re-sent with a fresh token (the
        same lease id) is not a new lease."""
        got = []
        while len(got) < n:
            m = self.inbox.get(timeout=30)
            if m.HasField("grant") and m.grant.lease.lease_id not in self.seen:
                self.seen.add(m.grant.lease.lease_id)
                got.append(m.grant.lease)
        return got

    def sync(self, sync_id):
        """Returns once the coordinator has handled every message sent before."""
        self.send(sync=self.pb.Sync(id=sync_id))
        while True:
            m = self.inbox.get(timeout=30)
            if m.HasField("synced") and m.synced.id == sync_id:
                return

    def close(self):
        self.out.put(None)
        self.call.cancel()


def test_both_pieces_of_a_unit_split_at_a_quota_are_served_in_either_order(tmp_path):
    # One 25-sample shard, dynamic, world size 2, units of 5 (rank 0's block
    # [0, 12) is [0,5) [5,10) [10,12); rank 1's [12,17) [17,22) [22,24)),
    # leases checked by the data server (token and fence). Rank 0 hands back
    # [2, 5); rank 1 then takes it, [5, 10) and [10, 12), and reaches its
    # quota 2 samples into [12, 17): the unit is split, [12, 14) to rank 1
    # and [14, 17), with the same sequence number and a higher fence, to
    # rank 0. Rank 0's piece is read first; rank 1's must still be served.
    import grpc
    from sluice.v1 import dataserver_pb2
    c = Cluster(tmp_path, shards=1, per_shard=25, lease_secret=True)
    try:
        c.create_job("split", world_size=2, mode="dynamic", max_samples_per_lease=5)
        with grpc.insecure_channel(c.address) as channel:
            r0 = _RawSession(channel, "split", 0, "rank-0", 1)
            (first,) = r0.grants(1)
            assert (first.unit.begin, first.unit.end) == (0, 5)
            r0.send(want=r0.pb.Want(credits=0))
            r0.send(release=r0.pb.Release(
                lease=r0.pb.LeaseRef(lease_id=first.lease_id, fence=first.fence), consumed=2))
            r0.sync(1)  # [2, 5) is back in the queue before rank 1 asks
            r1 = _RawSession(channel, "split", 1, "rank-1", 4)
            mine = r1.grants(4)
            assert [(l.unit.begin, l.unit.end) for l in mine] == [(2, 5), (5, 10), (10, 12),
                                                                  (12, 14)]
            r0.send(want=r0.pb.Want(credits=1))
            (theirs,) = r0.grants(1)
            assert (theirs.unit.begin, theirs.unit.end) == (14, 17)
            assert theirs.unit.sequence == mine[3].unit.sequence
            assert theirs.fence > mine[3].fence
            with grpc.insecure_channel(theirs.data_server) as data:
                read = data.unary_stream(
                    "/sluice.v1.DataServer/ReadSamples",
                    request_serializer=dataserver_pb2.ReadRequest.SerializeToString,
                    response_deserializer=dataserver_pb2.SampleBatch.FromString)

                def indices(lease):
                    return [x.index for b in read(dataserver_pb2.ReadRequest(lease=lease),
                                                  timeout=30) for x in b.samples]
                assert indices(theirs) == [14, 15, 16]
                assert indices(mine[3]) == [12, 13]
            r0.close()
            r1.close()
    finally:
        c.stop()


def _soak_repeats():
    return range(int(os.environ.get("SLUICE_SOAK", "1")))


@pytest.mark.parametrize("compact", [False, True], ids=["journal", "compacting"])
@pytest.mark.parametrize("repeat", _soak_repeats())
def test_four_dynamic_ranks_through_random_coordinator_kills_stay_exactly_once(tmp_path, repeat,
                                                                               compact):
    # 4 `sluicectl read` ranks, dynamic mode, 3 epochs, units of 7 (so units
    # are split where quotas end and pieces come back on expiry); the
    # coordinator is SIGKILLed at random moments and restarted on its
    # address and journal (compacting it every 16 KiB in one variant). No
    # stall (every reader ends), every epoch every served sample exactly
    # once, equal counts per rank.
    import random
    rng = random.Random(repeat)
    c = Cluster(tmp_path, shards=5, per_shard=41, data_servers=2, lease_secret=True)
    readers = []
    try:
        c.create_job("chaos", world_size=4, epochs=3, mode="dynamic", max_samples_per_lease=7)
        for r in range(4):
            out = open(tmp_path / f"rank{r}.jsonl", "w")
            readers.append((out, subprocess.Popen(
                [os.path.join(BIN, "sluicectl"), "read", "--job=chaos", f"--rank={r}",
                 "--rate=150", "--progress_interval=100ms", f"--coordinator={c.address}"],
                stdout=out, stderr=subprocess.PIPE, text=True)))
        compaction = ["--journal_compact_bytes=16384"] if compact else []
        for _ in range(5 if compact else 3):
            time.sleep(rng.uniform(0.2, 1.2))  # a random moment of the run
            c.coordinator.kill()
            c.restart_coordinator(compaction)
        for out, p in readers:
            _, err = p.communicate(timeout=90)
            out.close()
            assert p.returncode == 0, err[-2000:]
        per_rank = collections.Counter()
        seen = collections.defaultdict(collections.Counter)
        for r in range(4):
            with open(tmp_path / f"rank{r}.jsonl") as f:
                for line in f:
                    d = json.loads(line)
                    seen[d["epoch"]][(d["shard"], d["index"])] += 1
                    per_rank[(d["epoch"], r)] += 1
        for e in range(3):
            assert sum(seen[e].values()) == len(seen[e]) == 204, f"epoch {e}"  # 205 // 4 * 4
            assert [per_rank[(e, r)] for r in range(4)] == [51] * 4
    finally:
        for out, p in readers:
            if p.poll() is None:
                p.kill()
                p.wait()
        c.stop()
