"""Restarts as users meet them, through the README's loop (train_loop.py) in
its own processes: a run resumed from one checkpoint twice and three times
(a node that fails again before the next checkpoint), a checkpoint taken at
any batch of any epoch, and corrupt images under the default on_corrupt=skip
with DataLoader workers and DDP. Nothing special is passed to any run: each
restore of a checkpoint is a restore of its own.
"""
import collections
import io
import itertools
import json
import os
import struct
import subprocess
import tarfile

import pytest

from conftest import Cluster

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON = "/usr/bin/python3"
SHARDS, PER_SHARD = 6, 20  # 120 samples
BATCH = 16  # 8 steps per epoch: 7 of 16 and one of 8

_jobs = itertools.count()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("restarts"), shards=SHARDS, per_shard=PER_SHARD,
                data_servers=2)
    yield c
    c.stop()


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH", ""), HERE) if p)
    # No launcher: nothing names the restart but the checkpoint's restore.
    for name in ("TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "OMPI_MCA_ess_base_jobid",
                 "PMIX_NAMESPACE", "SLUICE_SCOPE"):
        env.pop(name, None)
    return env


def _loop(cluster, job, ckpt, workers=0, start="fork", epochs=2, extra=()):
    return [PYTHON, os.path.join(HERE, "train_loop.py"), cluster.address, job,
            f"--workers={workers}", f"--start={start}", f"--epochs={epochs}",
            f"--batch={BATCH}", f"--checkpoint={ckpt}", *extra]


def _killed(args):
    """Runs a loop that SIGKILLs itself (--kill_after)."""
    out = subprocess.run(args, capture_output=True, text=True, timeout=120, env=_env())
    assert out.returncode == -9, out.stderr[-3000:]


def _finished(args):
    out = subprocess.run(args, capture_output=True, text=True, timeout=120, env=_env())
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1]), out.stderr


def _per_epoch(trained):
    by_epoch = collections.defaultdict(collections.Counter)
    for e, shard, index in trained:
        by_epoch[e][(shard, index)] += 1
    return by_epoch


def _assert_each_epoch_exactly_once(trained, epochs, total):
    by_epoch = _per_epoch(trained)
    assert sorted(by_epoch) == list(range(epochs))
    for e in range(epochs):
        twice = sorted(k for k, n in by_epoch[e].items() if n > 1)
        assert not twice, f"epoch {e}: trained twice: {twice[:5]}"
        assert len(by_epoch[e]) == total, f"epoch {e}: {len(by_epoch[e])} of {total} trained"


@pytest.mark.parametrize("workers,start,resumes", [
    (0, "fork", 2),
    (2, "fork", 2),
    (2, "spawn", 3),
])
def test_resumed_again_and_again_from_one_checkpoint_trains_every_sample(cluster, tmp_path,
                                                                         workers, start,
                                                                         resumes):
    # Run 1 checkpoints after each step and dies after step 10. Each of the
    # next runs resumes from that step-10 checkpoint and dies 3 steps later,
    # before writing another; the last run resumes from it once more and
    # finishes. What the final model trained (the checkpoint's samples plus
    # the last run's) is every epoch exactly once.
    job = f"again-{next(_jobs)}"
    cluster.create_job(job, world_size=1, epochs=2, max_samples_per_lease=10)
    ckpt = tmp_path / "ckpt.json"
    _killed(_loop(cluster, job, ckpt, workers, start, extra=["--kill_after=10"]))
    saved = ckpt.read_text()
    for _ in range(resumes - 1):
        _killed(_loop(cluster, job, ckpt, workers, start, extra=["--kill_after=3", "--frozen"]))
        assert ckpt.read_text() == saved
    result, err = _finished(_loop(cluster, job, ckpt, workers, start))
    _assert_each_epoch_exactly_once(result["trained"], 2, cluster.total)
    assert "set_epoch(" not in err, err[-2000:]  # no epoch came out of order


# Steps of this run after which the first run is killed: the first, a
# middle and the last batch of each of 3 epochs (8 steps each).
@pytest.mark.parametrize("kill_after", [1, 4, 8, 9, 12, 16, 17, 20, 24])
def test_a_checkpoint_at_any_batch_resumes_exactly_once(cluster, tmp_path, kill_after):
    job = f"batch-{next(_jobs)}"
    cluster.create_job(job, world_size=1, epochs=3, max_samples_per_lease=10)
    ckpt = tmp_path / "ckpt.json"
    _killed(_loop(cluster, job, ckpt, epochs=3, extra=[f"--kill_after={kill_after}"]))
    result, err = _finished(_loop(cluster, job, ckpt, epochs=3))
    _assert_each_epoch_exactly_once(result["trained"], 3, cluster.total)
    assert "set_epoch(" not in err, err[-2000:]
    if kill_after == 24:  # the job's last sample was trained before the kill
        assert result["steps_per_epoch"] == {"2": 0}


def _jpeg(seed):
    from PIL import Image
    image = Image.new("RGB", (8, 8), (seed * 7 % 256, seed * 13 % 256, seed * 29 % 256))
    out = io.BytesIO()
    image.save(out, format="JPEG")
    return out.getvalue()


def _scan_bomb_jpeg(width, height, ac_scans):
    """A grey progressive JPEG that repeats one valid first AC scan (every
    block's coefficients zero) `ac_scans` times: a pass over every block per
    scan to decode (tests/testing/image_fixtures.h, ScanBombJpeg)."""
    def segment(marker, payload):
        return struct.pack(">BBH", 0xFF, marker, len(payload) + 2) + payload

    def scan(bits):
        bits += "1" * (-len(bits) % 8)
        data = int(bits, 2).to_bytes(len(bits) // 8, "big")
        return data.replace(b"\xff", b"\xff\x00")

    blocks = ((width + 7) // 8) * ((height + 7) // 8)
    one_code = bytes([1] + [0] * 15)
    out = b"\xff\xd8" + segment(0xDB, b"\x00" + bytes([1] * 64))
    out += segment(0xC2, struct.pack(">BHHB", 8, height, width, 1) + b"\x01\x11\x00")
    out += segment(0xC4, b"\x00" + one_code + b"\x00")  # DC: a zero difference
    out += segment(0xC4, b"\x10" + one_code + b"\xe0")  # AC: an end-of-band run
    out += segment(0xDA, b"\x01\x01\x00\x00\x00\x00") + scan("0" * blocks)
    runs = (blocks + 32766) // 32767
    for _ in range(ac_scans):
        out += segment(0xDA, b"\x01\x01\x00\x01\x3f\x00") + scan(("0" + "1" * 14) * runs)
    return out + b"\xff\xd9"


def _image_shard(path, count, corrupt, bombs=()):
    """A WebDataset tar of `count` 8x8 JPEGs (key img_I: .jpg and .cls); the
    images at `corrupt` are truncated or not JPEG at all, those at `bombs`
    progressive JPEGs of more scans than the data servers decode."""
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for i in range(count):
            jpg = _jpeg(i)
            if i in bombs:
                jpg = _scan_bomb_jpeg(64, 48, 600)
            elif i in corrupt:
                jpg = jpg[:len(jpg) // 3] if i % 2 else b"this is not a jpeg" * 4
            for ext, data in (("jpg", jpg), ("cls", str(i).encode())):
                info = tarfile.TarInfo(f"img_{i:03d}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))


def test_corrupt_images_are_skipped_with_equal_steps_under_ddp_with_workers(cluster, tmp_path):
    # 2 DDP ranks over gloo, 2 DataLoader workers each, default on_corrupt
    # (skip): the corrupt images (one a progressive JPEG of 601 scans) never
    # reach the collate, every rank takes the same number of steps (a batch
    # may be smaller), and the skipped samples are counted and named.
    shard = os.path.join(cluster.tmp, "shards", "images.tar")
    corrupt = {5, 22, 23, 30}
    _image_shard(shard, 48, corrupt, bombs={30})
    job = f"corrupt-{next(_jobs)}"
    cluster.create_job(job, world_size=2, epochs=1, max_samples_per_lease=6,
                       shards=[(shard, 48)])
    init = tmp_path / "init"
    procs = [subprocess.Popen(
        _loop(cluster, job, tmp_path / f"ckpt{r}.json", workers=2, epochs=1,
              extra=["--world=2", f"--rank={r}", f"--init={init}", "--batch=4"]),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env()) for r in range(2)]
    results, errs = [], []
    for p in procs:
        out, err = p.communicate(timeout=180)
        assert p.returncode == 0, err[-3000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
        errs.append(err)
    assert results[0]["steps_per_epoch"] == results[1]["steps_per_epoch"]
    trained = collections.Counter((s, i) for r in results for _, s, i in r["trained"])
    assert sorted(i for _, i in trained) == sorted(set(range(48)) - corrupt)
    assert set(trained.values()) == {1}
    assert results[0]["skipped"] + results[1]["skipped"] == len(corrupt)
    logged = "".join(errs)
    for i in corrupt:
        assert f"'img_{i:03d}'" in logged, logged[-3000:]
    assert "progressive JPEG of more than 500 scans" in logged, logged[-3000:]
    # The data servers count them by job and reason.
    counted = 0.0
    for server in cluster.data:
        for line in server.metric_text().splitlines():
            if (line.startswith("sluice_dataserver_samples_skipped_total{") and
                    f'sluice_job="{job}"' in line):
                counted += float(line.split()[-1])
    assert counted == len(corrupt)


def test_a_corrupt_image_under_on_corrupt_fail_raises_data_loss_in_the_training_process(
        cluster, tmp_path):
    shard = os.path.join(cluster.tmp, "shards", "images-fail.tar")
    _image_shard(shard, 12, {7})
    job = f"fail-{next(_jobs)}"
    cluster.create_job(job, world_size=1, epochs=1, shards=[(shard, 12)],
                       extra=["--on_corrupt=fail"])
    script = ("import sys, sluice, sluice.torch\n"
              "ds = sluice.torch.ShardLeaseDataset(sys.argv[1], sys.argv[2])\n"
              "try:\n"
              "    for batch in sluice.torch.DataLoader(ds, batch_size=4, num_workers=2):\n"
              "        pass\n"
              "except sluice.DataLossError as e:\n"
              "    print('DataLossError', e.code.name)\n"
              "    print(e)\n")
    out = subprocess.run([PYTHON, "-c", script, cluster.address, job], capture_output=True,
                         text=True, timeout=120, env=_env())
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.startswith("DataLossError DATA_LOSS"), out.stdout + out.stderr[-2000:]
    assert "images-fail.tar" in out.stdout and "img_007" in out.stdout, out.stdout
