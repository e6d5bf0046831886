#include "client/cpp/unit_fetcher.h"

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "client/cpp/channel_credentials.h"
#include "client/cpp/grpc_deadline.h"
#include "server/common/grpc_status.h"
#include "server/common/grpc_target.h"
#include "server/common/logging.h"
#include "server/common/status_details.h"
#include "server/common/work_unit.h"
#include "sluice/v1/dataserver.pb.h"

namespace sluice::client_internal {
namespace {

// What a unit reads, for counting failed streams: its shard, or its shuffle
// window's first shard.
const std::string& UnitKey(const v1::WorkUnit& unit) {
  return UnitFirstUrl(unit);
}

// Whether a stream's status is a draining data server's (UNAVAILABLE with a
// sluice.v1.HandedBack detail): it is leaving, not failing.
bool HandedBack(const absl::Status& status) {
  return status.code() == absl::StatusCode::kUnavailable &&
         HasStatusDetail(status, v1::HandedBack::descriptor()->full_name());
}

}  // namespace

UnitFetcher::UnitFetcher(const ReaderOptions& options, absl::Mutex* mu,
                         const HeldUnits* units, CompletionLoop* loop,
                         const Clock* clock, FetchListener* listener)
    : options_(options),
      mu_(mu),
      units_(units),
      loop_(loop),
      clock_(clock),
      listener_(listener),
      creds_(ChannelCredentials(options.tls)) {}

void UnitFetcher::StartEligibleLocked() {
  if (closing_) return;
  std::vector<const std::shared_ptr<HeldUnit>*> waiting;
  for (const auto& [id, u] : *units_) {
    if (!u->fetch_started && !u->dropped && !u->cancelled)
      waiting.push_back(&u);
  }
  std::sort(waiting.begin(), waiting.end(), [](const auto* a, const auto* b) {
    return (*a)->order < (*b)->order;
  });
  for (const auto* u : waiting) {
    if (MayStartLocked(**u)) StartLocked(*u);
  }
}

bool UnitFetcher::MayStartLocked(const HeldUnit& u) {
  turn_views_.clear();
  for (const auto& [id, other] : *units_) {
    const HeldUnit& o = *other;
    turn_views_.push_back(FetchTurnView{
        o.order, o.lease.data_server(),
        !o.dropped && o.fetch == HeldUnit::Fetch::kRunning &&
            o.retry_alarm == nullptr,
        o.lease.unit().end() - o.next_fetch, o.last_batch_samples});
  }
  return FetchMayStart(
      FetchTurnView{u.order, u.lease.data_server(), false, 0, 0}, turn_views_);
}

void UnitFetcher::ArmRetryLocked(HeldUnit& u, absl::Duration wait) {
  u.retry_alarm = std::make_unique<grpc::Alarm>();
  u.retry_alarm->Set(loop_->cq(), DeadlineAfter(wait), TagOf(&u.retry_tag));
}

void UnitFetcher::IssueReadLocked(HeldUnit& u) {
  u.op_pending = true;
  u.waiting_for_room = false;
  u.stream->Read(&u.batch, TagOf(&u.read_tag));
}

void UnitFetcher::ResumeReadLocked(HeldUnit& u) {
  if (!u.waiting_for_room || u.cancelled || u.dropped || closing_) return;
  u.last_activity = clock_->Now();
  IssueReadLocked(u);
}

void UnitFetcher::BeginFinishLocked(HeldUnit& u) {
  if (u.finishing) return;
  u.finishing = true;
  u.stream->Finish(&u.status, TagOf(&u.finish_tag));
}

void UnitFetcher::CancelLocked(HeldUnit& u) {
  u.cancelled = true;
  if (!u.fetch_started || u.call_done) return;
  if (u.retry_alarm != nullptr) {
    u.retry_alarm->Cancel();
    return;
  }
  u.ctx->TryCancel();
  if (!u.op_pending) BeginFinishLocked(u);
}

void UnitFetcher::EndFetchLocked(HeldUnit& u, HeldUnit::Fetch state,
                                 const std::string& error) {
  if (u.fetch == HeldUnit::Fetch::kRunning) {
    u.fetch = state;
    u.fetch_error = error;
  }
}

void UnitFetcher::CancelStalledLocked(absl::Time now) {
  for (auto& [id, u] : *units_) {
    if (u->fetch_started && !u->call_done && !u->cancelled &&
        u->retry_alarm == nullptr && u->fetch == HeldUnit::Fetch::kRunning &&
        !u->stalled && !u->waiting_for_room &&
        now - u->last_activity > options_.stall_timeout) {
      u->stalled = true;
      CancelLocked(*u);
    }
  }
}

std::vector<std::string> UnitFetcher::TakeTransportChecksLocked() {
  std::vector<std::string> out;
  out.swap(transport_checks_);
  return out;
}

void UnitFetcher::StartLocked(const std::shared_ptr<HeldUnit>& unit) {
  HeldUnit& u = *unit;
  u.fetch_started = true;
  u.io_hold = unit;
  const std::string& address = u.lease.data_server();
  // The coordinator routes nothing new to a leaving server, and the units
  // held there unopened were handed back: a stream opening there was
  // granted after it registered again.
  leaving_.erase(address);
  if (address.empty()) {
    // No live data server: wait a little, then ask for a re-route.
    u.retry_error = "no live data server";
    ArmRetryLocked(u, absl::Milliseconds(500));
    return;
  }
  auto& stub = stubs_[address];
  if (stub == nullptr) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(64 << 20);
    SetStreamKeepalive(args);  // a stopped data server fails its streams
    stub = v1::DataServer::NewStub(
        grpc::CreateCustomChannel(address, creds_, args));
  }
  u.request.Clear();  // a stream opened again starts from a new request
  *u.request.mutable_lease() = u.lease;
  *u.request.mutable_decode() = options_.decode;
  for (const std::string& f : options_.fields) u.request.add_fields(f);
  u.request.set_max_batch_bytes(options_.max_batch_bytes);
  u.request.set_start(u.next_fetch);
  u.request.set_node(options_.node);
  u.ctx = std::make_unique<grpc::ClientContext>();
  u.last_activity = clock_->Now();
  u.stream = stub->PrepareAsyncReadSamples(u.ctx.get(), u.request, loop_->cq());
  u.op_pending = true;
  u.stream->StartCall(TagOf(&u.start_tag));
}

void UnitFetcher::OnFetchEvent(HeldUnit& u, FetchOp op, bool ok) {
  switch (op) {
    case FetchOp::kStart: {
      absl::MutexLock lock(mu_);
      u.op_pending = false;
      if (!ok || u.cancelled || u.dropped || closing_) {
        BeginFinishLocked(u);
      } else {
        IssueReadLocked(u);
      }
      return;
    }
    case FetchOp::kRead:
      OnBatch(u, ok);
      return;
    case FetchOp::kFinish:
      OnFinished(u);
      return;
    case FetchOp::kRetryAfter: {
      std::shared_ptr<HeldUnit> hold;  // released after the lock
      absl::MutexLock lock(mu_);
      hold = std::move(u.io_hold);
      u.call_done = true;
      const bool again = u.retry_here;
      u.retry_here = false;
      if (again && !u.cancelled && !u.dropped && !closing_) {
        // The server refused the stream for now: open it there again.
        u.retry_alarm.reset();
        u.stream.reset();
        u.ctx.reset();
        u.status = grpc::Status();
        u.finishing = false;
        u.stalled = false;
        u.call_done = false;
        StartLocked(hold);
        return;
      }
      if (!u.dropped && !closing_)
        EndFetchLocked(u, HeldUnit::Fetch::kFailed, u.retry_error);
      listener_->FetchEndedLocked();
      return;
    }
  }
}

void UnitFetcher::OnBatch(HeldUnit& u, bool ok) {
  if (!ok) {  // end of stream, or cancelled: Finish tells which
    absl::MutexLock lock(mu_);
    u.op_pending = false;
    BeginFinishLocked(u);
    return;
  }
  // Convert outside the lock (the batch belongs to this Read until it is
  // re-issued), then hand it over in one step. The lease is read from the
  // stream's own request: a grant sent again (a fresh token) replaces
  // u.lease under the lock meanwhile, and only StartLocked, never while a
  // Read is outstanding, rewrites the request.
  const v1::Lease& lease = u.request.lease();
  std::vector<Sample> converted;
  converted.reserve(static_cast<size_t>(u.batch.samples_size()));
  for (v1::Sample& s : *u.batch.mutable_samples()) {
    Sample out;
    out.epoch = lease.epoch();
    out.rank = lease.rank();
    const v1::WorkUnit& unit = lease.unit();
    const auto& pieces = UnitPieces(unit);
    if (!pieces.empty()) {
      // A window or mixed unit: each sample names its shard (a piece index
      // the unit does not have is clamped; the data server sets it).
      const v1::WindowPiece& piece =
          pieces.Get(std::clamp(s.piece(), 0, pieces.size() - 1));
      out.shard_index = piece.shard_index();
      out.shard_url = piece.url();
      // A mixed unit: the piece's source, named by its segments.
      for (const v1::MixSegment& seg : unit.mixed().segments()) {
        if (seg.source() == piece.source()) {
          out.source = seg.source_name();
          break;
        }
      }
    } else {
      out.shard_index = unit.shard().shard_index();
      out.shard_url = unit.shard().url();
    }
    out.data_server = lease.data_server();
    out.index = s.index();
    out.key = std::move(*s.mutable_key());
    out.skipped = s.skipped();
    out.skip_reason = std::move(*s.mutable_skip_reason());
    out.fields.reserve(static_cast<size_t>(s.fields_size()));
    for (v1::Field& f : *s.mutable_fields()) out.fields.push_back(std::move(f));
    converted.push_back(std::move(out));
  }
  absl::MutexLock lock(mu_);
  u.op_pending = false;
  u.last_activity = clock_->Now();
  ++batches_;
  if (u.dropped || closing_) {
    u.ctx->TryCancel();
    BeginFinishLocked(u);
    return;
  }
  // A shard range's samples come with their positions (their index in the
  // shard); a window's or mixed unit's with their index in their own shard,
  // so only count.
  const bool window = !u.lease.unit().has_shard();
  for (Sample& out : converted) {
    if (!window && out.index != u.next_fetch) {
      u.protocol_error =
          absl::StrCat("data server ", u.lease.data_server(), " sent sample ",
                       out.index, ", expected ", u.next_fetch);
      u.cancelled = true;
      u.ctx->TryCancel();
      BeginFinishLocked(u);
      listener_->SamplesArrivedLocked();
      return;
    }
    u.buffer.push_back(std::move(out));
    ++u.next_fetch;
  }
  u.last_batch_samples = static_cast<int64_t>(converted.size());
  reroute_backoff_.Succeeded(u.lease.data_server(), UnitKey(u.lease.unit()));
  listener_->SamplesArrivedLocked();
  if (u.cancelled) {
    BeginFinishLocked(u);
  } else if (static_cast<int>(u.buffer.size()) < options_.buffer_samples ||
             u.next_fetch >= u.lease.unit().end()) {
    IssueReadLocked(u);  // at the end, this Read sees the end of the stream
  } else {
    u.waiting_for_room = true;  // ResumeReadLocked re-issues it
  }
  StartEligibleLocked();  // the next unit's turn comes near this one's
                          // end
}

void UnitFetcher::OnFinished(HeldUnit& u) {
  std::shared_ptr<HeldUnit> hold;  // released after the lock
  absl::MutexLock lock(mu_);
  hold = std::move(u.io_hold);
  u.call_done = true;
  const absl::Status status = FromGrpcStatus(u.status);
  const std::string& address = u.lease.data_server();
  if (u.dropped || closing_ || closed_ || u.final_report.has_value()) {
    // Nothing more to deliver or report: the unit was dropped, or given
    // back (a Release on Close, after which the data server may cancel the
    // stream), or the reader is closing.
  } else if (!u.protocol_error.empty()) {
    EndFetchLocked(u, HeldUnit::Fetch::kFailed, u.protocol_error);
  } else if (u.next_fetch == u.lease.unit().end()) {
    // Everything arrived; a status after the last sample (a cancel once
    // the unit was reported) does not matter.
    EndFetchLocked(u, HeldUnit::Fetch::kDone, "");
  } else if (status.ok()) {
    EndFetchLocked(u, HeldUnit::Fetch::kFailed, "stream ended early");
  } else if (HandedBack(status) ||
             (leaving_.count(address) > 0 &&
              (u.stalled || status.code() == absl::StatusCode::kUnavailable))) {
    // The server drains: what it sent is good, the rest goes back. A
    // stream that breaks or goes quiet on a server known to be leaving is
    // its exit, not a fault: a server that has finished its calls can stop
    // while the last batches still sit in the sockets between them.
    u.handed_back = true;
    EndFetchLocked(u, HeldUnit::Fetch::kFailed,
                   absl::StrCat(address, ": ", status.message()));
    HandBackUnopenedLocked(address, absl::StrCat(address,
                                                 ": draining (another stream "
                                                 "of the server was handed "
                                                 "back)"));
  } else if (status.code() == absl::StatusCode::kResourceExhausted) {
    // The server is at one of its limits (a tenant's open streams): it is
    // not failing. The stream is opened there again from where the unit
    // stands, after a back-off from 50 ms up to 1 s; no re-route.
    if (u.busy_retries == 0) {
      LogInfo(
          "sluice::Reader job %s rank %d: %s refused lease %s for now (%s); "
          "opening it there again once a stream ends",
          options_.job, options_.rank, address, u.lease.lease_id(),
          status.message());
    }
    const absl::Duration wait =
        std::min(absl::Milliseconds(50) * (1 << std::min(u.busy_retries, 5)),
                 absl::Seconds(1));
    ++u.busy_retries;
    u.retry_here = true;
    ArmRetryLocked(u, wait);
    u.call_done = false;  // the alarm is outstanding
    u.io_hold = std::move(hold);
    return;
  } else if (status.code() == absl::StatusCode::kAborted) {
    // A newer grant of the unit exists: deliver nothing more.
    u.dropped = true;
    u.buffer.clear();
  } else if (status.code() == absl::StatusCode::kDataLoss ||
             status.code() == absl::StatusCode::kOutOfRange ||
             status.code() == absl::StatusCode::kInvalidArgument ||
             status.code() == absl::StatusCode::kPermissionDenied) {
    // Not a server fault: corrupt data under on_corrupt=fail, or a manifest
    // / configuration that does not match the shards.
    listener_->FailLocked(absl::Status(
        status.code(),
        absl::StrCat("lease ", u.lease.lease_id(), ": ", status.message())));
  } else {
    std::string error =
        u.stalled ? absl::StrCat(address, ": no data for ",
                                 absl::FormatDuration(options_.stall_timeout))
                  : absl::StrCat(address, ": ", status.ToString());
    if (status.code() == absl::StatusCode::kUnavailable &&
        transport_checked_.insert(address).second) {
      transport_checks_.push_back(address);  // probed outside the lock
      listener_->TransportCheckQueuedLocked();
    }
    // A shard whose streams keep failing is re-routed with back-off
    // (reroute_backoff.h).
    const RerouteBackoff::Decision reroute =
        reroute_backoff_.Failed(address, UnitKey(u.lease.unit()));
    if (reroute.log) {
      LogWarning(
          "sluice::Reader job %s rank %d: stream %d in a row from %s failed, "
          "re-routing: %s",
          options_.job, options_.rank, reroute.failures_in_a_row, address,
          error);
    }
    if (reroute.wait > absl::ZeroDuration()) {
      u.retry_error = std::move(error);
      ArmRetryLocked(u, reroute.wait);
      u.call_done = false;  // the alarm is outstanding
      u.io_hold = std::move(hold);
      return;
    }
    const bool server_fault =
        u.stalled || status.code() == absl::StatusCode::kUnavailable ||
        status.code() == absl::StatusCode::kDeadlineExceeded;
    EndFetchLocked(u, HeldUnit::Fetch::kFailed, error);
    if (server_fault) FailSiblingsLocked(u, error);
  }
  listener_->FetchEndedLocked();
}

void UnitFetcher::FailSiblingsLocked(const HeldUnit& failed,
                                     const std::string& error) {
  // A data server that stalled or cannot be reached fails every unit held
  // on it at once: the ones waiting for their turn are re-routed without
  // opening a stream, the open streams are cancelled (each then fails as
  // stalled), instead of each waiting out its own stall timeout in turn.
  const std::string& address = failed.lease.data_server();
  for (auto& [id, o] : *units_) {
    if (o.get() == &failed || o->dropped || o->lease.data_server() != address ||
        o->fetch != HeldUnit::Fetch::kRunning || o->retry_alarm != nullptr) {
      continue;
    }
    if (!o->fetch_started) {
      o->fetch_started = true;  // never opened
      o->call_done = true;
      EndFetchLocked(*o, HeldUnit::Fetch::kFailed,
                     absl::StrCat(error, " (another stream of the server)"));
    } else if (!o->stalled && !o->call_done) {
      o->stalled = true;
      CancelLocked(*o);
    }
  }
}

void UnitFetcher::HandBackUnopenedLocked(const std::string& address,
                                         const std::string& why) {
  // The server is leaving: the units held on it that wait for their turn go
  // back without opening a stream (it may be gone when their turn comes),
  // and so do those waiting to open theirs there again (it was busy: its
  // retry could come after it left); open streams end with their own
  // HandedBack, or break or go quiet as it exits (OnFinished).
  leaving_.insert(address);
  for (auto& [id, o] : *units_) {
    if (o->dropped || o->lease.data_server() != address ||
        o->fetch != HeldUnit::Fetch::kRunning) {
      continue;
    }
    if (o->retry_alarm != nullptr) {
      if (o->retry_here) {
        // The cancelled alarm fails it with retry_error (OnFetchEvent).
        o->retry_here = false;
        o->handed_back = true;
        o->retry_error = why;
        o->retry_alarm->Cancel();
      }
      continue;
    }
    if (o->fetch_started) continue;
    o->fetch_started = true;  // never opened
    o->call_done = true;
    o->handed_back = true;
    EndFetchLocked(*o, HeldUnit::Fetch::kFailed, why);
  }
}

}  // namespace sluice::client_internal
