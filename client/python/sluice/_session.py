"""The Reader's coordinator side: the Session stream (Hello, Want, the grants,
revokes and epoch markers it brings), reconnecting with back-off, the
reports (Progress, and Complete/Reroute/Release kept in the ledger until a
Sync confirms them) and the maintenance thread's heartbeats and stall checks.

Session is a part of sluice.Reader (reader.py), whose __init__ sets the
state these methods share under Reader._cv; it is not used alone.
"""
import queue
import random
import threading
import time

import grpc

from sluice import tls
from sluice._fetch import CHANNEL_OPTIONS, _Unit
from sluice._types import ReaderError
from sluice.v1 import coordinator_pb2

# Statuses after which reconnecting cannot help.
_TERMINAL = {grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT,
             grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.PERMISSION_DENIED,
             grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.UNIMPLEMENTED}
# While the coordinator cannot be reached, how often to ask it whether it
# speaks TLS (tls.transport_mismatch).
_TRANSPORT_CHECK_PERIOD = 5.0


class Session:
    """The coordinator session of a Reader."""

    def _make_channel(self, address):
        return tls.coordinator_channel(address, self._credentials, CHANNEL_OPTIONS)

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
                self._hold.sync_sent(sync_id)
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
                        self._ledger.sent(u.lease, u.delivered, m, u.order)
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
                                              trainer_id=self._trainer_id,
                                              launch_id=self._launch_id)
                with self._cv:
                    if self._resume_from is not None and not self._resume_done:
                        hello.cursor.CopyFrom(self._resume_from)
                        hello.resume_attempt = self._resume_attempt
                    self._hold.hello_sent()
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
        # Reported but not taken (the lease expired before the report came):
        # everything the report covered was delivered.
        dropped = self._ledger.drop(lease_id)
        if dropped is not None:
            self._lost.lost(*dropped)
        u = self._units.pop(lease_id, None)
        if u is None:
            return None
        self._lost.lost(u.lease, u.delivered)
        u.dropped = True
        u.buffer.clear()
        u.final = None
        self._retired.append(u)
        return u.call

    def _handle(self, m):
        resend = stream = None
        closing = []
        with self._cv:
            kind = m.WhichOneof("msg")
            if kind == "welcome":
                if m.welcome.heartbeat_interval_ms > 0:
                    self._heartbeat_interval = m.welcome.heartbeat_interval_ms / 1000
                if m.welcome.lease_ttl_ms > 0:
                    self._hold.lease_ttl = m.welcome.lease_ttl_ms / 1000
                self._world_size = m.welcome.world_size
                self._resume_done = True
                self._hold.welcomed()
            elif kind == "synced":
                self._ledger.on_synced(m.synced.id)
                self._hold.on_synced(self._ledger.synced)
            elif kind == "waiting":
                pass
            elif kind == "epoch_begin":
                b = m.epoch_begin
                if b.epoch > self._last_epoch_begin:
                    self._last_epoch_begin = b.epoch
                    self._lost.forget_before(b.epoch)
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
                    # A new lease of a unit still held under another lease,
                    # or reported but unconfirmed: the coordinator has taken
                    # the old one back (expired while this session was away;
                    # its Rejected may come after this grant). Retired
                    # first, so what it delivered counts.
                    for old, delivered in self._ledger.drop_same_unit(lease):
                        self._lost.lost(old, delivered)
                    superseded = [i for i, h in self._units.items()
                                  if h.lease.epoch == lease.epoch
                                  and h.lease.unit.sequence == lease.unit.sequence
                                  and h.lease.unit.shard_index == lease.unit.shard_index]
                    closing = [self._retire(i) for i in superseded]
                    u = _Unit(lease, self._next_order)
                    self._next_order += 1
                    self._units[lease.lease_id] = u
                    # Samples delivered from a lost lease of the same unit
                    # (_rules.LostDeliveries): consumed already, reported now.
                    skip = self._lost.already_delivered(lease)
                    u.next_fetch += skip
                    u.delivered = skip
                    if skip and skip == u.size:  # nothing left to read
                        u.fetch = "done"
                        u.final = coordinator_pb2.TrainerMessage(complete=coordinator_pb2.Complete(
                            lease_id=lease.lease_id, fence=lease.fence))
                        self.stats["units_completed"] += 1
                    else:
                        self._entries.append(("unit", u))
                        u.thread = threading.Thread(target=self._fetch, args=(u,), daemon=True,
                                                    name="sluice-fetch")
                        u.thread.start()
            elif kind == "revoke":
                stream = self._retire(m.revoke.lease_id)
            elif kind == "rejected":
                stream = self._retire(m.rejected.lease_id)
            self._cv.notify_all()
        for s in [stream, *closing]:
            if s is not None:
                s.finish()
        if resend is not None:
            self._send(resend)

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
                holding = bool(self._units)
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
                    if holding:
                        # Have the renewal confirmed (LeaseHold): without it a
                        # silent stream holds delivery after 3/4 of a TTL.
                        self._send_sync()
            self._flush_reports(progress=True)
