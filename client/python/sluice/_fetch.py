"""The Reader's data-server side: a unit's ReadSamples stream, opened when its
turn comes and read by the consumer's own thread (_pull), its failures
(re-route with back-off, a refused lease handed back, a fatal error), and
the streams cut and reopened around a fork.

Fetcher is a part of sluice.Reader (reader.py), whose __init__ sets the
state these methods share under Reader._cv; it is not used alone.
"""
import collections
import functools
import logging
import threading
import time

import grpc
import numpy as np

from sluice import _grpcio, _rules, _wire, tls
from sluice._types import DataLossError, ReaderError, Sample
from sluice.v1 import coordinator_pb2, dataserver_pb2

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

# Data-server statuses that are not server faults: fail the reader.
_FATAL_READ = {grpc.StatusCode.DATA_LOSS, grpc.StatusCode.OUT_OF_RANGE,
               grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.PERMISSION_DENIED}

_READ_SAMPLES = "/%s/ReadSamples" % dataserver_pb2.DESCRIPTOR.services_by_name["DataServer"].full_name

# Seconds a unit waits for its stream's turn while the earlier streams on
# its data server make no progress.
_TURN_PATIENCE = 2.0

# Reconnect attempts start 100 ms apart and stay within a second of each
# other. (grpc.min_reconnect_backoff_ms is not set: gRPC takes it as the
# time a connection attempt may take, and 100 ms made connects to a busy
# server time out "before receiving SETTINGS frame".)
CHANNEL_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.max_receive_message_length", 64 << 20),
    # Keepalive: a stopped or silently cut-off coordinator or data server
    # fails its streams within about 4 s (as the C++ client's
    # SetStreamKeepalive); the servers accept pings this often.
    ("grpc.keepalive_time_ms", 2000),
    ("grpc.keepalive_timeout_ms", 2000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
]
# Data-server channels: ReadSamples is read by the consumer's own thread
# (see Fetcher._pull).
_DATA_CHANNEL_OPTIONS = CHANNEL_OPTIONS + [_grpcio.SINGLE_THREADED_UNARY_STREAM]

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


class Fetcher:
    """The data-server streams of a Reader's units."""

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
            while not (u.dropped or self._closing or u.fetch != "running" or
                       self._fetch_may_start(u)):
                self._cv.wait(_TURN_PATIENCE / 4)
                now_progress = self._earlier_progress(u)
                if now_progress != progress:
                    progress, since = now_progress, time.monotonic()
                elif time.monotonic() - since > _TURN_PATIENCE:
                    break
            while self._forking and not (u.dropped or self._closing):
                self._cv.wait()
            if u.dropped or self._closing or u.fetch != "running":
                return  # failed with another stream of its server
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
                self._fatal = (DataLossError if code == grpc.StatusCode.DATA_LOSS else
                               functools.partial(ReaderError, code))(
                                   f"lease {lease.lease_id}: {e.details()}")
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
        if stalled or code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            self._fail_siblings(u, address, error)

    def _fail_siblings(self, failed, address, error):
        """A data server that stalled or cannot be reached fails every unit
        held on it at once: the ones waiting for their turn are re-routed
        without opening a stream, the open streams are cancelled (each then
        fails as stalled), instead of each waiting out its own stall
        timeout, one after another."""
        cancel = []
        with self._cv:
            for o in list(self._units.values()):
                if (o is failed or o.dropped or o.lease.data_server != address or
                        o.fetch != "running"):
                    continue
                if o.call is None:
                    o.fetch, o.fetch_error = "failed", f"{error} (another stream of the server)"
                    o.retry_at = 0.0
                elif not o.stalled:
                    o.stalled = True
                    cancel.append(o.call)
            self._cv.notify_all()
        for call in cancel:
            call.cancel()
