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
import os
import socket
import sys
import threading
import time

import grpc

from sluice import _launcher, _lifecycle, _rules, tls
from sluice._cursor import merge_cursors, position_cursor
from sluice._fetch import Fetcher
from sluice._malloc import tune_malloc
from sluice._session import Session
from sluice._types import DataLossError, Event, JobDoneError, ReaderError, Sample
from sluice.v1 import coordinator_pb2, coordinator_pb2_grpc
from sluice.v1 import dataserver_pb2

__all__ = ["Event", "JobDoneError", "Reader", "ReaderError", "Sample", "merge_cursors",
           "tune_malloc"]


class Reader(Session, Fetcher):
    """See the module docstring. Iterating yields Samples across epochs until
    the job is done; next_event() also returns epoch boundaries.

    The facade: options, state and the consumer's side live here; the
    coordinator session in Session (_session.py), the data-server streams
    in Fetcher (_fetch.py)."""

    def __init__(self, coordinator, job, rank=0, worker=0, *, num_workers=0, trainer_id=None,
                 units_in_flight=4,
                 decode=True, resize_shorter_side=0, crop=(0, 0), transform=None, fields=(),
                 max_batch_bytes=0, progress_interval=0.5, stall_timeout=60.0,
                 reconnect_timeout=120.0, resume_from=None, resume_attempt=None, launch_id=None,
                 credentials=None,
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
        # A Reader with a cursor restores it: its launch id tells this restore
        # from an earlier one of the same cursor (a second run resumed from
        # the same checkpoint), and other ranks' and workers' Readers join it.
        # resume_attempt defaults to the launcher's restart id (_launcher.py).
        self._resume_attempt = (_launcher.restart_id() if resume_attempt is None
                                else resume_attempt)
        self._launch_id = launch_id or _launcher.new_launch_id()
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
        self._lost = _rules.LostDeliveries()
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

    def _wait(self, deadline):
        if deadline is None:
            self._cv.wait()
            return
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("no event within the timeout")
        self._cv.wait(left)

