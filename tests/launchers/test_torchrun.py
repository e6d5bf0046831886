"""The examples under torchrun (torch.distributed.run, Debian's torch 1.13
on Python 3.11, through the sluice.torchrun shim): an uneven shard split
hanging DDP, then Sluice's equal steps; a rank SIGKILLed mid-epoch and the
run restarted by --max_restarts resuming exactly."""
import collections
import os
import re
import signal
import subprocess

import pytest

from conftest import BIN, EXAMPLES, LocalSluice, free_port, wait_for

PYTHON = "/usr/bin/python3"
TRAIN = os.path.join(EXAMPLES, "common", "train.py")
PREPARE = os.path.join(EXAMPLES, "common", "prepare.py")


def launch(args, env, timeout):
    """Runs `args` in its own process group; on timeout stops the group
    (torchrun and its workers). Returns (returncode or None, output)."""
    proc = subprocess.Popen(args, env=dict(os.environ, **env), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
        return proc.returncode, out
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            out, _ = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
        return None, out


def torchrun(nproc, script_args, extra=()):
    return [PYTHON, "-m", "sluice.torchrun", "--standalone", f"--nproc_per_node={nproc}",
            *extra, *script_args]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("torchrun"))
    c = LocalSluice(d, os.path.join(d, "data"))  # the data servers' root
    c.root = os.path.join(d, "data")
    yield c
    c.stop()


def create_job(cluster, name, data_dir, world, epochs):
    manifest = os.path.join(data_dir, f"{name}.json")
    ctl = os.path.join(BIN, "sluicectl")
    subprocess.run([ctl, "index", os.path.join(data_dir, "shards"), "-o", manifest], check=True,
                   capture_output=True)
    out = subprocess.run([ctl, "job", "create", f"--coordinator={cluster.address}",
                          f"--name={name}", f"--manifest={manifest}", f"--world_size={world}",
                          f"--epochs={epochs}"], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def records(path_pattern, world):
    keys, steps = collections.defaultdict(collections.Counter), collections.defaultdict(dict)
    for rank in range(world):
        with open(path_pattern.format(rank=rank)) as f:
            for line in f:
                epoch, word, *rest = line.split()
                if word == "steps":
                    steps[int(epoch)][rank] = int(rest[0])
                else:
                    keys[int(epoch)][word] += 1
    return keys, steps


def test_debian_torchrun_fails_before_any_worker_and_the_shim_starts_them(tmp_path):
    from torch.distributed.elastic.multiprocessing import api
    script = tmp_path / "hello.py"
    script.write_text("import os; print('hello from rank', os.environ['RANK'], flush=True)\n")
    if api.Std.from_str("0") is None:  # torch 1.13 on Python 3.11
        code, out = launch([PYTHON, "-m", "torch.distributed.run", "--standalone",
                            "--nproc_per_node=2", str(script)], {}, 120)
        assert code != 0
        assert "AttributeError: 'NoneType' object has no attribute 'get'" in out
        assert "hello from rank" not in out
    code, out = launch(torchrun(2, [str(script)]), {}, 120)
    assert code == 0, out
    assert out.count("hello from rank") == 2


def test_an_uneven_shard_split_hangs_ddp_where_sluice_gives_equal_steps(cluster, tmp_path):
    data = os.path.join(cluster.root, "uneven")
    subprocess.run([PYTHON, PREPARE, data, "--shards", "5", "--per_shard", "50"], check=True)
    naive = os.path.join(os.path.dirname(__file__), "naive_uneven_split.py")
    # 5 shards over 3 ranks: 2, 2 and 1 shards. Rank 2 runs out after 5
    # steps; ranks 0 and 1 wait in their 6th all-reduce until the deadline.
    code, out = launch(torchrun(3, [naive, os.path.join(data, "shards")]), {}, 30)
    assert code is None, out  # still hung at the deadline
    assert "rank 2: 5 steps, done" in out
    assert "rank 0:" not in out and "rank 1:" not in out
    # The same shards through Sluice: 250 samples, 83 per rank (the
    # remainder dropped), 9 batches on every rank.
    create_job(cluster, "uneven", data, 3, 1)
    record = str(tmp_path / "uneven-{rank}.txt")
    code, out = launch(torchrun(3, [TRAIN, "--job=uneven", f"--checkpoint_dir={data}/ckpt",
                                    "--epochs=1", f"--record={record}"]),
                       {"SLUICE_COORDINATOR": cluster.address, "SLUICE_SCOPE": "uneven"}, 300)
    assert code == 0, out
    keys, steps = records(record, 3)
    assert steps[0] == {0: 9, 1: 9, 2: 9}
    assert len(keys[0]) == 249 and set(keys[0].values()) == {1}


def processes():
    """(pid, command line, environment) of every process that can be read."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read()
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(v.split(b"=", 1) for v in f.read().split(b"\0") if b"=" in v)
        except OSError:
            continue
        yield int(pid), cmdline, env


def worker_pid(rank, attempt):
    """The PID of torchrun's worker `rank` in restart `attempt`, or None."""
    for pid, cmdline, env in processes():
        if b"train.py" in cmdline and env.get(b"RANK") == str(rank).encode() and \
                env.get(b"TORCHELASTIC_RESTART_COUNT") == str(attempt).encode():
            return pid
    return None


def hung_run_report(cluster, job, proc):
    """What a run still going at its deadline was doing: the coordinator's
    view of the job, then every worker's Python stacks (SIGABRT under
    PYTHONFAULTHANDLER) in the run's own output."""
    status = subprocess.run([os.path.join(BIN, "sluicectl"), "status",
                             f"--coordinator={cluster.address}", job],
                            capture_output=True, text=True, timeout=60)
    for attempt in (0, 1):
        for rank in (0, 1):
            pid = worker_pid(rank, attempt)
            if pid:
                os.kill(pid, signal.SIGABRT)
    try:
        out, _ = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
    return f"the run did not finish in time\n{status.stdout}{status.stderr}\n{out}"


def test_a_rank_killed_mid_epoch_restarts_and_the_run_resumes_exactly(cluster, tmp_path):
    data = os.path.join(cluster.root, "big")
    subprocess.run([PYTHON, PREPARE, data, "--shards", "8", "--per_shard", "250"], check=True)
    create_job(cluster, "restart", data, 2, 2)
    ckpt = os.path.join(data, "ckpt")
    record = str(tmp_path / "restart-{rank}.txt")
    args = torchrun(2, [TRAIN, "--job=restart", f"--checkpoint_dir={ckpt}", "--epochs=2",
                        "--checkpoint_every=5", f"--record={record}"], ["--max_restarts=1"])
    # PYTHONFAULTHANDLER: a worker sent SIGABRT prints every thread's stack.
    proc = subprocess.Popen(args, env=dict(os.environ, SLUICE_COORDINATOR=cluster.address,
                                           SLUICE_SCOPE="restart", PYTHONFAULTHANDLER="1"),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    out = ""
    try:
        # After the first checkpoint, SIGKILL rank 1 of the first attempt.
        wait_for(lambda: os.path.exists(os.path.join(ckpt, "checkpoint.pt")), 120,
                 "the first checkpoint")
        pid = wait_for(lambda: worker_pid(1, 0), 30, "rank 1's PID")
        os.kill(pid, signal.SIGKILL)
        # torchrun stops the group and starts it again (restart 1), which
        # resumes from the checkpoint.
        wait_for(lambda: worker_pid(0, 1), 120, "the restarted workers")
        try:
            out, _ = proc.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            out = hung_run_report(cluster, "restart", proc)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, out
    # The final model was trained on every sample of each epoch exactly once,
    # 100 equal steps per rank, though rank 1 died part-way.
    keys, steps = records(record, 2)
    for epoch in (0, 1):
        assert len(keys[epoch]) == 2000 and set(keys[epoch].values()) == {1}, epoch
        assert steps[epoch] == {0: 100, 1: 100}


def _free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_relaunched_by_hand_twice_from_one_checkpoint_with_a_fixed_rdzv_id(cluster, tmp_path):
    # A person relaunches the same torchrun command (fixed --rdzv_id, so
    # every launch has the same run id and restart count 0) after a crash,
    # and again from the same checkpoint after the second launch died before
    # its next one. Each launch restores the checkpoint's position: the
    # final model trained on every sample of each epoch exactly once.
    data = os.path.join(cluster.root, "again")
    subprocess.run([PYTHON, PREPARE, data, "--shards", "4", "--per_shard", "250"], check=True)
    create_job(cluster, "again", data, 2, 2)
    ckpt = os.path.join(data, "ckpt")
    path = os.path.join(ckpt, "checkpoint.pt")
    record = str(tmp_path / "again-{rank}.txt")
    args = [PYTHON, "-m", "sluice.torchrun", "--nnodes=1", "--nproc_per_node=2",
            "--rdzv_backend=c10d", f"--rdzv_endpoint=127.0.0.1:{_free_port()}",
            "--rdzv_id=fixed-run", TRAIN, "--job=again", f"--checkpoint_dir={ckpt}",
            "--epochs=2", "--checkpoint_every=5", f"--record={record}"]
    env = dict(os.environ, SLUICE_COORDINATOR=cluster.address)
    env.pop("SLUICE_SCOPE", None)

    def start():
        return subprocess.Popen(args, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)

    def kill(proc):
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()

    first = start()
    try:
        wait_for(lambda: os.path.exists(path), 120, "the first checkpoint")
        saved = open(path, "rb").read()
    finally:
        kill(first)
    # The second launch resumes, checkpoints once more, and dies; the
    # checkpoint it wrote is lost with its node.
    with open(path, "wb") as f:
        f.write(saved)
    second = start()
    try:
        wait_for(lambda: open(path, "rb").read() != saved, 120, "a checkpoint of the second launch")
    finally:
        kill(second)
    with open(path, "wb") as f:
        f.write(saved)
    code, out = launch(args, {"SLUICE_COORDINATOR": cluster.address}, 300)
    assert code == 0, out
    keys, steps = records(record, 2)
    for epoch in (0, 1):
        assert len(keys[epoch]) == 1000 and set(keys[epoch].values()) == {1}, epoch
        assert steps[epoch] == {0: 50, 1: 50}
    # The same command once more for a new job and a new checkpoint
    # directory (same run id, so the same Once scope): the directory is
    # made, as its step is named by it.
    create_job(cluster, "again2", data, 2, 1)
    fresh = os.path.join(data, "ckpt2")
    again = [a.replace("--job=again", "--job=again2").replace(f"--checkpoint_dir={ckpt}",
                                                              f"--checkpoint_dir={fresh}")
             for a in args]
    code, out = launch([a for a in again if a != "--epochs=2"] + ["--epochs=1"],
                       {"SLUICE_COORDINATOR": cluster.address}, 300)
    assert code == 0, out
    assert os.path.exists(os.path.join(fresh, "checkpoint.pt"))


def node_pids(node):
    """The PIDs of every process of elastic node `node` (its agent and its
    worker), found by the SLUICE_TEST_NODE each was started with."""
    return [pid for pid, _, env in processes() if env.get(b"SLUICE_TEST_NODE") == node.encode()]


def test_elastic_torchrun_shrinks_and_grows_and_every_epoch_stays_exact(cluster, tmp_path):
    # torchrun --nnodes=1:3, three nodes (agent processes) of one worker
    # each. Node c is SIGKILLed after the first checkpoint: the other two
    # restart as 2 ranks (a failure restart) and resume from the checkpoint
    # through the job's copy for 2 ranks. A new node d then joins: they
    # restart as 3 ranks (a membership change) and resume the job itself from
    # the 2-rank checkpoint. The final model trained on every sample of each
    # epoch at most once, all but each re-plan's remainder (under its world
    # size), with equal steps on every rank of each launch.
    data = os.path.join(cluster.root, "elastic")
    subprocess.run([PYTHON, PREPARE, data, "--shards", "24", "--per_shard", "50"], check=True)
    create_job(cluster, "elastic", data, 3, 3)
    ckpt = os.path.join(data, "ckpt")
    record = str(tmp_path / "elastic-{rank}.txt")
    port = free_port()
    logs = {}

    def node(name, host):
        # The c10d store lives in node a (is_host): the nodes that leave
        # never take it with them. A dead node leaves the rendezvous after
        # torch's keep-alive (3 beats of 5 s); a membership completes 5 s
        # after its first 2 nodes arrived, at once with all 3. Steps of
        # 0.2 s make the 2-rank run outlast a new node's start and join.
        logs[name] = str(tmp_path / f"node-{name}.log")
        with open(logs[name], "w") as log:
            return subprocess.Popen(
                [PYTHON, "-m", "sluice.torchrun", "--nnodes=1:3", "--nproc_per_node=1",
                 "--rdzv_backend=c10d", f"--rdzv_endpoint=127.0.0.1:{port}",
                 "--rdzv_id=elastic", f"--rdzv_conf=is_host={int(host)},last_call_timeout=5",
                 "--max_restarts=3", "--monitor_interval=1",
                 TRAIN, "--job=elastic", f"--checkpoint_dir={ckpt}", "--epochs=3",
                 "--checkpoint_every=5", "--step_seconds=0.2", f"--record={record}"],
                env=dict(os.environ, SLUICE_COORDINATOR=cluster.address,
                         SLUICE_TEST_NODE=name, PYTHONFAULTHANDLER="1"),
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def checkpoints():
        """(world size, launch) of every checkpoint written so far, in order."""
        seen = []
        for path in logs.values():
            for line in open(path):
                m = re.search(r"rank 0/(\d+): checkpoint \S+ \(launch (\d+)\)", line)
                if m:
                    seen.append((int(m.group(1)), int(m.group(2))))
        return sorted(seen, key=lambda c: c[1])

    nodes = {"a": node("a", True), "b": node("b", False), "c": node("c", False)}
    try:
        wait_for(lambda: any(w == 3 for w, _ in checkpoints()), 180, "a checkpoint of 3 ranks")
        for pid in node_pids("c"):
            os.kill(pid, signal.SIGKILL)
        nodes["c"].wait()
        wait_for(lambda: any(w == 2 for w, _ in checkpoints()), 180, "a checkpoint of 2 ranks")
        nodes["d"] = node("d", False)
        for name in ("a", "b", "d"):
            nodes[name].wait(timeout=300)
    finally:
        for name, proc in nodes.items():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    for name in ("a", "b", "d"):
        assert nodes[name].returncode == 0, open(logs[name]).read()
    worlds = {}
    for world, launch in checkpoints():
        worlds.setdefault(launch, world)
    memberships = [worlds[launch] for launch in sorted(worlds)]
    assert memberships[0] == 3 and memberships[-1] == 3 and 2 in memberships, memberships

    # epoch -> key -> times trained; (epoch, launch) -> rank -> samples.
    keys = collections.defaultdict(collections.Counter)
    per_launch = collections.defaultdict(collections.Counter)
    for rank in range(3):
        with open(record.format(rank=rank)) as f:
            for line in f:
                epoch, key, *rest = line.split()
                if key == "steps":
                    continue
                launch, trained_by = int(rest[0]), int(rest[1])
                keys[int(epoch)][key] += 1
                per_launch[int(epoch), launch][trained_by] += 1
    for epoch in range(3):
        assert set(keys[epoch].values()) == {1}, (epoch, keys[epoch].most_common(3))
        launches = {launch for e, launch in per_launch if e == epoch}
        # A launch that resumed mid-epoch with another world size re-planned
        # the rest over its ranks, leaving out fewer samples than it has ranks.
        assert 1200 - 2 * (len(launches) - 1) <= len(keys[epoch]) <= 1200, \
            (epoch, len(keys[epoch]), sorted(launches))
    for (epoch, launch), by_rank in per_launch.items():
        world = worlds.get(launch, len(by_rank))
        assert sorted(by_rank) == list(range(world)), (epoch, launch, by_rank)
        assert len(set(by_rank.values())) == 1, (epoch, launch, by_rank)
