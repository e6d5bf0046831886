#include "client/cpp/coordinator_session.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "client/cpp/channel_credentials.h"
#include "client/cpp/grpc_deadline.h"
#include "server/common/backoff.h"
#include "server/common/grpc_status.h"
#include "server/common/grpc_target.h"
#include "server/common/tls_probe.h"

namespace sluice::client_internal {
namespace {

using v1::CoordinatorMessage;
using v1::TrainerMessage;

// Statuses after which reconnecting cannot help.
bool Terminal(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kPermissionDenied:
    case absl::StatusCode::kUnauthenticated:
    case absl::StatusCode::kUnimplemented:
      return true;
    default:
      return false;
  }
}

// How often a coordinator that cannot be connected to is asked whether it
// speaks TLS.
constexpr absl::Duration kTransportCheckPeriod = absl::Seconds(5);

}  // namespace

CoordinatorSession::CoordinatorSession(const ReaderOptions& options,
                                       CompletionLoop* loop, const Clock* clock,
                                       SessionHandler* handler)
    : options_(options), loop_(loop), clock_(clock), handler_(handler) {
  // gRPC's own reconnect backoff (up to 120 s) must not outlast a lease
  // TTL: a restarted coordinator keeps our leases only that long. (Not
  // GRPC_ARG_MIN_RECONNECT_BACKOFF_MS: gRPC takes it as the time one
  // connection attempt may take, and a short one fails connects to a busy
  // server.)
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  SetStreamKeepalive(args);  // a stopped coordinator fails the session
  channel_ = CoordinatorChannel(options_.coordinator,
                                ChannelCredentials(options_.tls), args);
  stub_ = v1::Coordinator::NewStub(channel_);
}

void CoordinatorSession::Start() {
  thread_ = std::thread([this] { Run(); });
}

bool CoordinatorSession::Send(absl::FunctionRef<void(TrainerMessage*)> build) {
  absl::MutexLock lock(&write_mu_);
  if (stream_ == nullptr) return false;
  TrainerMessage message;
  build(&message);
  WaitTag written;
  stream_->Write(message, TagOf(&written));
  return written.Wait();
}

void CoordinatorSession::WritesDone() {
  absl::MutexLock lock(&write_mu_);
  if (stream_ == nullptr) return;
  WaitTag done;
  stream_->WritesDone(TagOf(&done));
  done.Wait();
}

void CoordinatorSession::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  {
    absl::MutexLock lock(&write_mu_);
    cancelled_ = true;
    if (context_ != nullptr) context_->TryCancel();
  }
  if (thread_.joinable()) thread_.join();
}

void CoordinatorSession::Run() {
  // Retries stay well within a lease TTL: a restarted coordinator gives
  // the leases a fresh TTL and keeps them only if we are back before it
  // ends.
  Backoff backoff(absl::Milliseconds(100), absl::Seconds(5));
  absl::Time unreachable_since = clock_->Now();
  absl::Time next_transport_check = absl::InfinitePast();
  auto wanted = [this] {
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return false;
    }
    return handler_->SessionWanted();
  };
  auto unreachable = [this](absl::string_view why) {
    return absl::UnavailableError(
        absl::StrCat("coordinator ", options_.coordinator, " unreachable for ",
                     absl::FormatDuration(options_.reconnect_timeout), why));
  };
  while (true) {
    if (!wanted()) return;
    // Connect first (polling the connection up to once per retry period,
    // the channel's backoff capped as above), then open the stream.
    if (!channel_->WaitForConnected(
            DeadlineAfter(std::min(backoff.step() * 5, absl::Seconds(1))))) {
      // A client and coordinator that disagree about TLS fail every connect
      // the same way: say so instead of retrying until the timeout.
      if (clock_->Now() >= next_transport_check) {
        next_transport_check = clock_->Now() + kTransportCheckPeriod;
        absl::Status mismatch =
            CheckTransport("coordinator", options_.coordinator,
                           options_.tls.has_value(), "ReaderOptions::tls");
        if (!mismatch.ok()) {
          handler_->Failed(std::move(mismatch));
          return;
        }
      }
      if (!wanted()) return;
      if (clock_->Now() - unreachable_since > options_.reconnect_timeout) {
        handler_->Failed(unreachable(""));
        return;
      }
      backoff.set_max(std::min(absl::Seconds(5), handler_->LeaseTtl() / 4));
      backoff.Grow();
      continue;
    }
    grpc::ClientContext ctx;
    std::unique_ptr<
        grpc::ClientAsyncReaderWriter<TrainerMessage, CoordinatorMessage>>
        stream = stub_->PrepareAsyncSession(&ctx, loop_->cq());
    {
      absl::MutexLock lock(&write_mu_);
      context_ = &ctx;  // Stop() can cancel from here on
      if (cancelled_) ctx.TryCancel();
    }
    WaitTag started;
    stream->StartCall(TagOf(&started));
    const bool started_ok = started.Wait();
    auto read = [&stream](CoordinatorMessage* m) {
      WaitTag done;
      stream->Read(m, TagOf(&done));
      return done.Wait();
    };
    // The Hello is written before the stream is published to the other
    // writers (reports, Syncs, Want): a Progress flushed first on a new
    // stream would end it at the coordinator ("the first message must be
    // Hello").
    TrainerMessage hello, want;
    bool hello_written = false;
    {
      absl::MutexLock lock(&write_mu_);
      if (started_ok) {
        handler_->OpeningMessages(&hello, &want);
        WaitTag written;
        stream->Write(hello, TagOf(&written));
        hello_written = written.Wait();
      }
      stream_ = stream.get();
    }
    handler_->StreamOpen(true);
    bool welcomed = false;
    if (started_ok) {
      // A write fails when the coordinator has already ended the stream (a
      // finished job: Welcome, JobDone, OK right after the Hello). Its
      // messages are read all the same: they say why, and Finish() waits
      // for every incoming message to be read.
      if (hello_written) Send(want);
      CoordinatorMessage m;
      while (read(&m)) {
        if (m.has_welcome() && !welcomed) {
          welcomed = true;
          backoff.Reset();
          handler_->Welcomed(m);
          continue;
        }
        handler_->Received(m);
      }
    }
    {
      absl::MutexLock lock(&write_mu_);
      stream_ = nullptr;
      context_ = nullptr;
    }
    handler_->StreamOpen(false);
    grpc::Status finish_status;
    {
      WaitTag finished;
      stream->Finish(&finish_status, TagOf(&finished));
      finished.Wait();
    }
    const absl::Status status = FromGrpcStatus(finish_status);
    if (!wanted()) return;
    if (Terminal(status)) {
      handler_->Failed(status);
      return;
    }
    if (welcomed) {
      unreachable_since = clock_->Now();
      absl::MutexLock lock(&mu_);
      ++reconnects_;
    }
    if (clock_->Now() - unreachable_since > options_.reconnect_timeout) {
      handler_->Failed(unreachable(absl::StrCat(": ", status.ToString())));
      return;
    }
    backoff.set_max(std::min(absl::Seconds(5), handler_->LeaseTtl() / 4));
    // A pause, not a measurement: it passes on the real clock.
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(&stopping_), backoff.NextWait());
  }
}

}  // namespace sluice::client_internal
