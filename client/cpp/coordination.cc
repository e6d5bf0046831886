#include "sluice/coordination.h"

#include <unistd.h>

#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "client/cpp/channel_credentials.h"
#include "client/cpp/grpc_deadline.h"
#include "server/common/grpc_status.h"
#include "server/common/grpc_target.h"
#include "server/common/status_macros.h"
#include "sluice/v1/coordinator.grpc.pb.h"

namespace sluice {
namespace {

std::string DefaultParticipant() {
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  return absl::StrCat(host, "-", getpid());
}

// Keepalive (SetStreamKeepalive): a stopped coordinator fails the stream
// within about 4 s instead of holding every waiter for its stop.
grpc::ChannelArguments StreamChannelArgs() {
  grpc::ChannelArguments args;
  SetStreamKeepalive(args);
  return args;
}

}  // namespace

void OnceCancel::Cancel() {
  absl::MutexLock lock(&mu_);
  cancelled_ = true;
  if (call_ != nullptr) call_->TryCancel();
}

bool OnceCancel::Attach(grpc::ClientContext* call) {
  absl::MutexLock lock(&mu_);
  call_ = call;
  return !cancelled_;
}

absl::StatusOr<OnceOutcome> RunOnce(
    const OnceOptions& options,
    const std::function<absl::StatusOr<std::string>()>& step) {
  if (options.coordinator.empty() || options.name.empty()) {
    return absl::InvalidArgumentError(
        "OnceOptions.coordinator and .name are required");
  }
  RETURN_IF_ERROR(
      client_internal::CheckClientTls(options.tls, "OnceOptions.tls"));
  auto stub = v1::Coordinator::NewStub(CoordinatorChannel(
      options.coordinator, client_internal::ChannelCredentials(options.tls),
      StreamChannelArgs()));
  grpc::ClientContext ctx;
  if (options.timeout != absl::InfiniteDuration())
    ctx.set_deadline(client_internal::DeadlineAfter(options.timeout));
  // Detached before ctx goes: a Cancel() after this call returns touches
  // nothing.
  struct Detach {
    OnceCancel* cancel;
    ~Detach() {
      if (cancel != nullptr) cancel->Attach(nullptr);
    }
  } detach{options.cancel};
  if (options.cancel != nullptr && !options.cancel->Attach(&ctx)) {
    return absl::CancelledError(
        absl::StrCat("once ", options.scope, "/", options.name, ": cancelled"));
  }
  auto stream = stub->Once(&ctx);
  absl::Mutex write_mu;
  auto write = [&](const v1::OnceRequest& m) {
    absl::MutexLock lock(&write_mu);
    return stream->Write(m);
  };
  v1::OnceRequest join;
  join.mutable_join()->set_scope(options.scope);
  join.mutable_join()->set_name(options.name);
  join.mutable_join()->set_participant(
      options.participant.empty() ? DefaultParticipant() : options.participant);
  join.mutable_join()->set_ttl_ms(absl::ToInt64Milliseconds(options.ttl));
  join.mutable_join()->set_on_failure(options.fail_all
                                          ? v1::ONCE_FAILURE_POLICY_FAIL_ALL
                                          : v1::ONCE_FAILURE_POLICY_RETRY);
  OnceOutcome outcome;
  bool final = false;  // Done or Error received
  if (write(join)) {
    v1::OnceResponse r;
    while (stream->Read(&r)) {
      if (r.has_wait()) {
        if (options.on_wait) options.on_wait(r.wait().runner(), r.wait().run());
        continue;
      }
      if (r.has_done()) {
        outcome.run = r.done().run();
        outcome.result = r.done().result();
        final = true;
        break;
      }
      if (r.has_error()) {
        outcome.run = r.error().run();
        outcome.failed = true;
        outcome.error = r.error().error();
        final = true;
        break;
      }
      if (r.has_run()) {
        outcome.ran = true;
        outcome.run = r.run().run();
        if (options.on_run) options.on_run(outcome.run);
        // Heartbeat while the step runs: the execution lease.
        absl::Notification stepped;
        const absl::Duration interval = absl::Milliseconds(
            std::max<int64_t>(50, r.run().heartbeat_interval_ms()));
        std::thread heartbeat([&] {
          while (!stepped.WaitForNotificationWithTimeout(interval)) {
            v1::OnceRequest beat;
            beat.mutable_heartbeat();
            if (!write(beat)) return;
          }
        });
        absl::StatusOr<std::string> result = step();
        stepped.Notify();
        heartbeat.join();
        v1::OnceRequest report;
        if (result.ok()) {
          report.mutable_succeeded()->set_run(outcome.run);
          report.mutable_succeeded()->set_result(*result);
          outcome.result = *result;
        } else {
          report.mutable_failed()->set_run(outcome.run);
          report.mutable_failed()->set_error(
              std::string(result.status().message()));
          outcome.failed = true;
          outcome.error = std::string(result.status().message());
        }
        write(report);
        // Read the confirmation (Done / Error) or the refusal.
        continue;
      }
    }
  }
  stream->WritesDone();
  absl::Status status = client_internal::ExplainUnavailable(
      FromGrpcStatus(stream->Finish()), options.coordinator, options.tls,
      "OnceOptions.tls");
  if (final) return outcome;
  if (status.ok())
    status = absl::UnavailableError("the stream ended without an outcome");
  return absl::Status(status.code(),
                      absl::StrCat("once ", options.scope, "/", options.name,
                                   ": ", status.message()));
}

absl::StatusOr<v1::BarrierResponse> WaitBarrier(const BarrierOptions& options) {
  if (options.coordinator.empty() || options.name.empty() ||
      options.participant.empty() || options.participants <= 0) {
    return absl::InvalidArgumentError(
        "BarrierOptions.coordinator, .name, .participant and .participants are "
        "required");
  }
  RETURN_IF_ERROR(
      client_internal::CheckClientTls(options.tls, "BarrierOptions.tls"));
  auto stub = v1::Coordinator::NewStub(CoordinatorChannel(
      options.coordinator, client_internal::ChannelCredentials(options.tls),
      StreamChannelArgs()));
  grpc::ClientContext ctx;
  // The server answers at the timeout; the RPC deadline is a backstop.
  ctx.set_deadline(
      client_internal::DeadlineAfter(options.timeout + absl::Seconds(10)));
  v1::BarrierRequest request;
  request.set_scope(options.scope);
  request.set_name(options.name);
  request.set_participant(options.participant);
  request.set_participants(options.participants);
  request.set_timeout_ms(absl::ToInt64Milliseconds(options.timeout));
  v1::BarrierResponse response;
  absl::Status status = client_internal::ExplainUnavailable(
      FromGrpcStatus(stub->Barrier(&ctx, request, &response)),
      options.coordinator, options.tls, "BarrierOptions.tls");
  if (!status.ok()) return status;
  return response;
}

}  // namespace sluice
