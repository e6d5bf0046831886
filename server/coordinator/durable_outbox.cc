#include "server/coordinator/durable_outbox.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "server/common/logging.h"

namespace sluice {

DurableOutbox::DurableOutbox(Journal* journal, CoordinatorMetrics* metrics)
    : journal_(journal), metrics_(metrics) {
  flusher_ = std::thread([this] { RunFlusher(); });
}

DurableOutbox::~DurableOutbox() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (flusher_.joinable()) flusher_.join();
  absl::MutexLock lock(&mu_);
  while (!queue_.empty()) {
    Effects fx = std::move(queue_.front());
    queue_.pop_front();
    mu_.Unlock();
    Send(fx, journal_->WaitDurable(fx.ticket));
    mu_.Lock();
  }
}

void DurableOutbox::Submit(Effects fx) {
  const bool journaled = fx.ticket != 0;
  if (!journaled) fx.ticket = journal_->LastTicket();
  // Records with nothing to send still go through the flusher, so they are
  // written within one group commit rather than whenever the next reply is.
  if (fx.sends.empty() && fx.finishes.empty() && fx.hints.empty() &&
      fx.replies.empty() && !journaled)
    return;
  absl::MutexLock lock(&mu_);
  queue_.push_back(std::move(fx));  // the flusher's Await sees it
}

void DurableOutbox::Send(Effects& fx, const absl::Status& durable) {
  if (!durable.ok()) {
    const absl::Status failed = absl::UnavailableError(
        absl::StrCat("coordinator journal failed: ", durable.message()));
    std::set<SessionSink*> done;
    for (auto& [sink, msg] : fx.sends) {
      if (done.insert(sink.get()).second) sink->Finish(failed);
    }
    for (auto& reply : fx.replies) reply(failed);
    return;
  }
  int grants = 0;
  for (auto& [sink, msg] : fx.sends) {
    grants += msg.has_grant();
    sink->Send(std::move(msg));
  }
  for (auto& [sink, msg] : fx.hints) sink->Send(msg);
  for (auto& [sink, status] : fx.finishes) sink->Finish(status);
  for (auto& reply : fx.replies) reply(absl::OkStatus());
  if (metrics_ != nullptr && grants > 0) {
    const double seconds = absl::ToDoubleSeconds(absl::Now() - fx.started);
    for (int i = 0; i < grants; ++i) metrics_->grant_latency.Observe(seconds);
  }
}

void DurableOutbox::DeliverReady() {
  absl::MutexLock lock(&mu_);
  if (delivering_) return;  // whoever delivers also takes what we queued
  delivering_ = true;
  while (!queue_.empty() && journal_->IsDurable(queue_.front().ticket)) {
    Effects fx = std::move(queue_.front());
    queue_.pop_front();
    mu_.Unlock();
    Send(fx, absl::OkStatus());
    mu_.Lock();
  }
  delivering_ = false;
  UpdateJournalBytes();
}

void DurableOutbox::RunFlusher() {
  absl::MutexLock lock(&mu_);
  while (true) {
    auto work = [this] {
      mu_.AssertHeld();
      return stopping_ || (!delivering_ && !queue_.empty() &&
                           !journal_->IsDurable(queue_.front().ticket));
    };
    mu_.Await(absl::Condition(&work));
    if (stopping_) return;
    // Group commit: one write + fsync for everything queued so far; the
    // effects that depend on it go out in the order they were queued.
    uint64_t target = 0;
    for (const Effects& fx : queue_) target = std::max(target, fx.ticket);
    delivering_ = true;
    mu_.Unlock();
    const absl::Status durable = journal_->WaitDurable(target);
    if (!durable.ok()) LogError("journal write failed: %s", durable.message());
    mu_.Lock();
    // Then whatever became durable meanwhile (another thread's wait for its
    // own record): its submitter's DeliverReady returned at once while this
    // thread was delivering, leaving it to this loop.
    while (!queue_.empty() &&
           (!durable.ok() || queue_.front().ticket <= target ||
            journal_->IsDurable(queue_.front().ticket))) {
      Effects fx = std::move(queue_.front());
      queue_.pop_front();
      mu_.Unlock();
      Send(fx, durable);
      mu_.Lock();
    }
    delivering_ = false;
    UpdateJournalBytes();
  }
}

void DurableOutbox::Flush() {
  DeliverReady();
  absl::MutexLock lock(&mu_);
  auto idle = [this] {
    mu_.AssertHeld();
    return queue_.empty() && !delivering_;
  };
  mu_.Await(absl::Condition(&idle));
}

void DurableOutbox::UpdateJournalBytes() {
  if (metrics_ != nullptr) {
    metrics_->journal_bytes.Set(static_cast<double>(journal_->bytes_written()));
  }
}

}  // namespace sluice
