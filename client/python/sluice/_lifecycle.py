"""The process around the Readers: open ones are closed at exit, so what a
program consumed is reported and its unfinished units released at once, not
after their lease TTL; and a process forked while a Reader was open in its
parent is told it cannot read (gRPC's threads were busy at the fork, so gRPC
cannot start in the child: a Reader made there would wait forever)."""
import atexit
import logging
import os
import weakref

_log = logging.getLogger("sluice")

# Readers not closed yet. A program may end with one still open (a loop
# that breaks out of a generator wrapping it, a script that never calls
# close()); atexit closes them before the interpreter tears down.
_open_readers = weakref.WeakSet()

# In a child forked while its parent had a Reader open: the parent's pid.
_forked_from_open_reader = None


def _own_readers():
    """Open Readers of this process (a forked child's copies of its parent's
    are not its own)."""
    return [r for r in list(_open_readers) if r._pid == os.getpid()]


def has_open_readers():
    """Whether this process has a Reader open (a fork now would leave the
    child unable to read)."""
    return bool(_own_readers())


@atexit.register
def _close_open_readers():
    for reader in _own_readers():
        try:
            reader.close()
        except Exception:  # noqa: BLE001 -- exiting; nothing to raise to
            _log.exception("sluice: closing a Reader at exit")
    # gRPC's last internal holder (a reconnect timer of a connection that
    # failed) would otherwise destroy its event engine on a gRPC thread
    # while exit() frees what that destruction touches (a SIGSEGV after a
    # clean run): the engine goes here, before the exit handlers.
    if _forked_from_open_reader is None:
        from sluice import _core
        _core.release_grpc_at_exit(_GRPC_EXIT_WAIT)


# Seconds the exit waits at most for gRPC's reconnect timers (a first
# reconnect backoff is 1 s, give or take 20 %).
_GRPC_EXIT_WAIT = 3.0


def _after_fork_in_child():
    global _forked_from_open_reader
    parent = os.getppid()
    if _forked_from_open_reader is None and any(r._pid == parent for r in list(_open_readers)):
        _forked_from_open_reader = parent


os.register_at_fork(after_in_child=_after_fork_in_child)


def check_forked_child(what):
    """Raises RuntimeError naming the way out when this process was forked
    while its parent had a Reader open."""
    if _forked_from_open_reader is not None:
        raise RuntimeError(
            f"sluice: {what} cannot run in this process: it was forked from process "
            f"{_forked_from_open_reader} while a sluice.Reader was open there, so gRPC cannot "
            "start in it. Close the parent's Reader before forking, or start the workers with "
            "the 'spawn' or 'forkserver' method (DataLoader(multiprocessing_context=...); "
            "sluice.torch.DataLoader does so by itself when the process has a Reader open)")


def opened(reader):
    """`reader` is open: closed at exit."""
    _open_readers.add(reader)


def closed(reader):
    _open_readers.discard(reader)
