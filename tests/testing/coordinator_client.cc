#include "tests/testing/coordinator_client.h"

#include <grpcpp/grpcpp.h>

#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "server/common/grpc_status.h"
#include "sluice/v1/coordinator.grpc.pb.h"

namespace sluice::testing {
namespace {

std::unique_ptr<v1::Coordinator::Stub> Stub(const std::string& address) {
  return v1::Coordinator::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
}

}  // namespace

absl::Status CreateJob(const std::string& address, const v1::JobSpec& spec) {
  grpc::ClientContext ctx;
  v1::CreateJobRequest request;
  *request.mutable_spec() = spec;
  v1::Job job;
  return FromGrpcStatus(Stub(address)->CreateJob(&ctx, request, &job));
}

absl::StatusOr<v1::Job> GetJob(const std::string& address,
                               const std::string& name) {
  grpc::ClientContext ctx;
  v1::GetJobRequest request;
  request.set_name(name);
  v1::Job job;
  absl::Status s = FromGrpcStatus(Stub(address)->GetJob(&ctx, request, &job));
  if (!s.ok()) return s;
  return job;
}

absl::StatusOr<v1::Lease> FirstGrant(const std::string& address,
                                     const std::string& job,
                                     const std::string& trainer_id) {
  auto stub = Stub(address);
  grpc::ClientContext ctx;
  auto session = stub->Session(&ctx);
  v1::TrainerMessage hello;
  hello.mutable_hello()->set_job(job);
  hello.mutable_hello()->set_trainer_id(trainer_id);
  v1::TrainerMessage want;
  want.mutable_want()->set_credits(1);
  v1::CoordinatorMessage m;
  if (session->Write(hello) && session->Write(want)) {
    while (session->Read(&m) && !m.has_grant()) {
    }
  }
  if (!m.has_grant()) {
    // The stream ended: its status (and details) say why.
    while (session->Read(&m)) {
    }
    absl::Status status = FromGrpcStatus(session->Finish());
    if (!status.ok()) return status;
    return absl::UnavailableError(
        absl::StrCat("session on job ", job, " ended without a grant"));
  }
  ctx.TryCancel();
  session->Finish().ok();
  return m.grant().lease();
}

absl::Status WaitForReadiness(const std::string& address, bool serving,
                              absl::Duration timeout) {
  using grpc::health::v1::HealthCheckResponse;
  auto stub = grpc::health::v1::Health::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  const absl::Time deadline = absl::Now() + timeout;
  const auto want =
      serving ? HealthCheckResponse::SERVING : HealthCheckResponse::NOT_SERVING;
  HealthCheckResponse::ServingStatus last = HealthCheckResponse::UNKNOWN;
  // The stream sends the current status, then every change; it ends only
  // when the server does (a restart: watch again).
  while (absl::Now() < deadline) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(deadline));
    ctx.set_wait_for_ready(true);
    grpc::health::v1::HealthCheckRequest request;
    request.set_service("readiness");
    auto stream = stub->Watch(&ctx, request);
    HealthCheckResponse response;
    while (stream->Read(&response)) {
      last = response.status();
      if (last == want) {
        ctx.TryCancel();
        stream->Finish().ok();
        return absl::OkStatus();
      }
    }
    stream->Finish().ok();
  }
  return absl::DeadlineExceededError(
      absl::StrCat(address, " readiness still ",
                   HealthCheckResponse::ServingStatus_Name(last), " after ",
                   absl::FormatDuration(timeout)));
}

absl::StatusOr<std::string> NotLeaderHint(const absl::Status& status) {
  auto payload = status.GetPayload(kGrpcDetailsPayloadUrl);
  if (!payload.has_value()) {
    return absl::NotFoundError(
        absl::StrCat("no details in ", status.ToString()));
  }
  v1::RpcStatus rpc;
  if (!rpc.ParseFromString(std::string(*payload))) {
    return absl::NotFoundError("details do not parse as sluice.v1.RpcStatus");
  }
  for (const v1::AnyDetail& any : rpc.details()) {
    if (any.type_url() != "type.googleapis.com/sluice.v1.NotLeader") continue;
    v1::NotLeader details;
    if (!details.ParseFromString(any.value())) break;
    return details.leader();
  }
  return absl::NotFoundError(
      absl::StrCat("no NotLeader in ", status.ToString()));
}

}  // namespace sluice::testing
