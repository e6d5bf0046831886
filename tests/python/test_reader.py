"""sluice.Reader against the real servers: coverage, epochs, resume."""
import collections
import json
import os
import signal
import subprocess
import sys
import time

import pytest

import sluice
from conftest import BIN, Cluster, _wait_for, ready, start_etcd


def test_reader_reads_every_sample_once_per_epoch(cluster):
    cluster.create_job("plain", world_size=1, epochs=2)
    seen = collections.Counter()
    events = []
    with sluice.Reader(cluster.address, "plain", progress_interval=0.1) as reader:
        while True:
            e = reader.next_event(timeout=60)
            if e.kind == "done":
                break
            if e.kind == "sample":
                s = e.sample
                assert s.key == f"s{s.shard_index}_{s.index}"
                assert s["cls"] == s.index   # decoded by default: .cls as int
                assert s["bin"] == bytes([s.shard_index, s.index % 256]) * 50
                seen[(e.epoch, s.shard_index, s.index)] += 1
            else:
                events.append((e.kind, e.epoch))
    assert events == [("epoch_begin", 0), ("epoch_end", 0), ("epoch_begin", 1), ("epoch_end", 1)]
    assert len(seen) == 2 * cluster.total
    assert set(seen.values()) == {1}


@pytest.mark.parametrize("node", [None, "another-node"])
def test_a_reader_names_its_node_and_the_coordinator_counts_locality(cluster, node):
    # The cluster's data server runs on this host and names it (the host
    # name); a Reader names the same node by default, or the one given.
    job = f"node-{node or 'default'}"
    cluster.create_job(job, world_size=1, epochs=1)
    with sluice.Reader(cluster.address, job, node=node) as reader:
        while reader.next_event(timeout=60).kind != "done":
            pass
    out = subprocess.run([os.path.join(BIN, "sluicectl"), "status", "--json",
                          f"--coordinator={cluster.address}", job],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    leases = json.loads(out.stdout)["status"]["leases"]
    where = "samples_other_node" if node else "samples_same_node"
    assert int(leases.get(where, 0)) == cluster.total, leases


def test_reader_without_decode_gives_the_members_bytes(cluster):
    cluster.create_job("raw", world_size=1, epochs=1)
    with sluice.Reader(cluster.address, "raw", decode=False) as reader:
        samples = [s for _, s in zip(range(3), reader)]
    assert [s["cls"] for s in samples] == [str(s.index).encode() for s in samples]


def test_a_reader_given_both_coordinators_follows_the_leader_through_a_kill(tmp_path):
    # Two coordinators share a journal in etcd: the leader serves, the
    # standby listens but is not ready. The Reader is given the standby
    # first; it reads from the leader, and from the standby once the leader
    # is killed and the standby takes over: every sample exactly once.
    from conftest import BIN, Server, _wait_for, write_shards
    etcd, endpoint = start_etcd(str(tmp_path / "etcd"))
    servers = []
    try:
        urls = write_shards(str(tmp_path / "shards"), 6, 17)
        journal = [f"--journal=etcd://{endpoint}/sluice/py", "--election_ttl=1s",
                   "--heartbeat_interval=200ms"]
        leader = Server("sluice-coordinator", str(tmp_path), journal)
        servers.append(leader)
        _wait_for(lambda: ready(leader.address), 30, "the first coordinator to lead")
        standby = Server("sluice-coordinator", str(tmp_path), journal)
        servers.append(standby)
        assert not ready(standby.address)
        both = f"{standby.address},{leader.address}"
        servers.append(Server("sluice-dataserver", str(tmp_path),
                              [f"--roots={tmp_path / 'shards'}", f"--coordinator={both}"]))
        _wait_for(lambda: "sluice_coordinator_data_servers 1" in leader.metric_text(), 30,
                  "the data server to register")
        manifest = tmp_path / "m.json"
        manifest.write_text(json.dumps(
            {"shards": [{"url": u, "num_samples": n} for u, n in urls]}))
        out = subprocess.run(
            [os.path.join(BIN, "sluicectl"), "job", "create",
             f"--coordinator={both}", "--name=ha", f"--manifest={manifest}",
             "--world_size=1", "--epochs=1", "--max_samples_per_lease=10"],
            capture_output=True, text=True)
        assert out.returncode == 0, out.stdout + out.stderr
        seen = collections.Counter()
        with sluice.Reader(both, "ha", progress_interval=0.1) as reader:
            while True:
                e = reader.next_event(timeout=60)
                if e.kind == "done":
                    break
                if e.kind == "sample":
                    seen[(e.sample.shard_index, e.sample.index)] += 1
                    if sum(seen.values()) == 40:
                        leader.kill()  # the leader dies mid-epoch
                        leader.wait()
        assert len(seen) == 6 * 17
        assert set(seen.values()) == {1}
        assert ready(standby.address)
    finally:
        for server in reversed(servers):
            server.stop()
        etcd.terminate()
        etcd.wait()


def test_decoded_fields_are_typed(cluster):
    cluster.create_job("typed", world_size=1, epochs=1)
    with sluice.Reader(cluster.address, "typed", decode=True) as reader:
        samples = list(reader)
    assert len(samples) == cluster.total
    for s in samples:
        assert s["cls"] == s.index          # cls -> int
        d = s.as_dict()
        assert d["__key__"] == s.key and d["__index__"] == s.index
        assert d["__shard__"].endswith(f"shard-{s.shard_index:03d}.tar")


def test_images_decode_to_the_pixels_pil_gives(cluster):
    # What a WebDataset pipeline decoding with PIL (`convert("RGB")`, or the
    # array of a 16-bit PNG) would get, pixel for pixel: RGB, grayscale and
    # CMYK JPEGs (Photoshop-style inverted CMYK; ImageNet has some, which
    # TurboJPEG alone cannot turn into RGB), and a 16-bit PNG.
    import io
    import tarfile
    import numpy as np
    from PIL import Image
    y, x = np.mgrid[0:24, 0:32]
    rgb = np.stack([x * 8, y * 10, (x * y) % 256], axis=-1).astype(np.uint8)
    images = {}
    for mode in ("RGB", "L", "CMYK"):
        buf = io.BytesIO()
        Image.fromarray(rgb).convert(mode).save(buf, format="JPEG", quality=90)
        images[f"{mode.lower()}.jpg"] = buf.getvalue()
    buf = io.BytesIO()
    Image.fromarray((x * 2000 + y * 7).astype(np.uint16)).save(buf, format="PNG")
    images["depth.png"] = buf.getvalue()
    path = os.path.join(cluster.tmp, "shards", "images.tar")
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for field, data in images.items():
            info = tarfile.TarInfo(f"img.{field}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    cluster.create_job("images", extra_shards=[(path, 1)])
    with sluice.Reader(cluster.address, "images", decode=True) as reader:
        got = [s for s in reader if s.key == "img"]
    assert len(got) == 1 and not got[0].skipped, got
    for field, data in images.items():
        want = np.asarray(Image.open(io.BytesIO(data)).convert("RGB")
                          if field.endswith(".jpg") else Image.open(io.BytesIO(data)))
        have = got[0][field]
        if want.ndim == 2:
            want = want[:, :, None]
        assert have.shape == want.shape, field
        assert have.dtype == (np.uint16 if field == "depth.png" else np.uint8), field
        assert np.array_equal(have, want.astype(have.dtype)), field


def test_unknown_job_is_a_final_error(cluster):
    with sluice.Reader(cluster.address, "nope") as reader:
        with pytest.raises(sluice.ReaderError) as err:
            reader.next_event(timeout=30)
    assert err.value.code.name == "NOT_FOUND"
    assert "nope" in err.value.message


def test_cursor_resume_continues_after_the_checkpoint(cluster):
    cluster.create_job("resume", world_size=1, epochs=1, max_samples_per_lease=5)
    first, cursor = [], None
    with sluice.Reader(cluster.address, "resume") as reader:
        for s in reader:
            first.append((s.shard_index, s.index))
            if len(first) == 40:
                cursor = reader.cursor()
            if len(first) == 55:
                break  # 15 samples seen after the checkpoint are lost with the run
    assert list(cursor.consumed_per_rank) == [40]
    with sluice.Reader(cluster.address, "resume", resume_from=cursor,
                       resume_attempt="restart-1") as reader:
        rest = [(s.shard_index, s.index) for s in reader]
    assert len(first[:40]) + len(rest) == cluster.total
    assert sorted(first[:40] + rest) == sorted(
        (s, i) for s in range(6) for i in range(17))


def test_barrier_waits_for_everyone_and_names_the_missing(cluster):
    import threading
    results = {}

    def arrive(i):
        results[i] = sluice.barrier("py-ready", participants=3, participant=f"rank-{i}",
                                    coordinator=cluster.address, timeout=30)
    threads = [threading.Thread(target=arrive, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert results == {i: ["rank-0", "rank-1", "rank-2"] for i in range(3)}
    with pytest.raises(sluice.BarrierTimeout) as err:
        sluice.barrier("py-alone", participants=2, participant="rank-0",
                       coordinator=cluster.address, timeout=0.5)
    assert err.value.arrived == ["rank-0"]
    assert err.value.missing == ["rank-1"]


def test_a_once_block_that_raises_is_run_again_or_fails_everyone_after(cluster):
    # The block's own exception reaches its caller unchanged. By default the
    # next caller runs the step again; under fail_all it hears the failure,
    # naming the run and the error.
    for fail_all in (False, True):
        name = f"py-raises-{fail_all}"
        with pytest.raises(RuntimeError, match="disk full"):
            with sluice.once(name, coordinator=cluster.address, fail_all=fail_all) as step:
                assert step.should_run
                raise RuntimeError("disk full")
        if not fail_all:
            with sluice.once(name, coordinator=cluster.address) as step:
                assert step.should_run and step.run == 2
                step.result = "ok"
            with sluice.once(name, coordinator=cluster.address) as step:
                assert (step.should_run, step.result, step.run) == (False, "ok", 2)
        else:
            with pytest.raises(sluice.OnceFailed, match=r"run 1 failed: RuntimeError: disk full"):
                with sluice.once(name, coordinator=cluster.address, fail_all=True):
                    pass


_ONCE_PARTICIPANT = r"""
import sys
import sluice

address, scope = sys.argv[1], sys.argv[2]
try:
    with sluice.once("held", coordinator=address, scope=scope) as step:
        print("ran" if step.should_run else f"done {step.result}", flush=True)
        if step.should_run:
            sys.stdin.readline()  # holds the step until told
            step.result = "made"
except KeyboardInterrupt:
    print("interrupted", flush=True)
"""


def test_ctrl_c_ends_a_once_wait_and_the_step_goes_on(cluster):
    # A caller waiting on a step another process runs is interrupted: it
    # leaves at once with KeyboardInterrupt (no longer counted as waiting),
    # and the runner's result still reaches the next caller.
    scope = "py-ctrl-c"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))

    def start():
        return subprocess.Popen([sys.executable, "-c", _ONCE_PARTICIPANT, cluster.address, scope],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                env=env)

    def waiting():
        out = subprocess.run([os.path.join(BIN, "sluicectl"), "once", "--list", scope,
                              f"--coordinator={cluster.address}", "--json"],
                             capture_output=True, text=True, timeout=30)
        steps = json.loads(out.stdout or "{}").get("steps", [])
        return int(steps[0].get("waiting", 0)) if steps else 0

    runner = start()
    waiter = None
    try:
        assert runner.stdout.readline().strip() == "ran"
        waiter = start()
        _wait_for(lambda: waiting() == 1, 30, "the second caller to wait")
        waiter.send_signal(signal.SIGINT)
        out, _ = waiter.communicate(timeout=10)
        assert out.strip() == "interrupted" and waiter.returncode == 0
        _wait_for(lambda: waiting() == 0, 30, "the interrupted caller to leave")
        runner.stdin.write("\n")
        runner.stdin.flush()
        assert runner.wait(timeout=30) == 0
        late = start()
        out, _ = late.communicate(timeout=30)
        assert out.strip() == "done made"
    finally:
        for p in (runner, waiter):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()


def test_barrier_still_takes_id_with_a_deprecation_warning(cluster):
    with pytest.warns(DeprecationWarning, match=r"pass participant=\.\.\., as to sluice.once"):
        arrived = sluice.barrier("py-old-id", participants=1, id="rank-0",
                                 coordinator=cluster.address, timeout=30)
    assert arrived == ["rank-0"]
    with pytest.raises(TypeError, match="not both participant= and id="):
        sluice.barrier("py-old-id", participants=1, id="rank-0", participant="rank-0",
                       coordinator=cluster.address)


def test_a_shard_no_server_can_serve_keeps_being_rerouted(cluster, capfd):
    # A manifest entry whose file is gone: the data server answers NOT_FOUND
    # and every re-route of the unit comes back to it. The Reader keeps
    # re-routing it, with the back-off the C++ unit tests pin down on a fake
    # clock, and says so on stderr; everything readable arrives exactly once.
    missing = os.path.join(os.path.dirname(cluster.urls[0][0]), "gone.tar")
    cluster.create_job("gone", extra_shards=[(missing, 5)], shuffle=False)
    with sluice.Reader(cluster.address, "gone") as reader:
        got = 0
        while got < cluster.total:  # everything readable arrives
            e = reader.next_event(timeout=60)
            got += e.kind == "sample"
        before = reader.stats["reroutes"]
        deadline = time.monotonic() + 60
        while reader.stats["reroutes"] < before + 3 and time.monotonic() < deadline:
            with pytest.raises(TimeoutError):
                reader.next_event(timeout=0.5)  # only the missing unit is left
        assert reader.stats["reroutes"] >= before + 3, reader.stats
        assert reader.stats["delivered"] == cluster.total
    err = capfd.readouterr().err
    assert "gone.tar" in err and "NOT_FOUND" in err, err


def test_one_stream_per_data_server_carries_data_at_a_time(tmp_path):
    # Units held ahead are buffered, but per data server one stream carries
    # data at a time (the next opens as the current one reaches its last
    # batch). Were every held unit's stream opened at once, each would stay
    # open on the data server, parked by gRPC flow control (a unit is 10 MB).
    c = Cluster(tmp_path, shards=6, per_shard=100, bin_repeat=50_000)
    try:
        c.create_job("streams")
        most = samples = 0
        with sluice.Reader(c.address, "streams", units_in_flight=4) as reader:
            for _ in reader:
                samples += 1
                text = c.data[0].metric_text()
                line = next(l for l in text.splitlines()
                            if l.startswith("sluice_dataserver_active_streams "))
                most = max(most, int(float(line.split()[1])))
        assert samples == c.total
        assert 1 <= most <= 2, most
    finally:
        c.stop()


def test_closing_a_reader_mid_stream_is_quiet(tmp_path, capfd):
    # A training loop that stops early (`break` after N steps) closes the
    # Reader while its streams still carry data. Closing releases the units
    # with their exact counts and cancels their streams; that is not a
    # data-server failure, so nothing is re-routed or logged, and the next
    # reader gets exactly the rest at once (no lease waits for its TTL).
    c = Cluster(tmp_path, shards=4, per_shard=100, bin_repeat=50_000)
    try:
        c.create_job("stop-early", shuffle_window=1, lease_ttl="60s")  # a unit per shard
        first = []
        with sluice.Reader(c.address, "stop-early", units_in_flight=2) as reader:
            for s in reader:
                first.append((s.shard_index, s.index))
                if len(first) == 11:
                    break
            stats = dict(reader.stats)
        assert stats["reroutes"] == 0, stats
        assert stats["batches"] < 2 * 100, stats  # closed while the units still streamed
        with sluice.Reader(c.address, "stop-early") as reader:
            rest = [(s.shard_index, s.index) for s in reader]
        assert len(rest) == c.total - 11 and not set(first) & set(rest)
        leases = c.lease_counts("stop-early")
        assert leases["expired"] == 0 and leases["returned"] >= 1, leases
        assert capfd.readouterr().err == ""
    finally:
        c.stop()


def _read_epoch(reader, on_sample=None):
    """(shard_index, index) of every sample of one epoch, in delivery order."""
    seen = []
    while True:
        e = reader.next_event(timeout=120)
        if e.kind in ("epoch_end", "done"):
            return seen
        if e.kind == "sample":
            seen.append((e.sample.shard_index, e.sample.index))
            if on_sample is not None:
                on_sample(e.sample, len(seen))


def test_a_slow_consumer_is_not_a_stalled_server(tmp_path):
    # The consumer reads its streams itself: a stream it is not waiting on
    # (a training step longer than stall_timeout) has not stalled, and is
    # not cut. ~100 KB samples: the unit is still streaming during the pause.
    c = Cluster(tmp_path, shards=2, per_shard=60, bin_repeat=50_000)
    try:
        c.create_job("slow-consumer")
        with sluice.Reader(c.address, "slow-consumer", units_in_flight=1,
                           stall_timeout=0.3) as reader:
            def pause(sample, n):
                if n in (5, 70):  # within the first and the second unit
                    time.sleep(0.8)
            seen = _read_epoch(reader, pause)
            stats = collections.Counter(reader.stats)
        assert sorted(seen) == sorted(set(seen)) and len(seen) == c.total
        assert stats["reroutes"] == 0, stats
        assert 2 * 6 <= stats["batches"] <= 2 * 60, stats  # ~1 MiB batches of ~10
    finally:
        c.stop()


def _server_of(cluster, address):
    return next(d for d in cluster.data if d.address == address)


def test_a_data_server_killed_mid_stream_loses_and_repeats_nothing(tmp_path):
    # SIGKILL the data server a unit is streaming from: what was delivered
    # stays delivered, the unit's remainder is re-routed (Reroute with the
    # exact count) and arrives from the other server. A unit is 30 MB, more
    # than the connection buffers ahead.
    c = Cluster(tmp_path, shards=2, per_shard=300, data_servers=2, bin_repeat=50_000)
    try:
        c.create_job("killed-server", shuffle=False)
        killed = []
        with sluice.Reader(c.address, "killed-server", units_in_flight=2) as reader:
            def kill(sample, n):
                if n == 10:
                    victim = _server_of(c, sample.data_server)
                    victim.kill()
                    victim.wait()
                    killed.append(sample.data_server)
            seen = _read_epoch(reader, kill)
            stats = collections.Counter(reader.stats)
        assert killed
        assert len(seen) == c.total and len(set(seen)) == c.total
        assert stats["reroutes"] >= 1, stats
    finally:
        c.stop()


def test_a_stalled_data_server_is_cut_after_stall_timeout(tmp_path):
    # SIGSTOP the data server the consumer is reading from: once the
    # consumer has waited stall_timeout on the stream, it is cancelled and
    # the unit's remainder re-routed to the other server.
    c = Cluster(tmp_path, shards=2, per_shard=300, data_servers=2, bin_repeat=50_000)
    stopped = []
    try:
        c.create_job("stalled-server", shuffle=False)
        with sluice.Reader(c.address, "stalled-server", units_in_flight=2,
                           stall_timeout=1.0) as reader:
            def stop(sample, n):
                if n == 10:
                    victim = _server_of(c, sample.data_server)
                    victim.signal(signal.SIGSTOP)
                    stopped.append(victim)
            start = time.monotonic()
            seen = _read_epoch(reader, stop)
            elapsed = time.monotonic() - start
            stats = collections.Counter(reader.stats)
        assert stopped
        assert len(seen) == c.total and len(set(seen)) == c.total
        assert stats["reroutes"] >= 1, stats
        assert elapsed < 60, elapsed
    finally:
        for victim in stopped:
            victim.signal(signal.SIGCONT)
        c.stop()


def test_a_fork_while_a_reader_streams_leaves_the_child_and_the_reader_working(tmp_path):
    # A process forks (a subprocess launcher, say) while its own Reader is
    # mid-stream: the child starts and exits, and the parent's Reader reads
    # on, its epoch exactly once with nothing re-routed.
    c = Cluster(tmp_path, shards=2, per_shard=300, bin_repeat=50_000)
    try:
        c.create_job("fork-open", shuffle=False)
        with sluice.Reader(c.address, "fork-open", units_in_flight=2) as reader:
            statuses = []

            def fork(sample, n):
                if n in (10, 450):  # in the first unit, and in the second
                    pid = os.fork()
                    if pid == 0:
                        os._exit(7)
                    deadline = time.monotonic() + 30
                    while True:
                        done, status = os.waitpid(pid, os.WNOHANG)
                        if done:
                            statuses.append(os.waitstatus_to_exitcode(status))
                            return
                        if time.monotonic() > deadline:
                            os.kill(pid, signal.SIGKILL)
                            os.waitpid(pid, 0)
                            raise AssertionError("the forked child never started")
                        time.sleep(0.01)
            seen = _read_epoch(reader, fork)
            stats = collections.Counter(reader.stats)
        assert statuses == [7, 7]
        assert len(seen) == c.total and len(set(seen)) == c.total
        assert stats["reroutes"] == 0, stats
    finally:
        c.stop()


_FORKED_COPY = r"""
import gc, os, sys
import sluice

# A process that read (and closed, or still holds) a Reader, then forks: a
# DataLoader starting its workers. The child drops its copy of the parent's
# objects, and uses it by mistake.
reader = sluice.Reader(sys.argv[1], sys.argv[2])
print(sum(1 for _ in zip(range(5), reader)), flush=True)
if sys.argv[3] == "closed":
    reader.close()
pid = os.fork()
if pid == 0:
    try:
        reader.next_event()
        code = 1
    except sluice.ReaderError as e:
        code = 3 if e.code.name == "FAILED_PRECONDITION" and str(os.getppid()) in e.message else 2
    reader = None
    gc.collect()
    os._exit(code)
_, status = os.waitpid(pid, 0)
print(os.waitstatus_to_exitcode(status), flush=True)
print(sum(1 for _ in reader) if sys.argv[3] == "open" else 0, flush=True)
"""


@pytest.mark.parametrize("state", ["open", "closed"])
def test_a_forked_child_drops_its_copy_of_the_parents_reader(cluster, state):
    # The child's copy of a Reader has no threads behind it: using it is
    # FAILED_PRECONDITION naming the parent, and freeing it must not wait for
    # threads that only the parent has (it used to hang the DataLoader
    # workers forked after a Reader). The parent's Reader reads on.
    job = f"forked-copy-{state}"
    cluster.create_job(job)
    proc = subprocess.Popen([sys.executable, "-c", _FORKED_COPY, cluster.address, job, state],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the child too
        out, err = proc.communicate()
        pytest.fail(f"the fork did not finish within 60 s; it printed {out.split()}")
    assert proc.returncode == 0, err
    first, child, rest = (int(x) for x in out.split())
    assert (first, child) == (5, 3)
    assert rest == (cluster.total - 5 if state == "open" else 0)


_LOADER_BESIDE_A_READER = r"""
import sys
from torch.utils.data import DataLoader
import sluice, sluice.torch
from sluice.torch import ShardLeaseDataset

# The training process reads through a Reader of its own (open), then
# starts DataLoader workers over another job.
address, job_a, job_b, which = sys.argv[1:5]
reader = sluice.Reader(address, job_a)
it = iter(reader)
first = [next(it).key for _ in range(5)]
ds = ShardLeaseDataset(coordinator=address, job=job_b)
loader_class = sluice.torch.DataLoader if which == "sluice" else DataLoader
try:
    keys = [k for batch in loader_class(ds, batch_size=4, num_workers=2)
            for k in batch["__key__"]]
    print(len(keys), len(set(keys)))
except RuntimeError as e:
    print("error", str(e).replace("\n", " "))
print(len(first) + sum(1 for _ in it))
reader.close()
"""


@pytest.mark.parametrize("loader", ["sluice", "torch"])
def test_dataloader_workers_beside_an_open_reader(cluster, loader):
    # Workers forked while the process has a Reader open could not start
    # gRPC (its threads were busy at the fork): a Reader made there would
    # wait forever. sluice.torch.DataLoader starts them with forkserver
    # then; under torch's own DataLoader each worker fails at once, saying
    # why and what to do. The process's own Reader reads on either way.
    job_a, job_b = f"beside-{loader}-a", f"beside-{loader}-b"
    cluster.create_job(job_a)
    cluster.create_job(job_b)
    proc = subprocess.Popen([sys.executable, "-c", _LOADER_BESIDE_A_READER, cluster.address,
                             job_a, job_b, loader], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"the loader did not finish within 120 s; it printed {out!r}")
    assert proc.returncode == 0, err[-3000:]
    lines = out.strip().splitlines()
    if loader == "sluice":
        assert lines[0] == f"{cluster.total} {cluster.total}"
    else:
        assert lines[0].startswith("error") and "forked from process" in lines[0], lines
        assert "'spawn' or 'forkserver'" in lines[0], lines
    assert lines[1] == str(cluster.total)


_INTERRUPTED = r"""
import sys
import sluice

n = 0
try:
    with sluice.Reader(sys.argv[1], sys.argv[2]) as reader:
        for _ in reader:
            n += 1
            if n == 20:
                print("reading", flush=True)
except KeyboardInterrupt:
    print("interrupted", flush=True)
"""


def test_ctrl_c_while_waiting_on_a_stalled_data_server_exits_at_once(tmp_path):
    # Ctrl-C in a training loop whose data server hangs: the loop's thread is
    # inside gRPC waiting for the stream. KeyboardInterrupt must reach the
    # program, and closing the Reader on the way out must not wait for the
    # interrupted stream.
    c = Cluster(tmp_path, shards=2, per_shard=300, bin_repeat=50_000)
    proc = None
    try:
        c.create_job("interrupted")
        proc = subprocess.Popen([sys.executable, "-c", _INTERRUPTED, c.address, "interrupted"],
                                stdout=subprocess.PIPE, text=True,
                                env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
        assert proc.stdout.readline().strip() == "reading"
        c.data[0].signal(signal.SIGSTOP)
        # Until the consumer has drained what was sent and waits on the stream.
        sent = time.monotonic()
        deadline = sent + 30
        while not _waiting_in_grpc(proc.pid):
            assert time.monotonic() < deadline, "the reader never waited on the stream"
            time.sleep(0.01)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=10)
        assert out.strip() == "interrupted"
        assert proc.returncode == 0
    finally:
        c.data[0].signal(signal.SIGCONT)
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        c.stop()


def _waiting_in_grpc(pid):
    """Whether the process's main thread sleeps on a futex: the C++ Reader
    waiting for the stream's next batch (the loop's thread holds no Python
    lock another thread could keep it waiting on)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/wchan") as f:
            return "futex" in f.read()
    except OSError:
        return False


_EXIT_WITHOUT_CLOSE = r"""
import sys
import sluice

def samples():  # the Reader stays open in the suspended generator
    with sluice.Reader(sys.argv[1], sys.argv[2], progress_interval=60) as reader:
        yield from reader

it = samples()
for _ in range(int(sys.argv[3])):
    s = next(it)
    print(s.shard_index, s.index, flush=True)
"""


def test_a_program_that_exits_without_closing_its_reader_exits_and_reports(cluster):
    """A training script that breaks out of a generator wrapping the Reader
    and ends: the interpreter must exit (grpc's channel close, run by the
    garbage collector at shutdown, used to wait forever for threads that no
    longer ran), and what it consumed is reported and the rest released at
    exit: another reader gets exactly the remainder long before the 60 s
    lease TTL would have returned it."""
    cluster.create_job("exit-open", world_size=1, epochs=1, lease_ttl="60s")
    proc = subprocess.Popen([sys.executable, "-c", _EXIT_WITHOUT_CLOSE, cluster.address,
                             "exit-open", "30"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        out, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail("the program did not exit within 30 s of its last sample")
    assert proc.returncode == 0, err
    first = [tuple(map(int, line.split())) for line in out.strip().splitlines()]
    assert len(first) == 30
    with sluice.Reader(cluster.address, "exit-open") as reader:
        rest = [(s.shard_index, s.index) for s in reader]
    leases = cluster.lease_counts("exit-open")
    assert leases["expired"] == 0, f"units waited for their lease TTL: {leases}"
    assert leases["returned"] >= 1, leases
    assert len(rest) == cluster.total - 30
    assert sorted(first + rest) == sorted(set(first + rest))
    assert len(set(first + rest)) == cluster.total


_EXIT_AFTER_A_FAILED_CONNECTION = """
import socket, sys
import sluice
s = socket.socket()
s.bind(("127.0.0.1", 0))
port = s.getsockname()[1]
s.close()  # nothing listens there: the connection is refused
try:
    sluice.barrier("b", participants=1, participant="only",
                   coordinator=f"127.0.0.1:{port}", timeout=1)
except ConnectionError as e:
    print("refused:", e, flush=True)
"""


def test_a_program_exits_cleanly_while_grpc_waits_to_reconnect():
    """A connection that failed leaves gRPC a reconnect timer (about 1 s)
    that holds its event engine; the engine must go before exit() frees
    gRPC's statics, or the timer's thread destroys it after them and a
    program that did its work dies with SIGSEGV. exit_delay.so holds the
    process in exit() past the timer, so an engine left to the timer is
    destroyed there every time."""
    env = dict(os.environ, LD_PRELOAD=os.path.join(BIN, "exit_delay.so"),
               SLUICE_EXIT_DELAY_MS="2500")
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", _EXIT_AFTER_A_FAILED_CONNECTION],
                             capture_output=True, text=True, env=env, timeout=60)
        assert out.returncode == 0, out.stdout + out.stderr
        assert out.stdout.startswith("refused: barrier default/b: UNAVAILABLE"), out.stdout


def test_merge_cursors_joins_the_source_names_each_rank_saw():
    from sluice.v1 import common_pb2
    a = common_pb2.Cursor(job="mix", epoch=1, world_size=2, consumed_per_rank=[40, -1],
                          sources=["web", ""])
    b = common_pb2.Cursor(job="mix", epoch=1, world_size=2, consumed_per_rank=[-1, 38],
                          sources=["", "books"])
    merged = sluice.merge_cursors([a, b])
    assert list(merged.consumed_per_rank) == [40, 38]
    assert list(merged.sources) == ["web", "books"]
    b.sources[0] = "news"
    with pytest.raises(ValueError, match='names source 0 "news", another cursor "web"'):
        sluice.merge_cursors([a, b])


def _input_wait_count(cluster, job):
    for line in cluster.coordinator.metric_text().splitlines():
        if line.startswith(f'sluice_trainer_input_wait_seconds_count{{sluice_job="{job}"}}'):
            return int(float(line.split()[1]))
    return None


def test_the_consumers_input_wait_reaches_the_coordinator(cluster):
    # One observation per sample handed over, reported in heartbeats (and at
    # close): the coordinator's histogram counts exactly the samples taken,
    # and the rank's total in the status is the reader's own.
    cluster.create_job("input-wait", epochs=2)
    taken = 0
    with sluice.Reader(cluster.address, "input-wait") as reader:
        while True:
            e = reader.next_event(timeout=60)
            taken += e.kind == "sample"
            if e.kind == "epoch_end":
                break
        assert taken == cluster.total
        # The first sample of the epoch cannot have been buffered.
        assert reader.stats["input_wait_seconds"] > 0
        _wait_for(lambda: _input_wait_count(cluster, "input-wait") == taken, 30,
                  "the heartbeats to report every sample")
        for _ in range(5):  # reported when the reader closes
            taken += reader.next_event(timeout=60).kind == "sample"
    assert _input_wait_count(cluster, "input-wait") == taken
    ctl = [os.path.join(BIN, "sluicectl"), "status", "input-wait",
           f"--coordinator={cluster.address}"]
    out = subprocess.run(ctl + ["--json"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    rank0 = json.loads(out.stdout)["status"]["ranks"][0]
    assert rank0["input_wait_seconds"] == pytest.approx(reader.stats["input_wait_seconds"],
                                                        rel=1e-9)
    out = subprocess.run(ctl, capture_output=True, text=True)
    assert f"input wait {reader.stats['input_wait_seconds']:.1f}s" in out.stdout, out.stdout


def test_sluicectl_reads_report_their_input_wait_too(cluster):
    # The C++ Reader behind `sluicectl read`: one observation per sample
    # taken, the last ones sent when it closes after its epoch.
    cluster.create_job("input-wait-cpp", epochs=2)
    out = subprocess.run([os.path.join(BIN, "sluicectl"), "read", "--job=input-wait-cpp",
                          "--read_epochs=1", f"--coordinator={cluster.address}"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert len(out.stdout.splitlines()) == cluster.total
    assert _input_wait_count(cluster, "input-wait-cpp") == cluster.total


def _served(server):
    """Samples a data server served, summed over its series."""
    return sum(float(line.rsplit(" ", 1)[1]) for line in server.metric_text().splitlines()
               if line.startswith("sluice_dataserver_samples_served_total"))


def test_a_job_of_a_pool_reads_only_from_that_pools_servers(cluster):
    from conftest import Server
    gpu = Server("sluice-dataserver", os.path.join(cluster.tmp, "gpu"),
                 [f"--roots={os.path.join(cluster.tmp, 'shards')}",
                  f"--coordinator={cluster.address}", "--pool=gpu"])
    try:
        cluster.create_job("pooled", world_size=1, epochs=1, extra=["--pool=gpu"])
        before = _served(cluster.data[0])
        with sluice.Reader(cluster.address, "pooled") as reader:
            keys = [s.key for s in reader]
        assert len(keys) == cluster.total and len(set(keys)) == cluster.total
        assert _served(gpu) == cluster.total
        assert _served(cluster.data[0]) == before
        out = subprocess.run([os.path.join(BIN, "sluicectl"), "job", "create",
                              f"--coordinator={cluster.address}", "--name=badpool",
                              f"--manifest={os.path.join(cluster.tmp, 'pooled.json')}",
                              "--pool=no spaces"], capture_output=True, text=True, timeout=30)
        assert out.returncode != 0
        assert "INVALID_ARGUMENT" in out.stderr and "spec.pool" in out.stderr, out.stderr
    finally:
        gpu.stop()
