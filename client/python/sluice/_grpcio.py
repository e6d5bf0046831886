"""What the Python client relies on in grpcio beyond its public API, in one
place, behind one check at import.

* Data-server streams are grpcio single-threaded unary streams
  (grpc.experimental.ChannelOptions.SingleThreadedUnaryStream): the
  consumer's own thread reads them (see reader.Reader._pull).
* Such a call is freed only once every event of it was read: Stream reads
  the rest through the call's private `_state` and `_consume_next_event`.
* fork(): with GRPC_ENABLE_FORK_SUPPORT, grpcio's fork handlers need gRPC's
  threads at rest and no GIL drop request pending (add_fork_handlers).

check() runs when sluice is imported and raises ImportError naming the
supported grpcio versions if any of it is missing, rather than letting the
client degrade (calls never freed, forked workers exiting with status 64).
The range is the one pinned in pyproject.toml.
"""
import os
import sys
import threading
import time

import grpc
import grpc._channel
import grpc.experimental

# The grpcio versions the client supports (pyproject.toml pins the same
# range) and the one its tests run with (Debian bookworm's).
SUPPORTED = ">=1.51,<2"
TESTED = "1.51"


def check(grpc_module=grpc):
    """What the client needs and `grpc_module` lacks, as a list of strings
    (empty: all there)."""
    problems = []
    version = getattr(grpc_module, "__version__", "unknown")
    try:
        major, minor = (int(p) for p in version.split(".")[:2])
        if not (1, 51) <= (major, minor) < (2, 0):
            problems.append(f"version {version} is outside {SUPPORTED}")
    except ValueError:
        problems.append(f"version {version!r} cannot be read")
    experimental = getattr(grpc_module, "experimental", None)
    options = getattr(experimental, "ChannelOptions", None)
    if not hasattr(options, "SingleThreadedUnaryStream"):
        problems.append("grpc.experimental.ChannelOptions.SingleThreadedUnaryStream")
    channel = getattr(grpc_module, "_channel", None)
    rendezvous = getattr(channel, "_SingleThreadedRendezvous", None)
    if not hasattr(rendezvous, "_consume_next_event"):
        problems.append("grpc._channel._SingleThreadedRendezvous._consume_next_event")
    return problems


def _require():
    problems = check()
    if problems:
        raise ImportError(
            f"sluice needs grpcio {SUPPORTED} (tested with {TESTED}.x); the installed "
            f"grpcio {getattr(grpc, '__version__', 'unknown')} does not fit: "
            + "; ".join(problems))


_require()

SINGLE_THREADED_UNARY_STREAM = (grpc.experimental.ChannelOptions.SingleThreadedUnaryStream, 1)


class Stream:
    """A ReadSamples call (a grpcio single-threaded unary stream), read by one
    thread at a time, whose every event is read before it is dropped.

    grpcio frees such a call (its completion queue, its reference on gRPC
    Core) only once every operation of it has completed *and been read*, and
    nothing but a reading thread reads them. The iterator can end with events
    still queued: after cancel() (which ends it at once, locally), and with
    the initial metadata's when it ends before its first message. Left
    unread, the call is never freed; a forked child then cannot shut gRPC
    down and exits with status 64 (EX_USAGE), as every DataLoader worker
    forked after a Reader was closed mid-stream would. finish() reads the
    rest through grpcio 1.51's private `_state.due` / `_consume_next_event`
    (there is no public way); without them (another grpcio) it only cancels.
    A read interrupted by an exception of its own (KeyboardInterrupt) may
    have taken an event off the queue unhandled: such a call is only
    cancelled, since reading it to its end could wait forever.
    """
    __slots__ = ("_call", "_lock", "_end", "_interrupted")

    def __init__(self, call):
        self._call = call
        self._lock = threading.Lock()
        self._end = None  # StopIteration or the RpcError that ended it
        self._interrupted = False

    def next(self):
        """The next response (bytes); StopIteration at the end, RpcError on
        failure or cancel (again on every later call)."""
        with self._lock:
            if self._end is not None:
                raise self._end
            try:
                return next(self._call)
            except (StopIteration, grpc.RpcError) as e:
                self._end = e
                self._read_rest_locked()
                raise
            except BaseException:
                self._interrupted = True
                raise

    def cancel(self):
        """Cancels without waiting (safe under the Reader's lock): the thread
        reading the stream then sees it end."""
        self._call.cancel()

    def finish(self):
        """Cancels (unless ended) and reads what is left of the call; waits
        for a thread reading it."""
        self._call.cancel()
        with self._lock:
            if self._end is None:
                try:
                    next(self._call)  # ends at once (CANCELLED, or how it ended)
                except (StopIteration, grpc.RpcError) as e:
                    self._end = e
            self._read_rest_locked()

    def _read_rest_locked(self):
        if self._interrupted:
            return
        state, consume = self._call._state, self._call._consume_next_event
        while state.due:  # every operation has completed (ended or cancelled)
            consume()


# fork() and gRPC. With GRPC_ENABLE_FORK_SUPPORT (set by `import sluice`)
# grpcio 1.51 runs handlers around fork() that are safe only while none of
# gRPC's threads is running: a call or channel closed just before the fork
# is still being torn down on them for a few milliseconds, and a fork in
# that window crashed the parent or deadlocked the child in about 1 run in
# 20 of the fork test (a DataLoader forking its workers right after the
# parent read with a Reader). Before a fork, wait (at most a second) until
# no gRPC or sluice thread is running.
# gRPC's own threads by their kernel names; sluice's (Python threads, which
# keep the process's kernel name) by their Python names.
_GRPC_THREADS = ("grpc", "default-execut", "resolver-execu", "event_engine", "timer_manager")


def _grpc_threads_running():
    me = str(threading.get_native_id())
    ours = {str(t.native_id) for t in threading.enumerate() if t.name.startswith("sluice-")}
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return False
    for tid in tids:
        if tid == me:
            continue
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                stat = f.read()
        except OSError:
            continue  # exited
        name, state = stat[stat.find("(") + 1:stat.rfind(")")], stat[stat.rfind(")") + 2:][:1]
        if state == "R" and (name.startswith(_GRPC_THREADS) or tid in ours):
            return True
    return False


def _settle_grpc_before_fork():
    deadline, quiet = time.monotonic() + 1.0, 0
    while quiet < 3 and time.monotonic() < deadline:
        quiet = 0 if _grpc_threads_running() else quiet + 1
        time.sleep(0.001)


# grpcio's fork handlers run Python code in the child from a pthread_atfork
# handler, before Python has reset its threading state there. If, at the
# fork, another thread of the parent had been waiting for the GIL longer
# than the switch interval, it had asked the forking thread to drop the GIL;
# the child's first Python code honours that request and then waits forever
# for a thread that only exists in the parent to take it (seen under load:
# the child hangs in drop_gil). A long switch interval around the fork keeps
# any such request from being made; the parent's and the child's intervals
# are restored after it.
_FORK_SWITCH_INTERVAL_S = 1.0
_switch_interval_before_fork = None


def _restore_switch_interval():
    if _switch_interval_before_fork is not None:
        sys.setswitchinterval(_switch_interval_before_fork)


def add_fork_handlers(before, after_in_parent):
    """Around every fork(): a long switch interval, then `before` (which
    ends the process's streams), then a wait until gRPC's threads settle;
    after it, `after_in_parent` in the parent and the interval restored in
    both."""
    def _before():
        global _switch_interval_before_fork
        _switch_interval_before_fork = sys.getswitchinterval()
        sys.setswitchinterval(max(_switch_interval_before_fork, _FORK_SWITCH_INTERVAL_S))
        before()
        _settle_grpc_before_fork()

    def _after_in_parent():
        _restore_switch_interval()
        after_in_parent()

    os.register_at_fork(before=_before, after_in_parent=_after_in_parent,
                        after_in_child=_restore_switch_interval)
