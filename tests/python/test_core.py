"""sluice._core, the C++ Reader as a Python extension, against the real servers.

It must give a Python trainer what sluice.Reader gives it: the same samples
of the same job, field for field (raw bytes, decoded ints, tensors as
read-only numpy arrays), the same epochs, and a cursor a resume accepts.
"""
import collections

import grpc
import numpy as np
import pytest

import sluice
from sluice import _core
from sluice.v1 import common_pb2, dataserver_pb2


def _core_events(reader):
    out = []
    while True:
        kind, epoch, payload = reader.next()
        out.append((kind, epoch, payload))
        if kind == "done":
            return out


def test_core_reader_gives_the_python_readers_samples(cluster):
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


def test_core_reader_resumes_from_its_cursor(cluster):
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


def test_core_reader_errors_name_the_job(cluster):
    with pytest.raises(RuntimeError, match="no_such_job"):
        reader = _core.Reader(coordinator=cluster.address, job="no_such_job")
        reader.next()
    with pytest.raises(ValueError, match="DecodeSpec"):
        _core.Reader(coordinator=cluster.address, job="x", decode=b"\xff\xff")


def test_core_reader_has_the_python_readers_interface(cluster):
    # sluice.CoreReader over the same job as sluice.Reader over its twin:
    # the same Sample objects, events and counts; a resume from its cursor.
    cluster.create_job("iface_py", world_size=1, epochs=1)
    cluster.create_job("iface_core", world_size=1, epochs=1)
    with sluice.Reader(cluster.address, "iface_py", progress_interval=0.1) as reader:
        want = {(s.shard_index, s.index): s for s in reader}
    with sluice.CoreReader(cluster.address, "iface_core", progress_interval=0.1) as reader:
        begin = reader.next_event()
        assert (begin.kind, begin.epoch, begin.samples_for_rank) == ("epoch_begin", 0,
                                                                     cluster.total)
        got = {}
        for s in reader:
            assert isinstance(s, sluice.Sample)
            w = want[(s.shard_index, s.index)]
            assert (s.key, s.shard_url, s.epoch, s["cls"], s["bin"]) == (
                w.key, w.shard_url, w.epoch, w["cls"], w["bin"])
            got[(s.shard_index, s.index)] = s
        assert reader.stats["delivered"] == cluster.total
    assert set(got) == set(want)
    # A job already done: JobDoneError, as from sluice.Reader.
    with pytest.raises(sluice.JobDoneError):
        with sluice.CoreReader(cluster.address, "iface_core") as reader:
            list(reader)


def test_core_reader_maps_errors_to_reader_errors(cluster):
    with pytest.raises(sluice.ReaderError) as e:
        with sluice.CoreReader(cluster.address, "no_such_job") as reader:
            reader.next_event()
    assert e.value.code == grpc.StatusCode.NOT_FOUND
    assert "no_such_job" in e.value.message


_LOADER_SCRIPT = r"""
import collections, json, sys
import torch
from torch.utils.data import DataLoader
from sluice.torch import ShardLeaseDataset
ds = ShardLeaseDataset(coordinator=sys.argv[1], job=sys.argv[2], core=True)
loader = DataLoader(ds, batch_size=4, num_workers=2)
seen = collections.Counter()
for epoch in range(2):
    for batch in loader:
        for shard, index in zip(batch["__shard__"], batch["__index__"].tolist()):
            seen[(epoch, shard, index)] += 1
print(json.dumps({"samples": len(seen), "most": max(seen.values())}))
"""


def test_dataloader_workers_read_through_the_core_reader(cluster):
    # As a trainer runs it: a fresh process whose DataLoader forks two
    # workers, each of which creates its C++ Reader after the fork.
    import json
    import os
    import subprocess
    import sys
    cluster.create_job("core_loader", world_size=1, epochs=2)
    out = subprocess.run([sys.executable, "-c", _LOADER_SCRIPT, cluster.address, "core_loader"],
                         capture_output=True, text=True, timeout=300, env=dict(os.environ))
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    # Every sample of both epochs, each exactly once.
    assert result == {"samples": 2 * cluster.total, "most": 1}
