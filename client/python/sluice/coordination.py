"""Once and Barrier: run a step on exactly one process, wait for N processes.

    with sluice.once("prepare-cifar", coordinator="head:7070") as step:
        if step.should_run:
            download_and_preprocess("/data/cifar")
            step.result = "/data/cifar"        # announced to the others
    # here every caller knows the step is done; step.result is the runner's

    sluice.barrier("checkpoint-dir-ready", participants=world,
                   participant=f"rank-{rank}", coordinator="head:7070", timeout=60)

A runner that dies (its stream breaks or its heartbeats stop for the TTL)
hands the step to the next waiter; a step that raised is reported to the
others and (by default) run again by one of them. Completion is journaled by
the coordinator, so a restart never re-runs a finished step. The coordinator
address defaults to $SLUICE_COORDINATOR.

Names live in a scope. The default scope is $SLUICE_SCOPE, else the
launcher's run: torchrun's rendezvous id and restart count, SLURM's job id
and restart count, Open MPI's job id (sluice/_launcher.py); outside those,
"default", shared by every run. So a step done in one run (or one restart of
it) is not taken as done by the next; pass scope= to share it across runs.
"""
import os
import queue
import socket
import threading
import warnings

import grpc

from sluice import _launcher, tls
from sluice.v1 import common_pb2, coordinator_pb2, coordinator_pb2_grpc

CHANNEL_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    # Keepalive: a stopped or silently cut-off coordinator fails the calls
    # within about 4 s (as the C++ client's SetStreamKeepalive); the servers
    # accept pings this often.
    ("grpc.keepalive_time_ms", 2000),
    ("grpc.keepalive_timeout_ms", 2000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
]


class OnceFailed(Exception):
    """The step failed (under fail_all), or the coordinator refused the call."""


class BarrierTimeout(Exception):
    """Not everyone arrived in time. `arrived` and `missing` name the ids."""

    def __init__(self, message, arrived=(), missing=()):
        super().__init__(message)
        self.arrived = list(arrived)
        self.missing = list(missing)


def _address(coordinator):
    address = coordinator or os.environ.get("SLUICE_COORDINATOR", "")
    if not address:
        raise ValueError("no coordinator: pass coordinator='host:port' or set SLUICE_COORDINATOR")
    return address


def _participant(participant):
    return participant or f"{socket.gethostname()}/{os.getpid()}"


class _Step:
    def __init__(self, should_run, result, run):
        self.should_run = should_run
        self.result = result
        self.run = run


class once:  # noqa: N801 (used as a context manager: `with sluice.once(...)`)
    """Context manager: `step.should_run` is True on exactly one caller at a
    time; the others block in __enter__ until the step is done (then
    should_run is False and step.result is the runner's result). An exception
    inside the block reports the run as failed. TLS: ca_cert / client_cert /
    client_key PEM paths (or SLUICE_CA_CERT ...; see sluice.tls)."""

    def __init__(self, name, *, coordinator=None, scope=None, participant=None, ttl=10.0,
                 fail_all=False, timeout=None, ca_cert=None, client_cert=None, client_key=None):
        self._name, self._scope = name, scope or _launcher.default_scope()
        self._credentials = tls.channel_credentials(ca_cert, client_cert, client_key)
        self._address = _address(coordinator)
        self._participant = _participant(participant)
        self._ttl, self._fail_all, self._timeout = ttl, fail_all, timeout
        self._out = None
        self._call = None
        self._channel = None
        self._heartbeats = None
        self._stop = threading.Event()
        self._run = 0
        self.step = None

    def __enter__(self):
        # Keepalive (CHANNEL_OPTIONS): a stopped coordinator fails the stream
        # within about 4 s instead of holding every waiter for its stop.
        self._channel = tls.coordinator_channel(self._address, self._credentials,
                                                CHANNEL_OPTIONS)
        stub = coordinator_pb2_grpc.CoordinatorStub(self._channel)
        self._out = queue.Queue()
        join = coordinator_pb2.OnceRequest(join=coordinator_pb2.OnceJoin(
            scope=self._scope, name=self._name, participant=self._participant,
            ttl_ms=int(self._ttl * 1000),
            on_failure=(coordinator_pb2.ONCE_FAILURE_POLICY_FAIL_ALL if self._fail_all
                        else coordinator_pb2.ONCE_FAILURE_POLICY_RETRY)))
        self._out.put(join)

        def requests():
            while True:
                m = self._out.get()
                if m is None:
                    return
                yield m

        self._call = stub.Once(requests(), timeout=self._timeout)
        self._responses = iter(self._call)
        try:
            for r in self._responses:
                kind = r.WhichOneof("msg")
                if kind == "done":
                    self._finish()
                    self.step = _Step(False, r.done.result, r.done.run)
                    return self.step
                if kind == "run":
                    self._run = r.run.run
                    interval = max(0.05, r.run.heartbeat_interval_ms / 1000)
                    self._heartbeats = threading.Thread(target=self._beat, args=(interval,),
                                                        daemon=True)
                    self._heartbeats.start()
                    self.step = _Step(True, "", r.run.run)
                    return self.step
                # wait / error (under RETRY): keep waiting on the stream
        except grpc.RpcError as e:
            self._finish()
            details = e.details()
            if e.code() == grpc.StatusCode.UNAVAILABLE:
                details = tls.transport_mismatch("coordinator", self._address,
                                                 self._credentials is not None) or details
            raise OnceFailed(f"once {self._scope}/{self._name}: {e.code().name}: {details}") from e
        self._finish()
        raise OnceFailed(f"once {self._scope}/{self._name}: the coordinator closed the stream")

    def _beat(self, interval):
        while not self._stop.wait(interval):
            self._out.put(coordinator_pb2.OnceRequest(heartbeat=coordinator_pb2.Heartbeat()))

    def __exit__(self, exc_type, exc, tb):
        if self.step is None or not self.step.should_run:
            return False
        self._stop.set()
        if exc_type is None:
            self._out.put(coordinator_pb2.OnceRequest(succeeded=coordinator_pb2.OnceSucceeded(
                run=self._run, result=str(self.step.result or ""))))
        else:
            self._out.put(coordinator_pb2.OnceRequest(failed=coordinator_pb2.OnceFailed(
                run=self._run, error=f"{exc_type.__name__}: {exc}")))
        try:
            for r in self._responses:  # Done (or Error) confirms it is journaled
                if r.WhichOneof("msg") in ("done", "error"):
                    break
        except grpc.RpcError as e:
            if exc_type is None:
                raise OnceFailed(f"once {self._scope}/{self._name}: reporting success: "
                                 f"{e.code().name}: {e.details()}") from e
        finally:
            self._finish()
        return False

    def _finish(self):
        self._stop.set()
        if self._out is not None:
            self._out.put(None)
        if self._channel is not None:
            self._channel.close()


def barrier(name, *, participants, participant=None, coordinator=None, scope=None,
            timeout=60.0, ca_cert=None, client_cert=None, client_key=None, id=None):
    """Blocks until `participants` distinct participant ids arrived; returns
    the arrived ids. `participant` is this caller's id, as in once() (default
    host/pid); `id=` is its former name, still accepted with a
    DeprecationWarning. BarrierTimeout names who is missing. TLS as for
    once()."""
    if id is not None:
        if participant is not None:
            raise TypeError("barrier: give participant=, not both participant= and id=")
        warnings.warn("sluice.barrier(id=...) is deprecated: pass participant=..., as to "
                      "sluice.once()", DeprecationWarning, stacklevel=2)
        participant = id
    address = _address(coordinator)
    scope = scope or _launcher.default_scope()
    credentials = tls.channel_credentials(ca_cert, client_cert, client_key)
    with tls.coordinator_channel(address, credentials, CHANNEL_OPTIONS) as channel:
        stub = coordinator_pb2_grpc.CoordinatorStub(channel)
        request = coordinator_pb2.BarrierRequest(
            scope=scope, name=name, participant=_participant(participant),
            participants=participants,
            timeout_ms=int(timeout * 1000))
        try:
            response = stub.Barrier(request, timeout=timeout + 10)
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                arrived, missing = [], []
                for key, value in (e.trailing_metadata() or ()):
                    if key == "grpc-status-details-bin":
                        status = common_pb2.RpcStatus.FromString(value)
                        for d in status.details:
                            if d.type_url.endswith("BarrierTimeout"):
                                t = coordinator_pb2.BarrierTimeout.FromString(d.value)
                                arrived, missing = list(t.arrived), list(t.missing)
                raise BarrierTimeout(e.details(), arrived, missing) from e
            if e.code() == grpc.StatusCode.UNAVAILABLE:
                mismatch = tls.transport_mismatch("coordinator", address, credentials is not None)
                if mismatch is not None:
                    raise ConnectionError(f"barrier {scope}/{name}: {mismatch}") from e
            raise
        return list(response.arrived)
