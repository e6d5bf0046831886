// sluicectl health: a server's gRPC health (liveness or readiness).
#include <grpcpp/grpcpp.h>

#include <cstdio>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/cli/cli.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "nlohmann/json.hpp"
#include "server/common/grpc_status.h"

ABSL_DECLARE_FLAG(absl::Duration, timeout);
ABSL_DECLARE_FLAG(bool, json);
// health
ABSL_FLAG(
    std::string, service, "",
    "health: service name (\"readiness\" for readiness; empty = overall).");
ABSL_FLAG(bool, wait, false,
          "health: keep asking until the status is SERVING (or --timeout "
          "passes), for scripts that start a server and wait for it.");

namespace sluice::cli {

int HealthCommand(const std::vector<std::string>& args) {
  if (args.size() != 1) return Usage("health: give one HOST:PORT");
  auto stub = grpc::health::v1::Health::NewStub(
      grpc::CreateChannel(args[0], Credentials()));
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(absl::GetFlag(FLAGS_service));
  grpc::health::v1::HealthCheckResponse response;
  const absl::Time deadline = absl::Now() + absl::GetFlag(FLAGS_timeout);
  absl::Status s;
  while (true) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(deadline));
    s = FromGrpcStatus(stub->Check(&ctx, request, &response));
    const bool serving =
        s.ok() &&
        response.status() == grpc::health::v1::HealthCheckResponse::SERVING;
    if (serving || !absl::GetFlag(FLAGS_wait) ||
        absl::Now() + absl::Milliseconds(100) >= deadline) {
      break;
    }
    absl::SleepFor(absl::Milliseconds(100));  // --wait: ask again
  }
  if (!s.ok()) {
    return Fail(absl::Status(
        s.code(), absl::StrCat("health ", args[0], ": ", s.message())));
  }
  std::string status =
      grpc::health::v1::HealthCheckResponse::ServingStatus_Name(
          response.status());
  if (absl::GetFlag(FLAGS_json)) {
    nlohmann::ordered_json out;
    out["address"] = args[0];
    out["status"] = status;
    std::printf("%s\n", out.dump().c_str());
  } else {
    std::printf("%s %s\n", args[0].c_str(), status.c_str());
  }
  return response.status() == grpc::health::v1::HealthCheckResponse::SERVING
             ? kOk
             : kError;
}

}  // namespace sluice::cli
