"""sluice.CoreReader: sluice.Reader's interface over the C++ Reader.

The session, fetching, reports, re-routing and cursors run in the C++
sluice::Reader (client/include/sluice/reader.h) through the sluice._core
extension; this module only turns its events into the Python client's
Event, Sample and ReaderError types:

    with sluice.CoreReader("head:7070", "cifar", rank=0) as reader:
        for sample in reader:
            train(sample["jpg"], sample["cls"])

The same arguments as sluice.Reader for what both do (decoding, fields,
resume, TLS from PEM files or the SLUICE_CA_CERT / SLUICE_CLIENT_CERT /
SLUICE_CLIENT_KEY environment); not supported here: grpc credentials
objects, next_event(timeout=...), want(), and use across fork() (create it
in the process that reads: a DataLoader worker, not its parent).
"""
import grpc

from sluice import _launcher, tls
from sluice._types import DataLossError, Event, JobDoneError, ReaderError, Sample
from sluice.v1 import common_pb2, dataserver_pb2


def _reader_error(error):
    """The ReaderError for the C++ Reader's status ("CODE: message")."""
    name, _, message = str(error).partition(": ")
    code = getattr(grpc.StatusCode, name, None)
    if code is None:
        return ReaderError(grpc.StatusCode.UNKNOWN, str(error))
    if code == grpc.StatusCode.DATA_LOSS:
        return DataLossError(message)
    return ReaderError(code, message)


class CoreReader:
    """A trainer's stream of samples for one (job, rank, worker), read by the
    C++ Reader. See sluice.Reader for the meaning of each argument."""

    def __init__(self, coordinator, job, rank=0, worker=0, *, num_workers=0, trainer_id=None,
                 units_in_flight=4, decode=True, resize_shorter_side=0, crop=(0, 0),
                 transform=None, fields=(), max_batch_bytes=0, progress_interval=0.5,
                 stall_timeout=60.0, reconnect_timeout=120.0, resume_from=None,
                 resume_attempt=None, launch_id=None, ca_cert=None, client_cert=None,
                 client_key=None):
        if transform is not None:
            if resize_shorter_side or any(crop):
                raise ValueError("give transform or resize_shorter_side/crop, not both "
                                 "(put Resize and CenterCrop in the transform)")
            spec = transform.decode_spec()
        else:
            spec = dataserver_pb2.DecodeSpec(decode=decode,
                                             resize_shorter_side=resize_shorter_side,
                                             crop_height=crop[0], crop_width=crop[1])
        ca_cert, client_cert, client_key = tls.tls_settings(ca_cert, client_cert, client_key)
        self._began = False  # an epoch began for this reader
        try:
            from sluice import _core
        except ImportError as e:
            raise ImportError("sluice.CoreReader needs the sluice._core extension, built with "
                              "the C++ client (build/python/sluice, `make build`)") from e
        try:
            self._reader = _core.Reader(
                coordinator=coordinator, job=job, rank=rank, worker=worker,
                num_workers=num_workers, trainer_id=trainer_id or "",
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
                client_key=client_key or "")
        except RuntimeError as e:
            raise _reader_error(e) from None

    def next_event(self):
        """The next Event; blocks (without the GIL). Raises ReaderError (or
        DataLossError) on a final error."""
        try:
            kind, epoch, payload = self._reader.next()
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
        """The resume Cursor after the last sample returned (see
        sluice.Reader.cursor)."""
        try:
            return common_pb2.Cursor.FromString(self._reader.cursor())
        except RuntimeError as e:
            raise _reader_error(e) from None

    @property
    def stats(self):
        """delivered, units_completed, reroutes, dropped_units, reconnects,
        input_wait_seconds."""
        return self._reader.stats()

    def close(self):
        """Reports what was consumed, gives unfinished units back and ends
        the session. Idempotent."""
        self._reader.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
