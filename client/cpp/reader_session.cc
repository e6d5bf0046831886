#include <algorithm>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "client/cpp/reader_impl.h"
#include "server/common/tls_probe.h"

namespace sluice::client_internal {

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
      while (!closing_ && clock_->Now() < until)
        maintenance_cv_.WaitWithTimeout(&mu_, until - clock_->Now());
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

}  // namespace sluice::client_internal
