#include "sluice/jobs.h"

#include <grpcpp/grpcpp.h>

#include <memory>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "client/cpp/channel_credentials.h"
#include "client/cpp/grpc_deadline.h"
#include "server/common/grpc_status.h"
#include "server/common/grpc_target.h"
#include "server/common/status_macros.h"
#include "sluice/v1/coordinator.grpc.pb.h"

namespace sluice {
namespace {

constexpr char kTlsField[] = "JobQuery.tls";

// One channel to the coordinator for a query's calls.
class JobCalls {
 public:
  explicit JobCalls(const JobQuery& query)
      : query_(query),
        stub_(v1::Coordinator::NewStub(CoordinatorChannel(
            query.coordinator,
            client_internal::ChannelCredentials(query.tls)))) {}

  absl::StatusOr<v1::Job> GetJob(const std::string& job) {
    grpc::ClientContext ctx;
    Prepare(ctx);
    v1::GetJobRequest request;
    request.set_name(job);
    v1::Job out;
    RETURN_IF_ERROR(Explain(stub_->GetJob(&ctx, request, &out)));
    return out;
  }

  absl::Status CreateCopy(const std::string& job, const std::string& copy,
                          int world_size) {
    grpc::ClientContext ctx;
    Prepare(ctx);
    v1::CreateJobRequest request;
    request.mutable_spec()->set_name(copy);
    request.mutable_spec()->set_world_size(world_size);
    request.set_copy_of(job);
    v1::Job response;
    return Explain(stub_->CreateJob(&ctx, request, &response));
  }

 private:
  void Prepare(grpc::ClientContext& ctx) const {
    ctx.set_deadline(client_internal::DeadlineAfter(query_.timeout));
    ctx.set_wait_for_ready(true);
  }

  absl::Status Explain(const grpc::Status& s) const {
    return client_internal::ExplainUnavailable(
        FromGrpcStatus(s), query_.coordinator, query_.tls, kTlsField);
  }

  const JobQuery& query_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
};

absl::Status Check(const JobQuery& query, const std::string& job) {
  if (query.coordinator.empty() || job.empty()) {
    return absl::InvalidArgumentError(
        "JobQuery.coordinator and the job's name are required");
  }
  return client_internal::CheckClientTls(query.tls, kTlsField);
}

absl::Status Prefixed(const absl::Status& status, absl::string_view prefix) {
  return absl::Status(status.code(), absl::StrCat(prefix, status.message()));
}

}  // namespace

absl::StatusOr<v1::Job> DescribeJob(const JobQuery& query,
                                    const std::string& job) {
  RETURN_IF_ERROR(Check(query, job));
  absl::StatusOr<v1::Job> out = JobCalls(query).GetJob(job);
  if (!out.ok())
    return Prefixed(out.status(), absl::StrCat("sluice job ", job, ": "));
  return out;
}

absl::StatusOr<std::string> JobForWorldSize(const JobQuery& query,
                                            const std::string& job,
                                            int world_size) {
  RETURN_IF_ERROR(Check(query, job));
  const std::string prefix = absl::StrCat("sluice job ", job, " for a run of ",
                                          world_size, " ranks: ");
  if (world_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix, "the world size must be at least 1"));
  }
  JobCalls calls(query);
  absl::StatusOr<v1::Job> described = calls.GetJob(job);
  if (!described.ok()) return Prefixed(described.status(), prefix);
  const int made_for = described->spec().world_size();
  if (made_for == 0 || made_for == world_size) return job;
  const std::string copy = absl::StrCat(job, ".w", world_size);
  absl::Status created = calls.CreateCopy(job, copy, world_size);
  if (!created.ok()) return Prefixed(created, prefix);
  return copy;
}

}  // namespace sluice
