"""Hostile input against the real binaries: every request below gets its
documented status, none echoes its input whole, and the servers stay
healthy throughout (Health answered within a second while the bad calls
run) and small (resident memory under a stated bound).
"""
import os
import threading
import time

import grpc
import pytest

from sluice.grpc_health.v1 import health_pb2, health_pb2_grpc
from sluice.v1 import common_pb2, coordinator_pb2, coordinator_pb2_grpc, dataserver_pb2

from conftest import Cluster

RSS_BOUND = 1 << 30  # bytes, each server


def _rss(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return -1


class _HealthWatch:
    """Asks a server's Health every 50 ms on its own thread; the slowest
    answer (a failure counts as infinitely slow) is `worst`."""

    def __init__(self, address):
        self.channel = grpc.insecure_channel(address)
        self.stub = health_pb2_grpc.HealthStub(self.channel)
        self.worst = 0.0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.stop.is_set():
            start = time.monotonic()
            try:
                self.stub.Check(health_pb2.HealthCheckRequest(), timeout=5)
                took = time.monotonic() - start
            except grpc.RpcError:
                took = float("inf")
            self.worst = max(self.worst, took)
            self.stop.wait(0.05)

    def close(self):
        self.stop.set()
        self.thread.join()
        self.channel.close()


@pytest.fixture(scope="module")
def probed(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("probe"), shards=2, per_shard=10, lease_secret=True)
    yield c
    c.stop()


def _code(call):
    try:
        call()
    except grpc.RpcError as e:
        return e.code(), e.details() or ""
    return grpc.StatusCode.OK, ""


def test_hostile_requests_get_their_codes_and_the_servers_stay_healthy(probed):
    watches = [_HealthWatch(probed.address), _HealthWatch(probed.data[0].address)]
    channel = grpc.insecure_channel(probed.address,
                                    options=[("grpc.max_send_message_length", 64 << 20)])
    stub = coordinator_pb2_grpc.CoordinatorStub(channel)
    huge = "x" * (1 << 20)
    shard = common_pb2.Shard(url="/d/a.tar", num_samples=10)

    def create(**spec):
        spec.setdefault("name", "probe")
        if "manifest_path" not in spec:
            spec.setdefault("manifest", common_pb2.Manifest(shards=[shard]))
        return lambda: stub.CreateJob(coordinator_pb2.CreateJobRequest(
            spec=coordinator_pb2.JobSpec(**spec)), timeout=10, metadata=probed.admin_metadata)

    secret = os.path.join(probed.tmp, "lease.secret")
    cases = [
        ("manifest_path of the lease secret", create(manifest_path=secret),
         grpc.StatusCode.INVALID_ARGUMENT),
        ("manifest_path /dev/zero", create(manifest_path="/dev/zero"),
         grpc.StatusCode.INVALID_ARGUMENT),
        ("world_size 2^31-1", create(world_size=2 ** 31 - 1), grpc.StatusCode.INVALID_ARGUMENT),
        ("10^12 samples in units of 1",
         create(manifest=common_pb2.Manifest(shards=[
             common_pb2.Shard(url="/d/a.tar", num_samples=10 ** 12)]),
             max_samples_per_lease=1),
         grpc.StatusCode.INVALID_ARGUMENT),
        ("num_samples overflowing int64",
         create(manifest=common_pb2.Manifest(shards=[
             common_pb2.Shard(url=f"/d/{i}.tar", num_samples=2 ** 62) for i in range(3)])),
         grpc.StatusCode.INVALID_ARGUMENT),
        ("a 1 MB job name", create(name=huge), grpc.StatusCode.INVALID_ARGUMENT),
        ("Barrier of 2^31-1 participants",
         lambda: stub.Barrier(coordinator_pb2.BarrierRequest(
             scope="s", name="b", participant="p", participants=2 ** 31 - 1, timeout_ms=10),
             timeout=10),
         grpc.StatusCode.INVALID_ARGUMENT),
        ("CreateJob without the operator token",
         lambda: stub.CreateJob(coordinator_pb2.CreateJobRequest(spec=coordinator_pb2.JobSpec(
             name="anonymous", manifest=common_pb2.Manifest(shards=[shard]))), timeout=10),
         grpc.StatusCode.UNAUTHENTICATED),
        ("DeleteJob with a guessed token",
         lambda: stub.DeleteJob(coordinator_pb2.DeleteJobRequest(name="probe"), timeout=10,
                                metadata=(("authorization", "Bearer guess"),)),
         grpc.StatusCode.PERMISSION_DENIED),
        ("GetJob of a 1 MB name",
         lambda: stub.GetJob(coordinator_pb2.GetJobRequest(name=huge), timeout=10),
         grpc.StatusCode.NOT_FOUND),
    ]
    data = dataserver_pb2
    data_channel = grpc.insecure_channel(probed.data[0].address)
    read = data_channel.unary_stream("/sluice.v1.DataServer/ReadSamples",
                                     request_serializer=data.ReadRequest.SerializeToString,
                                     response_deserializer=data.SampleBatch.FromString)
    forged = common_pb2.Lease(lease_id="forged", job="j", fence=1, token=b"\0" * 32,
                              unit=common_pb2.WorkUnit(
                                  shard=common_pb2.ShardRange(url=probed.urls[0][0]), begin=0,
                                  end=1))
    cases.append(("a forged lease token",
                  lambda: list(read(data.ReadRequest(lease=forged), timeout=10)),
                  grpc.StatusCode.PERMISSION_DENIED))
    # A 1 MB lease id, job and shard URL without a token, and with a forged
    # one: refused, each quoted by its first bytes only.
    tokenless = common_pb2.Lease(lease_id=huge, job=huge, fence=1,
                                 unit=common_pb2.WorkUnit(
                                     shard=common_pb2.ShardRange(url="/" + huge), begin=0, end=1))
    cases.append(("a 1 MB lease id without a token",
                  lambda: list(read(data.ReadRequest(lease=tokenless), timeout=10)),
                  grpc.StatusCode.PERMISSION_DENIED))
    forged_huge = common_pb2.Lease()
    forged_huge.CopyFrom(tokenless)
    forged_huge.token = b"\0" * 32
    cases.append(("a 1 MB lease id with a forged token",
                  lambda: list(read(data.ReadRequest(lease=forged_huge), timeout=10)),
                  grpc.StatusCode.PERMISSION_DENIED))
    # A registration claiming fences near 2^64 (the secret's credential
    # comes first, so without it the claim is never looked at).
    fence_claim = stub.RegisterDataServer(iter([coordinator_pb2.DataServerMessage(
        register=coordinator_pb2.RegisterDataServer(address="10.9.9.9:1",
                                                    max_fence_seen=2 ** 64 - 2))]), timeout=10)
    cases.append(("a registration claiming fence 2^64-2 without credential",
                  lambda: list(fence_claim), grpc.StatusCode.UNAUTHENTICATED))
    # A registration without the lease secret's credential.
    register = stub.RegisterDataServer(iter([coordinator_pb2.DataServerMessage(
        register=coordinator_pb2.RegisterDataServer(address="10.9.9.9:1",
                                                    capacity=2 ** 31 - 1))]), timeout=10)
    cases.append(("a registration without credential", lambda: list(register),
                  grpc.StatusCode.UNAUTHENTICATED))
    try:
        for what, call, want in cases:
            code, details = _code(call)
            assert code == want, f"{what}: {code} {details[:200]}"
            assert len(details) < 1000, f"{what}: a {len(details)}-byte message"
            with open(secret) as f:
                assert f.read().strip() not in details, f"{what}: the secret leaked"
        for w in watches:
            assert w.worst < 1.0, f"Health took {w.worst:.2f}s during the probe"
        assert _rss(probed.coordinator.pid) < RSS_BOUND
        assert _rss(probed.data[0].pid) < RSS_BOUND
    finally:
        for w in watches:
            w.close()
        channel.close()
        data_channel.close()
