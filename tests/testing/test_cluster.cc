#include "tests/testing/test_cluster.h"

#include <sys/stat.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "tests/testing/http.h"

namespace sluice::testing {

TestCluster::TestCluster(std::string dir) : dir_(std::move(dir)) {
  mkdir(shards_dir().c_str(), 0755);
}

std::string TestCluster::WriteShard(
    const std::string& name, int samples,
    const std::function<void(TarWriter&, int)>& sample) {
  TarWriter tar;
  for (int i = 0; i < samples; ++i) sample(tar, i);
  const std::string path = absl::StrCat(shards_dir(), "/", name, ".tar");
  WriteFile(path, tar.Finish());
  return path;
}

absl::Status TestCluster::StartCoordinator(std::vector<std::string> extra) {
  coordinator_args_ = std::move(extra);
  coordinator_args_.push_back("--journal_dir=" + dir_ + "/journal");
  coordinator_args_.push_back("--heartbeat_interval=200ms");
  auto c = ServerProcess::Start("sluice-coordinator", dir_, coordinator_args_);
  if (!c.ok()) return c.status();
  coordinator_ = std::move(*c);
  return absl::OkStatus();
}

absl::Status TestCluster::RestartCoordinator() {
  const std::string address = coordinator_.grpc_address;
  KillCoordinator();
  std::vector<std::string> args = coordinator_args_;
  args.push_back("--listen=" + address);  // after the default: it wins
  auto c = ServerProcess::Start("sluice-coordinator", dir_, args);
  if (!c.ok()) return c.status();
  coordinator_ = std::move(*c);
  return absl::OkStatus();
}

absl::Status TestCluster::StartDataServers(int n,
                                           std::vector<std::string> extra) {
  extra.push_back("--roots=" + shards_dir());
  extra.push_back("--coordinator=" + coordinator_.grpc_address);
  for (int i = 0; i < n; ++i) {
    auto ds = ServerProcess::Start("sluice-dataserver", dir_, extra);
    if (!ds.ok()) return ds.status();
    data_.push_back(std::move(*ds));
  }
  const std::string live =
      absl::StrCat("sluice_coordinator_data_servers ", data_.size());
  if (!WaitForMetric(coordinator_.metrics_address, live)) {
    return absl::DeadlineExceededError(
        absl::StrCat("the coordinator never reported \"", live, "\""));
  }
  return absl::OkStatus();
}

std::string TestCluster::CoordinatorLog() const {
  if (coordinator_.log_path.empty()) return "";
  return ReadWholeFile(coordinator_.log_path).value_or("");
}

}  // namespace sluice::testing
