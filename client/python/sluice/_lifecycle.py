"""Open Readers are closed at exit, so what a program consumed is reported
and its unfinished units released at once, not after their lease TTL."""
import atexit
import logging
import os
import weakref

_log = logging.getLogger("sluice")

# Readers not closed yet. A program may end with one still open (a loop
# that breaks out of a generator wrapping it, a script that never calls
# close()); atexit closes them before the interpreter tears down.
_open_readers = weakref.WeakSet()


@atexit.register
def _close_open_readers():
    # A forked child's copies of its parent's Readers are not its own.
    for reader in [r for r in list(_open_readers) if r._pid == os.getpid()]:
        try:
            reader.close()
        except Exception:  # noqa: BLE001 -- exiting; nothing to raise to
            _log.exception("sluice: closing a Reader at exit")


def opened(reader):
    """`reader` is open: closed at exit."""
    _open_readers.add(reader)


def closed(reader):
    _open_readers.discard(reader)
