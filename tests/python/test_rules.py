"""The Python Reader's bookkeeping and timing rules (sluice/_rules.py) on a
fake clock: the report ledger, holding delivery after half a lease TTL, the
one-stream-per-data-server turn, the re-route back-off and the input-wait
histogram. No servers; the same cases as the C++ rules' unit tests
(tests/unit/client)."""
from sluice import _rules
from sluice._cursor import merge_cursors, position_cursor
from sluice.v1 import common_pb2, coordinator_pb2


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def _complete(lease):
    return coordinator_pb2.TrainerMessage(complete=coordinator_pb2.Complete(lease_id=lease))


def _leases(messages):
    return [m.complete.lease_id for m in messages]


# ------------------------------------------------------------ ReportLedger

def test_a_report_is_confirmed_only_by_a_sync_sent_after_it():
    ledger = _rules.ReportLedger()
    assert ledger.next_sync_id() == 1  # Sync{1} goes out before the report
    ledger.sent(_lease(0, 0, 0, 0, 10, "a"), 0, _complete("a"), 0)
    ledger.on_synced(1)
    assert _leases(ledger.unconfirmed()) == ["a"]
    assert ledger.find("a") is not None
    assert ledger.next_sync_id() == 2
    ledger.on_synced(2)
    assert not ledger
    assert ledger.find("a") is None
    assert ledger.synced == 2


def test_a_synced_confirms_every_report_before_its_sync():
    ledger = _rules.ReportLedger()
    ledger.sent(_lease(0, 0, 0, 0, 10, "a"), 0, _complete("a"), 0)
    ledger.next_sync_id()
    ledger.sent(_lease(0, 0, 0, 0, 10, "b"), 0, _complete("b"), 1)
    ledger.next_sync_id()
    ledger.sent(_lease(0, 0, 0, 0, 10, "c"), 0, _complete("c"), 2)
    ledger.on_synced(2)  # Synced{1} was lost with a broken stream
    assert _leases(ledger.unconfirmed()) == ["c"]


def test_a_late_smaller_synced_changes_nothing():
    ledger = _rules.ReportLedger()
    ledger.next_sync_id()
    ledger.next_sync_id()
    ledger.sent(_lease(0, 0, 0, 0, 10, "a"), 0, _complete("a"), 0)
    ledger.next_sync_id()
    ledger.on_synced(3)
    ledger.sent(_lease(0, 0, 0, 0, 10, "b"), 0, _complete("b"), 1)
    ledger.on_synced(1)
    assert ledger.synced == 3
    assert _leases(ledger.unconfirmed()) == ["b"]


def test_unconfirmed_reports_come_in_grant_order():
    ledger = _rules.ReportLedger()
    ledger.sent(_lease(0, 0, 0, 0, 10, "z"), 0, _complete("z"), 0)
    ledger.sent(_lease(0, 0, 0, 0, 10, "m"), 0, _complete("m"), 2)
    ledger.sent(_lease(0, 0, 0, 0, 10, "a"), 0, _complete("a"), 1)
    assert _leases(ledger.unconfirmed()) == ["z", "a", "m"]


def test_drop_forgets_a_report_and_says_what_it_delivered():
    # A paused reader's Complete reached the coordinator after its lease
    # expired: the Rejected forgets the report; it had delivered all.
    ledger = _rules.ReportLedger()
    ledger.sent(_lease(0, 0, 0, 0, 10, "a"), 10, _complete("a"), 0)
    assert ledger.drop("b") is None
    lease, delivered = ledger.drop("a")
    assert (lease.lease_id, delivered) == ("a", 10)
    assert not ledger
    assert ledger.drop("a") is None


def test_drop_same_unit_forgets_only_other_leases_of_that_unit():
    ledger = _rules.ReportLedger()
    ledger.sent(_lease(0, 0, 1, 0, 10, "a"), 10, _complete("a"), 0)
    ledger.sent(_lease(0, 0, 2, 0, 10, "b"), 4, _complete("b"), 1)
    ledger.sent(_lease(1, 0, 1, 0, 10, "c"), 10, _complete("c"), 2)
    dropped = ledger.drop_same_unit(_lease(0, 0, 1, 0, 10, "new"))
    assert [(lease.lease_id, delivered) for lease, delivered in dropped] == [("a", 10)]
    assert _leases(ledger.unconfirmed()) == ["b", "c"]
    # A re-announced grant of a reported lease is not a new grant.
    assert ledger.drop_same_unit(_lease(0, 0, 2, 0, 10, "b")) == []


# --------------------------------------------------------------- LeaseHold

def _hold():
    clock = FakeClock()
    hold = _rules.LeaseHold(clock)
    hold.lease_ttl = 10.0
    return clock, hold


def test_connected_delivers_freely():
    clock, hold = _hold()
    clock.now += 3600
    assert not hold.may_have_lost_leases()


def test_down_for_half_a_ttl_still_delivers():
    clock, hold = _hold()
    hold.disconnected()
    clock.now += 5.0
    assert not hold.may_have_lost_leases()
    clock.now += 0.001
    assert hold.may_have_lost_leases()


def test_a_second_disconnect_does_not_restart_the_timer():
    clock, hold = _hold()
    hold.disconnected()
    clock.now += 4
    hold.disconnected()
    clock.now += 2
    assert hold.may_have_lost_leases()


def test_a_short_break_needs_no_confirmation():
    clock, hold = _hold()
    hold.disconnected()
    clock.now += 3
    hold.reconnected(7)
    assert not hold.may_have_lost_leases()
    clock.now += 30
    assert not hold.may_have_lost_leases()


def test_a_long_break_holds_until_the_sync_after_the_reports_is_answered():
    clock, hold = _hold()
    hold.disconnected()
    clock.now += 6
    hold.reconnected(7)
    assert hold.may_have_lost_leases()
    hold.on_synced(6)
    assert hold.may_have_lost_leases()
    hold.on_synced(7)
    assert not hold.may_have_lost_leases()


def test_a_silent_stream_holds_after_three_quarters_of_a_ttl_from_the_last_confirmed_renewal():
    # This process (or the coordinator) was paused: the stream never broke,
    # but no renewal was confirmed for longer than 3/4 of a TTL.
    clock, hold = _hold()
    hold.hello_sent()
    clock.now += 0.01
    hold.welcomed()
    clock.now += 7.5 - 0.01
    assert not hold.may_have_lost_leases()
    clock.now += 0.001
    assert hold.may_have_lost_leases()
    hold.sync_sent(1)  # after the pause
    clock.now += 0.02
    hold.on_synced(1)  # answered: renewed no earlier than it was sent
    assert not hold.may_have_lost_leases()
    clock.now += 7.5 - 0.02
    assert not hold.may_have_lost_leases()
    clock.now += 0.001
    assert hold.may_have_lost_leases()


def test_only_the_send_time_of_a_confirmed_sync_counts():
    clock, hold = _hold()
    hold.hello_sent()
    hold.welcomed()
    hold.sync_sent(1)
    clock.now += 9  # paused with Sync 1 unanswered
    hold.sync_sent(2)
    hold.on_synced(1)  # its renewal dates from before the pause
    assert hold.may_have_lost_leases()
    hold.on_synced(2)
    assert not hold.may_have_lost_leases()


def test_a_reconnect_whose_sync_was_not_sent_keeps_holding():
    clock, hold = _hold()
    hold.disconnected()
    clock.now += 6
    hold.reconnected(0)
    hold.on_synced(100)
    assert hold.may_have_lost_leases()


# ---------------------------------------------------------------- the turn

def test_the_first_unit_starts_at_once():
    assert _rules.fetch_may_start(0, "a:1", [(0, "a:1", False, 0, 0)])


def test_waits_for_an_earlier_stream_to_the_same_server():
    assert not _rules.fetch_may_start(1, "a:1", [(0, "a:1", True, 100, 0)])
    assert not _rules.fetch_may_start(1, "a:1", [(0, "a:1", True, 33, 32)])
    assert _rules.fetch_may_start(1, "a:1", [(0, "a:1", True, 32, 32)])


def test_other_servers_and_later_or_finished_units_do_not_hold_it_up():
    assert _rules.fetch_may_start(1, "b:1", [(0, "a:1", True, 100, 0)])
    assert _rules.fetch_may_start(0, "a:1", [(1, "a:1", True, 100, 0)])
    assert _rules.fetch_may_start(1, "a:1", [(0, "a:1", False, 100, 0)])


def test_every_earlier_stream_to_the_server_must_be_near_its_end():
    held = [(0, "a:1", True, 10, 32), (1, "a:1", True, 100, 32)]
    assert not _rules.fetch_may_start(2, "a:1", held)
    assert _rules.fetch_may_start(1, "a:1", held)


# --------------------------------------------------------- RerouteBackoff

def test_reroutes_first_at_once_then_doubling_from_50_ms_to_2_s():
    backoff = _rules.RerouteBackoff()
    waits = [backoff.failed("a:1", "s")[1] for _ in range(9)]
    assert waits == [0.0, 0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0]


def test_a_stream_failing_forever_is_retried_a_few_times_per_minute():
    backoff = _rules.RerouteBackoff()
    waited, attempts = 0.0, 0
    while waited < 60:
        waited += backoff.failed("a:1", "gone.tar")[1]
        attempts += 1
    assert attempts == 36  # 3.15 s for the first 7, then 2 s each


def test_reroute_failures_count_per_server_and_shard_and_a_batch_ends_the_run():
    backoff = _rules.RerouteBackoff()
    backoff.failed("a:1", "s")
    backoff.failed("a:1", "s")
    assert backoff.failed("a:1", "t")[0] == 1
    assert backoff.failed("b:1", "s")[0] == 1
    assert backoff.failed("a:1", "s")[0] == 3
    backoff.succeeded("a:1", "s")
    assert backoff.failed("a:1", "s")[:2] == (1, 0.0)


def test_reroutes_log_the_first_failure_and_every_tenth():
    backoff = _rules.RerouteBackoff()
    logged = [i for i in range(1, 31) if backoff.failed("a:1", "s")[2]]
    assert logged == [1, 10, 20, 30]


# ------------------------------------------------------- input wait, cursor

def test_input_wait_buckets_are_upper_bounds_with_a_last_open_one():
    h = _rules.InputWaitHistogram()
    assert h.take() is None
    for s in (0.0, 0.001, 0.0011, 0.5, 10.0, 10.5, 99.0):
        h.observe(s)
    wait = h.take()
    assert list(wait.bucket_counts) == [2, 1, 0, 0, 0, 1, 0, 0, 1, 2]
    assert abs(wait.sum_seconds - (0.0011 + 0.001 + 0.5 + 10 + 10.5 + 99)) < 1e-9
    assert h.take() is None


def test_position_cursors_of_every_worker_merge_into_rank_sums():
    cursors = [position_cursor("j", 0, 2, rank, worker, 2, 5 + 2 * rank + worker)
               for rank in range(2) for worker in range(2)]
    assert list(cursors[2].consumed_per_worker) == [-1, -1, 7, -1]
    assert list(cursors[2].consumed_per_rank) == [-1, -1]
    merged = merge_cursors(cursors)
    assert list(merged.consumed_per_worker) == [5, 6, 7, 8]
    assert list(merged.consumed_per_rank) == [11, 15]
    assert list(merge_cursors(cursors[:3]).consumed_per_rank) == [11, -1]


def test_a_rank_cursor_knows_only_its_own_count():
    c = position_cursor("j", 3, 3, 1, 0, 0, 40, ["web"])
    assert list(c.consumed_per_rank) == [-1, 40, -1]
    assert c.workers_per_rank == 0 and not c.consumed_per_worker
    assert list(c.sources) == ["web"]


# --------------------------------------------------------------- LostDeliveries

def _lease(epoch, sequence, shard, begin, end, lease_id=""):
    return common_pb2.Lease(lease_id=lease_id, epoch=epoch, unit=common_pb2.WorkUnit(
        sequence=sequence, shard_index=shard, begin=begin, end=end))


def test_a_regrant_skips_what_was_delivered_before_the_loss():
    lost = _rules.LostDeliveries()
    lost.lost(_lease(0, 5, 2, 10, 20), 7)
    assert lost.already_delivered(_lease(0, 5, 2, 13, 20)) == 4
    assert len(lost) == 0
    assert lost.already_delivered(_lease(0, 5, 2, 13, 20)) == 0


def test_only_the_same_unit_of_the_same_epoch_matches():
    lost = _rules.LostDeliveries()
    lost.lost(_lease(0, 5, 2, 10, 20), 7)
    assert lost.already_delivered(_lease(1, 5, 2, 13, 20)) == 0
    assert lost.already_delivered(_lease(0, 6, 2, 13, 20)) == 0
    assert lost.already_delivered(_lease(0, 5, 3, 13, 20)) == 0
    assert lost.already_delivered(_lease(0, 5, 2, 17, 20)) == 0
    assert lost.already_delivered(_lease(0, 5, 2, 10, 20)) == 7


def test_a_shorter_grant_keeps_the_rest_for_the_next():
    lost = _rules.LostDeliveries()
    lost.lost(_lease(0, 5, 2, 10, 20), 8)
    assert lost.already_delivered(_lease(0, 5, 2, 12, 15)) == 3
    assert lost.already_delivered(_lease(0, 5, 2, 15, 20)) == 3
    assert len(lost) == 0
    lost.lost(_lease(0, 5, 2, 10, 20), 4)
    lost.lost(_lease(1, 5, 2, 10, 20), 4)
    lost.forget_before(1)
    assert lost.already_delivered(_lease(0, 5, 2, 10, 20)) == 0
    assert lost.already_delivered(_lease(1, 5, 2, 10, 20)) == 4
