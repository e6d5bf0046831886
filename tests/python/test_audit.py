"""`sluicectl audit` against what the readers themselves yielded: for every
rank of a 4-rank dynamic job with shuffle windows and of a static job in
shuffled shard order, a job mixing two sources, readers whose data server
is SIGKILLed mid-epoch (their units re-routed), and a training loop
SIGKILLed and resumed from its checkpoint, the audit lists the samples each
reader's loop took, in order, with their keys; the same after a
coordinator restart and journal compactions. The draws an audit lists are
the crops and flips that give the trainers' tensors. `sluicectl replay` /
`sluice.replay` give back the tensors a RandomResizedCrop + flip job's
trainers received, byte for byte, through either data server, past a hung
one, and after a data server restart."""
import io
import itertools
import json
import os
import random
import signal
import subprocess
import tarfile
import threading

import numpy as np
import pytest
import torchvision.transforms.functional as F
from google.protobuf import text_format
from PIL import Image

import sluice
from conftest import BIN, Cluster, _wait_for
from sample_data import photo_like_jpegs, write_jpeg_shards
from sluice import transforms as T

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON = "/usr/bin/python3"
SHARDS, PER_SHARD = 6, 20  # 120 samples

_jobs = itertools.count()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    # A small journal: compacted into a snapshot many times per job, so
    # audits after a restart come from snapshots.
    c = Cluster(tmp_path_factory.mktemp("audit"), shards=SHARDS, per_shard=PER_SHARD,
                data_servers=2, coordinator_flags=["--journal_compact_bytes=1024"])
    yield c
    c.stop()


def _sluicectl(*args, check=True):
    out = subprocess.run([os.path.join(BIN, "sluicectl"), *args], capture_output=True,
                         text=True, timeout=120)
    if check:
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    return out


def _read(cluster, job, ranks, epochs=1):
    """Every rank as `sluicectl read` at once, until `epochs` epochs end:
    per rank, its (epoch, shard URL, index, key, source) in the order it
    yielded them."""
    procs = [subprocess.Popen([os.path.join(BIN, "sluicectl"), "read", f"--job={job}",
                               f"--rank={r}", f"--read_epochs={epochs}",
                               f"--coordinator={cluster.address}"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in range(ranks)]
    ledgers = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-2000:]
        ledgers.append([json.loads(line) for line in out.splitlines()])
    return ledgers


def _audit(cluster, job, epoch, rank, *extra):
    out = _sluicectl("audit", job, f"--epoch={epoch}", f"--rank={rank}", "--json",
                     f"--coordinator={cluster.address}", *extra)
    return [json.loads(line) for line in out.stdout.splitlines()]


def _as_read(audit):
    """Audit lines as (shard URL, index, key, source)."""
    return [(a["url"], a["index"], a["key"], a.get("source", "")) for a in audit]


def _ledger(lines, epoch, urls):
    return [(urls[s.get("source", "")][s["shard"]], s["index"], s["key"], s.get("source", ""))
            for s in lines if s["epoch"] == epoch]


def _restart_coordinator(cluster):
    cluster.coordinator.stop()
    cluster.restart_coordinator()
    n = len(cluster.data)
    _wait_for(lambda: f"sluice_coordinator_data_servers {n}"
              in cluster.coordinator.metric_text(), 30, "data servers to register again")


def _compactions(cluster):
    for line in cluster.coordinator.metric_text().splitlines():
        if line.startswith("sluice_coordinator_journal_compactions_total "):
            return float(line.split()[1])
    return 0.0


@pytest.mark.parametrize("mode,window", [("dynamic", 3), ("static", 1)])
def test_every_rank_of_a_job_is_audited_in_order(cluster, mode, window):
    ranks = 4
    job = f"{mode}-{next(_jobs)}"
    cluster.create_job(job, world_size=ranks, epochs=2, mode=mode, shuffle_window=window,
                       max_samples_per_lease=7)
    urls = {"": [u for u, _ in cluster.urls]}
    compacted = _compactions(cluster)
    first = _read(cluster, job, ranks, epochs=1)
    assert _compactions(cluster) > compacted  # the epoch's record went through snapshots
    audits = []
    for rank in range(ranks):
        want = _ledger(first[rank], 0, urls)
        assert len(want) == cluster.total // ranks
        got = _audit(cluster, job, 0, rank)
        assert {a["unit_kind"] for a in got} == {"window" if window > 1 else "shard"}
        assert [a["position"] for a in got] == list(range(len(want)))
        assert _as_read(got) == want, f"rank {rank}"
        audits.append(got)
        # A page from the middle.
        page = _audit(cluster, job, 0, rank, "--from=13", "--count=10")
        assert _as_read(page) == want[13:23]
    # Restarted, the coordinator recovers epoch 0's record from its last
    # snapshot and the journal after it.
    _restart_coordinator(cluster)
    for rank in range(ranks):
        assert _audit(cluster, job, 0, rank) == audits[rank], f"rank {rank} after a restart"
    second = _read(cluster, job, ranks, epochs=1)
    for rank in range(ranks):
        assert _as_read(_audit(cluster, job, 1, rank)) == _ledger(second[rank], 1, urls)
    # The text form: a line per sample between a header and a total.
    text = _sluicectl("audit", job, "--epoch=1", "--rank=1",
                      f"--coordinator={cluster.address}").stdout.splitlines()
    assert text[0] == "# position key shard index source unit_kind unit"
    assert text[-1] == f"# job {job} epoch 1 rank 1 worker 0: 30 samples acknowledged"
    first_url, first_index, first_key, _ = _ledger(second[1], 1, urls)[0]
    assert text[1].split()[:4] == ["0", first_key, first_url, str(first_index)]
    assert len(text) == 32
    # Exported: every kept epoch of every reader, as --json prints it.
    export = os.path.join(cluster.tmp, f"export-{job}")
    _sluicectl("audit", job, f"--export_dir={export}", f"--coordinator={cluster.address}")
    assert sorted(os.listdir(os.path.join(export, job))) == ["epoch-1"]
    for rank in range(ranks):
        with open(os.path.join(export, job, "epoch-1", f"rank-{rank}-worker-0.jsonl")) as f:
            assert [json.loads(line) for line in f] == _audit(cluster, job, 1, rank)
    # The job is done: epoch 1 is kept, epoch 0 no longer.
    out = _sluicectl("audit", job, "--epoch=0", f"--coordinator={cluster.address}",
                     check=False)
    assert out.returncode == 1
    assert "audit.epoch=0 is not kept; the job keeps epoch(s) 1" in out.stderr
    out = _sluicectl("audit", "no-such-job", "--epoch=0", f"--coordinator={cluster.address}",
                     check=False)
    assert out.returncode == 1
    assert 'job "no-such-job" not found' in out.stderr


def test_a_job_mixing_two_sources_is_audited_with_its_sources(cluster):
    job = f"mixed-{next(_jobs)}"
    manifests = {}
    for name, urls in (("a", cluster.urls[:3]), ("b", cluster.urls[3:])):
        path = os.path.join(cluster.tmp, f"{job}-{name}.json")
        with open(path, "w") as f:
            json.dump({"shards": [{"url": u, "num_samples": n} for u, n in urls]}, f)
        manifests[name] = path
    _sluicectl("job", "create", f"--coordinator={cluster.address}", f"--name={job}",
               "--world_size=2", "--epochs=1", "--seed=3", "--samples_per_epoch=90",
               "--max_samples_per_lease=10",
               f"--source=name=a,manifest={manifests['a']},weight=2",
               f"--source=name=b,manifest={manifests['b']},weight=1")
    urls = {"a": [u for u, _ in cluster.urls[:3]], "b": [u for u, _ in cluster.urls[3:]]}
    ledgers = _read(cluster, job, 2, epochs=1)
    for rank in range(2):
        want = _ledger(ledgers[rank], 0, urls)
        assert len(want) == 45
        assert {s for *_, s in want} == {"a", "b"}
        got = _audit(cluster, job, 0, rank)
        assert {a["unit_kind"] for a in got} == {"mixed"}
        assert _as_read(got) == want, f"rank {rank}"


def test_a_loop_killed_and_resumed_is_audited_as_its_model_trained(cluster, tmp_path):
    # The README's loop checkpoints after every step and is SIGKILLed after
    # step 4; the next run restores that checkpoint and finishes. What the
    # model trained (the checkpoint's samples, then the resumed run's) is
    # the audit of the epoch; the samples the killed run read after its
    # checkpoint are not.
    job = f"resumed-{next(_jobs)}"
    cluster.create_job(job, world_size=1, epochs=1, mode="dynamic", max_samples_per_lease=10)
    ckpt = tmp_path / "ckpt.json"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH", ""), HERE) if p)
    loop = [PYTHON, os.path.join(HERE, "train_loop.py"), cluster.address, job, "--workers=0",
            "--epochs=1", "--batch=8", f"--checkpoint={ckpt}"]
    killed = subprocess.run(loop + ["--kill_after=4"], capture_output=True, text=True,
                            timeout=120, env=env)
    assert killed.returncode == -9, killed.stderr[-3000:]
    done = subprocess.run(loop, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    trained = json.loads(done.stdout.strip().splitlines()[-1])["trained"]
    assert len(trained) == cluster.total
    got = _audit(cluster, job, 0, 0, "--nokeys")
    assert [[0, a["url"], a["index"]] for a in got] == trained
    assert {a["key"] for a in got} == {""}
    # What the killed run had acknowledged past its checkpoint (if it got
    # to report any) was read again by the resumed run, and is marked so.
    cut = _audit(cluster, job, 0, 0, "--nokeys", "--rolled_back")
    again = [(a["url"], a["index"]) for a in got if a.get("reread")]
    assert sorted(again) == sorted((a["url"], a["index"]) for a in cut)


def test_a_data_server_killed_mid_epoch_is_audited_as_the_readers_read(tmp_path):
    # Rank 0's reader SIGKILLs the data server of its 5th sample: its units
    # there fail and are re-routed (the rest of a unit comes back as a new
    # grant, after other units); each rank's audit is still what it read.
    c = Cluster(tmp_path, shards=SHARDS, per_shard=PER_SHARD, data_servers=2)
    try:
        job = f"rerouted-{next(_jobs)}"
        c.create_job(job, world_size=2, epochs=1, mode="dynamic", max_samples_per_lease=6)
        ledgers, reroutes = [[], []], [0, 0]
        by_address = {d.address: d for d in c.data}

        def reader(rank):
            return sluice.Reader(c.address, job, rank=rank, decode=False, stall_timeout=5.0)

        def on_sample(rank, s):
            ledgers[rank].append((s.shard_url, s.index, s.key))
            if rank == 0 and len(ledgers[0]) == 5:
                by_address[s.data_server].kill()
        readers = {}

        def make(rank):
            readers[rank] = reader(rank)
            return readers[rank]
        _read_in_threads([(lambda r=r: make(r), lambda s, r=r: on_sample(r, s))
                          for r in range(2)])
        reroutes = sum(readers[r].stats["reroutes"] for r in range(2))
        assert reroutes >= 1
        assert sorted(map(len, ledgers)) == [60, 60]
        assert len(set(ledgers[0] + ledgers[1])) == 120
        for rank in range(2):
            got = sluice.audit(job, 0, rank=rank, coordinator=c.address)
            assert [(a["url"], a["index"], a["key"]) for a in got] == ledgers[rank], rank
    finally:
        c.stop()


def test_python_audit_of_each_worker_is_what_its_reader_yielded(cluster):
    # Two readers share rank 0 (DataLoader workers 0 and 1), each in its own
    # thread; sluice.audit(worker=w) is what reader w yielded, in order.
    job = f"workers-{next(_jobs)}"
    cluster.create_job(job, world_size=1, epochs=1, mode="dynamic", max_samples_per_lease=9)
    ledgers, errors = [[], []], []

    def read(worker):
        reader = sluice.Reader(cluster.address, job, rank=0, worker=worker, num_workers=2,
                               decode=False)
        try:
            for s in reader:
                ledgers[worker].append((s.shard_url, s.index, s.key))
        except Exception as e:  # reported below, not lost in the thread
            errors.append(e)
        finally:
            reader.close()
    threads = [threading.Thread(target=read, args=(w,)) for w in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    assert sorted(map(len, ledgers)) == [60, 60]
    for worker in range(2):
        got = sluice.audit(job, 0, rank=0, worker=worker, coordinator=cluster.address)
        assert [(a["url"], a["index"], a["key"]) for a in got] == ledgers[worker]
        assert [a["position"] for a in got] == list(range(60))
        page = sluice.audit(job, 0, worker=worker, start=50, count=5, keys=False,
                            coordinator=cluster.address)
        assert [(a["url"], a["index"]) for a in page] == [l[:2] for l in ledgers[worker][50:55]]
        assert {a["key"] for a in page} == {""}
    with pytest.raises(LookupError, match="audit.epoch=1 is not kept"):
        sluice.audit(job, 1, coordinator=cluster.address)
    with pytest.raises(ValueError, match="audit.worker=2"):
        sluice.audit(job, 0, worker=2, coordinator=cluster.address)
    with pytest.raises(LookupError, match="not found"):
        sluice.audit("no-such-job", 0, coordinator=cluster.address)


def _read_in_threads(readers):
    """Runs each (name, make_reader, on_sample) in its own thread to the end."""
    errors = []

    def run(make, on_sample):
        reader = make()
        try:
            for s in reader:
                on_sample(s)
        except Exception as e:  # reported below, not lost in the thread
            errors.append(e)
        finally:
            reader.close()
    threads = [threading.Thread(target=run, args=r) for r in readers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors


def test_replay_gives_back_the_tensors_the_trainers_got(cluster, tmp_path):
    jpegs = photo_like_jpegs(12, width=96, height=72)
    shards = write_jpeg_shards(os.path.join(cluster.tmp, "shards", "replay"), 3, 12, jpegs,
                               name="photo")
    job = f"replay-{next(_jobs)}"
    cluster.create_job(job, world_size=2, epochs=1, mode="dynamic", shards=shards,
                       shuffle_window=3, max_samples_per_lease=5)
    train = T.Compose([T.RandomResizedCrop(40), T.RandomHorizontalFlip(), T.PILToTensor()])
    got = [[], []]  # per rank: (key, tensor bytes, shape)
    _read_in_threads([
        (lambda r=r: sluice.Reader(cluster.address, job, rank=r, transform=train),
         lambda s, r=r: got[r].append((s.key, s["jpg"].tobytes(), s["jpg"].shape)))
        for r in range(2)])
    assert sorted(map(len, got)) == [18, 18]
    picks = random.Random(5).sample([(r, p) for r in range(2) for p in range(18)], 20)
    servers = [d.address for d in cluster.data]
    flips = set()
    for n, (rank, position) in enumerate(picks):
        key, data, shape = got[rank][position]
        # By key, then by position; through each data server in turn.
        again = (sluice.replay(job, 0, key=key, transform=train, coordinator=cluster.address,
                               data_server=servers[n % 2])
                 if n % 2 == 0 else
                 sluice.replay(job, 0, rank=rank, position=position, transform=train,
                               coordinator=cluster.address, data_server=servers[n % 2]))
        assert (again["rank"], again["position"], again["key"]) == (rank, position, key)
        assert again["data_server"] == servers[n % 2]
        assert again["fields"]["jpg"].shape == shape
        assert again["fields"]["jpg"].tobytes() == data, f"rank {rank} position {position}"
        assert again["source_size"] == (96, 72)
        assert [list(step) for step in again["steps"]] == [["crop"], ["resize"]]
        assert again["steps"][1]["resize"] == (40, 40)
        flips.add(again["flip_horizontal"])
    assert flips == {False, True}  # both draws seen: the flip is the sample's own

    # The audit lists every sample's draws: the replay's, and the crop and
    # flip that, applied to the source image by torchvision, give the
    # tensor the trainer got (within the documented resize tolerance).
    audited = [sluice.audit(job, 0, rank=r, transform=train, coordinator=cluster.address)
               for r in range(2)]
    for n, (rank, position) in enumerate(picks[:6]):
        again = sluice.replay(job, 0, rank=rank, position=position, transform=train,
                              coordinator=cluster.address)
        a = audited[rank][position]
        assert (a["source_size"], a["steps"], a["flip_horizontal"], a["flip_vertical"]) == \
            (again["source_size"], again["steps"], again["flip_horizontal"],
             again["flip_vertical"])
    boxes = set()
    for rank in range(2):
        assert [a["key"] for a in audited[rank]] == [k for k, _, _ in got[rank]]
        for a, (key, data, shape) in zip(audited[rank], got[rank]):
            with tarfile.open(a["url"]) as tar:
                src = Image.open(io.BytesIO(tar.extractfile(f"{key}.jpg").read())).convert("RGB")
            assert a["source_size"] == src.size
            (left, top, w, h), (rw, rh) = a["steps"][0]["crop"], a["steps"][1]["resize"]
            want = F.resized_crop(src, top, left, h, w, [rh, rw])
            if a["flip_horizontal"]:
                want = F.hflip(want)
            tensor = np.frombuffer(data, np.uint8).reshape(shape).transpose(1, 2, 0)
            d = np.abs(tensor.astype(int) - np.asarray(want).astype(int))
            assert d.mean() <= 1.5 and d.max() <= 8, f"{key}: mean {d.mean():.3f} max {d.max()}"
            boxes.add((left, top, w, h))
    assert len(boxes) > 30  # each sample its own crop
    # The reader's field choice: only those fields come back.
    rank, position = picks[2]
    key, data, _ = got[rank][position]
    only = sluice.replay(job, 0, rank=rank, position=position, transform=train,
                         fields=("jpg",), coordinator=cluster.address)
    assert set(only["fields"]) == {"jpg"}
    assert only["fields"]["jpg"].tobytes() == data
    assert sluice.audit(job, 0, rank=rank, transform=train, fields=("jpg",),
                        coordinator=cluster.address) == audited[rank]
    # The command line shows them too: a word per line, a JSON object.
    rank, position = picks[0]
    spec = text_format.MessageToString(train.decode_spec(), as_one_line=True)
    line = _audit(cluster, job, 0, rank, f"--from={position}", "--count=1",
                  f"--decode_spec={spec}")[0]
    a = audited[rank][position]
    assert line["source_size"] == list(a["source_size"])
    assert line["steps"] == [{k: list(v) for k, v in step.items()} for step in a["steps"]]
    text = _sluicectl("audit", job, "--epoch=0", f"--rank={rank}", f"--from={position}",
                      "--count=1", f"--decode_spec={spec}",
                      f"--coordinator={cluster.address}").stdout.splitlines()
    assert text[0] == "# position key shard index source unit_kind unit draws"
    (cl, ct, cw, ch), (rw, rh) = a["steps"][0]["crop"], a["steps"][1]["resize"]
    assert text[1].split()[-1] == (f"96x72:crop({cl},{ct},{cw},{ch}):resize({rw},{rh})"
                                   + (":hflip" if a["flip_horizontal"] else ""))

    # The command line: a PNG, a .npy and the sidecar.
    rank, position = picks[0]
    key, data, shape = got[rank][position]
    spec = text_format.MessageToString(train.decode_spec(), as_one_line=True)
    for out in (tmp_path / "s.npy", tmp_path / "s.png"):
        _sluicectl("replay", job, "--epoch=0", f"--key={key}", f"--decode_spec={spec}",
                   f"--out={out}", f"--coordinator={cluster.address}")
        side = json.loads((tmp_path / (out.name + ".json")).read_text())
        assert (side["rank"], side["position"], side["key"]) == (rank, position, key)
        assert side["fields"]["jpg"]["shape"] == list(shape)
        if out.suffix == ".npy":
            assert np.load(out).tobytes() == data
        else:
            image = np.asarray(Image.open(out))  # HWC; the trainer's tensor is CHW
            assert image.transpose(2, 0, 1).tobytes() == data
    out = _sluicectl("replay", job, "--epoch=0", "--key=no-such-key",
                     f"--coordinator={cluster.address}", check=False)
    assert out.returncode == 1
    assert 'took a sample with key "no-such-key"' in out.stderr

    # A hung data server (SIGSTOP) that the coordinator still lists first:
    # replay, keys and draws come from the other one, after one timeout.
    job_status = json.loads(_sluicectl("job", "get", job, "--json",
                                       f"--coordinator={cluster.address}").stdout)
    first = job_status["status"]["live_data_servers"][0]
    hung = next(d for d in cluster.data if d.address == first)
    other = next(d for d in cluster.data if d.address != first)
    rank, position = picks[1]
    key, data, _ = got[rank][position]
    hung.signal(signal.SIGSTOP)
    try:
        again = sluice.replay(job, 0, rank=rank, position=position, transform=train,
                              coordinator=cluster.address, timeout=1.0)
        assert again["data_server"] == other.address
        assert again["fields"]["jpg"].tobytes() == data
        assert again["key"] == key
        lines = sluice.audit(job, 0, rank=rank, transform=train, coordinator=cluster.address,
                             timeout=1.0)
        assert lines == audited[rank]
    finally:
        hung.signal(signal.SIGCONT)
    _wait_for(lambda: "sluice_coordinator_data_servers 2" in cluster.coordinator.metric_text(),
              30, "the resumed data server to be live again")

    # A data server restarted (a new process, a new port) replays the same.
    cluster.restart_data_server(0)
    for rank, position in picks[:5]:
        key, data, _ = got[rank][position]
        again = sluice.replay(job, 0, rank=rank, position=position, transform=train,
                              coordinator=cluster.address, data_server=cluster.data[0].address)
        assert again["fields"]["jpg"].tobytes() == data


_LOOP = """
import json, sys
import sluice.torch
ds = sluice.torch.ShardLeaseDataset(coordinator=sys.argv[1], job=sys.argv[2], fields=("cls",))
loader = sluice.torch.DataLoader(ds, batch_size=8, num_workers=2)
print(json.dumps([list(batch["__key__"]) for batch in loader]))
"""


def test_a_step_of_a_dataloader_loop_is_audited_as_its_batch(cluster):
    # A DataLoader loop with 2 workers and batches of 8 records each step's
    # keys; the audit of (step, batch size, workers) names the same keys,
    # from sluicectl and from Python.
    job = f"steps-{next(_jobs)}"
    cluster.create_job(job, world_size=1, epochs=1, mode="dynamic", max_samples_per_lease=10)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH", ""), HERE) if p)
    out = subprocess.run([PYTHON, "-c", _LOOP, cluster.address, job], capture_output=True,
                         text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    steps = json.loads(out.stdout.strip().splitlines()[-1])
    assert sum(map(len, steps)) == cluster.total
    for step, keys in enumerate(steps):
        if len(keys) < 8:
            continue  # a worker's last, partial batch
        lines = _audit(cluster, job, 0, 0, f"--step={step}", "--batch_size=8",
                       "--num_workers=2")
        assert [a["key"] for a in lines] == keys, f"step {step}"
        got = sluice.audit(job, 0, step=step, batch_size=8, num_workers=2,
                           coordinator=cluster.address)
        assert [a["key"] for a in got] == keys, f"step {step}"
