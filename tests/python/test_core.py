"""sluice._core, the C++ Reader as the Python extension under sluice.Reader,
against the real servers: its raw events carry every field as sluice.Reader
hands it on (raw bytes, ints, tensors as read-only numpy arrays), its cursor
resumes, its errors name what failed, and want()/next(timeout) do what the
Python API promises.
"""
import collections
import signal

import grpc
import numpy as np
import pytest

import sluice
from sluice import _core
from sluice._types import core_status
from sluice.v1 import common_pb2, dataserver_pb2


def _core_events(reader):
    out = []
    while True:
        kind, epoch, payload = reader.next()
        out.append((kind, epoch, payload))
        if kind == "done":
            return out


def test_the_binding_gives_the_readers_samples_field_for_field(cluster):
    cluster.create_job("core_same", world_size=1, epochs=2)
    expected = collections.Counter()
    fields = {}
    with sluice.Reader(cluster.address, "core_same", progress_interval=0.1) as reader:
        for e in iter(lambda: reader.next_event(timeout=60), None):
            if e.kind == "done":
                break
            if e.kind == "sample":
                s = e.sample
                expected[(e.epoch, s.shard_index, s.index, s.key)] += 1
                fields[(s.shard_index, s.index)] = dict(s.fields)

    cluster.create_job("core_same2", world_size=1, epochs=2)
    # The Python Reader's default decoding, as a serialized DecodeSpec.
    spec = dataserver_pb2.DecodeSpec(decode=True)
    core = _core.Reader(coordinator=cluster.address, job="core_same2",
                        decode=spec.SerializeToString(), progress_interval=0.1)
    got = collections.Counter()
    kinds = []
    for kind, epoch, payload in _core_events(core):
        if kind != "sample":
            kinds.append((kind, epoch))
            continue
        got[(epoch, payload["shard_index"], payload["index"], payload["key"])] += 1
        want = fields[(payload["shard_index"], payload["index"])]
        assert set(payload["fields"]) == set(want)
        for name, value in payload["fields"].items():
            if isinstance(want[name], np.ndarray):
                assert isinstance(value, np.ndarray) and not value.flags.writeable
                np.testing.assert_array_equal(value, want[name])
            else:
                assert value == want[name] and type(value) is type(want[name])
    core.close()
    assert kinds == [("epoch_begin", 0), ("epoch_end", 0), ("epoch_begin", 1),
                     ("epoch_end", 1), ("done", 2)]
    # The same seed and manifest: the same samples, each once per epoch.
    assert got == expected
    assert len(got) == 2 * cluster.total and set(got.values()) == {1}
    stats = core.stats()
    assert stats["delivered"] == 2 * cluster.total


def test_the_binding_resumes_from_its_cursor(cluster):
    cluster.create_job("core_resume", world_size=1, epochs=1)
    first = _core.Reader(coordinator=cluster.address, job="core_resume", progress_interval=0.1)
    seen = []
    while len(seen) < 30:
        kind, epoch, payload = first.next()
        if kind == "sample":
            seen.append((payload["shard_index"], payload["index"]))
    cursor = common_pb2.Cursor.FromString(first.cursor())
    assert cursor.job == "core_resume" and list(cursor.consumed_per_rank) == [30]
    first.close()

    second = _core.Reader(coordinator=cluster.address, job="core_resume",
                          resume_from=cursor.SerializeToString(), resume_attempt="one")
    rest = [(p["shard_index"], p["index"]) for k, _, p in _core_events(second) if k == "sample"]
    second.close()
    # Every sample of the epoch exactly once over the two runs.
    assert len(seen) + len(rest) == cluster.total
    assert len(set(seen) | set(rest)) == cluster.total


def test_the_bindings_errors_name_the_job(cluster):
    with pytest.raises(RuntimeError, match="no_such_job"):
        reader = _core.Reader(coordinator=cluster.address, job="no_such_job")
        reader.next()
    with pytest.raises(ValueError, match="DecodeSpec"):
        _core.Reader(coordinator=cluster.address, job="x", decode=b"\xff\xff")


def test_the_readers_errors_carry_the_status_code(cluster):
    with pytest.raises(sluice.ReaderError) as e:
        with sluice.Reader(cluster.address, "no_such_job") as reader:
            reader.next_event()
    assert e.value.code == grpc.StatusCode.NOT_FOUND
    assert "no_such_job" in e.value.message


def test_the_bindings_errors_are_read_back_as_a_code_and_a_message(cluster):
    with pytest.raises(RuntimeError) as e:
        _core.Reader(coordinator=cluster.address, job="no_such_job").next()
    code, message = core_status(e.value)
    assert code == grpc.StatusCode.NOT_FOUND
    assert "no_such_job" in message and not message.startswith("NOT_FOUND")
    # Text that names no status code stays whole, as UNKNOWN.
    assert core_status(RuntimeError("NOPE: not a code")) == (grpc.StatusCode.UNKNOWN,
                                                            "NOPE: not a code")
    assert core_status(RuntimeError("plain")) == (grpc.StatusCode.UNKNOWN, "plain")


def test_want_zero_takes_no_new_work_until_asked_again(cluster):
    # One unit per shard; one held at a time. After want(0) the units held
    # are still delivered, then nothing more is granted (the coordinator
    # counts the leases) until want(2).
    cluster.create_job("want", world_size=1, epochs=1, shuffle_window=1)
    with sluice.Reader(cluster.address, "want", units_in_flight=1) as reader:
        reader.want(0)
        first = []
        with pytest.raises(TimeoutError):
            while True:
                e = reader.next_event(timeout=1.0)
                if e.kind == "sample":
                    first.append((e.sample.shard_index, e.sample.index))
        per_shard = cluster.total // len(cluster.urls)
        assert len(first) in (0, per_shard), first
        granted = cluster.lease_counts("want")["granted"]
        assert granted == len(first) // per_shard
        reader.want(2)
        rest = [(s.shard_index, s.index) for s in reader]
    assert sorted(first + rest) == sorted(set(first + rest))
    assert len(first + rest) == cluster.total


def test_a_timed_out_wait_is_not_final_and_counts_as_input_wait(cluster):
    # next_event(timeout) while the only data server is stopped: the epoch
    # begins, then TimeoutError; the reader goes on once the server does,
    # and the time spent waiting is the loop's input wait.
    cluster.create_job("timeouts", world_size=1, epochs=1)
    server = cluster.data[0]
    server.signal(signal.SIGSTOP)
    try:
        with sluice.Reader(cluster.address, "timeouts") as reader:
            kinds = []
            with pytest.raises(TimeoutError):
                for _ in range(10):
                    kinds.append(reader.next_event(timeout=0.5).kind)
            assert kinds == ["epoch_begin"]
            server.signal(signal.SIGCONT)
            got = [s.key for s in reader]
            assert len(got) == len(set(got)) == cluster.total
            assert reader.stats["input_wait_seconds"] >= 0.5, reader.stats
    finally:
        server.signal(signal.SIGCONT)


def test_message_modules_imported_after_the_binding_loaded_still_nest_messages():
    # The binding's C++ copy of the .proto files must not shadow the Python
    # modules imported after it: a fresh interpreter loads sluice._core first.
    import subprocess
    import sys
    code = ("from sluice import _core\n"
            "from sluice.v1 import common_pb2, coordinator_pb2, dataserver_pb2\n"
            "spec = coordinator_pb2.JobSpec(manifest=common_pb2.Manifest(\n"
            "    shards=[common_pb2.Shard(url='/a.tar', num_samples=3)]))\n"
            "request = coordinator_pb2.CreateJobRequest(spec=spec)\n"
            "read = dataserver_pb2.ReadRequest(lease=common_pb2.Lease(job='j'))\n"
            "print(request.spec.manifest.shards[0].num_samples, read.lease.job)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["3", "j"]
