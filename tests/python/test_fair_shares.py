"""Jobs sharing one data server get its reading and decoding threads in
proportion to their weights (JobSpec.weight), measured as samples delivered
while both jobs keep the server busy and as the server's per-job CPU
seconds (sluice_dataserver_job_cpu_seconds_total)."""
import io
import os
import re
import subprocess
import sys
import tarfile
import textwrap
import threading

import pytest
from PIL import Image

import sluice

from conftest import Cluster

PHOTO = "/usr/share/matplotlib/mpl-data/sample_data/grace_hopper.jpg"
SHARDS = 4
PER_SHARD = 100


@pytest.fixture(scope="module")
def one_thread(tmp_path_factory):
    """One data server with one reading and decoding thread, over shards of
    identical 384x384 JPEGs: every sample costs the server the same. Shared
    decoding is off: jobs reading the same shards in step would otherwise
    decode each image once between them (test_shared_decoding.py), and the
    job that decodes it would be charged for both."""
    tmp = tmp_path_factory.mktemp("fair")
    c = Cluster(tmp, shards=1, per_shard=1,
                data_flags=["--decode_threads=1", "--shared_decode_bytes=0"])
    buf = io.BytesIO()
    Image.open(PHOTO).convert("RGB").crop((0, 0, 384, 384)).save(buf, format="JPEG",
                                                                  quality=90)
    jpeg = buf.getvalue()
    c.photo_urls = []
    for s in range(SHARDS):
        path = os.path.join(c.tmp, "shards", f"photos-{s}.tar")
        with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
            for i in range(PER_SHARD):
                info = tarfile.TarInfo(f"s{s}_{i:04d}.jpg")
                info.size = len(jpeg)
                tar.addfile(info, io.BytesIO(jpeg))
        c.photo_urls.append((path, PER_SHARD))
    yield c
    c.stop()


def cpu_seconds(cluster, job):
    m = re.search(r'sluice_dataserver_job_cpu_seconds_total\{sluice_job="%s"\} (\S+)' % job,
                  cluster.data[0].metric_text())
    return float(m.group(1)) if m else 0.0


def race(cluster, jobs, marks):
    """Reads `jobs` concurrently. When the last job has received marks[0]
    samples and again at marks[1], notes how many each job had received and
    the server's CPU seconds per job; returns what each gained in between
    (past the start, while both jobs had their streams open and full)."""
    counts = {job: 0 for job in jobs}
    lock = threading.Lock()
    done = threading.Event()
    start = threading.Barrier(len(jobs))
    notes = []

    def read(job):
        with sluice.Reader(cluster.address, job, resize_shorter_side=128) as reader:
            start.wait()
            for _ in reader:
                with lock:
                    counts[job] += 1
                    if job == jobs[-1] and counts[job] in marks:
                        notes.append((dict(counts), {j: cpu_seconds(cluster, j) for j in jobs}))
                        if len(notes) == len(marks):
                            done.set()
                if done.is_set():
                    return

    threads = [threading.Thread(target=read, args=(job,)) for job in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads)
    assert done.is_set(), counts
    (n0, c0), (n1, c1) = notes
    return {j: n1[j] - n0[j] for j in jobs}, {j: c1[j] - c0[j] for j in jobs}


@pytest.mark.parametrize("heavy_weight", [1, 3])
def test_two_saturating_jobs_share_one_server_by_weight(one_thread, heavy_weight):
    c = one_thread
    heavy, light = f"heavy{heavy_weight}", f"light{heavy_weight}"
    # Enough epochs that neither job runs out during the race.
    c.create_job(heavy, epochs=20, shards=c.photo_urls, extra=[f"--weight={heavy_weight}"])
    c.create_job(light, epochs=20, shards=c.photo_urls, extra=["--weight=1"])
    samples, cpu = race(c, [heavy, light], marks=(100, 400))
    # Samples delivered, and the server's CPU, split by weight (within 10 %).
    assert heavy_weight * 0.9 <= samples[heavy] / samples[light] <= heavy_weight * 1.1, samples
    assert heavy_weight * 0.9 <= cpu[heavy] / cpu[light] <= heavy_weight * 1.1, cpu


def test_readers_in_threads_of_one_process_start_together(one_thread):
    """Four Readers in four threads of a fresh interpreter, whose first image
    samples arrive at once: each gets its samples (the first array a Reader
    hands out must not wait on another thread's first one)."""
    c = one_thread
    c.create_job("threads", epochs=1, shards=c.photo_urls)
    script = textwrap.dedent(f"""
        import threading, sluice
        got = []
        def read(worker):
            with sluice.Reader({c.address!r}, "threads", worker=worker, num_workers=4,
                               resize_shorter_side=64) as r:
                got.append(sum(s.fields["jpg"].shape == (64, 64, 3) for s in r))
        threads = [threading.Thread(target=read, args=(w,)) for w in range(4)]
        for t in threads: t.start()
        for t in threads: t.join()
        print(sum(got), len(got))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [str(SHARDS * PER_SHARD), "4"]
