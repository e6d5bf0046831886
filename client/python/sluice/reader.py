"""sluice.Reader: a trainer's stream of samples for one (job, rank, worker).

Semantics follow the C++ Reader (client/include/sluice/reader.h):

* A session thread runs the coordinator Session stream (Hello, Want credits =
  units in flight); a maintenance thread heartbeats, reports Progress at most
  every `progress_interval`, and cancels data-server streams that stall.
* Units are delivered one after another, each in sample order. The thread
  that consumes the samples also receives them: when the current unit has
  nothing buffered, next_event() reads the unit's next batch itself (the
  data channels are grpcio single-threaded unary streams), so a batch
  reaches the consumer without a hand-off between threads, and with no
  reading thread behind it, a consumer slower than its streams wakes
  nothing. Read-ahead is the connection's: a data server streams into the
  HTTP/2 flow-control window and the socket buffers until the consumer
  reads. A short-lived thread per unit opens its stream when its turn
  comes: per data server one stream carries data at a time (the next opens
  as the current one reaches its last batch). Responses are read as bytes
  and walked by sluice._wire, so tensors are numpy views of the received
  message. (The C++ Reader reads on its own I/O thread into a bounded
  per-unit buffer, `buffer_samples`.)
* Images are decoded by the data servers unless decode=False (the default
  is the same as ShardLeaseDataset's): sample["jpg"] is a numpy array, or
  with decode=False the encoded bytes.
* `stats` counts delivered, units_completed, reroutes, dropped_units,
  reconnects and batches (received).
* A data server that fails, or stalls (the consumer waited `stall_timeout`
  on its stream; a stream nobody waits on has not stalled): the samples
  already received are delivered, then the unit is re-routed (Reroute
  with the exact count) and its remainder arrives as a new grant on
  another server.
* The coordinator unreachable: held units keep being read while the session
  reconnects with jittered backoff (well within a lease TTL) under the same
  trainer_id; unconfirmed reports are re-sent and every held lease is
  confirmed again after a reconnect; while disconnected for more than half a
  TTL nothing is delivered, so an expired lease is never delivered twice.
* A stale lease (ABORTED, Revoke, Rejected): its undelivered samples are
  dropped.
* `cursor()` returns the resume position after the samples handed out so far,
  once the coordinator has made every report durable (G7).

Thread-safety: iterate (or call next_event/cursor) from one thread; close()
from any. A fork() while a Reader streams cuts its streams before and
reopens them after (see _suspend_streams); the child cannot use the parent's
Reader: create Readers after fork (gRPC and fork do not mix).
"""
import collections
import functools
import logging
import os
import queue
import random
import socket
import sys
import threading
import time

import grpc
import numpy as np

from sluice import _grpcio, _lifecycle, _rules, _wire, tls
from sluice._malloc import tune_malloc
from sluice._cursor import merge_cursors, position_cursor
from sluice._types import Event, JobDoneError, ReaderError, Sample
from sluice.v1 import coordinator_pb2, coordinator_pb2_grpc
from sluice.v1 import dataserver_pb2

__all__ = ["Event", "JobDoneError", "Reader", "ReaderError", "Sample", "merge_cursors",
           "tune_malloc"]

_log = logging.getLogger("sluice")

_DTYPES = {
    dataserver_pb2.DTYPE_UINT8: np.uint8, dataserver_pb2.DTYPE_INT8: np.int8,
    dataserver_pb2.DTYPE_INT16: np.int16, dataserver_pb2.DTYPE_UINT16: np.uint16,
    dataserver_pb2.DTYPE_INT32: np.int32, dataserver_pb2.DTYPE_UINT32: np.uint32,
    dataserver_pb2.DTYPE_INT64: np.int64,
}
for _name, _np in (("DTYPE_UINT64", np.uint64), ("DTYPE_FLOAT16", np.float16),
                   ("DTYPE_FLOAT32", np.float32), ("DTYPE_FLOAT64", np.float64),
                   ("DTYPE_BOOL", np.bool_)):
    if hasattr(dataserver_pb2, _name):
        _DTYPES[getattr(dataserver_pb2, _name)] = _np

# Statuses after which reconnecting cannot help.
_TERMINAL = {grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT,
             grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.PERMISSION_DENIED,
             grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.UNIMPLEMENTED}
# Data-server statuses that are not server faults: fail the reader.
_FATAL_READ = {grpc.StatusCode.DATA_LOSS, grpc.StatusCode.OUT_OF_RANGE,
               grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.PERMISSION_DENIED}

_READ_SAMPLES = "/%s/ReadSamples" % dataserver_pb2.DESCRIPTOR.services_by_name["DataServer"].full_name

# While the coordinator cannot be reached, how often to ask it whether it
# speaks TLS (tls.transport_mismatch).
_TRANSPORT_CHECK_PERIOD = 5.0

# Seconds a unit waits for its stream's turn while the earlier streams on
# its data server make no progress.
_TURN_PATIENCE = 2.0

# Reconnect attempts start 100 ms apart and stay within a second of each
# other. (grpc.min_reconnect_backoff_ms is not set: gRPC takes it as the
# time a connection attempt may take, and 100 ms made connects to a busy
# server time out "before receiving SETTINGS frame".)
_CHANNEL_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.max_receive_message_length", 64 << 20),
]
# Data-server channels: ReadSamples is read by the consumer's own thread
# (see Reader._pull).
_DATA_CHANNEL_OPTIONS = _CHANNEL_OPTIONS + [_grpcio.SINGLE_THREADED_UNARY_STREAM]


# How long a unit's thread waits for its data server's channel to connect
# before opening the stream anyway (which then fails if the server is down).
_CONNECT_TIMEOUT = 5.0
_SETTLED = (grpc.ChannelConnectivity.READY, grpc.ChannelConnectivity.TRANSIENT_FAILURE,
            grpc.ChannelConnectivity.SHUTDOWN)

def _unit_key(unit):
    """What a unit reads, for counting failed streams: its shard, or its shuffle
    window's first shard."""
    return unit.pieces[0].url if unit.pieces else unit.shard_url


class _Unit:
    __slots__ = ("lease", "order", "size", "buffer", "next_fetch", "last_batch", "fetch",
                 "fetch_error", "dropped", "delivered", "reported", "final", "call",
                 "pulling_since", "retry_at", "stalled", "thread", "reopen")

    def __init__(self, lease, order):
        self.lease, self.order = lease, order
        self.size = lease.unit.end - lease.unit.begin
        self.buffer = collections.deque()  # one received batch at most
        self.next_fetch = lease.unit.begin
        self.last_batch = 0  # samples in the newest batch received
        self.fetch = "running"  # running | done | failed
        self.fetch_error = ""
        self.dropped = False
        self.delivered = 0
        self.reported = 0
        self.final = None  # TrainerMessage: Complete / Reroute / Release
        self.call = None  # the open ReadSamples stream, read by the consumer
        self.pulling_since = None  # the consumer has waited on the stream since
        self.retry_at = 0.0  # a failed stream's re-route waits until then
        self.stalled = False
        self.thread = None
        self.reopen = False  # its stream was cut for a fork: open it again after


class Reader:
    """See the module docstring. Iterating yields Samples across epochs until
    the job is done; next_event() also returns epoch boundaries."""

    def __init__(self, coordinator, job, rank=0, worker=0, *, num_workers=0, trainer_id=None,
                 units_in_flight=4,
                 decode=True, resize_shorter_side=0, crop=(0, 0), transform=None, fields=(),
                 max_batch_bytes=0, progress_interval=0.5, stall_timeout=60.0,
                 reconnect_timeout=120.0, resume_from=None, resume_attempt="", credentials=None,
                 ca_cert=None, client_cert=None, client_key=None):
        if not coordinator:
            raise ValueError("coordinator is empty")
        if not job:
            raise ValueError("job is empty")
        if os.environ.get("SLUICE_TUNE_MALLOC") == "1":
            tune_malloc()
        if rank < 0:
            raise ValueError("rank is negative")
        if num_workers < 0 or not 0 <= worker < max(num_workers, 1):
            raise ValueError(f"worker={worker} must be in [0, num_workers={num_workers})")
        self._coordinator, self._job, self._rank, self._worker = coordinator, job, rank, worker
        # Readers sharing the rank (DataLoader workers): each reads its own
        # slot of the rank's quota.
        self._num_workers = num_workers
        self._trainer_id = trainer_id or f"{socket.gethostname()}-{os.getpid()}-r{rank}-w{worker}"
        self._units_in_flight = max(1, units_in_flight)
        if transform is not None:
            # sluice.transforms.Compose: decoding with the data servers' transforms.
            if resize_shorter_side or any(crop):
                raise ValueError("give transform or resize_shorter_side/crop, not both "
                                 "(put Resize and CenterCrop in the transform)")
            self._decode = transform.decode_spec()
        else:
            self._decode = dataserver_pb2.DecodeSpec(
                decode=decode, resize_shorter_side=resize_shorter_side,
                crop_height=crop[0], crop_width=crop[1])
        self._fields = list(fields)
        self._max_batch_bytes = max_batch_bytes
        self._progress_interval = progress_interval
        self._stall_timeout = stall_timeout
        self._reconnect_timeout = reconnect_timeout
        self._resume_from = resume_from
        self._resume_attempt = resume_attempt
        # TLS: `credentials` (grpc.ChannelCredentials), or PEM files (also from
        # SLUICE_CA_CERT / SLUICE_CLIENT_CERT / SLUICE_CLIENT_KEY); the same
        # for the coordinator and the data servers.
        self._credentials = credentials or tls.channel_credentials(ca_cert, client_cert,
                                                                   client_key)
        self._channel = self._make_channel(coordinator)
        self._stub = coordinator_pb2_grpc.CoordinatorStub(self._channel)

        self._cv = threading.Condition()
        self._entries = collections.deque()
        self._units = {}
        # Final reports not yet known durable, and the Sync ids.
        self._ledger = _rules.ReportLedger()
        # Whether delivery waits for the coordinator to confirm held leases.
        self._hold = _rules.LeaseHold(time.monotonic)
        self._retired = []
        self._data_stubs = {}  # address -> (channel, ReadSamples, state watch)
        self._channel_states = {}  # address -> grpc.ChannelConnectivity
        self._reroute_backoff = _rules.RerouteBackoff()
        self._fatal = None
        # Data servers whose streams failed UNAVAILABLE and were asked
        # whether they speak TLS (each once).
        self._transport_checked = set()
        self._closing = False
        self._forking = False  # streams suspended around a fork (see _suspend_streams)
        self._opening = 0  # _fetch threads creating a stream
        self._closed = False
        self._job_done = False
        self._last_epoch_begin = -1
        self._last_epoch_end = -1
        self._heartbeat_interval = 1.0
        self._world_size = 0
        self._source_names = []  # a job with sources: their names, for cursors
        self._next_order = 0
        self._resume_done = False
        self._out = None  # queue of the live stream's requests
        self._write_lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self._position_epoch = -1
        self._position_consumed = 0
        self.stats = collections.Counter()
        # The consumer's waits for samples since the last heartbeat.
        self._input_wait = _rules.InputWaitHistogram()

        self._session_thread = threading.Thread(target=self._run_session, daemon=True,
                                                name="sluice-session")
        self._maintenance_thread = threading.Thread(target=self._run_maintenance, daemon=True,
                                                    name="sluice-maintenance")
        self._pid = os.getpid()
        self._session_thread.start()
        self._maintenance_thread.start()
        _lifecycle.opened(self)

    # ------------------------------------------------------------- public

    def __iter__(self):
        """Samples until the job is done; JobDoneError when it already was
        (no epoch began for this reader)."""
        began = False
        while True:
            e = self.next_event()
            if e.kind == "done":
                if not began:
                    raise JobDoneError(e.message)
                return
            if e.kind == "epoch_begin":
                began = True
            elif e.kind == "sample":
                yield e.sample

    def next_event(self, timeout=None):
        """The next Event; blocks. Raises ReaderError on a final error.

        timeout: seconds to wait (TimeoutError after); while the event is a
        sample a data server is streaming, the wait is bounded by
        stall_timeout instead (then the stream is cut and the unit
        re-routed, and the wait goes on within `timeout`).

        "done" (the job served all its epochs) carries a message saying so;
        it repeats on every later call."""
        deadline = None if timeout is None else time.monotonic() + timeout
        # The input wait of the sample returned: 0 unless this call blocks,
        # timed from its first wait (no clock read on the buffered path).
        waiting_since = None
        while True:
            flush = False
            event = None
            pull = None
            with self._cv:
                while event is None and not flush and pull is None:
                    if self._fatal is not None:
                        raise self._fatal
                    if self._closed:
                        raise ReaderError(grpc.StatusCode.CANCELLED, "reader closed")
                    if not self._entries:
                        if waiting_since is None:
                            waiting_since = time.monotonic()
                        self._wait(deadline)
                        continue
                    kind, payload = self._entries[0]
                    if kind != "unit":
                        if kind != "done":
                            self._entries.popleft()  # done stays
                        event = Event(kind, *payload)
                        break
                    u = payload
                    if u.dropped:
                        self.stats["dropped_units"] += 1
                        self._entries.popleft()
                        continue
                    if u.buffer and self._hold.may_have_lost_leases():
                        if waiting_since is None:
                            waiting_since = time.monotonic()
                        self._cv.wait(0.05)
                        continue
                    if u.buffer:
                        event = Event("sample", sample=u.buffer.popleft())
                        event.epoch = event.sample.epoch
                        u.delivered += 1
                        self.stats["delivered"] += 1
                        wait = 0.0 if waiting_since is None else time.monotonic() - waiting_since
                        self._input_wait.observe(wait)
                        self.stats["input_wait_seconds"] += wait
                        if u.delivered == u.size:
                            u.final = coordinator_pb2.TrainerMessage(
                                complete=coordinator_pb2.Complete(lease_id=u.lease.lease_id,
                                                                  fence=u.lease.fence))
                            self.stats["units_completed"] += 1
                            self._entries.popleft()
                            flush = True
                        break
                    if u.fetch == "failed":
                        wait = u.retry_at - time.monotonic()
                        if wait > 0:  # the re-route's back-off
                            if deadline is not None:
                                if deadline <= time.monotonic():
                                    raise TimeoutError("no event within the timeout")
                                wait = min(wait, deadline - time.monotonic())
                            self._cv.wait(wait)
                            continue
                        u.final = coordinator_pb2.TrainerMessage(reroute=coordinator_pb2.Reroute(
                            lease_id=u.lease.lease_id, fence=u.lease.fence, consumed=u.delivered,
                            failed_data_server=u.lease.data_server, error=u.fetch_error))
                        self.stats["reroutes"] += 1
                        self._entries.popleft()
                        flush = True
                        break
                    if u.fetch == "running" and u.call is not None:
                        # Its buffer is empty: receive the next batch on this
                        # thread (no hand-off between threads per batch).
                        u.pulling_since = time.monotonic()
                        pull = (u, u.call)
                        if waiting_since is None:
                            waiting_since = time.monotonic()
                        break
                    if waiting_since is None:
                        waiting_since = time.monotonic()
                    self._wait(deadline)
            if pull is not None:
                self._pull(*pull)
                continue
            if flush:
                self._flush_reports(progress=False)
            if event is not None:
                if event.kind == "epoch_begin":
                    self._position_epoch = event.epoch
                    self._position_consumed = (event.already_consumed_by_worker
                                               if self._num_workers > 1 else event.already_consumed)
                elif event.kind == "sample":
                    self._position_consumed += 1
                return event

    def _take_input_wait(self):
        """The waits observed since the last call as an InputWait, or None."""
        with self._cv:
            return self._input_wait.take()

    def cursor(self):
        """The resume Cursor after the last sample returned: this rank's count
        in the current epoch, -1 for other ranks (merge with merge_cursors or an
        all-gather). Waits until everything delivered is durable at the
        coordinator; ReaderError(UNAVAILABLE) if that is not confirmed within
        reconnect_timeout."""
        if self._position_epoch < 0:
            raise ReaderError(grpc.StatusCode.FAILED_PRECONDITION,
                              f"job {self._job} rank {self._rank}: no cursor before the first "
                              "epoch begins")
        with self._cv:
            world = self._world_size
            sources = list(self._source_names)
        c = position_cursor(self._job, self._position_epoch, world, self._rank, self._worker,
                            self._num_workers, self._position_consumed, sources)
        deadline = time.monotonic() + self._reconnect_timeout
        while True:
            self._flush_reports(progress=True)
            sync_id = self._send_sync()
            with self._cv:
                retry = min(deadline, time.monotonic() + 1.0)
                while (sync_id and self._ledger.synced < sync_id and self._fatal is None and
                       not self._closing and time.monotonic() < retry):
                    self._cv.wait(retry - time.monotonic())
                if (sync_id and self._ledger.synced >= sync_id) or self._job_done:
                    # JobDone follows the last epoch's reports made durable.
                    return c
                if self._fatal is not None:
                    raise self._fatal
                if self._closing:
                    raise ReaderError(grpc.StatusCode.CANCELLED, "reader closed")
                if time.monotonic() >= deadline:
                    raise ReaderError(grpc.StatusCode.UNAVAILABLE,
                                      f"coordinator {self._coordinator} did not confirm the "
                                      f"reports of job {self._job} rank {self._rank}; the cursor "
                                      "is not safe to save")
                if not sync_id:
                    self._cv.wait(max(0.0, retry - time.monotonic()))

    def want(self, units):
        """Changes how many units this reader holds at once (0 = take no new
        work; held units are still delivered)."""
        self._units_in_flight = max(0, units)
        self._send(coordinator_pb2.TrainerMessage(want=coordinator_pb2.Want(credits=units)))

    def close(self):
        """Reports what was consumed, gives unfinished units back (Release) and
        ends the session. Idempotent."""
        with self._cv:
            if self._closed:
                return
            self._closed = True
        _lifecycle.closed(self)
        if sys.is_finalizing():
            # Collected during interpreter shutdown (after atexit): the
            # session and gRPC threads no longer run, so reporting would hang
            # (grpc's channel close waits for them). The leases expire after
            # their TTL as if the process had died.
            return
        # The input wait not yet reported.
        wait = self._take_input_wait()
        if wait is not None:
            self._send(coordinator_pb2.TrainerMessage(
                heartbeat=coordinator_pb2.Heartbeat(input_wait=wait)))
        # No new grants (a Release frees a credit the coordinator would
        # refill), and a Synced means every grant already sent has arrived:
        # all of them are released below instead of lingering until the TTL.
        if self._send(coordinator_pb2.TrainerMessage(want=coordinator_pb2.Want(credits=0))):
            sync_id = self._send_sync()
            with self._cv:
                until = time.monotonic() + 2.0
                while (sync_id and self._ledger.synced < sync_id and self._out is not None and
                       time.monotonic() < until):
                    self._cv.wait(until - time.monotonic())
        with self._cv:
            for u in self._units.values():
                if u.final is None and not u.dropped:
                    u.final = coordinator_pb2.TrainerMessage(release=coordinator_pb2.Release(
                        lease_id=u.lease.lease_id, fence=u.lease.fence, consumed=u.delivered))
        self._flush_reports(progress=False)
        with self._cv:
            self._closing = True
            units = list(self._units.values()) + self._retired
            streams = [u.call for u in units if u.call is not None]
            out = self._out
            self._cv.notify_all()
        for stream in streams:
            stream.finish()
        if out is not None:
            out.put(None)  # half-close: the coordinator ends the stream after the reports
        self._session_thread.join(timeout=5)
        self._maintenance_thread.join(timeout=5)
        for u in units:
            if u.thread is not None:
                u.thread.join(timeout=5)
        with self._cv:
            # A unit's thread may still be connecting (subscribed to its
            # channel's state): closing the channel under it makes grpcio's
            # polling thread fail.
            until = time.monotonic() + 5
            while self._opening and time.monotonic() < until:
                self._cv.wait(0.05)
            data_channels = list(self._data_stubs.values())
            self._data_stubs.clear()
        for channel, _, watch in data_channels:
            channel.unsubscribe(watch)
            channel.close()
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ------------------------------------------------------------- internals

    def _make_channel(self, address):
        return tls.coordinator_channel(address, self._credentials, _CHANNEL_OPTIONS)

    def _wait(self, deadline):
        if deadline is None:
            self._cv.wait()
            return
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("no event within the timeout")
        self._cv.wait(left)

    def _send(self, message):
        out = self._out
        if out is None:
            return False
        out.put(message)
        return True

    def _send_sync(self):
        with self._write_lock:
            out = self._out
            if out is None:
                return 0
            with self._cv:
                sync_id = self._ledger.next_sync_id()
            out.put(coordinator_pb2.TrainerMessage(sync=coordinator_pb2.Sync(id=sync_id)))
            return sync_id

    def _flush_reports(self, progress, force=False):
        with self._flush_lock:
            out = []
            with self._cv:
                for u in self._units.values():
                    if u.final is not None:
                        out.append((u, u.final))
                    elif progress and not u.dropped and (u.delivered > u.reported or force):
                        out.append((u, coordinator_pb2.TrainerMessage(
                            progress=coordinator_pb2.Progress(
                                lease_id=u.lease.lease_id, fence=u.lease.fence,
                                consumed=u.delivered))))
            out.sort(key=lambda x: x[0].order)  # acknowledgement order = delivery order
            for u, m in out:
                with self._write_lock:
                    if not self._send(m):
                        return  # disconnected: re-sent after reconnecting
                stream = None
                with self._cv:
                    if m.HasField("progress"):
                        u.reported = max(u.reported, m.progress.consumed)
                    else:
                        self._ledger.sent(u.lease.lease_id, m, u.order)
                        self._units.pop(u.lease.lease_id, None)
                        stream = u.call
                        self._retired.append(u)
                        self._cv.notify_all()
                if stream is not None:
                    stream.finish()  # handed back: its stream is not needed

    def _requests(self, out, first):
        for m in first:
            yield m
        while True:
            m = out.get()
            if m is None:
                return
            yield m

    def _run_session(self):
        backoff = 0.1
        unreachable_since = time.monotonic()
        next_transport_check = 0.0
        while True:
            with self._cv:
                if self._closing or self._job_done:
                    return
            try:
                grpc.channel_ready_future(self._channel).result(timeout=min(backoff * 5, 1.0))
                ready = True
            except grpc.FutureTimeoutError:
                ready = False
                # A client and coordinator that disagree about TLS fail every
                # connect the same way: say so instead of retrying until the
                # timeout.
                if time.monotonic() >= next_transport_check:
                    next_transport_check = time.monotonic() + _TRANSPORT_CHECK_PERIOD
                    mismatch = tls.transport_mismatch("coordinator", self._coordinator,
                                                      self._credentials is not None)
                    if mismatch is not None:
                        with self._cv:
                            self._fatal = ReaderError(grpc.StatusCode.FAILED_PRECONDITION,
                                                      mismatch)
                            self._cv.notify_all()
                        return
            status = None
            welcomed = False
            if ready:
                hello = coordinator_pb2.Hello(job=self._job, rank=self._rank, worker=self._worker,
                                              num_workers=self._num_workers,
                                              trainer_id=self._trainer_id)
                with self._cv:
                    if self._resume_from is not None and not self._resume_done:
                        hello.cursor.CopyFrom(self._resume_from)
                        hello.resume_attempt = self._resume_attempt
                out = queue.Queue()
                with self._write_lock:
                    self._out = out
                first = [coordinator_pb2.TrainerMessage(hello=hello),
                         coordinator_pb2.TrainerMessage(
                             want=coordinator_pb2.Want(credits=self._units_in_flight))]
                call = self._stub.Session(self._requests(out, first))
                with self._cv:
                    self._session_call = call
                    if self._closing:
                        call.cancel()
                try:
                    for m in call:
                        if m.HasField("welcome") and not welcomed:
                            welcomed = True
                            backoff = 0.1
                            self._handle(m)
                            self._after_reconnect()
                            continue
                        self._handle(m)
                    status = grpc.StatusCode.OK
                except grpc.RpcError as e:
                    status = e.code()
                    details = e.details()
                finally:
                    with self._write_lock:
                        self._out = None
                    out.put(None)
                    with self._cv:
                        self._hold.disconnected()
                        self._cv.notify_all()
            with self._cv:
                if self._closing or self._job_done:
                    return
                if status in _TERMINAL:
                    self._fatal = ReaderError(status, details)
                    self._cv.notify_all()
                    return
                if welcomed:
                    unreachable_since = time.monotonic()
                    self.stats["reconnects"] += 1
                if time.monotonic() - unreachable_since > self._reconnect_timeout:
                    self._fatal = ReaderError(
                        grpc.StatusCode.UNAVAILABLE,
                        f"coordinator {self._coordinator} unreachable for "
                        f"{self._reconnect_timeout:.0f}s")
                    self._cv.notify_all()
                    return
                until = time.monotonic() + backoff * random.uniform(0.5, 1.0)
                while not self._closing and time.monotonic() < until:
                    self._cv.wait(until - time.monotonic())
                backoff = min(backoff * 2, 5.0, self._hold.lease_ttl / 4)

    def _after_reconnect(self):
        # Finals the old stream may have lost, then every live unit's position,
        # then a Sync: leases the coordinator no longer knows are Rejected
        # before the Synced, and their rest is never delivered.
        with self._cv:
            finals = self._ledger.unconfirmed()
        for m in finals:
            self._send(m)
        self._flush_reports(progress=True, force=True)
        sync_id = self._send_sync()
        with self._cv:
            self._hold.reconnected(sync_id)

    def _retire(self, lease_id):
        """Under the lock; returns the unit's stream, for the caller to close
        once it has released the lock (or None)."""
        u = self._units.pop(lease_id, None)
        if u is None:
            return None
        u.dropped = True
        u.buffer.clear()
        u.final = None
        self._retired.append(u)
        return u.call

    def _handle(self, m):
        resend = stream = None
        with self._cv:
            kind = m.WhichOneof("msg")
            if kind == "welcome":
                if m.welcome.heartbeat_interval_ms > 0:
                    self._heartbeat_interval = m.welcome.heartbeat_interval_ms / 1000
                if m.welcome.lease_ttl_ms > 0:
                    self._hold.lease_ttl = m.welcome.lease_ttl_ms / 1000
                self._world_size = m.welcome.world_size
                self._resume_done = True
            elif kind == "synced":
                self._ledger.on_synced(m.synced.id)
                self._hold.on_synced(self._ledger.synced)
            elif kind == "waiting":
                pass
            elif kind == "epoch_begin":
                b = m.epoch_begin
                if b.epoch > self._last_epoch_begin:
                    self._last_epoch_begin = b.epoch
                    self._entries.append(("epoch_begin", (b.epoch, b.samples_for_rank,
                                                          b.already_consumed, None,
                                                          b.samples_for_worker,
                                                          b.already_consumed_by_worker)))
            elif kind == "epoch_end":
                if m.epoch_end.epoch > self._last_epoch_end:
                    self._last_epoch_end = m.epoch_end.epoch
                    self._entries.append(("epoch_end", (m.epoch_end.epoch,)))
            elif kind == "job_done":
                self._job_done = True
                message = m.job_done.message or f"job {self._job} is done"
                self._entries.append(("done", (m.job_done.num_epochs, 0, 0, None, 0, 0, message)))
            elif kind == "grant":
                lease = m.grant.lease
                if lease.unit.mix_samples:  # a unit names the sources it reads
                    names = self._source_names
                    names.extend([""] * (len(lease.unit.mix_samples) - len(names)))
                    for seg in lease.unit.segments:
                        if 0 <= seg.source < len(names):
                            names[seg.source] = seg.source_name
                final = self._ledger.find(lease.lease_id)
                held = self._units.get(lease.lease_id)
                if final is not None:
                    resend = final  # re-announced after a reconnect
                elif held is not None and lease.fence == held.lease.fence:
                    # Sent again (a reconnect, or a token near its expiry):
                    # streams opened from now on present the new token.
                    held.lease.CopyFrom(lease)
                elif lease.lease_id not in self._units and not self._closing:
                    u = _Unit(lease, self._next_order)
                    self._next_order += 1
                    self._units[lease.lease_id] = u
                    self._entries.append(("unit", u))
                    u.thread = threading.Thread(target=self._fetch, args=(u,), daemon=True,
                                                name="sluice-fetch")
                    u.thread.start()
            elif kind == "revoke":
                stream = self._retire(m.revoke.lease_id)
            elif kind == "rejected":
                stream = self._retire(m.rejected.lease_id)
            self._cv.notify_all()
        if stream is not None:
            stream.finish()
        if resend is not None:
            self._send(resend)

    def _earlier_progress(self, u):
        return [(o.order, o.next_fetch, o.fetch) for o in self._units.values()
                if o.order < u.order and o.lease.data_server == u.lease.data_server]

    def _fetch_may_start(self, u):
        """The turn rule (_rules.fetch_may_start) over the units held."""
        return _rules.fetch_may_start(
            u.order, u.lease.data_server,
            [(o.order, o.lease.data_server, not o.dropped and o.fetch == "running",
              o.lease.unit.end - o.next_fetch, o.last_batch) for o in self._units.values()])

    def _read_samples(self, address):
        """ReadSamples on `address`, its responses as bytes (see _wire)."""
        with self._cv:
            stub = self._data_stubs.get(address)
            if stub is None:
                channel = tls.channel(address, self._credentials, _DATA_CHANNEL_OPTIONS)
                # Watched for the channel's lifetime (see _connect): grpcio's
                # watching thread also services the connection attempts.
                watch = functools.partial(self._on_channel_state, address)
                channel.subscribe(watch, try_to_connect=True)
                stub = (channel, channel.unary_stream(
                    _READ_SAMPLES, request_serializer=dataserver_pb2.ReadRequest.SerializeToString,
                    response_deserializer=None), watch)
                self._data_stubs[address] = stub
            return stub[1]

    def _connect(self, address, timeout=_CONNECT_TIMEOUT):
        """Waits (at most `timeout`) until the channel to `address` has
        connected or failed to (a server that is down fails at once)."""
        deadline = time.monotonic() + timeout
        with self._cv:
            while (self._channel_states.get(address) not in _SETTLED and not self._closing and
                   time.monotonic() < deadline):
                self._cv.wait(deadline - time.monotonic())

    def _on_channel_state(self, address, state):
        with self._cv:
            self._channel_states[address] = state
            self._cv.notify_all()

    def _back_off(self, u, address, error):
        """Seconds a failed stream's unit waits before it is re-routed: the
        more streams of its shard from `address` failed in a row, the longer
        (the first re-routes at once), so a shard a server cannot serve
        (missing, unreadable) does not become a grant/re-route storm; logged
        at the first failure and every tenth."""
        with self._cv:
            n, wait, log = self._reroute_backoff.failed(address, _unit_key(u.lease.unit))
        if log:
            _log.warning("sluice: job %s rank %d: stream from data server %s failed (%d in a "
                         "row), re-routing: %s", self._job, self._rank, address, n, error)
        return wait

    def _finish_fetch(self, u, state, error="", retry_in=0.0):
        with self._cv:
            u.call = None
            if u.fetch == "running":
                u.fetch, u.fetch_error = state, error
                u.retry_at = time.monotonic() + retry_in
            self._cv.notify_all()

    def _fetch(self, u):
        """Opens the unit's stream when its turn comes (on its own thread, as
        the turn may take a while); the consumer reads it (_pull)."""
        address = u.lease.data_server
        if not address:
            # No live data server: wait a little (notifications for other
            # units do not cut this short), then ask for a re-route.
            deadline = time.monotonic() + 0.5
            with self._cv:
                while not (u.dropped or self._closing) and time.monotonic() < deadline:
                    self._cv.wait(deadline - time.monotonic())
            self._finish_fetch(u, "failed", "no live data server")
            return
        request = dataserver_pb2.ReadRequest(lease=u.lease, decode=self._decode,
                                             fields=self._fields,
                                             max_batch_bytes=self._max_batch_bytes)
        with self._cv:
            # One stream per data server carries data at a time, as in the
            # C++ Reader: this unit's opens when every earlier unit on the
            # same server is at its last batch (concurrent streams to one
            # server only compete for the same cores).
            # The turn is an optimisation, never a reason to stall: when the
            # earlier streams make no progress for _TURN_PATIENCE seconds (a
            # slow consumer, or a stream stuck for any reason), open anyway.
            progress, since = self._earlier_progress(u), time.monotonic()
            while not (u.dropped or self._closing or self._fetch_may_start(u)):
                self._cv.wait(_TURN_PATIENCE / 4)
                now_progress = self._earlier_progress(u)
                if now_progress != progress:
                    progress, since = now_progress, time.monotonic()
                elif time.monotonic() - since > _TURN_PATIENCE:
                    break
            while self._forking and not (u.dropped or self._closing):
                self._cv.wait()
            if u.dropped or self._closing:
                return
            request.start = u.next_fetch
            self._opening += 1
        try:
            read_samples = self._read_samples(address)
            # Connect first, on this thread. A single-threaded stream's call
            # is driven only by the thread that reads it: started on a
            # channel that is still connecting while the consumer reads
            # another unit, its TCP/HTTP2 handshake went unserviced and was
            # shut down, and the call failed with "tcp handshaker shutdown",
            # a spurious re-route. A server that cannot be reached in time
            # fails the call below, as before.
            self._connect(address)
            # Sends the request: the server streams into the connection's
            # flow-control window until the consumer reads.
            stream = _grpcio.Stream(read_samples(request))
        except ValueError:  # grpc: the channel was closed under us
            with self._cv:
                self._opening -= 1
                self._cv.notify_all()
            if self._closing:
                return
            raise
        with self._cv:
            self._opening -= 1
            opened = not (u.dropped or self._closing)
            if opened:
                u.call = stream
            self._cv.notify_all()
        if not opened:
            stream.finish()

    def _suspend_streams(self):
        """Before fork(): ends every open ReadSamples stream, so none is in
        flight in the child (grpcio's fork handler there would wait forever
        for a single-threaded call only this process can read). The units
        keep what they received; _resume_streams opens their streams again
        from the next sample, on the same data server."""
        with self._cv:
            self._forking = True
            while self._opening:
                self._cv.wait()
            streams = []
            for u in self._units.values():
                if u.call is not None:
                    streams.append(u.call)
                    u.call = None
                    u.reopen = True
        for stream in streams:
            stream.finish()

    def _resume_streams(self):
        with self._cv:
            self._forking = False
            for u in self._units.values():
                if u.reopen:
                    u.reopen = False
                    if u.fetch == "running" and not (u.dropped or self._closing):
                        u.thread = threading.Thread(target=self._fetch, args=(u,), daemon=True,
                                                    name="sluice-fetch")
                        u.thread.start()
            self._cv.notify_all()

    def _pull(self, u, stream):
        """Receives the next batch of `u`'s stream on the consumer's thread
        (the data channels are grpcio single-threaded unary streams: the
        thread that waits for a message also receives it, so a batch reaches
        the consumer without a thread hand-off)."""
        lease = u.lease
        address, shard_url = lease.data_server, lease.unit.shard_url
        shard = _unit_key(lease.unit)
        batch = failure = None
        try:
            batch = stream.next()
        except StopIteration:
            pass
        except grpc.RpcError as e:
            failure = e
        with self._cv:
            u.pulling_since = None
            replaced = u.call is not stream  # cut for a fork: reopened from next_fetch
        if replaced:
            return
        if failure is not None:
            self._stream_failed(u, failure)
            return
        if batch is None:
            # (After the last batch the stream's end is read below, and the
            # unit is not read again.)
            self._finish_fetch(u, "failed", "stream ended early")
            return
        protocol_error = None
        try:
            pieces = lease.unit.pieces
            if lease.unit.mix_samples:  # several sources: samples name shard and source
                names = {seg.source: seg.source_name for seg in lease.unit.segments}
                converted = [Sample(lease.epoch, lease.rank, pieces[piece].shard_index,
                                    pieces[piece].url, index, key, address, skipped, reason,
                                    fields, names[pieces[piece].source])
                             for key, index, skipped, reason, fields, piece
                             in _wire.sample_batch(batch, _DTYPES)]
            elif pieces:  # a shuffle window: each sample names its shard
                converted = [Sample(lease.epoch, lease.rank, pieces[piece].shard_index,
                                    pieces[piece].url, index, key, address, skipped, reason,
                                    fields)
                             for key, index, skipped, reason, fields, piece
                             in _wire.sample_batch(batch, _DTYPES)]
            else:
                converted = [Sample(lease.epoch, lease.rank, lease.unit.shard_index, shard_url,
                                    index, key, address, skipped, reason, fields)
                             for key, index, skipped, reason, fields, _
                             in _wire.sample_batch(batch, _DTYPES)]
        except (IndexError, KeyError):
            converted = []
            protocol_error = (f"data server {address} sent a sample of a piece the lease "
                              f"{lease.lease_id} does not have")
        except _wire.WireError as e:
            converted = []
            protocol_error = f"data server {address} sent a malformed SampleBatch: {e}"
        with self._cv:
            if u.call is not stream:
                return  # cut for a fork meanwhile: the new stream resends these
            abandoned = u.dropped or self._closing
            if not abandoned:
                self.stats["batches"] += 1
                # A plain unit's samples carry their position (their index in
                # the shard); a window's their index in their own shard.
                for s in converted:
                    if not pieces and s.index != u.next_fetch:
                        protocol_error = (f"data server {address} sent sample {s.index}, "
                                          f"expected {u.next_fetch}")
                        break
                    u.buffer.append(s)
                    u.next_fetch += 1
                u.last_batch = len(converted)
                if not protocol_error:
                    self._reroute_backoff.succeeded(address, shard)
                complete = u.next_fetch == lease.unit.end
                self._cv.notify_all()
        if abandoned:
            stream.finish()
        elif protocol_error:
            stream.finish()
            self._finish_fetch(u, "failed", protocol_error)
        elif complete:
            # Read the stream's end too (it follows the last batch), so the
            # server sees it finish rather than cancelled.
            try:
                stream.next()
            except (StopIteration, grpc.RpcError):
                pass
            self._finish_fetch(u, "done")

    def _stream_failed(self, u, e):
        lease = u.lease
        address = lease.data_server
        with self._cv:
            # Dropped, closing, or handed back (a Release as close() begins
            # cancels the stream): an expected end, not a failure.
            if u.dropped or self._closing or u.final is not None:
                return
            stalled = u.stalled
        code = e.code()
        if code == grpc.StatusCode.ABORTED:
            # The data server holds a newer fence for these samples. Usually
            # the coordinator granted them again and revokes this lease; if
            # it still counts the lease live, handing it back is what lets
            # the rest be granted anew (with a fence the server accepts)
            # instead of staying with a lease nobody can read. A Release the
            # coordinator finds stale is refused, harmlessly.
            _log.warning("sluice: job %s rank %d: data server %s refused lease %s (%s); "
                         "handing it back", self._job, self._rank, address, lease.lease_id,
                         e.details())
            with self._cv:
                u.dropped = True
                u.buffer.clear()
                u.final = coordinator_pb2.TrainerMessage(release=coordinator_pb2.Release(
                    lease_id=lease.lease_id, fence=lease.fence, consumed=u.delivered))
                self.stats["refused_leases"] += 1
                self._cv.notify_all()
            self._flush_reports(progress=False)
            return
        if code in _FATAL_READ:
            with self._cv:
                self._fatal = ReaderError(code, f"lease {lease.lease_id}: {e.details()}")
                self._cv.notify_all()
            return
        if code == grpc.StatusCode.UNAVAILABLE and address not in self._transport_checked:
            self._transport_checked.add(address)
            mismatch = tls.transport_mismatch("data server", address,
                                              self._credentials is not None)
            if mismatch is not None:
                with self._cv:
                    self._fatal = ReaderError(grpc.StatusCode.FAILED_PRECONDITION, mismatch)
                    self._cv.notify_all()
                return
        error = (f"{address}: no data for {self._stall_timeout}s" if stalled
                 else f"{address}: {code.name}: {e.details()}")
        self._finish_fetch(u, "failed", error, retry_in=self._back_off(u, address, error))

    def _run_maintenance(self):
        last_heartbeat = 0.0
        while True:
            with self._cv:
                period = min(self._heartbeat_interval, self._progress_interval,
                             self._stall_timeout / 2)
                until = time.monotonic() + period
                while not self._closing and time.monotonic() < until:
                    self._cv.wait(until - time.monotonic())
                if self._closing:
                    return
                now = time.monotonic()
                for u in self._units.values():
                    # Only a stream the consumer is waiting on can stall (one
                    # not yet read is just ahead of a busy consumer).
                    if (u.call is not None and u.pulling_since is not None and not u.stalled and
                            now - u.pulling_since > self._stall_timeout):
                        u.stalled = True
                        u.call.cancel()
                self._retired = [u for u in self._retired
                                 if u.thread is not None and u.thread.is_alive()]
                unconfirmed = bool(self._ledger)
                heartbeat = self._heartbeat_interval
            if time.monotonic() - last_heartbeat >= heartbeat:
                # A Sync renews like a heartbeat and lets confirmed finals go;
                # a heartbeat carries the consumer's input wait since the last
                # one (one message per interval either way).
                if unconfirmed:
                    if self._send_sync():
                        last_heartbeat = time.monotonic()
                elif self._send(coordinator_pb2.TrainerMessage(
                        heartbeat=coordinator_pb2.Heartbeat(
                            input_wait=self._take_input_wait()))):
                    last_heartbeat = time.monotonic()
            self._flush_reports(progress=True)
