// A local Sluice cluster for integration tests: a coordinator (journal in
// the cluster's directory, 200 ms heartbeats) and data servers serving the
// directory's shards/, all real binaries on 127.0.0.1:0. Members can be
// killed and the coordinator restarted on its address and journal, as a
// crashed coordinator comes back. Every process is stopped by its own PID
// when the cluster goes.
#ifndef SLUICE_TESTS_TESTING_TEST_CLUSTER_H_
#define SLUICE_TESTS_TESTING_TEST_CLUSTER_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "tests/testing/process.h"
#include "tests/testing/tar_writer.h"

namespace sluice::testing {

class TestCluster {
 public:
  // `dir` must exist and outlive the cluster.
  explicit TestCluster(std::string dir);

  // Writes "<dir>/shards/<name>.tar" with `samples` samples, each made by
  // `sample(tar, i)`; returns its path (the URL a manifest names).
  std::string WriteShard(const std::string& name, int samples,
                         const std::function<void(TarWriter&, int)>& sample);
  std::string shards_dir() const { return dir_ + "/shards"; }

  // Starts the coordinator with `extra` flags (kept for restarts).
  absl::Status StartCoordinator(std::vector<std::string> extra = {});
  // SIGKILLs the coordinator (a crash).
  void KillCoordinator() { coordinator_.process.Kill(); }
  // Kills the coordinator unless it is down already and starts it again on
  // the same address and journal: what a supervisor's restart does.
  absl::Status RestartCoordinator();
  // Starts `n` more data servers (with `extra` flags) registered with the
  // coordinator and waits until it counts every one live.
  absl::Status StartDataServers(int n, std::vector<std::string> extra = {});

  ServerProcess& coordinator() { return coordinator_; }
  std::vector<ServerProcess>& data_servers() { return data_; }
  // The coordinator's log so far (for a failing test's output).
  std::string CoordinatorLog() const;

 private:
  const std::string dir_;
  std::vector<std::string> coordinator_args_;
  ServerProcess coordinator_;
  std::vector<ServerProcess> data_;
};

}  // namespace sluice::testing

#endif  // SLUICE_TESTS_TESTING_TEST_CLUSTER_H_
