// A local Sluice cluster for integration tests: cli::LocalCluster (the one
// sluicectl up runs) in the test's directory, with 200 ms heartbeats, over
// shards the test writes into its shards/. Members can be killed and the
// coordinator restarted on its address and journal, as a crashed
// coordinator comes back. Every process is stopped by its own PID when the
// cluster goes.
#ifndef SLUICE_TESTS_TESTING_TEST_CLUSTER_H_
#define SLUICE_TESTS_TESTING_TEST_CLUSTER_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "client/cli/local_cluster.h"
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

  // Starts the coordinator with `extra` flags (kept for restarts) and waits
  // until it is ready.
  absl::Status StartCoordinator(std::vector<std::string> extra = {}) {
    return cluster_.StartCoordinator(extra);
  }
  // SIGKILLs the coordinator (a crash).
  void KillCoordinator() { cluster_.KillCoordinator(); }
  // Kills the coordinator unless it is down already and starts it again on
  // the same address and journal: what a supervisor's restart does.
  absl::Status RestartCoordinator() { return cluster_.RestartCoordinator(); }
  // Starts `n` more data servers (with `extra` flags) registered with the
  // coordinator and waits until it counts every one live.
  absl::Status StartDataServers(int n, std::vector<std::string> extra = {}) {
    return cluster_.StartDataServers(n, extra);
  }

  cli::ServerProcess& coordinator() { return cluster_.coordinator(); }
  std::vector<cli::ServerProcess>& data_servers() {
    return cluster_.data_servers();
  }
  // The coordinator's log so far (for a failing test's output).
  std::string CoordinatorLog();

 private:
  const std::string dir_;
  cli::LocalCluster cluster_;
};

}  // namespace sluice::testing

#endif  // SLUICE_TESTS_TESTING_TEST_CLUSTER_H_
