#include "sluice/reader.h"

#include <algorithm>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "client/cpp/cursor.h"
#include "client/cpp/reader_impl.h"
#include "server/common/tls_probe.h"

namespace sluice {
namespace client_internal {

void ReaderImpl::Want(int32_t units) {
  TrainerMessage want;
  {
    absl::MutexLock lock(&mu_);
    credits_ = std::max(0, units);
    want.mutable_want()->set_credits(credits_);
  }
  Send(want);
}

absl::StatusOr<ReaderEvent> ReaderImpl::NextWithin(absl::Duration timeout) {
  const absl::Time deadline = timeout == absl::InfiniteDuration()
                                  ? absl::InfiniteFuture()
                                  : clock_->Now() + timeout;
  // The input wait of the sample this call returns: 0 unless it blocks,
  // timed from its first wait (no clock read on the buffered path); a wait
  // that timed out goes on in the next call.
  auto start_waiting = [&] {
    if (!waiting_) waiting_since_ = clock_->Now();
    waiting_ = true;
  };
  // Waits for news until the deadline; false when it has passed.
  auto wait = [&](absl::Time until) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (deadline != absl::InfiniteFuture() && clock_->Now() >= deadline)
      return false;
    if (until == absl::InfiniteFuture() && deadline == absl::InfiniteFuture()) {
      data_cv_.Wait(&mu_);
    } else {
      data_cv_.WaitWithTimeout(&mu_, std::min(until, deadline) - clock_->Now());
    }
    return true;
  };
  const absl::Status timed_out =
      absl::DeadlineExceededError("no event within the timeout");
  while (true) {
    ReaderEvent event;
    bool flush = false;
    bool have_event = false;
    {
      absl::MutexLock lock(&mu_);
      while (!have_event && !flush) {
        if (!fatal_.ok()) return fatal_;
        if (closed_) return absl::CancelledError("reader closed");
        if (entries_.empty()) {
          start_waiting();
          if (!wait(absl::InfiniteFuture())) return timed_out;
          continue;
        }
        Entry& e = entries_.front();
        if (e.unit == nullptr) {
          event.kind = e.kind;
          event.epoch = e.epoch;
          event.samples_for_rank = e.samples;
          event.already_consumed = e.already;
          event.samples_for_worker = e.worker_samples;
          event.already_consumed_by_worker = e.worker_already;
          event.message = e.message;
          if (e.kind != ReaderEvent::Kind::kDone)
            entries_.pop_front();  // Done stays
          have_event = true;
          break;
        }
        HeldUnit& u = *e.unit;
        if (u.dropped) {
          ++stats_.dropped_units;
          entries_.pop_front();
          continue;
        }
        if (!u.buffer.empty() && hold_.MayHaveLostLeases()) {
          // Our leases may have expired at the coordinator (and been
          // granted to others): deliver nothing until it confirms them.
          start_waiting();
          if (!wait(clock_->Now() + absl::Milliseconds(50))) return timed_out;
          continue;
        }
        if (!u.buffer.empty()) {
          event.kind = ReaderEvent::Kind::kSample;
          event.sample = std::move(u.buffer.front());
          event.epoch = event.sample.epoch;
          u.buffer.pop_front();
          // The stream skipped its next Read on a full buffer: room now.
          if (static_cast<int>(u.buffer.size()) < options_.buffer_samples)
            fetcher_.ResumeReadLocked(u);
          ++u.delivered;
          ++stats_.delivered;
          const double wait =
              waiting_ ? absl::ToDoubleSeconds(clock_->Now() - waiting_since_)
                       : 0;
          input_wait_.Observe(wait);
          stats_.input_wait_seconds += wait;
          have_event = true;
          if (u.delivered == u.size) {
            TrainerMessage m;
            m.mutable_complete()->mutable_lease()->set_lease_id(
                u.lease.lease_id());
            m.mutable_complete()->mutable_lease()->set_fence(u.lease.fence());
            u.final_report = m;
            ++stats_.units_completed;
            entries_.pop_front();
            flush = true;
          }
          break;
        }
        if (u.fetch == HeldUnit::Fetch::kFailed && u.handed_back) {
          // A draining data server ended the stream: give the rest back,
          // counting exactly what was consumed; the coordinator grants it
          // again on another server.
          TrainerMessage m;
          m.mutable_release()->mutable_lease()->set_lease_id(
              u.lease.lease_id());
          m.mutable_release()->mutable_lease()->set_fence(u.lease.fence());
          m.mutable_release()->set_consumed(u.delivered);
          u.final_report = m;
          ++stats_.handed_back;
          entries_.pop_front();
          flush = true;
          break;
        }
        if (u.fetch == HeldUnit::Fetch::kFailed) {
          // Everything fetched has been delivered: hand the rest back for a
          // re-route, counting exactly what was consumed.
          TrainerMessage m;
          m.mutable_reroute()->mutable_lease()->set_lease_id(
              u.lease.lease_id());
          m.mutable_reroute()->mutable_lease()->set_fence(u.lease.fence());
          m.mutable_reroute()->set_consumed(u.delivered);
          m.mutable_reroute()->set_failed_data_server(u.lease.data_server());
          m.mutable_reroute()->set_error(u.fetch_error);
          u.final_report = m;
          ++stats_.reroutes;
          entries_.pop_front();
          flush = true;
          break;
        }
        start_waiting();
        if (!wait(absl::InfiniteFuture())) return timed_out;
      }
    }
    if (flush) FlushReports(false);
    if (have_event) {
      waiting_ = false;
      if (event.kind == ReaderEvent::Kind::kEpochBegin) {
        position_epoch_ = event.epoch;
        position_consumed_ = options_.num_workers > 1
                                 ? event.already_consumed_by_worker
                                 : event.already_consumed;
      } else if (event.kind == ReaderEvent::Kind::kSample) {
        ++position_consumed_;
      }
      return event;
    }
  }
}

void ReaderImpl::Close() {
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return;
    closed_ = true;
    fetcher_.SetClosedLocked();
  }
  // The input wait not yet reported.
  {
    TrainerMessage beat;
    bool has_wait;
    {
      absl::MutexLock lock(&mu_);
      has_wait =
          input_wait_.Take(beat.mutable_heartbeat()->mutable_input_wait());
    }
    if (has_wait) Send(beat);
  }
  // No new grants (a Release frees a credit the coordinator would refill),
  // and a Synced means every grant already sent has arrived: all of them are
  // released below instead of lingering until their TTL.
  {
    TrainerMessage stop;
    stop.mutable_want()->set_credits(0);
    if (Send(stop)) {
      const uint64_t id = SendSync();
      absl::MutexLock lock(&mu_);
      const absl::Time until = clock_->Now() + absl::Seconds(2);
      while (id != 0 && ledger_.synced() < id && stream_open_ &&
             clock_->Now() < until) {
        cv_.WaitWithTimeout(&mu_, until - clock_->Now());
      }
    }
  }
  {
    absl::MutexLock lock(&mu_);
    for (auto& [id, u] : units_) {
      if (u->final_report.has_value() || u->dropped) continue;
      TrainerMessage m;
      m.mutable_release()->mutable_lease()->set_lease_id(u->lease.lease_id());
      m.mutable_release()->mutable_lease()->set_fence(u->lease.fence());
      m.mutable_release()->set_consumed(u->delivered);
      u->final_report = m;
    }
  }
  FlushReports(false);
  std::vector<std::shared_ptr<HeldUnit>> all;
  {
    absl::MutexLock lock(&mu_);
    closing_ = true;
    fetcher_.SetClosingLocked();
    for (auto& [id, u] : units_) {
      fetcher_.CancelLocked(*u);
      all.push_back(u);
    }
    for (auto& u : retired_) {
      fetcher_.CancelLocked(*u);
      all.push_back(u);
    }
    NotifyAllLocked();
  }
  // Half-close and let the coordinator end the stream, so the reports just
  // sent arrive (cancelling at once could drop them); cancel after a bound.
  session_.WritesDone();
  {
    absl::MutexLock lock(&mu_);
    const absl::Time until = clock_->Now() + absl::Seconds(2);
    while (stream_open_ && clock_->Now() < until)
      cv_.WaitWithTimeout(&mu_, until - clock_->Now());
  }
  session_.Stop();
  if (maintenance_thread_.joinable()) maintenance_thread_.join();
  // Every stream's last operation completes before the queue shuts down.
  {
    absl::MutexLock lock(&mu_);
    auto outstanding = [&all] {
      for (const auto& u : all) {
        if (u->fetch_started && !u->call_done) return true;
      }
      return false;
    };
    while (outstanding()) cv_.Wait(&mu_);
    // Streams and their contexts go before the queue they completed on.
    entries_.clear();
    units_.clear();
    retired_.clear();
  }
  all.clear();
  loop_.Shutdown();
}

absl::StatusOr<v1::Cursor> ReaderImpl::Cursor() {
  if (position_epoch_ < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", options_.job, " rank ", options_.rank,
                     ": no cursor before the first EpochBegin event"));
  }
  client_internal::ReaderPosition position;
  position.job = options_.job;
  position.epoch = position_epoch_;
  position.rank = options_.rank;
  position.worker = options_.worker;
  position.num_workers = options_.num_workers;
  position.consumed = position_consumed_;
  {
    absl::MutexLock lock(&mu_);
    position.world_size = world_size_;
    position.source_names = source_names_;
  }
  const v1::Cursor cursor = client_internal::PositionCursor(position);
  // Report everything delivered, then wait until it is durable. A broken
  // stream loses the Sync: send it again after each reconnect.
  const absl::Time deadline = clock_->Now() + options_.reconnect_timeout;
  while (true) {
    FlushReports(true);
    const uint64_t id = SendSync();
    const bool sent = id != 0;
    absl::MutexLock lock(&mu_);
    const absl::Time retry =
        std::min(deadline, clock_->Now() + absl::Seconds(1));
    while (sent && ledger_.synced() < id && fatal_.ok() && !closing_ &&
           clock_->Now() < retry) {
      cv_.WaitWithTimeout(&mu_, retry - clock_->Now());
    }
    // JobDone follows the last epoch's reports made durable.
    if ((sent && ledger_.synced() >= id) || job_done_) return cursor;
    if (!fatal_.ok()) return fatal_;
    if (closing_) return absl::CancelledError("reader closed");
    if (clock_->Now() >= deadline) {
      return absl::UnavailableError(
          absl::StrCat("coordinator ", options_.coordinator,
                       " did not confirm the reports of job ", options_.job,
                       " rank ", options_.rank, " within ",
                       absl::FormatDuration(options_.reconnect_timeout),
                       "; the cursor is not safe to save"));
    }
    if (!sent) cv_.WaitWithTimeout(&mu_, retry - clock_->Now());
  }
}

// ------------------------------------------- the coordinator's messages
void ReaderImpl::FlushReports(bool progress, bool force) {
  absl::MutexLock flush_lock(&flush_mu_);
  std::vector<std::pair<std::shared_ptr<HeldUnit>, TrainerMessage>> out;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [id, u] : units_) {
      if (u->final_report.has_value()) {
        out.emplace_back(u, *u->final_report);
      } else if (progress && !u->dropped &&
                 (u->delivered > u->reported || force)) {
        TrainerMessage m;
        m.mutable_progress()->mutable_lease()->set_lease_id(
            u->lease.lease_id());
        m.mutable_progress()->mutable_lease()->set_fence(u->lease.fence());
        m.mutable_progress()->set_consumed(u->delivered);
        out.emplace_back(u, m);
      }
    }
  }
  // In delivery order: the coordinator's per-rank acknowledgement order is
  // what a resume cursor counts in.
  std::stable_sort(out.begin(), out.end(), [](const auto& a, const auto& b) {
    return a.first->order < b.first->order;
  });
  for (auto& [u, m] : out) {
    if (!Send(m)) return;  // disconnected: the session re-flushes on reconnect
    absl::MutexLock lock(&mu_);
    if (m.has_progress()) {
      u->reported = std::max(u->reported, m.progress().consumed());
    } else {
      ledger_.Sent(u->lease, u->delivered, m, u->order);
      units_.erase(u->lease.lease_id());
      fetcher_.CancelLocked(*u);
      retired_.push_back(u);
      NotifyAllLocked();
    }
  }
}

bool ReaderImpl::SessionWanted() {
  absl::MutexLock lock(&mu_);
  return !closing_ && !job_done_;
}

absl::Duration ReaderImpl::LeaseTtl() {
  absl::MutexLock lock(&mu_);
  return hold_.lease_ttl();
}

void ReaderImpl::OpeningMessages(TrainerMessage* hello, TrainerMessage* want) {
  v1::Hello& h = *hello->mutable_hello();
  h.set_job(options_.job);
  h.set_rank(options_.rank);
  h.set_worker(options_.worker);
  h.set_num_workers(options_.num_workers);
  h.set_trainer_id(options_.trainer_id);
  h.set_launch_id(options_.launch_id);
  h.set_node(options_.node);
  absl::MutexLock lock(&mu_);
  if (options_.resume_from.has_value() && !resume_done_) {
    *h.mutable_cursor() = *options_.resume_from;
    h.set_resume_attempt(options_.resume_attempt);
  }
  want->mutable_want()->set_credits(credits_);
  hold_.HelloSent();
}

void ReaderImpl::StreamOpen(bool open) {
  absl::MutexLock lock(&mu_);
  stream_open_ = open;
  if (!open) {
    hold_.Disconnected();
    NotifyAllLocked();
  }
}

void ReaderImpl::Welcomed(const CoordinatorMessage& welcome) {
  Handle(welcome);
  // Re-send what a broken stream may have lost, and have every held lease
  // confirmed: a lease the coordinator no longer knows is Rejected (before
  // the Synced), and its rest is never delivered. Finals the old
  // coordinator may never have made durable first, in delivery order; then
  // every live unit's position.
  std::vector<TrainerMessage> finals;
  {
    absl::MutexLock lock(&mu_);
    finals = ledger_.Unconfirmed();
  }
  for (const TrainerMessage& f : finals) Send(f);
  FlushReports(true, /*force=*/true);
  const uint64_t id = SendSync();
  absl::MutexLock lock(&mu_);
  hold_.Reconnected(id);
}

void ReaderImpl::Failed(absl::Status status) {
  absl::MutexLock lock(&mu_);
  fatal_ = std::move(status);
  NotifyAllLocked();
}

void ReaderImpl::Handle(const CoordinatorMessage& m) {
  std::optional<TrainerMessage> resend;
  {
    absl::MutexLock lock(&mu_);
    switch (m.msg_case()) {
      case CoordinatorMessage::kWelcome:
        if (m.welcome().heartbeat_interval_ms() > 0) {
          heartbeat_interval_ =
              absl::Milliseconds(m.welcome().heartbeat_interval_ms());
        }
        world_size_ = m.welcome().world_size();
        if (m.welcome().lease_ttl_ms() > 0) {
          hold_.set_lease_ttl(absl::Milliseconds(m.welcome().lease_ttl_ms()));
        }
        resume_done_ = true;
        hold_.Welcomed();
        break;
      case CoordinatorMessage::kSynced:
        ledger_.Synced(m.synced().id());
        hold_.Synced(ledger_.synced());
        break;
      case CoordinatorMessage::kEpochBegin:
        if (m.epoch_begin().epoch() > last_epoch_begin_) {
          last_epoch_begin_ = m.epoch_begin().epoch();
          lost_.ForgetBefore(last_epoch_begin_);
          entries_.push_back(Entry{ReaderEvent::Kind::kEpochBegin,
                                   m.epoch_begin().epoch(),
                                   m.epoch_begin().samples_for_rank(),
                                   m.epoch_begin().already_consumed(),
                                   nullptr,
                                   m.epoch_begin().samples_for_worker(),
                                   m.epoch_begin().already_consumed_by_worker(),
                                   {}});
        }
        break;
      case CoordinatorMessage::kEpochEnd:
        if (m.epoch_end().epoch() > last_epoch_end_) {
          last_epoch_end_ = m.epoch_end().epoch();
          entries_.push_back(Entry{ReaderEvent::Kind::kEpochEnd,
                                   m.epoch_end().epoch(),
                                   0,
                                   0,
                                   nullptr,
                                   0,
                                   0,
                                   {}});
        }
        break;
      case CoordinatorMessage::kJobDone:
        job_done_ = true;
        entries_.push_back(Entry{ReaderEvent::Kind::kDone,
                                 m.job_done().num_epochs(), 0, 0, nullptr, 0, 0,
                                 m.job_done().message()});
        break;
      case CoordinatorMessage::kGrant: {
        const v1::Lease& lease = m.grant().lease();
        // A unit names the sources it reads: learn the names as they come.
        if (lease.unit().has_mixed()) {
          const v1::MixedUnit& mixed = lease.unit().mixed();
          source_names_.resize(
              std::max<size_t>(source_names_.size(), mixed.mix_samples_size()));
          for (const v1::MixSegment& seg : mixed.segments()) {
            if (seg.source() >= 0 && seg.source() < mixed.mix_samples_size())
              source_names_[seg.source()] = seg.source_name();
          }
        }
        if (const TrainerMessage* final = ledger_.Find(lease.lease_id())) {
          resend = *final;  // re-announced after a reconnect
          break;
        }
        if (auto held = units_.find(lease.lease_id()); held != units_.end()) {
          // Sent again (a reconnect, or a token near its expiry): streams
          // opened from now on present the new token.
          if (held->second->lease.fence() == lease.fence())
            held->second->lease = lease;
          break;
        }
        if (closing_) break;
        // A new lease of a unit this Reader still holds under another
        // lease, or reported but unconfirmed: the coordinator has taken the
        // old one back (it expired while this session was away, and its
        // Rejected may arrive only after this grant). Retired first, so
        // what it delivered counts.
        for (ReportLedger::Dropped& d : ledger_.DropSameUnit(lease))
          lost_.Lost(d.lease, d.delivered);
        RetireSupersededLocked(lease);
        auto u = std::make_shared<HeldUnit>(&fetcher_);
        u->lease = lease;
        u->size = lease.unit().end() - lease.unit().begin();
        u->next_fetch = lease.unit().begin();
        u->order = next_order_++;
        units_[lease.lease_id()] = u;
        // Samples this Reader delivered from a lost lease of the same unit
        // (lost_deliveries.h): consumed already, reported at once.
        if (const int64_t skip = lost_.AlreadyDelivered(lease); skip > 0) {
          u->next_fetch += skip;
          u->delivered = skip;
          if (skip == u->size) {  // nothing left to read
            u->fetch_started = true;
            u->call_done = true;
            u->fetch = HeldUnit::Fetch::kDone;
            TrainerMessage complete;
            complete.mutable_complete()->mutable_lease()->set_lease_id(
                lease.lease_id());
            complete.mutable_complete()->mutable_lease()->set_fence(
                lease.fence());
            u->final_report = complete;
            ++stats_.units_completed;
            break;
          }
        }
        entries_.push_back(
            Entry{ReaderEvent::Kind::kSample, 0, 0, 0, u, 0, 0, {}});
        break;  // its stream opens in NotifyAllLocked below, when its turn
                // comes
      }
      case CoordinatorMessage::kRevoke:
        RetireLocked(m.revoke().lease_id());
        break;
      case CoordinatorMessage::kLeaving:
        fetcher_.HandBackUnopenedLocked(
            m.leaving().data_server(),
            absl::StrCat(m.leaving().data_server(), ": draining"));
        break;
      case CoordinatorMessage::kRejected:
        RetireLocked(m.rejected().lease_id());
        break;
      default:
        break;
    }
    NotifyAllLocked();
  }
  if (resend.has_value()) Send(*resend);
}

void ReaderImpl::RunMaintenance() {
  absl::Time last_heartbeat = absl::InfinitePast();
  while (true) {
    absl::Duration heartbeat;
    std::vector<std::shared_ptr<HeldUnit>> finished;  // freed outside the lock
    {
      absl::MutexLock lock(&mu_);
      heartbeat = heartbeat_interval_;
      absl::Time until =
          clock_->Now() + std::min({heartbeat, options_.progress_interval,
                                    options_.stall_timeout / 2});
      // Woken early to close, or to ask a data server about TLS.
      while (!closing_ && !fetcher_.transport_checks_queued() &&
             clock_->Now() < until) {
        maintenance_cv_.WaitWithTimeout(&mu_, until - clock_->Now());
      }
      if (closing_) return;
      // Streams that went quiet: cancel them, the unit is then re-routed.
      fetcher_.CancelStalledLocked(clock_->Now());
      for (auto it = retired_.begin(); it != retired_.end();) {
        if (!(*it)->fetch_started || (*it)->call_done) {
          finished.push_back(std::move(*it));
          it = retired_.erase(it);
        } else {
          ++it;
        }
      }
    }
    finished.clear();
    CheckDataServerTransports();
    if (clock_->Now() - last_heartbeat >= heartbeat) {
      bool unconfirmed, holding;
      {
        absl::MutexLock lock(&mu_);
        unconfirmed = !ledger_.empty();
        holding = !units_.empty();
      }
      // A Sync renews like a heartbeat and lets confirmed finals go; a
      // heartbeat carries the consumer's input wait since the last one (one
      // message per interval either way).
      if (unconfirmed) {
        if (SendSync() != 0) last_heartbeat = clock_->Now();
      } else {
        TrainerMessage beat;
        {
          absl::MutexLock lock(&mu_);
          input_wait_.Take(beat.mutable_heartbeat()->mutable_input_wait());
        }
        if (Send(beat)) last_heartbeat = clock_->Now();
        // While leases are held, have the renewal confirmed (LeaseHold):
        // without it a silent stream holds delivery after 3/4 of a TTL.
        if (holding) SendSync();
      }
    }
    FlushReports(true);
  }
}

void ReaderImpl::CheckDataServerTransports() {
  std::vector<std::string> addresses;
  {
    absl::MutexLock lock(&mu_);
    addresses = fetcher_.TakeTransportChecksLocked();
  }
  for (const std::string& address : addresses) {
    absl::Status mismatch = CheckTransport(
        "data server", address, options_.tls.has_value(), "ReaderOptions::tls");
    if (mismatch.ok()) continue;
    absl::MutexLock lock(&mu_);
    if (fatal_.ok()) fatal_ = std::move(mismatch);
    NotifyAllLocked();
    return;
  }
}

}  // namespace client_internal

absl::StatusOr<std::unique_ptr<Reader>> Reader::Create(ReaderOptions options) {
  if (options.coordinator.empty()) {
    return absl::InvalidArgumentError("ReaderOptions.coordinator is empty");
  }
  if (options.job.empty())
    return absl::InvalidArgumentError("ReaderOptions.job is empty");
  if (options.rank < 0)
    return absl::InvalidArgumentError("ReaderOptions.rank is negative");
  if (options.num_workers < 0 || options.worker < 0 ||
      options.worker >= std::max(options.num_workers, 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("ReaderOptions.worker=", options.worker,
                     " must be in [0, num_workers=", options.num_workers, ")"));
  }
  if (absl::Status tls =
          client_internal::CheckClientTls(options.tls, "ReaderOptions.tls");
      !tls.ok()) {
    return tls;
  }
  auto reader =
      std::make_unique<client_internal::ReaderImpl>(std::move(options));
  reader->Start();
  return std::unique_ptr<Reader>(std::move(reader));
}

}  // namespace sluice
