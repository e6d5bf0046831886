#include "server/dataserver/coordinator_registration.h"

#include <grpcpp/create_channel.h>
#include <grpcpp/support/channel_arguments.h>
#include <sys/resource.h>

#include <algorithm>

#include "absl/time/clock.h"
#include "server/common/backoff.h"
#include "server/common/grpc_target.h"
#include "server/common/logging.h"
#include "server/common/tls_probe.h"
#include "sluice/v1/coordinator.grpc.pb.h"

namespace sluice::dataserver {
namespace {

// User and system CPU time of this process so far.
double ProcessCpuSeconds() {
  rusage usage{};
  if (getrusage(RUSAGE_SELF, &usage) != 0) return 0;
  const auto seconds = [](const timeval& t) {
    return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) / 1e6;
  };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}
// Longest wait between registration attempts (the coordinator's default
// heartbeat interval).
constexpr absl::Duration kMaxRetry = absl::Seconds(1);
}  // namespace

CoordinatorRegistration::CoordinatorRegistration(Options options)
    : options_(std::move(options)) {}

CoordinatorRegistration::~CoordinatorRegistration() { Stop(); }

void CoordinatorRegistration::Start() {
  thread_ = std::thread([this] { Run(); });
}

void CoordinatorRegistration::Drain() {
  absl::MutexLock lock(&mu_);
  draining_ = true;
}

void CoordinatorRegistration::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    if (context_ != nullptr) context_->TryCancel();
  }
  if (thread_.joinable()) thread_.join();
}

int CoordinatorRegistration::registrations() const {
  absl::MutexLock lock(&mu_);
  return registrations_;
}

bool CoordinatorRegistration::Sleep(absl::Duration d) {
  absl::MutexLock lock(&mu_);
  auto wake = [this] {
    mu_.AssertHeld();
    return stopping_ || stream_broken_ || (draining_ && !draining_sent_);
  };
  mu_.AwaitWithTimeout(absl::Condition(&wake), d);
  return !stopping_;
}

void CoordinatorRegistration::Run() {
  // gRPC's own reconnect backoff grows to 120 s by default: after a
  // coordinator restart the channel would retry only every 10-20 s, and no
  // unit is granted meanwhile. Kept at most kMaxRetry, like the loop below,
  // so a restarted coordinator sees this server within about a heartbeat
  // interval. (Not GRPC_ARG_MIN_RECONNECT_BACKOFF_MS: gRPC takes it as the
  // time one connection attempt may take.)
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS,
              static_cast<int>(absl::ToInt64Milliseconds(kMaxRetry)));
  auto connect = [&] {
    return v1::Coordinator::NewStub(CoordinatorChannel(
        options_.coordinator,
        options_.credentials ? options_.credentials
                             : grpc::InsecureChannelCredentials(),
        args));
  };
  auto stub = connect();
  Backoff backoff(absl::Milliseconds(100), kMaxRetry);
  bool reported_failure = false;
  bool fresh_channel = false;
  while (true) {
    grpc::ClientContext context;
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
      context_ = &context;
    }
    auto stream = stub->RegisterDataServer(&context);
    v1::DataServerMessage hello;
    hello.mutable_register_()->set_address(options_.advertise);
    hello.mutable_register_()->set_capacity(options_.capacity);
    hello.mutable_register_()->set_node(options_.node);
    hello.mutable_register_()->set_pool(options_.pool);
    hello.mutable_register_()->set_credential(options_.credential);
    if (options_.max_fence_seen) {
      hello.mutable_register_()->set_max_fence_seen(options_.max_fence_seen());
    }
    v1::CoordinatorToDataServer reply;
    const bool replied = stream->Write(hello) && stream->Read(&reply);
    const bool registered = replied && reply.has_registered();
    if (registered) {
      int count;
      {
        absl::MutexLock lock(&mu_);
        count = ++registrations_;
      }
      LogInfo("%s with coordinator %s as %s",
              count == 1 ? "registered" : "re-registered", options_.coordinator,
              options_.advertise);
      reported_failure = false;
      backoff.Reset();
      absl::Duration interval = absl::Milliseconds(
          std::max<int64_t>(50, reply.registered().heartbeat_interval_ms()));
      // Silence for as long as the coordinator waits before it declares
      // this server dead means the coordinator is not running (a stopped
      // process keeps its connection up). Only a coordinator that answers
      // heartbeats is held to it.
      const bool acks_heartbeats = reply.registered().acks_heartbeats();
      const absl::Duration silence_bound = std::max(
          3 * interval,
          absl::Milliseconds(reply.registered().heartbeat_timeout_ms()));
      absl::Time last_heard = absl::Now();
      // Reads (prefetch hints, heartbeat answers) run beside the heartbeat
      // writes.
      std::thread reader([&] {
        v1::CoordinatorToDataServer in;
        while (stream->Read(&in)) {
          {
            absl::MutexLock lock(&mu_);
            last_heard = absl::Now();
          }
          if (in.has_prefetch() && options_.on_prefetch)
            options_.on_prefetch(in.prefetch());
        }
        absl::MutexLock lock(&mu_);
        stream_broken_ = true;
      });
      bool silent = false;
      while (Sleep(interval)) {
        {
          absl::MutexLock lock(&mu_);
          if (stream_broken_) break;
          const absl::Duration quiet = absl::Now() - last_heard;
          if (acks_heartbeats && quiet > silence_bound) {
            LogWarning(
                "coordinator %s: no answer to heartbeats for %s; registering "
                "again with whichever coordinator is ready",
                options_.coordinator, absl::FormatDuration(quiet));
            silent = true;
            break;
          }
        }
        bool send_draining = false;
        {
          absl::MutexLock lock(&mu_);
          send_draining = draining_ && !draining_sent_;
          draining_sent_ = draining_;
        }
        if (send_draining) {
          v1::DataServerMessage draining;
          draining.mutable_draining();
          if (!stream->Write(draining)) break;
          LogInfo("draining: told coordinator %s to route nothing new here",
                  options_.coordinator);
        }
        v1::DataServerMessage beat;
        beat.mutable_heartbeat()->set_active_streams(
            options_.active_streams ? options_.active_streams() : 0);
        if (options_.max_fence_seen) {
          beat.mutable_heartbeat()->set_max_fence_seen(
              options_.max_fence_seen());
        }
        if (options_.samples_served) {
          beat.mutable_heartbeat()->set_samples_served(
              options_.samples_served());
        }
        beat.mutable_heartbeat()->set_cpu_seconds(ProcessCpuSeconds());
        beat.mutable_heartbeat()->set_cores(options_.cores);
        if (!stream->Write(beat)) break;
      }
      context.TryCancel();
      reader.join();
      {
        absl::MutexLock lock(&mu_);
        stream_broken_ = false;
        draining_sent_ = false;  // a new stream is told again
      }
      fresh_channel = silent;
    } else if (replied) {
      context
          .TryCancel();  // an answer that is not a registration: end the stream
    }
    // A refused registration was ended by the coordinator: its status says
    // why (a missing credential, a certificate that is not a data server's).
    grpc::Status status = stream->Finish();
    {
      absl::MutexLock lock(&mu_);
      context_ = nullptr;
      if (stopping_) return;
    }
    if (fresh_channel) {
      // The silent coordinator's connection stays up, and the channel would
      // keep choosing it: a new channel connects afresh, to a coordinator
      // that answers its readiness check. Said above; retried at once.
      stub = connect();
      fresh_channel = false;
      continue;
    }
    if (!reported_failure) {
      std::string why = status.ok() ? "closed" : status.error_message();
      if (status.error_code() == grpc::StatusCode::UNAVAILABLE) {
        // A coordinator that speaks TLS while this server registers in
        // plaintext (or the reverse) fails the same way every time.
        absl::Status mismatch =
            CheckTransport("coordinator", options_.coordinator,
                           options_.credentials != nullptr, "--coordinator_ca");
        if (!mismatch.ok()) why = std::string(mismatch.message());
      }
      LogWarning(
          "coordinator %s: registration stream ended (%s); retrying with "
          "backoff",
          options_.coordinator, why);
      reported_failure = true;
    }
    if (!Sleep(backoff.NextWait())) return;
  }
}

}  // namespace sluice::dataserver
