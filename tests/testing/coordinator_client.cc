#include "tests/testing/coordinator_client.h"

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
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
  if (!session->Write(hello) || !session->Write(want)) {
    return absl::UnavailableError(
        absl::StrCat("session on job ", job, " broke"));
  }
  v1::CoordinatorMessage m;
  while (session->Read(&m) && !m.has_grant()) {
  }
  ctx.TryCancel();
  if (!m.has_grant()) {
    absl::Status status = FromGrpcStatus(session->Finish());
    return absl::UnavailableError(absl::StrCat(
        "session on job ", job, " ended without a grant: ", status.ToString()));
  }
  session->Finish().ok();
  return m.grant().lease();
}

}  // namespace sluice::testing
