#include "server/coordinator/coordinator_front_door.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "server/common/grpc_status.h"
#include "server/common/status_details.h"

namespace sluice {
namespace {

// A stream refused before it starts: finishes with `status` at once.
template <typename Request, typename Response>
class RefusedStream final : public grpc::ServerBidiReactor<Request, Response> {
 public:
  explicit RefusedStream(const grpc::Status& status) { this->Finish(status); }
  void OnDone() override { delete this; }
};

}  // namespace

void CoordinatorFrontDoor::SetLeader(const std::string& leader) {
  absl::MutexLock lock(&mu_);
  leader_ = leader;
}

void CoordinatorFrontDoor::Lead(GrpcCoordinatorService* leading) {
  leading_.store(leading);
}

grpc::Status CoordinatorFrontDoor::NotLeaderStatus() const {
  v1::NotLeader details;
  {
    absl::MutexLock lock(&mu_);
    details.set_leader(leader_);
  }
  const std::string message =
      details.leader().empty()
          ? std::string(
                "standby coordinator: no coordinator leads at the moment; "
                "retry")
          : absl::StrCat("standby coordinator: ", details.leader(),
                         " leads; call it");
  return ToGrpcStatus(
      StatusWithDetail(absl::StatusCode::kUnavailable, message, details));
}

grpc::ServerUnaryReactor* CoordinatorFrontDoor::Refuse(
    grpc::CallbackServerContext* ctx) const {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(NotLeaderStatus());
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorFrontDoor::CreateJob(
    grpc::CallbackServerContext* ctx, const v1::CreateJobRequest* req,
    v1::Job* resp) {
  if (auto* s = leading()) return s->CreateJob(ctx, req, resp);
  return Refuse(ctx);
}

grpc::ServerUnaryReactor* CoordinatorFrontDoor::GetJob(
    grpc::CallbackServerContext* ctx, const v1::GetJobRequest* req,
    v1::Job* resp) {
  if (auto* s = leading()) return s->GetJob(ctx, req, resp);
  return Refuse(ctx);
}

grpc::ServerUnaryReactor* CoordinatorFrontDoor::ListJobs(
    grpc::CallbackServerContext* ctx, const v1::ListJobsRequest* req,
    v1::ListJobsResponse* resp) {
  if (auto* s = leading()) return s->ListJobs(ctx, req, resp);
  return Refuse(ctx);
}

grpc::ServerUnaryReactor* CoordinatorFrontDoor::DeleteJob(
    grpc::CallbackServerContext* ctx, const v1::DeleteJobRequest* req,
    v1::DeleteJobResponse* resp) {
  if (auto* s = leading()) return s->DeleteJob(ctx, req, resp);
  return Refuse(ctx);
}

grpc::ServerUnaryReactor* CoordinatorFrontDoor::Barrier(
    grpc::CallbackServerContext* ctx, const v1::BarrierRequest* req,
    v1::BarrierResponse* resp) {
  if (auto* s = leading()) return s->Barrier(ctx, req, resp);
  return Refuse(ctx);
}

grpc::ServerUnaryReactor* CoordinatorFrontDoor::ListOnce(
    grpc::CallbackServerContext* ctx, const v1::ListOnceRequest* req,
    v1::ListOnceResponse* resp) {
  if (auto* s = leading()) return s->ListOnce(ctx, req, resp);
  return Refuse(ctx);
}

grpc::ServerUnaryReactor* CoordinatorFrontDoor::ResetOnce(
    grpc::CallbackServerContext* ctx, const v1::ResetOnceRequest* req,
    v1::ResetOnceResponse* resp) {
  if (auto* s = leading()) return s->ResetOnce(ctx, req, resp);
  return Refuse(ctx);
}

grpc::ServerBidiReactor<v1::TrainerMessage, v1::CoordinatorMessage>*
CoordinatorFrontDoor::Session(grpc::CallbackServerContext* ctx) {
  if (auto* s = leading()) return s->Session(ctx);
  return new RefusedStream<v1::TrainerMessage, v1::CoordinatorMessage>(
      NotLeaderStatus());
}

grpc::ServerBidiReactor<v1::DataServerMessage, v1::CoordinatorToDataServer>*
CoordinatorFrontDoor::RegisterDataServer(grpc::CallbackServerContext* ctx) {
  if (auto* s = leading()) return s->RegisterDataServer(ctx);
  return new RefusedStream<v1::DataServerMessage, v1::CoordinatorToDataServer>(
      NotLeaderStatus());
}

grpc::ServerBidiReactor<v1::OnceRequest, v1::OnceResponse>*
CoordinatorFrontDoor::Once(grpc::CallbackServerContext* ctx) {
  if (auto* s = leading()) return s->Once(ctx);
  return new RefusedStream<v1::OnceRequest, v1::OnceResponse>(
      NotLeaderStatus());
}

}  // namespace sluice
