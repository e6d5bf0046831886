// sluice-dataserver: streams samples of WebDataset tar shards to trainers.
#include <memory>

#include "server/common/server_host.h"
#include "sluice/v1/dataserver.grpc.pb.h"

namespace {

class DataServerServices : public sluice::ServiceSet {
 public:
  std::vector<grpc::Service*> services() override { return {&dataserver_}; }

 private:
  sluice::v1::DataServer::CallbackService dataserver_;
};

}  // namespace

int main(int argc, char** argv) {
  sluice::ServerMainOptions options;
  options.program = "sluice-dataserver";
  options.usage =
      "Streams samples of WebDataset tar shards to "
      "trainers.\n\nUsage: sluice-dataserver [flags]\nStops cleanly on "
      "SIGTERM/SIGINT (exit 0).";
  options.default_listen = "0.0.0.0:7071";
  options.default_metrics_listen = "0.0.0.0:9071";
  options.make_services = [](std::shared_ptr<prometheus::Registry>)
      -> absl::StatusOr<std::unique_ptr<sluice::ServiceSet>> {
    return std::make_unique<DataServerServices>();
  };
  return sluice::RunServerMain(argc, argv, options);
}
