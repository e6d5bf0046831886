"""sluice.torch.ShardLeaseDataset with real DataLoaders, DDP and processes."""
import collections
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

import sluice
from sluice.torch import ShardLeaseDataset

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.mark.parametrize("workers,start", [(0, None), (2, "fork"), (2, "spawn")])
def test_dataloader_covers_the_epoch_exactly_once(cluster, workers, start):
    job = f"loader-{workers}-{start}"
    cluster.create_job(job, world_size=1, epochs=2, max_samples_per_lease=4)
    ds = ShardLeaseDataset(coordinator=cluster.address, job=job, decode=True)
    loader = DataLoader(ds, batch_size=None, num_workers=workers,
                        multiprocessing_context=start, persistent_workers=workers > 0)
    for epoch in range(2):
        ds.set_epoch(epoch)
        seen = collections.Counter()
        for item in loader:
            assert item["__epoch__"] == epoch
            assert isinstance(item["cls"], int) and item["cls"] == item["__index__"]
            seen[(item["__shard__"], item["__index__"])] += 1
        assert len(seen) == cluster.total, f"epoch {epoch}"
        assert set(seen.values()) == {1}
    ds.close()


def _ddp_rank(rank, world, init_file, address, job, results):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world)
    ds = ShardLeaseDataset(coordinator=address, job=job, decode=True)
    loader = DataLoader(ds, batch_size=4)
    steps = samples = 0
    for batch in loader:
        t = torch.ones(1)
        dist.all_reduce(t)  # every rank must take part in every step
        assert t.item() == world
        steps += 1
        samples += len(batch["__key__"])
    ds.close()
    results.put((rank, steps, samples))
    dist.destroy_process_group()


def test_ddp_ranks_take_the_same_number_of_steps(cluster100, tmp_path):
    # 100 samples over 3 ranks. Splitting shards per rank (split_by_node)
    # gives uneven counts, and DDP hangs in the all_reduce of the first step
    # one rank does not take. Shown from the manifest, not run:
    shard_sizes = [n for _, n in cluster100.urls]
    naive = [sum(shard_sizes[r::3]) for r in range(3)]
    assert naive == [40, 40, 20]
    # With Sluice every rank gets 33 samples (one dropped), 9 steps of <= 4.
    cluster100.create_job("ddp", world_size=3, epochs=1)
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=_ddp_rank, args=(r, 3, str(tmp_path / "rdzv"),
                                                   cluster100.address, "ddp", results))
             for r in range(3)]
    for p in procs:
        p.start()
    got = sorted(results.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert got == [(0, 9, 33), (1, 9, 33), (2, 9, 33)]


RESUME_SCRIPT = textwrap.dedent("""
    import json, sys
    from torch.utils.data import DataLoader
    from sluice.torch import ShardLeaseDataset
    address, job, state_file = sys.argv[1:4]
    ds = ShardLeaseDataset(coordinator=address, job=job, decode=True,
                           resume_attempt="restart-1")
    saved = json.load(open(state_file))["dataset"]
    ds.load_state_dict({"cursor": bytes.fromhex(saved["cursor"])})
    for item in DataLoader(ds, batch_size=None):
        print(item["__shard__"], item["__index__"], flush=True)
    ds.close()
""")


def test_state_dict_resumes_exactly_in_a_new_process(cluster, tmp_path):
    # Two jobs with one spec: one read without interruption, one interrupted.
    for job in ("straight", "interrupted"):
        cluster.create_job(job, world_size=1, epochs=1, mode="static", max_samples_per_lease=3)
    straight = ShardLeaseDataset(coordinator=cluster.address, job="straight", decode=True)
    reference = [(i["__shard__"], i["__index__"]) for i in DataLoader(straight, batch_size=None)]
    straight.close()
    assert len(reference) == cluster.total

    ds = ShardLeaseDataset(coordinator=cluster.address, job="interrupted", decode=True)
    before, state = [], None
    for item in DataLoader(ds, batch_size=None):
        before.append((item["__shard__"], item["__index__"]))
        if len(before) == 37:
            state = ds.state_dict()  # the checkpoint
        if len(before) == 50:
            break  # the run dies; 13 samples after the checkpoint are lost with it
    ds.close()
    state_file = tmp_path / "checkpoint.json"
    state_file.write_text(json.dumps({"dataset": {"cursor": state["cursor"].hex()}}))
    out = subprocess.run([sys.executable, "-c", RESUME_SCRIPT, cluster.address, "interrupted",
                          str(state_file)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    after = [(line.split()[0], int(line.split()[1])) for line in out.stdout.splitlines()]
    assert before[:37] + after == reference


READER_SCRIPT = textwrap.dedent("""
    import sys, time
    import sluice
    address, job, delay = sys.argv[1], sys.argv[2], float(sys.argv[3])
    with sluice.Reader(address, job, units_in_flight=2, progress_interval=0.05) as r:
        for s in r:
            print(s.shard_index, s.index, flush=True)
            time.sleep(delay)
""")


def test_a_killed_process_does_not_lose_its_samples(cluster, tmp_path):
    # No quotas (world_size 0, dynamic): three readers share the epoch; one is
    # SIGKILLed mid-way and the others finish it.
    cluster.create_job("fleet", world_size=0, epochs=1, mode="dynamic", lease_ttl="1s",
                       max_samples_per_lease=4)
    procs = [subprocess.Popen([sys.executable, "-c", READER_SCRIPT, cluster.address, "fleet",
                               "0.01"], stdout=subprocess.PIPE, text=True) for _ in range(3)]
    victim = procs[0]
    seen_by_victim = []
    for line in victim.stdout:
        seen_by_victim.append(tuple(map(int, line.split())))
        if len(seen_by_victim) == 10:
            victim.send_signal(signal.SIGKILL)
            break
    victim.wait()
    survivors = []
    for p in procs[1:]:
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0
        survivors += [tuple(map(int, line.split())) for line in out.splitlines()]
    every = {(s, i) for s in range(6) for i in range(17)}
    assert set(survivors) | set(seen_by_victim) == every
    counts = collections.Counter(survivors)
    assert set(counts.values()) == {1}  # the survivors never see a sample twice
    # Samples seen twice are only ones the victim took but may not have reported.
    assert set(seen_by_victim) & set(survivors) <= set(seen_by_victim[-4 * 2 - 1:])


ONCE_SCRIPT = textwrap.dedent("""
    import os, sys, time
    import sluice
    address, root = sys.argv[1], sys.argv[2]
    with sluice.once("prepare-dataset", coordinator=address, scope="pytest") as step:
        if step.should_run:
            # PyG-style: download, preprocess, then publish by rename.
            with open(os.path.join(root, "runs.log"), "a") as f:
                f.write(f"{os.getpid()}\\n")
            tmp = os.path.join(root, "processed.tmp")
            os.makedirs(tmp)
            for i in range(5):
                time.sleep(0.1)
                with open(os.path.join(tmp, f"part-{i}.pt"), "w") as f:
                    f.write("x" * 1000)
            os.rename(tmp, os.path.join(root, "processed"))
            step.result = os.path.join(root, "processed")
    parts = sorted(os.listdir(os.path.join(root, "processed")))
    print(step.should_run, len(parts), step.result, flush=True)
""")


def test_once_prepares_the_dataset_exactly_once(cluster, tmp_path):
    root = tmp_path / "data"
    root.mkdir()
    procs = [subprocess.Popen([sys.executable, "-c", ONCE_SCRIPT, cluster.address, str(root)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(6)]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        outs.append(out.split())
    assert len((root / "runs.log").read_text().split()) == 1
    assert sorted(o[0] for o in outs) == ["False"] * 5 + ["True"]
    assert all(o[1] == "5" and o[2] == str(root / "processed") for o in outs)


def test_fork_workers_after_the_parent_used_grpc_mid_epoch(cluster):
    # The parent reads part of the epoch itself (gRPC in use), then forks a
    # 2-worker DataLoader: the first pass is exactly the rest of the epoch,
    # the next pass a whole epoch.
    cluster.create_job("forked", world_size=1, epochs=0, max_samples_per_lease=0)
    with sluice.Reader(cluster.address, "forked") as reader:
        head = []
        for s in reader:
            head.append((s.shard_url, s.index))
            if len(head) == 31:
                break
    ds = ShardLeaseDataset(coordinator=cluster.address, job="forked")
    loader = DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="fork",
                        persistent_workers=True)
    rest = [(i["__shard__"], i["__index__"]) for i in loader]
    assert len(rest) == cluster.total - 31
    assert sorted(head + rest) == sorted(set(head + rest))
    whole = [(i["__shard__"], i["__index__"]) for i in loader]
    assert len(set(whole)) == len(whole) == cluster.total
    ds.close()


def _write_npy_shard(path, key, arrays):
    import io
    import tarfile
    import numpy as np
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for field, array in arrays.items():
            buf = io.BytesIO()
            if field.endswith(".png"):
                from PIL import Image
                Image.fromarray(array).save(buf, format="PNG")  # uint16 -> 16-bit gray
            else:
                np.save(buf, array)
            info = tarfile.TarInfo(f"{key}.{field}")
            info.size = buf.tell()
            buf.seek(0)
            tar.addfile(info, buf)


def test_unsigned_tensors_this_torch_lacks_are_widened_losslessly(cluster):
    # torch 1.13 has no uint16/uint32/uint64 tensors: from_numpy refused them
    # and the DataLoader died on the first such field.
    import numpy as np
    path = os.path.join(cluster.tmp, "shards", "unsigned.tar")
    _write_npy_shard(path, "u", {
        "u16.npy": np.array([[0, 1], [65535, 40000]], dtype=np.uint16),
        "u32.npy": np.array([0, 4294967295], dtype=np.uint32),
        "u64.npy": np.array([2 ** 63 - 1], dtype=np.uint64),
        "u8.npy": np.array([255], dtype=np.uint8),
        "depth.png": np.array([[0, 1000, 65535], [300, 40000, 7]], dtype=np.uint16),
    })
    _write_npy_shard(os.path.join(cluster.tmp, "shards", "huge.tar"), "h",
                     {"big.npy": np.array([2 ** 63], dtype=np.uint64)})
    cluster.create_job("unsigned", extra_shards=[(path, 1)])
    ds = ShardLeaseDataset(coordinator=cluster.address, job="unsigned", decode=True)
    items = [item for item in ds if item["__key__"] == "u"]
    ds.close()
    assert len(items) == 1
    item = items[0]
    assert item["u16.npy"].dtype == torch.int32
    assert item["u16.npy"].tolist() == [[0, 1], [65535, 40000]]
    assert item["u32.npy"].dtype == torch.int64
    assert item["u32.npy"].tolist() == [0, 4294967295]
    assert item["u64.npy"].dtype == torch.int64
    assert item["u64.npy"].tolist() == [2 ** 63 - 1]
    assert item["u8.npy"].dtype == torch.uint8 and item["u8.npy"].tolist() == [255]
    # A 16-bit PNG keeps its values (HWC, one channel).
    assert item["depth.png"].dtype == torch.int32
    assert item["depth.png"][:, :, 0].tolist() == [[0, 1000, 65535], [300, 40000, 7]]

    # A uint64 beyond int64 is an error naming the field, not a silent wrap.
    cluster.create_job("unsigned-huge", extra_shards=[
        (os.path.join(cluster.tmp, "shards", "huge.tar"), 1)])
    ds = ShardLeaseDataset(coordinator=cluster.address, job="unsigned-huge", decode=True)
    with pytest.raises(ValueError, match="'big.npy'"):
        for _ in ds:
            pass
    ds.close()


def _create_two_source_job(cluster, tmp_path, name, *flags):
    """The cluster's six shards as two datasets, web and books, mixed 2:1
    over 60 samples per epoch."""
    manifests = {}
    for source, urls in (("web", cluster.urls[:3]), ("books", cluster.urls[3:])):
        manifests[source] = str(tmp_path / f"{name}-{source}.json")
        with open(manifests[source], "w") as f:
            json.dump({"shards": [{"url": u, "num_samples": n} for u, n in urls]}, f)
    out = subprocess.run(
        [os.path.join(os.environ["SLUICE_BIN_DIR"], "sluicectl"), "job", "create",
         f"--coordinator={cluster.address}", f"--name={name}", "--samples_per_epoch=60",
         "--source", f"name=web,manifest={manifests['web']},weight=2",
         "--source", f"name=books,manifest={manifests['books']},weight=1",
         *flags, *cluster.client_tls, *cluster.admin_token],
        capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


MIX_READER_SCRIPT = READER_SCRIPT.replace("print(s.shard_index, s.index,",
                                          "print(s.source, s.shard_index, s.index,")


def test_a_killed_process_of_a_mixed_job_loses_nothing(cluster, tmp_path):
    # Three readers share a mixed epoch (no quotas); one is SIGKILLed
    # mid-way. Each source's share of 60 (40 + 20) lies within its first
    # pass, so the epoch holds 60 distinct samples.
    _create_two_source_job(cluster, tmp_path, "mixed-fleet", "--world_size=0", "--epochs=1",
                           "--mode=dynamic", "--lease_ttl=1s", "--max_samples_per_lease=4")
    procs = [subprocess.Popen([sys.executable, "-c", MIX_READER_SCRIPT, cluster.address,
                               "mixed-fleet", "0.01"], stdout=subprocess.PIPE, text=True)
             for _ in range(3)]

    def parse(line):
        source, shard, index = line.split()
        return source, int(shard), int(index)
    victim = procs[0]
    seen_by_victim = []
    for line in victim.stdout:
        seen_by_victim.append(parse(line))
        if len(seen_by_victim) == 10:
            victim.send_signal(signal.SIGKILL)
            break
    victim.wait()
    survivors = []
    for p in procs[1:]:
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0
        survivors += [parse(line) for line in out.splitlines()]
    assert set(collections.Counter(survivors).values()) == {1}
    union = set(survivors) | set(seen_by_victim)
    assert collections.Counter(source for source, _, _ in union) == {"web": 40, "books": 20}
    # Samples seen twice are only ones the victim took but may not have reported.
    assert set(seen_by_victim) & set(survivors) <= set(seen_by_victim[-4 * 2 - 1:])


def test_a_job_over_two_sources_tags_every_item_with_its_source(cluster, tmp_path):
    # Read by a DataLoader with two workers.
    _create_two_source_job(cluster, tmp_path, "two-sources", "--world_size=1", "--epochs=2")
    shards_of = {name: {u for u, _ in urls}
                 for name, urls in (("web", cluster.urls[:3]), ("books", cluster.urls[3:]))}
    ds = ShardLeaseDataset(coordinator=cluster.address, job="two-sources", decode=True)
    loader = DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="fork",
                        persistent_workers=True)
    for epoch in range(2):
        ds.set_epoch(epoch)
        per_source = collections.Counter()
        seen = collections.Counter()
        for item in loader:
            assert item["__shard__"] in shards_of[item["__source__"]]
            per_source[item["__source__"]] += 1
            seen[(item["__shard__"], item["__index__"])] += 1
        assert per_source == {"web": 40, "books": 20}, f"epoch {epoch}"
        if epoch == 0:  # within each source's first pass: no sample twice
            assert set(seen.values()) == {1}
    ds.close()


def test_a_run_of_another_world_size_reads_the_jobs_copy_for_it(cluster):
    import grpc
    from sluice.v1 import coordinator_pb2, coordinator_pb2_grpc
    # A job of 2 ranks read by a run of 1 (an elastic run that shrank):
    # the dataset reads the job's copy for 1 rank, which it creates, and
    # that one rank gets the whole epoch.
    cluster.create_job("wide", world_size=2, epochs=1, max_samples_per_lease=5)
    ds = ShardLeaseDataset(coordinator=cluster.address, job="wide", rank=0, world_size=1,
                           decode=False)
    assert ds.reading_job == "wide.w1"
    keys = [s["__key__"] for s in ds]
    assert len(keys) == cluster.total and len(set(keys)) == cluster.total
    ds.close()
    with grpc.insecure_channel(cluster.address) as channel:
        stub = coordinator_pb2_grpc.CoordinatorStub(channel)
        job = stub.GetJob(coordinator_pb2.GetJobRequest(name="wide"))
        copy = stub.GetJob(coordinator_pb2.GetJobRequest(name="wide.w1"))
        assert copy.spec.world_size == 1 and job.spec.world_size == 2
        job.spec.name, job.spec.world_size = "wide.w1", 1
        assert copy.spec == job.spec
        # A copy takes nothing but its name and world size.
        with pytest.raises(grpc.RpcError) as bad:
            stub.CreateJob(coordinator_pb2.CreateJobRequest(
                copy_of="wide", spec=coordinator_pb2.JobSpec(name="wide.w3", world_size=3,
                                                             seed=1)))
        assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "spec.seed" in bad.value.details()
        with pytest.raises(grpc.RpcError) as missing:
            stub.CreateJob(coordinator_pb2.CreateJobRequest(
                copy_of="narrow", spec=coordinator_pb2.JobSpec(name="narrow.w3", world_size=3)))
        assert missing.value.code() == grpc.StatusCode.NOT_FOUND
        assert "narrow" in missing.value.details()
    # The same run at the job's own world size reads the job.
    assert ShardLeaseDataset(coordinator=cluster.address, job="wide", rank=1,
                             world_size=2).reading_job == "wide"
    # An unknown job is the Reader's final error, naming it.
    with pytest.raises(sluice.ReaderError) as unknown:
        ShardLeaseDataset(coordinator=cluster.address, job="absent", rank=0,
                          world_size=2).reading_job
    assert unknown.value.code == grpc.StatusCode.NOT_FOUND and "absent" in str(unknown.value)
    # sluicectl makes the same copies, named JOB.wN by default.
    out = subprocess.run([os.path.join(os.environ["SLUICE_BIN_DIR"], "sluicectl"), "job", "create",
                          f"--coordinator={cluster.address}", "--copy_of=wide", "--world_size=3",
                          "--json", *cluster.client_tls, *cluster.admin_token],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    made = json.loads(out.stdout)
    assert made["spec"]["name"] == "wide.w3" and made["spec"]["world_size"] == 3, made
    out = subprocess.run([os.path.join(os.environ["SLUICE_BIN_DIR"], "sluicectl"), "job", "create",
                          f"--coordinator={cluster.address}", "--copy_of=wide", "--world_size=3",
                          "--manifest=x.json"], capture_output=True, text=True)
    assert out.returncode == 2 and "--copy_of takes the data from that job" in out.stderr
    # Deleting the job deletes its copies, and says which.
    out = subprocess.run([os.path.join(os.environ["SLUICE_BIN_DIR"], "sluicectl"), "job", "delete",
                          "wide", f"--coordinator={cluster.address}", *cluster.client_tls,
                          *cluster.admin_token], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stderr.splitlines() == [
        "deleted job wide.w1 (its copy for another world size)",
        "deleted job wide.w3 (its copy for another world size)",
        "deleted job wide"], out.stderr
    with grpc.insecure_channel(cluster.address) as channel:
        stub = coordinator_pb2_grpc.CoordinatorStub(channel)
        names = [j.spec.name for j in stub.ListJobs(coordinator_pb2.ListJobsRequest()).jobs]
    assert not [n for n in names if n == "wide" or n.startswith("wide.w")], names
