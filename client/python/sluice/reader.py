"""sluice.Reader: a trainer's stream of samples for one (job, rank, worker).

The C++ sluice::Reader (client/include/sluice/reader.h) through the
sluice._core extension: the coordinator session, heartbeats, fetching from
the data servers, Progress/Complete reports, re-routing, reconnecting and
cursors run there, on its own threads and without the GIL; this module
checks the arguments and turns its events into Event, Sample and
ReaderError objects.

* Images are decoded by the data servers unless decode=False:
  sample["jpg"] is a read-only numpy array over the received bytes (no
  copy), or with decode=False the encoded bytes.
* A data server that fails, or stalls (nothing arrives for `stall_timeout`
  while the unit's buffer has room): the samples already received are
  delivered, then the unit is re-routed (Reroute with the exact count) and
  its remainder arrives as a new grant on another server.
* The coordinator unreachable: held units keep being read while the session
  reconnects under the same trainer_id; while disconnected for more than
  half a lease TTL nothing is delivered, so an expired lease is never
  delivered twice. ReaderError(UNAVAILABLE) after `reconnect_timeout`.
* A stale lease (ABORTED, Revoke, Rejected): its undelivered samples are
  dropped.
* `cursor()` returns the resume position after the samples handed out so
  far, once the coordinator has made every report durable (G7).
* TLS: PEM files (ca_cert, and client_cert with client_key for mutual TLS),
  or the SLUICE_CA_CERT / SLUICE_CLIENT_CERT / SLUICE_CLIENT_KEY
  environment; the same for the coordinator and the data servers.

Thread-safety: iterate (or call next_event/cursor) from one thread; close()
and want() from any. fork(): a Reader belongs to the process that made it;
a forked child (a DataLoader worker) makes its own, which needs the parent
to have had no Reader open at the fork (gRPC cannot start in the child
otherwise: FAILED_PRECONDITION saying so; use the spawn or forkserver
start method then).
"""
import os
import socket

import grpc

from sluice import _launcher, _lifecycle, tls
from sluice._types import (DataLossError, Event, JobDoneError, ReaderError, Sample,
                           core_status)
from sluice.v1 import common_pb2, dataserver_pb2

__all__ = ["Event", "JobDoneError", "Reader", "ReaderError", "Sample", "merge_cursors",
           "tune_malloc"]


def _core():
    try:
        from sluice import _core as core
    except ImportError as e:
        raise ImportError("sluice needs its sluice._core extension, built with the C++ client "
                          "into build/python/sluice (`make build`)") from e
    return core


def _reader_error(error):
    """The ReaderError for the C++ Reader's status."""
    code, message = core_status(error)
    if code == grpc.StatusCode.DATA_LOSS:
        return DataLossError(message)
    return ReaderError(code, message)


def merge_cursors(cursors):
    """Combines the ranks' (and workers') cursors (same job, epoch, world
    size, workers per rank) into one with every count; ValueError on a
    mismatch or conflicting counts."""
    serialized = [c.SerializeToString() for c in cursors]
    if not serialized:
        raise ValueError("merge_cursors: no cursors")
    return common_pb2.Cursor.FromString(_core().merge_cursors(serialized))


def tune_malloc():
    """Keeps up to 64 MiB of freed memory per glibc malloc arena instead of
    handing it back to the kernel after every megabyte-sized message (reading
    samples allocates and frees such buffers many times a second; with
    glibc's defaults each one's pages are faulted in again). The same setting
    as the servers' --tune_malloc (server/common/malloc_tuning.h has the
    measurements). Process-wide, so opt-in: call it once at start-up, or set
    SLUICE_TUNE_MALLOC=1 for a Reader to do it. False where the allocator
    refuses the settings (not glibc, sanitizers, a preloaded malloc)."""
    return _core().tune_malloc()


class Reader:
    """See the module docstring. Iterating yields Samples across epochs until
    the job is done; next_event() also returns epoch boundaries.

    coordinator: "host:port", or several comma-separated (the one SERVING is
    used: with an etcd journal, the leader). rank, worker, num_workers: this
    reader's slot (num_workers Readers share the rank, e.g. DataLoader
    workers). units_in_flight: units held and buffered at once. decode,
    resize_shorter_side, crop or transform (sluice.transforms.Compose): what
    the data servers do to images. fields: the fields wanted (empty = all).
    progress_interval: most seconds between delivering a sample and reporting
    it. stall_timeout: seconds without data before a stream counts as failed.
    reconnect_timeout: seconds the coordinator may stay unreachable.
    resume_from: a merged Cursor to continue after (G7); resume_attempt names
    the restart (default: the launcher's restart id), launch_id this launch.
    node: the node this reader runs on, for locality (default: $SLUICE_NODE,
    else $SLURMD_NODENAME, else the host name); a data server registered on
    the same node serves its leases first.
    """

    def __init__(self, coordinator, job, rank=0, worker=0, *, num_workers=0, trainer_id=None,
                 units_in_flight=4, decode=True, resize_shorter_side=0, crop=(0, 0),
                 transform=None, fields=(), max_batch_bytes=0, progress_interval=0.5,
                 stall_timeout=60.0, reconnect_timeout=120.0, resume_from=None,
                 resume_attempt=None, launch_id=None, ca_cert=None, client_cert=None,
                 client_key=None, node=None):
        if not coordinator:
            raise ValueError("coordinator is empty")
        if not job:
            raise ValueError("job is empty")
        if rank < 0:
            raise ValueError("rank is negative")
        if num_workers < 0 or not 0 <= worker < max(num_workers, 1):
            raise ValueError(f"worker={worker} must be in [0, num_workers={num_workers})")
        if transform is not None:
            # sluice.transforms.Compose: decoding with the data servers' transforms.
            if resize_shorter_side or any(crop):
                raise ValueError("give transform or resize_shorter_side/crop, not both "
                                 "(put Resize and CenterCrop in the transform)")
            spec = transform.decode_spec()
        else:
            spec = dataserver_pb2.DecodeSpec(decode=decode,
                                             resize_shorter_side=resize_shorter_side,
                                             crop_height=crop[0], crop_width=crop[1])
        ca_cert, client_cert, client_key = tls.tls_settings(ca_cert, client_cert, client_key)
        try:
            _lifecycle.check_forked_child("a Reader")
        except RuntimeError as e:
            raise ReaderError(grpc.StatusCode.FAILED_PRECONDITION, str(e)) from None
        core = _core()
        if os.environ.get("SLUICE_TUNE_MALLOC") == "1":
            core.tune_malloc()
        self._job, self._rank = job, rank
        self._began = False  # an epoch began for this reader
        self._closed = False
        self._pid = os.getpid()
        try:
            self._reader = core.Reader(
                coordinator=coordinator, job=job, rank=rank, worker=worker,
                num_workers=num_workers,
                trainer_id=trainer_id or f"{socket.gethostname()}-{os.getpid()}-r{rank}-w{worker}",
                units_in_flight=max(1, units_in_flight), decode=spec.SerializeToString(),
                fields=list(fields), max_batch_bytes=max_batch_bytes,
                progress_interval=progress_interval, stall_timeout=stall_timeout,
                reconnect_timeout=reconnect_timeout,
                resume_from=(resume_from.SerializeToString()
                             if resume_from is not None else None),
                resume_attempt=(_launcher.restart_id() if resume_attempt is None
                                else resume_attempt),
                launch_id=launch_id or _launcher.new_launch_id(),
                ca_cert=ca_cert or "", client_cert=client_cert or "",
                client_key=client_key or "", node=node or "")
        except RuntimeError as e:
            raise _reader_error(e) from None
        _lifecycle.opened(self)

    def next_event(self, timeout=None):
        """The next Event; blocks (without the GIL), for at most `timeout`
        seconds (TimeoutError after) unless None. Raises ReaderError (or
        DataLossError) on a final error, ReaderError(CANCELLED) once closed.

        "done" (the job served all its epochs) carries a message saying so;
        it repeats on every later call."""
        try:
            kind, epoch, payload = self._reader.next(timeout)
        except RuntimeError as e:
            raise _reader_error(e) from None
        if kind == "sample":
            p = payload
            return Event("sample", epoch, sample=Sample(
                epoch, p["rank"], p["shard_index"], p["shard_url"], p["index"], p["key"],
                p["data_server"], p["skipped"], p["skip_reason"], p["fields"], p["source"]))
        if kind == "epoch_begin":
            self._began = True
            return Event("epoch_begin", epoch, payload["samples_for_rank"],
                         payload["already_consumed"],
                         samples_for_worker=payload["samples_for_worker"],
                         already_consumed_by_worker=payload["already_consumed_by_worker"])
        if kind == "done":
            return Event("done", epoch, message=payload)
        return Event(kind, epoch)

    def __iter__(self):
        """Samples until the job is done; JobDoneError when it already was
        (no epoch began for this reader)."""
        while True:
            e = self.next_event()
            if e.kind == "done":
                if not self._began:
                    raise JobDoneError(e.message)
                return
            if e.kind == "sample":
                yield e.sample

    def cursor(self):
        """The resume Cursor after the last sample returned: this rank's count
        in the current epoch, -1 for other ranks (merge with merge_cursors or an
        all-gather). Waits until everything delivered is durable at the
        coordinator; ReaderError(UNAVAILABLE) if that is not confirmed within
        reconnect_timeout, FAILED_PRECONDITION before the first epoch."""
        try:
            return common_pb2.Cursor.FromString(self._reader.cursor())
        except RuntimeError as e:
            raise _reader_error(e) from None

    def want(self, units):
        """Changes how many units this reader holds at once (0 = take no new
        work; held units are still delivered)."""
        self._reader.want(units)

    @property
    def stats(self):
        """delivered, units_completed, reroutes, handed_back (units a
        draining data server gave back, read again elsewhere: not failures),
        dropped_units, reconnects, batches (received) and input_wait_seconds
        (next_event blocked before returning a sample)."""
        return self._reader.stats()

    def close(self):
        """Reports what was consumed, gives unfinished units back (Release) and
        ends the session. Idempotent."""
        if self._closed:
            return
        self._closed = True
        _lifecycle.closed(self)
        self._reader.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
