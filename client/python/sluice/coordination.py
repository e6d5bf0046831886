"""Once and Barrier: run a step on exactly one process, wait for N processes.

    with sluice.once("prepare-cifar", coordinator="head:7070") as step:
        if step.should_run:
            download_and_preprocess("/data/cifar")
            step.result = "/data/cifar"        # announced to the others
    # here every caller knows the step is done; step.result is the runner's

    sluice.barrier("checkpoint-dir-ready", participants=world,
                   participant=f"rank-{rank}", coordinator="head:7070", timeout=60)

A runner that dies (its stream breaks or its heartbeats stop for the TTL)
hands the step to the next waiter; a step that raised is reported to every
caller waiting on it (OnceFailed naming the run and its error), and the next
caller to join runs it again (with fail_all=True every later caller gets
the failure instead). Completion is journaled by
the coordinator, so a restart never re-runs a finished step. The coordinator
address defaults to $SLUICE_COORDINATOR.

Names live in a scope. The default scope is $SLUICE_SCOPE, else the
launcher's run: torchrun's rendezvous id and restart count, SLURM's job id
and restart count, Open MPI's job id (sluice/_launcher.py); outside those,
"default", shared by every run. So a step done in one run (or one restart of
it) is not taken as done by the next; pass scope= to share it across runs.

Both are the C++ client's RunOnce and WaitBarrier (sluice/coordination.h)
through sluice._core: the heartbeats run on its threads, and the waits do
not hold the GIL.
"""
import os
import socket
import warnings

import grpc

from sluice import _launcher, tls
from sluice._types import core_status


class OnceFailed(Exception):
    """The step failed (a run raised, or under fail_all an earlier one did),
    or the coordinator could not be reached or refused the call."""


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


def _tls(ca_cert, client_cert, client_key):
    """The PEM paths as the extension takes them ("" for none)."""
    return {k: v or "" for k, v in zip(("ca_cert", "client_cert", "client_key"),
                                        tls.tls_settings(ca_cert, client_cert, client_key))}


def _core(what):
    from sluice import _lifecycle, reader  # the extension, with its import error explained
    _lifecycle.check_forked_child(what)
    return reader._core()


class _Step:
    def __init__(self, should_run, result, run):
        self.should_run = should_run
        self.result = result
        self.run = run


class once:  # noqa: N801 (used as a context manager: `with sluice.once(...)`)
    """Context manager: `step.should_run` is True on exactly one caller at a
    time; the others block in __enter__ until the step is done (then
    should_run is False and step.result is the runner's result). An exception
    inside the block reports the run as failed. timeout: seconds to give up
    after (OnceFailed), waiting included; None waits for as long as it takes.
    TLS: ca_cert / client_cert / client_key PEM paths (or SLUICE_CA_CERT ...;
    see sluice.tls)."""

    def __init__(self, name, *, coordinator=None, scope=None, participant=None, ttl=10.0,
                 fail_all=False, timeout=None, ca_cert=None, client_cert=None, client_key=None):
        self._name, self._scope = name, scope or _launcher.default_scope()
        self._tls = _tls(ca_cert, client_cert, client_key)
        self._address = _address(coordinator)
        self._participant = _participant(participant)
        self._ttl, self._fail_all, self._timeout = ttl, fail_all, timeout
        self._once = None
        self.step = None

    def __enter__(self):
        self._once = _core(f"once {self._scope}/{self._name}").Once(coordinator=self._address, scope=self._scope, name=self._name,
                                  participant=self._participant, ttl=self._ttl,
                                  fail_all=self._fail_all, timeout=self._timeout, **self._tls)
        try:
            kind, run, result = self._once.begin()
        except RuntimeError as e:
            self._once = None
            raise OnceFailed(f"once {self._scope}/{self._name}: {e}") from None
        self.step = _Step(kind == "run", result, run)
        if kind != "run":
            self._once = None
        return self.step

    def __exit__(self, exc_type, exc, tb):
        if self._once is None:
            return False
        once, self._once = self._once, None
        ok = exc_type is None
        try:
            once.finish(ok, str(self.step.result or "") if ok else f"{exc_type.__name__}: {exc}")
        except RuntimeError as e:
            if ok:
                raise OnceFailed(f"once {self._scope}/{self._name}: reporting success: "
                                 f"{e}") from None
            # The block's own exception is what the caller sees.
        return False


def barrier(name, *, participants, participant=None, coordinator=None, scope=None,
            timeout=60.0, ca_cert=None, client_cert=None, client_key=None, id=None):
    """Blocks until `participants` distinct participant ids arrived; returns
    the arrived ids. `participant` is this caller's id, as in once() (default
    host/pid); `id=` is its former name, still accepted with a
    DeprecationWarning. BarrierTimeout names who is missing;
    ConnectionError when the coordinator cannot be reached (or speaks the
    other of TLS and plaintext); RuntimeError for a refused call. TLS as for
    once()."""
    if id is not None:
        if participant is not None:
            raise TypeError("barrier: give participant=, not both participant= and id=")
        warnings.warn("sluice.barrier(id=...) is deprecated: pass participant=..., as to "
                      "sluice.once()", DeprecationWarning, stacklevel=2)
        participant = id
    address = _address(coordinator)
    scope = scope or _launcher.default_scope()
    try:
        status, arrived, missing = _core(f"barrier {scope}/{name}").barrier(
            coordinator=address, scope=scope, name=name, participant=_participant(participant),
            participants=participants, timeout=timeout,
            **_tls(ca_cert, client_cert, client_key))
    except RuntimeError as e:
        code, _ = core_status(e)
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.FAILED_PRECONDITION):
            raise ConnectionError(f"barrier {scope}/{name}: {e}") from None
        raise RuntimeError(f"barrier {scope}/{name}: {e}") from None
    if status != "OK":
        raise BarrierTimeout(f"barrier {scope}/{name}: {status}", arrived, missing)
    return list(arrived)
