// sluice-coordinator: hands out epoch-consistent shard leases to trainers.
#include <memory>

#include "server/common/server_host.h"
#include "sluice/v1/coordinator.grpc.pb.h"

namespace {

class CoordinatorServices : public sluice::ServiceSet {
 public:
  std::vector<grpc::Service*> services() override { return {&coordinator_}; }

 private:
  sluice::v1::Coordinator::CallbackService coordinator_;
};

}  // namespace

int main(int argc, char** argv) {
  sluice::ServerMainOptions options;
  options.program = "sluice-coordinator";
  options.usage =
      "Hands out epoch-consistent shard leases to "
      "trainers.\n\nUsage: sluice-coordinator [flags]\nStops cleanly on "
      "SIGTERM/SIGINT (exit 0).";
  options.default_listen = "0.0.0.0:7070";
  options.default_metrics_listen = "0.0.0.0:9070";
  options.make_services = [](std::shared_ptr<prometheus::Registry>)
      -> absl::StatusOr<std::unique_ptr<sluice::ServiceSet>> {
    return std::make_unique<CoordinatorServices>();
  };
  return sluice::RunServerMain(argc, argv, options);
}
