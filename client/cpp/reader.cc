#include "sluice/reader.h"

#include <algorithm>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "client/cpp/cursor.h"
#include "client/cpp/reader_impl.h"

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
