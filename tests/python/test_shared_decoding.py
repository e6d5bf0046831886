"""A sweep of trials over one dataset on one data server: four dynamic jobs
with their own seeds, transforms and step times read together. The
coordinator steers each job's grants towards shards the others read, the
data server decodes each JPEG once for all of them (--shared_decode_bytes),
and every job still gets each sample of its epoch exactly once, with the
tensors it gets when it runs alone."""
import hashlib
import os
import re
import threading
import time

import pytest

import sluice
from sluice import transforms as T

from conftest import Cluster
from sample_data import photo_like_jpegs, write_jpeg_shards

SHARDS = 6
PER_SHARD = 24

TRIALS = [
    # (seed, transform, seconds per training step)
    (11, lambda: T.Compose([T.RandomResizedCrop(64), T.RandomHorizontalFlip()]), 0.0),
    (12, lambda: T.Compose([T.RandomResizedCrop(96, scale=(0.3, 1.0))]), 0.002),
    (13, lambda: T.Compose([T.Resize(80), T.CenterCrop(64)]), 0.0),
    (14, lambda: T.Compose([T.RandomResizedCrop(48), T.RandomHorizontalFlip(),
                            T.ToTensor()]), 0.006),  # 3x the step time of the second
]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sweep")
    c = Cluster(tmp, shards=1, per_shard=1)
    # Every sample its own 320x240 image.
    jpegs = photo_like_jpegs(SHARDS * PER_SHARD, width=320, height=240, quality=85)
    c.photo_urls = write_jpeg_shards(os.path.join(c.tmp, "shards"), SHARDS, PER_SHARD, jpegs,
                                     name="photos")
    yield c
    c.stop()


def shared_decodes(cluster):
    text = cluster.data[0].metric_text()
    found = dict(re.findall(r'sluice_dataserver_shared_decodes_total\{result="(\w+)"\} (\S+)',
                            text))
    return {k: float(found.get(k, 0)) for k in ("hit", "miss")}


def read_job(cluster, job, transform, step, out, start=None):
    """Reads the job's one epoch into out[key] = digest of the tensor; a
    key read twice is recorded as such."""
    with sluice.Reader(cluster.address, job, transform=transform) as reader:
        if start is not None:
            start.wait()
        for sample in reader:
            value = sample.fields["jpg"]
            data = value.numpy().tobytes() if hasattr(value, "numpy") else bytes(value)
            digest = hashlib.sha256(data).hexdigest()
            out.setdefault(sample.key, []).append(digest)
            if step:
                time.sleep(step)  # the trial's training step


def test_four_trials_decode_once_and_get_what_they_get_alone(sweep):
    c = sweep
    total = SHARDS * PER_SHARD
    alone = []
    for n, (seed, transform, _) in enumerate(TRIALS):
        name = f"alone{n}"
        c.create_job(name, mode="dynamic", seed=seed, shuffle_window=1, shards=c.photo_urls)
        got = {}
        read_job(c, name, transform(), 0.0, got)
        assert len(got) == total and all(len(v) == 1 for v in got.values())
        alone.append(got)
    before = shared_decodes(c)
    assert before["hit"] == 0  # nothing is shared by jobs that run one at a time

    together = [{} for _ in TRIALS]
    start = threading.Barrier(len(TRIALS))
    threads = []
    for n, (seed, transform, step) in enumerate(TRIALS):
        name = f"trial{n}"
        c.create_job(name, mode="dynamic", seed=seed, shuffle_window=1, shards=c.photo_urls)
        threads.append(threading.Thread(target=read_job,
                                        args=(c, name, transform(), step, together[n], start)))
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads)
    for n, got in enumerate(together):
        # Exactly once, and the tensors of the same job alone.
        assert len(got) == total, n
        twice = [k for k, v in got.items() if len(v) != 1]
        assert not twice, (n, twice[:5])
        differ = [k for k in got if got[k] != alone[n][k]]
        assert not differ, (n, len(differ), differ[:5])
    after = shared_decodes(c)
    hits = after["hit"] - before["hit"]
    misses = after["miss"] - before["miss"]
    # The jobs read the same shards together: images decoded for one job
    # were reused by others. (How many depends on the steps' timing; the
    # benchmark measures the CPU saved.)
    assert hits > 0 and misses > 0, after
    print(f"shared decodes: {hits:.0f} hits, {misses:.0f} misses of "
          f"{len(TRIALS) * total} samples")
