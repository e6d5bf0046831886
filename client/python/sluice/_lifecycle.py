"""The process around the Readers: open ones are closed at exit, and their
data streams are cut before a fork() and reopened after it in the parent
(a Reader calls _suspend_streams / _resume_streams)."""
import atexit
import logging
import os
import weakref

from sluice import _grpcio

_log = logging.getLogger("sluice")

# Readers not closed yet. A program may end with one still open (a loop
# that breaks out of a generator wrapping it, a script that never calls
# close()): atexit closes them while the interpreter still runs their
# threads, so consumption is reported and unfinished units released at once.
# Left to the garbage collector at interpreter shutdown, close() would wait
# forever in grpc's channel close for threads that no longer run.
_open_readers = weakref.WeakSet()


def _own_readers():
    """Open Readers of this process (a forked child's copies of its parent's
    are not its own)."""
    return [r for r in list(_open_readers) if r._pid == os.getpid()]


@atexit.register
def _close_open_readers():
    for reader in _own_readers():
        try:
            reader.close()
        except Exception:  # noqa: BLE001 -- exiting; nothing to raise to
            _log.exception("sluice: closing a Reader at exit")


def _before_fork():
    for reader in _own_readers():
        reader._suspend_streams()


def _after_fork_in_parent():
    for reader in _own_readers():
        reader._resume_streams()


_grpcio.add_fork_handlers(before=_before_fork, after_in_parent=_after_fork_in_parent)


def opened(reader):
    """`reader` is open: closed at exit, its streams cut around a fork."""
    _open_readers.add(reader)


def closed(reader):
    _open_readers.discard(reader)
