"""The Reader's timing and bookkeeping rules, apart from its threads and
streams so they can be tested on their own with a fake clock. The same
rules as the C++ Reader's (client/cpp/report_ledger.h, lease_hold.h,
fetch_turn.h, reroute_backoff.h, input_wait.h). None is thread-safe: the
Reader calls them under its lock."""
import bisect
import time

from sluice.v1 import coordinator_pb2

# Upper bounds (seconds) of the protocol's InputWait buckets; the last bucket
# is +Inf (protos/sluice/v1/coordinator.proto).
INPUT_WAIT_BOUNDS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10)


class ReportLedger:
    """Final reports (Complete, Reroute, Release) until the coordinator has
    made them durable.

    A final may be lost with the session stream: the coordinator's
    Synced{n} answers a Sync{n} sent after the report, and only then is it
    known to be committed. Until then it is re-sent after every reconnect,
    in grant order, and a grant re-announced for a lease already reported
    gets the report again. Sync ids increase, so Synced{n} confirms every
    Sync below n and every report sent before them.

    A report the coordinator did not take (its lease expired first: a
    paused reader) leaves samples delivered that the coordinator will grant
    again: drop and drop_same_unit hand back (lease, delivered) of each such
    report, for LostDeliveries, and forget it."""

    def __init__(self):
        # lease_id -> (message, order, last Sync id when sent, lease, delivered)
        self._reports = {}
        self.last_sync_id = 0
        self.synced = 0

    def next_sync_id(self):
        self.last_sync_id += 1
        return self.last_sync_id

    def sent(self, lease, delivered, message, order):
        """`message` (the final report of `lease`, which had delivered
        `delivered` samples of its unit, granted `order`th) was written
        after every Sync up to last_sync_id."""
        self._reports[lease.lease_id] = (message, order, self.last_sync_id, lease, delivered)

    def on_synced(self, sync_id):
        self.synced = max(self.synced, sync_id)
        for lease_id in [k for k, r in self._reports.items() if r[2] < self.synced]:
            del self._reports[lease_id]

    def unconfirmed(self):
        """The reports not yet confirmed, in grant order."""
        return [r[0] for r in sorted(self._reports.values(), key=lambda r: r[1])]

    def find(self, lease_id):
        """The unconfirmed report of `lease_id`, or None."""
        report = self._reports.get(lease_id)
        return None if report is None else report[0]

    def drop(self, lease_id):
        """The coordinator no longer knows `lease_id` (Revoke, Rejected):
        forgets its report; (lease, delivered), or None."""
        report = self._reports.pop(lease_id, None)
        return None if report is None else (report[3], report[4])

    def drop_same_unit(self, lease):
        """`lease` is a new grant: the coordinator grants a unit again only
        after its earlier lease ended, so the reports of other leases of the
        same unit (epoch, sequence, shard) are forgotten; [(lease,
        delivered)]."""
        def same(old):
            return (old.lease_id != lease.lease_id and old.epoch == lease.epoch and
                    old.unit.sequence == lease.unit.sequence and
                    old.unit.shard_index == lease.unit.shard_index)
        ids = [k for k, r in self._reports.items() if same(r[3])]
        return [self._reports.pop(k)[3:] for k in ids]

    def __bool__(self):
        return bool(self._reports)


class LeaseHold:
    """Whether already-fetched samples must be held back.

    A coordinator that has not heard from a trainer for a lease TTL expires
    its leases. After the session has been down for more than half a TTL,
    nothing is delivered until the coordinator has answered the Sync sent
    after re-reporting every held lease (a lease it no longer knows is
    Rejected before the Synced). A stream that goes silent without breaking
    (this process or the coordinator paused) holds too, by this clock: once
    more than 3/4 of a TTL has passed since the send time of the newest Sync
    (or Hello) the coordinator confirmed, until a newer one is confirmed (a
    lease expired meanwhile is Revoked before that Synced). The 1/4 margin
    covers clocks whose rates differ by less than a quarter. `clock` gives
    seconds (time.monotonic)."""

    def __init__(self, clock=time.monotonic):
        self._clock = clock
        self.lease_ttl = 10.0
        self._disconnected_at = None  # while connected
        self._revalidating = False
        self._revalidate_id = 0
        self._confirmed_at = None  # send time of the newest confirmed renewal
        self._hello_sent_at = None
        self._syncs_sent = {}  # id -> send time, not yet confirmed

    def hello_sent(self):
        self._hello_sent_at = self._clock()

    def welcomed(self):
        if self._hello_sent_at is not None:
            self._confirmed_at = max(self._confirmed_at or self._hello_sent_at,
                                     self._hello_sent_at)

    def sync_sent(self, sync_id):
        if len(self._syncs_sent) >= 1024:
            del self._syncs_sent[min(self._syncs_sent)]
        self._syncs_sent[sync_id] = self._clock()

    def disconnected(self):
        if self._disconnected_at is None:
            self._disconnected_at = self._clock()

    def reconnected(self, sync_id):
        """Welcomed again; `sync_id` is the Sync sent after re-reporting,
        0 if it could not be sent."""
        self._revalidating = bool(sync_id) and self._down_too_long()
        self._revalidate_id = sync_id
        if sync_id:
            self._disconnected_at = None

    def on_synced(self, synced):
        if synced >= self._revalidate_id:
            self._revalidating = False
        for sync_id in [i for i in self._syncs_sent if i <= synced]:
            sent = self._syncs_sent.pop(sync_id)
            self._confirmed_at = sent if self._confirmed_at is None else max(
                self._confirmed_at, sent)

    def may_have_lost_leases(self):
        return self._revalidating or self._down_too_long() or self._silent()

    def _silent(self):
        return (self._confirmed_at is not None and
                self._clock() - self._confirmed_at > self.lease_ttl * 3 / 4)

    def _down_too_long(self):
        return (self._disconnected_at is not None and
                self._clock() - self._disconnected_at > self.lease_ttl / 2)


class LostDeliveries:
    """Samples a Reader delivered from a lease it then lost.

    A trainer paused past its lease TTL may have handed samples to the loop
    that its Progress had not yet reported when the coordinator expired the
    lease; the coordinator re-grants the unreported rest to the same reader
    slot while its session is open, so it comes back to this reader. What
    was delivered of every lost
    lease (Revoke, Rejected) is remembered by unit; a later grant of the same
    unit in the same epoch that starts inside it reports those samples as
    consumed at once and fetches only the rest (client/cpp/lost_deliveries.h
    is the same rule)."""

    def __init__(self):
        self._ranges = {}  # (epoch, sequence, shard_index) -> [begin, end)

    @staticmethod
    def _key(lease):
        return (lease.epoch, lease.unit.sequence, lease.unit.shard_index)

    def lost(self, lease, delivered):
        if delivered <= 0:
            return
        begin, end = lease.unit.begin, lease.unit.begin + delivered
        old = self._ranges.get(self._key(lease))
        if old is not None and begin <= old[1] and end >= old[0]:
            begin, end = min(begin, old[0]), max(end, old[1])
        self._ranges[self._key(lease)] = (begin, end)

    def already_delivered(self, lease):
        key = self._key(lease)
        got = self._ranges.get(key)
        if got is None:
            return 0
        lo, hi = got
        begin, end = lease.unit.begin, lease.unit.end
        if not lo <= begin < hi:
            return 0
        skip = min(hi, end) - begin
        if hi <= end:
            del self._ranges[key]
        else:
            self._ranges[key] = (end, hi)
        return skip

    def forget_before(self, epoch):
        for key in [k for k in self._ranges if k[0] < epoch]:
            del self._ranges[key]

    def __len__(self):
        return len(self._ranges)


def fetch_may_start(order, data_server, held):
    """The turn rule: one stream per data server carries data at a time. A
    unit (granted `order`th, on `data_server`) may open its stream once every
    earlier unit on the same server that is still streaming is at its last
    batch: its newest batch was at least as large as what it still lacks.
    `held`: (order, data_server, streaming, remaining, last_batch) per unit."""
    for o_order, o_server, streaming, remaining, last_batch in held:
        if (o_order < order and streaming and o_server == data_server and
                (last_batch == 0 or remaining > last_batch)):
            return False
    return True


class RerouteBackoff:
    """Seconds before re-routing a unit whose stream failed: the more streams
    of one shard from one data server failed in a row, the longer (the first
    at once, then `initial` doubling up to `maximum`), so a shard a server
    cannot serve is no grant/re-route storm. A batch received ends the run."""

    def __init__(self, initial=0.05, maximum=2.0):
        self._initial, self._maximum = initial, maximum
        self._failures = {}

    def failed(self, data_server, shard):
        """(failures in a row, seconds to wait, whether to log: the first
        failure and every tenth)."""
        n = self._failures.get((data_server, shard), 0) + 1
        self._failures[(data_server, shard)] = n
        wait = 0.0 if n == 1 else min(self._maximum, self._initial * 2 ** (n - 2))
        return n, wait, n == 1 or n % 10 == 0

    def succeeded(self, data_server, shard):
        if self._failures:
            self._failures.pop((data_server, shard), None)


class InputWaitHistogram:
    """The consumer's waits for samples in the protocol's InputWait buckets,
    drained into each heartbeat."""

    def __init__(self):
        self._counts = [0] * (len(INPUT_WAIT_BOUNDS) + 1)
        self._sum = 0.0

    def observe(self, seconds):
        self._counts[bisect.bisect_left(INPUT_WAIT_BOUNDS, seconds)] += 1
        self._sum += seconds

    def take(self):
        """The waits since the last call as an InputWait, or None."""
        if not any(self._counts):
            return None
        wait = coordinator_pb2.InputWait(bucket_counts=self._counts, sum_seconds=self._sum)
        self._counts = [0] * (len(INPUT_WAIT_BOUNDS) + 1)
        self._sum = 0.0
        return wait
