#include "server/coordinator/once_barrier.h"

#include <algorithm>
#include <cctype>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/common/status_details.h"

namespace sluice {
namespace {

// The map key of a step or barrier: scope and name joined by a NUL, which
// a scope may not contain (CheckKeys), so ("a/b", "c") and ("a", "b/c")
// stay apart and keys sort by scope, then name.
std::string Key(absl::string_view scope, absl::string_view name) {
  return absl::StrCat(scope, absl::string_view("\0", 1), name);
}

// "scope/name": how messages name a key.
std::string Named(absl::string_view key) {
  std::string named(key);
  std::replace(named.begin(), named.end(), '\0', '/');
  return named;
}

// "rank-3" -> ("rank-", 3).
bool SplitNumbered(const std::string& id, std::string* prefix, int64_t* n) {
  size_t i = id.size();
  while (i > 0 && std::isdigit(static_cast<unsigned char>(id[i - 1]))) --i;
  if (i == id.size()) return false;
  *prefix = id.substr(0, i);
  return absl::SimpleAtoi(id.substr(i), n);
}

// INVALID_ARGUMENT when scope, name or participant is longer than
// kMaxKeyBytes (quoting none of them: they may be megabytes), or the scope
// holds a NUL byte (Key).
absl::Status CheckKeys(absl::string_view what, absl::string_view scope,
                       absl::string_view name, absl::string_view participant) {
  for (const auto& [field, value] :
       {std::pair<const char*, absl::string_view>{"scope", scope},
        {"name", name},
        {"participant", participant}}) {
    if (value.size() > kMaxKeyBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ".", field, " is ", value.size(),
                       " bytes; the limit is ", kMaxKeyBytes));
    }
  }
  if (absl::StrContains(scope, absl::string_view("\0", 1))) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ".scope holds a NUL byte"));
  }
  return absl::OkStatus();
}

}  // namespace

void OnceBarrier::Effects::Run() {
  for (auto& [sink, m] : sends) sink->Send(m);
  for (auto& [sink, s] : finishes) sink->Finish(s);
  for (auto& [done, r] : barriers) done(std::move(r));
}

int64_t OnceBarrier::OpenOnce(std::shared_ptr<OnceSink> sink) {
  Effects fx;
  int64_t id;
  {
    absl::MutexLock lock(&mu_);
    id = next_stream_++;
    streams_[id].sink = std::move(sink);
    if (draining_)
      FinishLocked(id, absl::UnavailableError("coordinator is shutting down"),
                   fx);
  }
  fx.Run();
  return id;
}

void OnceBarrier::FinishLocked(int64_t id, const absl::Status& status,
                               Effects& fx) {
  auto it = streams_.find(id);
  if (it == streams_.end() || it->second.finished) return;
  it->second.finished = true;
  fx.finishes.emplace_back(it->second.sink, status);
}

void OnceBarrier::StartRunLocked(OnceEntry& entry, int64_t id, Effects& fx) {
  Stream& s = streams_[id];
  ++entry.run;
  entry.runner = id;
  entry.runner_deadline = options_.clock->Now() + s.ttl;
  v1::OnceResponse r;
  r.mutable_run()->set_run(entry.run);
  r.mutable_run()->set_heartbeat_interval_ms(absl::ToInt64Milliseconds(
      std::min(options_.heartbeat_interval, s.ttl / 3)));
  r.mutable_run()->set_ttl_ms(absl::ToInt64Milliseconds(s.ttl));
  fx.sends.emplace_back(s.sink, r);
  // Tell the waiters who runs now.
  for (int64_t w : entry.waiters) {
    auto ws = streams_.find(w);
    if (ws == streams_.end() || ws->second.finished) continue;
    v1::OnceResponse wait;
    wait.mutable_wait()->set_runner(s.participant);
    wait.mutable_wait()->set_run(entry.run);
    fx.sends.emplace_back(ws->second.sink, wait);
  }
}

void OnceBarrier::PromoteLocked(const std::string& key, Effects& fx) {
  OnceEntry& entry = once_[key];
  entry.runner = 0;
  if (entry.persisting) return;  // FinishOutcomeLocked decides
  while (!entry.waiters.empty()) {
    int64_t next = entry.waiters.front();
    entry.waiters.pop_front();
    auto it = streams_.find(next);
    if (it != streams_.end() && !it->second.finished) {
      StartRunLocked(entry, next, fx);
      return;
    }
  }
}

std::vector<v1::OnceStep> OnceBarrier::Running(const std::string& scope) {
  absl::MutexLock lock(&mu_);
  std::vector<v1::OnceStep> out;
  for (const auto& [key, entry] : once_) {
    const Stream* runner = nullptr;
    int32_t waiting = 0;
    if (auto it = streams_.find(entry.runner);
        entry.runner != 0 && it != streams_.end() && !it->second.finished) {
      runner = &it->second;
    }
    const Stream* any = runner;
    for (int64_t w : entry.waiters) {
      auto it = streams_.find(w);
      if (it == streams_.end() || it->second.finished) continue;
      ++waiting;
      if (any == nullptr) any = &it->second;
    }
    if (any == nullptr || (!scope.empty() && any->scope != scope)) continue;
    v1::OnceStep& step = out.emplace_back();
    step.set_scope(any->scope);
    step.set_name(any->name);
    step.set_state(v1::OnceStep::STATE_RUNNING);
    step.set_run(entry.run);
    if (runner != nullptr) step.set_runner(runner->participant);
    step.set_waiting(waiting);
  }
  return out;
}

void OnceBarrier::EndStepLocked(const std::string& key,
                                const v1::OnceResponse& to_all, Effects& fx) {
  OnceEntry& entry = once_[key];
  std::vector<int64_t> everyone(entry.waiters.begin(), entry.waiters.end());
  if (entry.runner != 0) everyone.push_back(entry.runner);
  for (int64_t id : everyone) {
    auto it = streams_.find(id);
    if (it == streams_.end() || it->second.finished) continue;
    fx.sends.emplace_back(it->second.sink, to_all);
    FinishLocked(id, absl::OkStatus(), fx);
  }
  entry.runner = 0;
  entry.waiters.clear();
}

void OnceBarrier::FinishOutcomeLocked(const Outcome& outcome,
                                      const absl::Status& persisted,
                                      Effects& fx) {
  OnceEntry& entry = once_[outcome.key];
  entry.persisting = false;
  if (!persisted.ok()) {
    // Not journaled: the runner hears why; a success is not announced (the
    // next waiter runs the step), a failure still reaches everyone.
    FinishLocked(outcome.stream, persisted, fx);
    if (!outcome.failed) {
      // No run started while persisting: the runner is this stream or gone.
      PromoteLocked(outcome.key, fx);
      return;
    }
  }
  EndStepLocked(outcome.key, outcome.to_all, fx);
}

void OnceBarrier::OnOnceMessage(int64_t id, const v1::OnceRequest& request) {
  Effects fx;
  std::optional<Outcome> outcome;
  {
    absl::MutexLock lock(&mu_);
    auto it = streams_.find(id);
    if (it == streams_.end() || it->second.finished) return;
    Stream& s = it->second;
    if (!s.joined) {
      if (!request.has_join()) {
        FinishLocked(id,
                     absl::FailedPreconditionError(
                         "once: the first message must be Join"),
                     fx);
      } else if (request.join().scope().empty() ||
                 request.join().name().empty()) {
        FinishLocked(id,
                     absl::InvalidArgumentError(
                         "once: join.scope and join.name are required"),
                     fx);
      } else if (request.join().ttl_ms() < 0) {
        FinishLocked(
            id, absl::InvalidArgumentError("once: join.ttl_ms must be >= 0"),
            fx);
      } else if (absl::Status too_long = CheckKeys(
                     "once: join", request.join().scope(),
                     request.join().name(), request.join().participant());
                 !too_long.ok()) {
        FinishLocked(id, too_long, fx);
      } else {
        const v1::OnceJoin& j = request.join();
        s.joined = true;
        s.scope = j.scope();
        s.name = j.name();
        s.key = Key(j.scope(), j.name());
        s.participant = j.participant().empty() ? absl::StrCat("stream-", id)
                                                : j.participant();
        s.ttl = j.ttl_ms() > 0 ? std::max(absl::Milliseconds(j.ttl_ms()),
                                          absl::Milliseconds(300))
                               : options_.default_ttl;
        s.policy = j.on_failure() == v1::ONCE_FAILURE_POLICY_FAIL_ALL
                       ? v1::ONCE_FAILURE_POLICY_FAIL_ALL
                       : v1::ONCE_FAILURE_POLICY_RETRY;
        std::optional<v1::internal::OnceFinished> finished =
            options_.find_finished ? options_.find_finished(s.scope, s.name)
                                   : std::nullopt;
        OnceEntry& entry = once_[s.key];
        if (finished.has_value()) {
          v1::OnceResponse r;
          if (finished->error().empty()) {
            r.mutable_done()->set_result(finished->result());
            r.mutable_done()->set_run(finished->run());
          } else {
            r.mutable_error()->set_run(finished->run());
            r.mutable_error()->set_error(finished->error());
          }
          fx.sends.emplace_back(s.sink, r);
          FinishLocked(id, absl::OkStatus(), fx);
        } else if (entry.runner == 0 && !entry.persisting) {
          StartRunLocked(entry, id, fx);
        } else {
          entry.waiters.push_back(id);
          v1::OnceResponse r;
          if (auto runner = streams_.find(entry.runner);
              runner != streams_.end()) {
            r.mutable_wait()->set_runner(runner->second.participant);
          }
          r.mutable_wait()->set_run(entry.run);
          fx.sends.emplace_back(s.sink, r);
        }
      }
    } else if (request.has_join()) {
      FinishLocked(id, absl::FailedPreconditionError("once: second Join"), fx);
    } else {
      OnceEntry& entry = once_[s.key];
      const bool is_runner = entry.runner == id;
      if (is_runner)
        entry.runner_deadline =
            options_.clock->Now() + s.ttl;  // any message renews
      if (request.has_succeeded() || request.has_failed()) {
        const int64_t run = request.has_succeeded() ? request.succeeded().run()
                                                    : request.failed().run();
        if (is_runner && run == entry.run && entry.persisting) {
          FinishLocked(id,
                       absl::FailedPreconditionError(
                           absl::StrCat("once ", Named(s.key), ": run ", run,
                                        " already reported its outcome")),
                       fx);
        } else if (!is_runner || run != entry.run) {
          FinishLocked(id,
                       absl::AbortedError(absl::StrCat(
                           "once ", Named(s.key), ": run ", run, " is over (",
                           s.participant, " no longer holds it; current run ",
                           entry.run, ")")),
                       fx);
        } else if (request.has_succeeded() &&
                   request.succeeded().result().size() > kMaxOnceResultBytes) {
          FinishLocked(id,
                       absl::InvalidArgumentError(absl::StrCat(
                           "once ", Named(s.key), ": succeeded.result is ",
                           request.succeeded().result().size(),
                           " bytes; the limit is ", kMaxOnceResultBytes)),
                       fx);
        } else if (request.has_failed() &&
                   request.failed().error().size() > kMaxOnceErrorBytes) {
          FinishLocked(id,
                       absl::InvalidArgumentError(absl::StrCat(
                           "once ", Named(s.key), ": failed.error is ",
                           request.failed().error().size(),
                           " bytes; the limit is ", kMaxOnceErrorBytes)),
                       fx);
        } else if (request.has_succeeded()) {
          v1::internal::OnceFinished f;
          f.set_scope(s.scope);
          f.set_name(s.name);
          f.set_run(run);
          f.set_result(request.succeeded().result());
          outcome.emplace();
          outcome->to_all.mutable_done()->set_result(f.result());
          outcome->to_all.mutable_done()->set_run(run);
          outcome->finished = std::move(f);
        } else {
          v1::OnceResponse error;
          error.mutable_error()->set_run(run);
          error.mutable_error()->set_error(request.failed().error());
          if (s.policy == v1::ONCE_FAILURE_POLICY_FAIL_ALL) {
            v1::internal::OnceFinished f;
            f.set_scope(s.scope);
            f.set_name(s.name);
            f.set_run(run);
            f.set_error(request.failed().error().empty()
                            ? "failed"
                            : request.failed().error());
            outcome.emplace();
            outcome->finished = std::move(f);
            outcome->to_all = std::move(error);
            outcome->failed = true;
          } else {
            EndStepLocked(s.key, error, fx);
          }
        }
        if (outcome.has_value()) {
          outcome->stream = id;
          outcome->key = s.key;
          entry.persisting = true;
        }
      }
    }
  }
  if (outcome.has_value() && !options_.persist) {
    absl::MutexLock lock(&mu_);
    FinishOutcomeLocked(*outcome, absl::OkStatus(), fx);
  }
  fx.Run();
  if (outcome.has_value() && options_.persist) {
    // Journal the outcome without holding mu_; announce it once durable.
    const v1::internal::OnceFinished finished = outcome->finished;
    options_.persist(finished, [this, outcome = *std::move(outcome)](
                                   const absl::Status& persisted) {
      Effects done;
      {
        absl::MutexLock lock(&mu_);
        FinishOutcomeLocked(outcome, persisted, done);
      }
      done.Run();
    });
  }
}

void OnceBarrier::CloseOnce(int64_t id) {
  Effects fx;
  {
    absl::MutexLock lock(&mu_);
    auto it = streams_.find(id);
    if (it == streams_.end()) return;
    const std::string key = it->second.key;
    it->second.finished = true;
    streams_.erase(it);
    auto entry = once_.find(key);
    if (entry != once_.end()) {
      auto& w = entry->second.waiters;
      w.erase(std::remove(w.begin(), w.end(), id), w.end());
      if (entry->second.runner == id) PromoteLocked(key, fx);
    }
  }
  fx.Run();
}

absl::Status OnceBarrier::BarrierTimeoutStatus(const std::string& key,
                                               const BarrierEntry& entry,
                                               const Pending& pending) const {
  v1::BarrierTimeout details;
  details.set_generation(entry.generation);
  for (const std::string& a : entry.arrived) details.add_arrived(a);
  const int32_t missing =
      entry.participants - static_cast<int32_t>(entry.arrived.size());
  details.set_missing_count(missing);
  // Ids like "rank-3": name the missing ones.
  std::string prefix;
  bool numbered = !entry.arrived.empty();
  std::set<int64_t> seen;
  for (const std::string& a : entry.arrived) {
    std::string p;
    int64_t n = 0;
    if (!SplitNumbered(a, &p, &n) || (!prefix.empty() && p != prefix)) {
      numbered = false;
      break;
    }
    prefix = p;
    seen.insert(n);
  }
  if (numbered) {
    for (int64_t i = 0;
         i < entry.participants && details.missing_size() < kMaxListedMissing;
         ++i) {
      if (!seen.count(i)) details.add_missing(absl::StrCat(prefix, i));
    }
  }
  std::string message = absl::StrCat(
      "barrier ", Named(key), " generation ", entry.generation, ": ",
      entry.arrived.size(), " of ", entry.participants, " arrived within ",
      absl::FormatDuration(pending.timeout), " (",
      absl::StrJoin(entry.arrived, ", "), "); ", missing, " missing",
      details.missing_size() > 0
          ? absl::StrCat(": ", absl::StrJoin(details.missing(), ", "))
          : "");
  return StatusWithDetail(absl::StatusCode::kDeadlineExceeded, message,
                          details);
}

void OnceBarrier::ReportWaitingLocked() {
  if (options_.on_barrier_waiting) options_.on_barrier_waiting(waiters_.size());
}

int64_t OnceBarrier::Barrier(const v1::BarrierRequest& request,
                             BarrierDone done) {
  Effects fx;
  int64_t waiter = 0;
  {
    absl::MutexLock lock(&mu_);
    const std::string key = Key(request.scope(), request.name());
    if (draining_) {
      fx.barriers.emplace_back(
          std::move(done),
          absl::UnavailableError("coordinator is shutting down"));
    } else if (request.scope().empty() || request.name().empty() ||
               request.participant().empty()) {
      fx.barriers.emplace_back(
          std::move(done),
          absl::InvalidArgumentError(
              "barrier: scope, name and participant are required"));
    } else if (absl::Status too_long =
                   CheckKeys("barrier", request.scope(), request.name(),
                             request.participant());
               !too_long.ok()) {
      fx.barriers.emplace_back(std::move(done), too_long);
    } else if (request.participants() <= 0 ||
               request.participants() > options_.max_barrier_participants) {
      fx.barriers.emplace_back(
          std::move(done),
          absl::InvalidArgumentError(absl::StrCat(
              "barrier ", Named(key), ": participants must be in [1, ",
              options_.max_barrier_participants, "], got ",
              request.participants())));
    } else {
      BarrierEntry& entry = barriers_[key];
      if (!entry.arrived.empty() &&
          entry.participants != request.participants()) {
        fx.barriers.emplace_back(
            std::move(done),
            absl::InvalidArgumentError(absl::StrCat(
                "barrier ", Named(key), ": participant ", request.participant(),
                " says ", request.participants(), " participants, others said ",
                entry.participants)));
      } else {
        entry.participants = request.participants();
        if (std::find(entry.arrived.begin(), entry.arrived.end(),
                      request.participant()) == entry.arrived.end()) {
          entry.arrived.push_back(request.participant());
        }
        absl::Duration timeout = request.timeout_ms() > 0
                                     ? absl::Milliseconds(request.timeout_ms())
                                     : options_.default_barrier_timeout;
        waiter = next_waiter_++;
        waiters_[waiter] = key;
        entry.pending.push_back(Pending{waiter, request.participant(),
                                        options_.clock->Now() + timeout,
                                        timeout, std::move(done)});
        if (static_cast<int32_t>(entry.arrived.size()) >= entry.participants) {
          waiter = 0;
          v1::BarrierResponse response;
          response.set_generation(entry.generation);
          // Sorted, as the API promises (arrival order is an accident).
          std::vector<std::string> sorted = entry.arrived;
          std::sort(sorted.begin(), sorted.end());
          for (const std::string& a : sorted) response.add_arrived(a);
          for (Pending& p : entry.pending) {
            waiters_.erase(p.id);
            fx.barriers.emplace_back(std::move(p.done), response);
          }
          ++entry.generation;
          entry.arrived.clear();
          entry.pending.clear();
          entry.participants = 0;
        }
        ReportWaitingLocked();
      }
    }
  }
  fx.Run();
  return waiter;
}

void OnceBarrier::CancelBarrier(int64_t waiter) {
  Effects fx;
  {
    absl::MutexLock lock(&mu_);
    auto it = waiters_.find(waiter);
    if (it == waiters_.end()) return;
    const std::string key = it->second;
    waiters_.erase(it);
    BarrierEntry& entry = barriers_[key];
    auto p = std::find_if(entry.pending.begin(), entry.pending.end(),
                          [&](const Pending& q) { return q.id == waiter; });
    if (p == entry.pending.end()) return;
    const std::string participant = p->participant;
    fx.barriers.emplace_back(
        std::move(p->done),
        absl::CancelledError(absl::StrCat(
            "barrier ", Named(key), ": participant ", participant, " left")));
    entry.pending.erase(p);
    const bool still_waiting = std::any_of(
        entry.pending.begin(), entry.pending.end(),
        [&](const Pending& q) { return q.participant == participant; });
    if (!still_waiting) {
      entry.arrived.erase(
          std::remove(entry.arrived.begin(), entry.arrived.end(), participant),
          entry.arrived.end());
    }
    if (entry.arrived.empty()) entry.participants = 0;
    ReportWaitingLocked();
  }
  fx.Run();
}

void OnceBarrier::Tick() {
  Effects fx;
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = options_.clock->Now();
    std::vector<std::string> lost;
    for (auto& [key, entry] : once_) {
      if (entry.runner != 0 && !entry.persisting && now > entry.runner_deadline)
        lost.push_back(key);
    }
    for (const std::string& key : lost) {
      OnceEntry& entry = once_[key];
      const int64_t runner = entry.runner;
      FinishLocked(runner,
                   absl::AbortedError(
                       absl::StrCat("once ", Named(key), ": run ", entry.run,
                                    " expired (no heartbeat within its ttl)")),
                   fx);
      PromoteLocked(key, fx);
    }
    for (auto& [key, entry] : barriers_) {
      const bool expired =
          std::any_of(entry.pending.begin(), entry.pending.end(),
                      [&](const Pending& p) { return now >= p.deadline; });
      if (!expired) continue;
      // The generation fails as a whole: everyone waiting hears it, and
      // whoever comes later starts the next one.
      std::vector<Pending> failed = std::move(entry.pending);
      for (Pending& p : failed) {
        waiters_.erase(p.id);
        fx.barriers.emplace_back(std::move(p.done),
                                 BarrierTimeoutStatus(key, entry, p));
      }
      ++entry.generation;
      entry.arrived.clear();
      entry.pending.clear();
      entry.participants = 0;
    }
    ReportWaitingLocked();
  }
  fx.Run();
}

void OnceBarrier::Drain() {
  Effects fx;
  {
    absl::MutexLock lock(&mu_);
    draining_ = true;
    for (auto& [id, s] : streams_) {
      (void)s;
      FinishLocked(id, absl::UnavailableError("coordinator is shutting down"),
                   fx);
    }
    for (auto& [key, entry] : barriers_) {
      for (Pending& p : entry.pending) {
        waiters_.erase(p.id);
        fx.barriers.emplace_back(
            std::move(p.done),
            absl::UnavailableError("coordinator is shutting down"));
      }
      entry.pending.clear();
    }
    ReportWaitingLocked();
  }
  fx.Run();
}

}  // namespace sluice
