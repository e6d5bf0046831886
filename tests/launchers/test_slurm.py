"""The SLURM example and the seeds' failures under a real slurmctld/slurmd:
each failure as users write it today, then the Sluice version passing."""
import collections
import os
import re
import time

import pytest

from conftest import BIN, EXAMPLES, LocalSluice, wait_for

PYTHON = "/usr/bin/python3"  # Debian's, with torch and grpcio


def keys_by_epoch(data, world):
    """{rank: {epoch: [key, ...]}} and {rank: {epoch: steps}} from the
    examples' --record files."""
    keys, steps = {}, {}
    for rank in range(world):
        keys[rank], steps[rank] = collections.defaultdict(list), {}
        with open(os.path.join(data, f"keys-{rank}.txt")) as f:
            for line in f:
                epoch, word, *rest = line.split()
                if word == "steps":
                    steps[rank][int(epoch)] = int(rest[0])
                else:
                    keys[rank][int(epoch)].append(word)
    return keys, steps


def tasks_that_exited(stderr, code):
    """The task ids srun reports as having exited with `code`: it reports
    tasks that end together on one line ("tasks 1-3", "tasks 1,3") and the
    others on lines of their own."""
    ids = set()
    for listed in re.findall(rf"tasks? ([0-9,-]+): Exited with exit code {code}\b", stderr):
        for part in listed.split(","):
            first, _, last = part.partition("-")
            ids.update(range(int(first), int(last or first) + 1))
    return ids


def test_the_sbatch_example_prepares_once_and_every_rank_trains_equal_steps(slurm, tmp_path):
    data = str(tmp_path / "data")
    env = {"DATA_DIR": data, "SLUICE_BIN": BIN, "EXAMPLES_DIR": os.path.join(EXAMPLES, "common"),
           "EPOCHS": "2", "PYTHON": PYTHON, "TRAIN_ARGS": f"--record={data}/keys-{{rank}}.txt"}
    env_all = dict(slurm.env, **env)
    env_all.pop("SLUICE_COORDINATOR", None)  # the script starts its own
    job, code, info = slurm.sbatch(
        ["--ntasks=4", f"--output={tmp_path}/job-%j.out",
         os.path.join(EXAMPLES, "slurm", "prepare_and_train.sbatch")],
        env=env_all, cwd=os.path.join(EXAMPLES, "slurm"))
    with open(os.path.join(tmp_path, f"job-{job}.out")) as f:
        job_out = f.read()
    assert code == 0, info + job_out
    # The dataset was prepared by one task; the job was created once.
    with open(os.path.join(data, "prepare.log")) as f:
        assert len(f.readlines()) == 1
    # 8 shards x 50 samples, 4 ranks, batches of 10: 10 equal steps per rank
    # per epoch, every sample once per epoch.
    keys, steps = keys_by_epoch(data, 4)
    for epoch in (0, 1):
        seen = collections.Counter(k for r in range(4) for k in keys[r][epoch])
        assert len(seen) == 400 and set(seen.values()) == {1}, epoch
        assert [steps[r][epoch] for r in range(4)] == [10, 10, 10, 10]
    ckpt = os.path.join(data, "checkpoints", job)
    assert os.listdir(ckpt) == ["checkpoint.pt"]


def test_a_requeued_job_resumes_from_its_checkpoint_exactly(slurm, tmp_path):
    # The sbatch example with --requeue, checkpointing every 2 steps. After
    # its first checkpoint the job is requeued (its tasks killed): it runs
    # again under the same job id (SLURM_RESTART_COUNT=1), resumes from the
    # checkpoint, and what the final model trained is every epoch once.
    data = str(tmp_path / "data")
    env = {"DATA_DIR": data, "SLUICE_BIN": BIN, "EXAMPLES_DIR": os.path.join(EXAMPLES, "common"),
           "EPOCHS": "2", "PYTHON": PYTHON,
           "TRAIN_ARGS": f"--record={data}/keys-{{rank}}.txt --checkpoint_every=2"}
    env_all = dict(slurm.env, **env)
    env_all.pop("SLUICE_COORDINATOR", None)  # the script starts its own
    job = slurm.submit(["--requeue", "--ntasks=4", "--open-mode=append",
                        f"--output={tmp_path}/job-%j.out",
                        os.path.join(EXAMPLES, "slurm", "prepare_and_train.sbatch")],
                       env=env_all, cwd=os.path.join(EXAMPLES, "slurm"))
    checkpoint = os.path.join(data, "checkpoints", job, "checkpoint.pt")
    wait_for(lambda: os.path.exists(checkpoint), 300, "the job's first checkpoint")
    requeued_at = time.time()
    requeued = slurm.run(["scontrol", "requeue", job])
    assert requeued.returncode == 0, requeued.stdout + requeued.stderr
    # SLURM holds a requeued batch job back for a while (BeginTime); let it
    # start as soon as its node is free. Not sooner: slurmd refuses to launch
    # a job whose credential dates from the second in which the previous
    # run's was revoked ("Job credential revoked"), and the job then fails.
    wait_for(lambda: "JobState=PENDING" in slurm.run(["scontrol", "show", "job", job]).stdout,
             120, "the job to be pending again")
    wait_for(lambda: slurm.idle() and time.time() >= int(requeued_at) + 2, 120,
             "the node to be idle after the first run, in a later second")
    slurm.run(["scontrol", "update", f"JobId={job}", "StartTime=now"])
    code, info = slurm.wait(job)
    with open(os.path.join(tmp_path, f"job-{job}.out")) as f:
        job_out = f.read()
    up_log = os.path.join(data, ".sluice", job, "up.log")
    up = open(up_log).read() if os.path.exists(up_log) else "(no up.log)"
    assert code == 0, "\n".join([info, job_out, "up.log:", up, slurm.log_lines(job)])
    assert re.search(r"\bRestarts=1\b", info), info
    keys, steps = keys_by_epoch(data, 4)
    for epoch in (0, 1):
        seen = collections.Counter(k for r in range(4) for k in keys[r][epoch])
        assert len(seen) == 400 and set(seen.values()) == {1}, epoch
        assert [steps[r][epoch] for r in range(4)] == [10, 10, 10, 10]


@pytest.fixture(scope="module")
def sluice_cluster(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("sluice"))
    c = LocalSluice(d, os.path.join(d, "shards"))
    yield c
    c.stop()


def test_makedirs_on_every_rank_raises_where_once_makes_it_once(slurm, sluice_cluster, tmp_path):
    target = str(tmp_path / "out")
    before = slurm.run(["srun", "--ntasks=4", PYTHON, "-c",
                        "import os, sys; os.makedirs(sys.argv[1])", target])
    assert before.returncode != 0
    assert before.stderr.count("FileExistsError") == 3, before.stderr
    target2 = str(tmp_path / "out2")
    after = slurm.run(["srun", "--ntasks=4", "bash", "-c",
                       f'exec {BIN}/sluicectl once mkdir-out2 --scope=slurm-$SLURM_JOB_ID '
                       f'--id=rank-$SLURM_PROCID -- mkdir {target2}'],
                      env={"SLUICE_COORDINATOR": sluice_cluster.address})
    assert after.returncode == 0, after.stdout + after.stderr
    assert os.path.isdir(target2)
    assert after.stderr.count(": running mkdir") == 1, after.stderr


def test_wait_for_exists_times_out_on_a_slow_rank0_where_a_barrier_waits(slurm, sluice_cluster,
                                                                        tmp_path):
    # Rank 0 creates the checkpoint directory 2 s late; the others give up
    # after 1 s, as OLMo's 10 s wait_for(exists) does on a slow filesystem.
    naive = os.path.join(os.path.dirname(__file__), "naive_wait_for_exists.py")
    target = str(tmp_path / "ckpt")
    before = slurm.run(["srun", "--ntasks=4", PYTHON, naive, target, "2", "1"])
    assert before.returncode != 0
    assert before.stderr.count("TimeoutError: timed out waiting") == 3, before.stderr
    assert tasks_that_exited(before.stderr, 1) == {1, 2, 3}, before.stderr
    # The same with Sluice: whoever comes first makes the directory (once),
    # and everyone waits at a barrier, however late rank 0 is.
    target2 = str(tmp_path / "ckpt2")
    script = (f'[ "$SLURM_PROCID" = 0 ] && sleep 2; '
              f'{BIN}/sluicectl once mkdir-ckpt2 --scope=slurm-$SLURM_JOB_ID --id=rank-$SLURM_PROCID'
              f' -- mkdir -p {target2} && '
              f'{BIN}/sluicectl barrier ckpt2-ready --participants=4 --scope=slurm-$SLURM_JOB_ID '
              f'--id=rank-$SLURM_PROCID --timeout=60s && test -d {target2}')
    after = slurm.run(["srun", "--ntasks=4", "bash", "-c", script],
                      env={"SLUICE_COORDINATOR": sluice_cluster.address})
    assert after.returncode == 0, after.stdout + after.stderr
    assert after.stdout.count("4 arrived") == 4, after.stdout
    # A barrier that times out names who is missing, on every rank that came.
    late = slurm.run(["srun", "--ntasks=3", "bash", "-c",
                      f'exec {BIN}/sluicectl barrier short --participants=4 '
                      f'--scope=slurm-$SLURM_JOB_ID --id=rank-$SLURM_PROCID --timeout=3s'],
                     env={"SLUICE_COORDINATOR": sluice_cluster.address})
    assert late.returncode != 0
    assert late.stderr.count("1 missing: rank-3") == 3, late.stderr


def test_a_lock_file_cache_breaks_when_its_lock_vanishes_where_data_servers_fetch_once(
        slurm, tmp_path):
    import json
    import subprocess
    from conftest import Nginx, wait_for
    www = str(tmp_path / "www")
    subprocess.run([PYTHON, os.path.join(EXAMPLES, "common", "prepare.py"), www, "--shards", "4",
                    "--per_shard", "50"], check=True)
    nginx = Nginx(str(tmp_path), www)
    try:
        # Before: 4 tasks share a lock-file cache; the lock vanishes while the
        # first task downloads (the test removes it, as a tmp cleaner or NFS
        # would). The holder's release fails with the error WebDataset users
        # report; tasks that find no lock download the shard again. Every
        # task that created the lock removes it, and the test removed it
        # once: at least one of those releases finds no lock.
        cache = str(tmp_path / "cache")
        os.makedirs(cache)
        naive = os.path.join(os.path.dirname(__file__), "naive_lock_cache.py")
        lock = os.path.join(cache, "shard-0000.tar.lock")
        proc = subprocess.Popen(["srun", "--ntasks=4", PYTHON, naive,
                                 f"{nginx.url}/shards/shard-0000.tar", cache, "3"],
                                env=slurm.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
        wait_for(lambda: os.path.exists(lock), 60, "the first task's lock")
        os.remove(lock)
        out, err = proc.communicate(timeout=120)
        assert proc.returncode != 0
        assert "FileNotFoundError: [Errno 2] No such file or directory" in err, err
        assert "shard-0000.tar.lock'" in err, err
        # After: the same shards behind the same nginx, read by 4 tasks through
        # Sluice: the data server downloads each shard once into its own
        # cache; no task touches a shared file.
        earlier = [nginx.gets(f"/shards/shard-{s:04d}.tar") for s in range(4)]
        sluice_dir = str(tmp_path / "sluice")
        cluster = LocalSluice(sluice_dir, os.path.join(sluice_dir, "roots"))
        try:
            manifest = str(tmp_path / "remote.json")
            with open(manifest, "w") as f:
                json.dump({"shards": [{"url": f"{nginx.url}/shards/shard-{s:04d}.tar",
                                       "num_samples": 50} for s in range(4)]}, f)
            ctl = os.path.join(BIN, "sluicectl")
            env = {"SLUICE_COORDINATOR": cluster.address}
            created = slurm.run([ctl, "job", "create", "--name=remote", f"--manifest={manifest}",
                                 "--world_size=4", "--epochs=1"], env=env)
            assert created.returncode == 0, created.stdout + created.stderr
            read = slurm.run(["srun", "--ntasks=4", "bash", "-c",
                              f"exec {ctl} read --job=remote --rank=$SLURM_PROCID"], env=env)
            assert read.returncode == 0, read.stdout + read.stderr
            samples = [json.loads(line) for line in read.stdout.splitlines()
                       if line.startswith('{"epoch"')]
            keys = collections.Counter((s["shard"], s["index"]) for s in samples)
            assert len(keys) == 200 and set(keys.values()) == {1}
            assert collections.Counter(s["rank"] for s in samples) == {0: 50, 1: 50, 2: 50,
                                                                       3: 50}
            for s in range(4):
                assert nginx.gets(f"/shards/shard-{s:04d}.tar") - earlier[s] == 1, s
        finally:
            cluster.stop()
    finally:
        nginx.stop()
