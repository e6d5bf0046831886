// A local Sluice cluster of real processes: a coordinator (its journal in
// the cluster's directory, or, with `ha`, in a local etcd with a standby
// coordinator beside it) and data servers serving one directory of shards.
// Every server listens on port 0 and its addresses are read back from its
// --port_file; its output goes to DIR/logs. `sluicectl up` and `sluicectl
// demo` run one, and so do the C++ integration tests
// (tests/testing/test_cluster.h) and the Python tests
// (tests/python/conftest.py). Every process is stopped by its own PID.
//
//   LocalClusterOptions o;
//   o.dir = "/tmp/c", o.bin_dir = "build/bin", o.shards_dir = "/data/shards";
//   LocalCluster cluster(std::move(o));
//   RETURN_IF_ERROR(cluster.StartCoordinator());
//   RETURN_IF_ERROR(cluster.StartDataServers(2));
//   ... trainers use cluster.coordinator_address() ...
//   cluster.Stop();
//
// The Python tests' fixtures drive it through sluice._core
// (client/python/core/local_cluster_bindings.cc). Not thread-safe: one thread
// drives it.
#ifndef SLUICE_CLIENT_CLI_LOCAL_CLUSTER_H_
#define SLUICE_CLIENT_CLI_LOCAL_CLUSTER_H_

#include <grpcpp/security/credentials.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/cli/subprocess.h"

namespace sluice::cli {

// A server binary running with its addresses read from its port file.
struct ServerProcess {
  Subprocess process;
  // The command as started, without the flags StartServer puts first (what
  // a restart runs again).
  std::vector<std::string> argv;
  std::string grpc_address;            // "HOST:PORT"
  std::string metrics_address;         // "127.0.0.1:PORT"
  std::string log_path;                // its stdout and stderr
  std::string port_file;               // its --port_file
  std::vector<std::string> unset_env;  // not passed on (Subprocess::Spawn)
};

// Starts `argv` (a server binary's path, its --listen and other flags) with
// --metrics_listen=127.0.0.1:0 and --port_file=`port_file` put first (a flag
// in `argv` wins), its output appended to `log_path`, and waits until the port
// file names its addresses. An error carries the last line of the log (a port
// in use, a bad flag). The environment variables named in `unset_env` are
// not passed on (to it, nor to it restarted).
absl::StatusOr<ServerProcess> StartServer(
    std::vector<std::string> argv, const std::string& port_file,
    const std::string& log_path, absl::Duration timeout = absl::Seconds(20),
    const std::vector<std::string>& unset_env = {});

// "host:port", brackets around an IPv6 host.
std::string JoinHostPort(const std::string& host, int port);

struct LocalClusterOptions {
  // The cluster's directory: journal/, logs/, port files, data server
  // caches (created when missing).
  std::string dir;
  // Where sluice-coordinator and sluice-dataserver are.
  std::string bin_dir;
  // What the data servers serve (--roots).
  std::string shards_dir;
  // The coordinator's --listen.
  std::string listen = "127.0.0.1:0";
  // The host data servers and the standby coordinator bind to (port 0).
  std::string host = "127.0.0.1";
  std::vector<std::string> coordinator_flags;
  std::vector<std::string> data_server_flags;
  // Two coordinators with their journal in a local etcd (`etcd` on the
  // PATH): the first leads, the second waits as a standby.
  bool ha = false;
  // What the cluster's own checks (readiness, live data servers) connect
  // to the coordinator with; null: plaintext. A coordinator given TLS flags
  // needs the matching client credentials here.
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  // Environment variables of this process the servers do not inherit: the
  // Python client's own gRPC settings (sluice/__init__.py), which a server
  // started by hand or by Kubernetes does not have either.
  std::vector<std::string> unset_env;
};

class LocalCluster {
 public:
  explicit LocalCluster(LocalClusterOptions options);
  ~LocalCluster() { Stop(); }
  LocalCluster(const LocalCluster&) = delete;
  LocalCluster& operator=(const LocalCluster&) = delete;

  // Starts the coordinator (with `ha`, etcd first and the standby after)
  // with `extra` flags after the cluster's (kept for restarts), and waits
  // until it is ready to serve.
  absl::Status StartCoordinator(
      const std::vector<std::string>& extra = std::vector<std::string>());
  // SIGKILLs the coordinator (a crash).
  void KillCoordinator();
  // Kills the coordinator unless it is down already and starts it again on
  // the same address and journal, as a supervisor's restart does; waits
  // until it is ready. `extra` replaces the flags StartCoordinator was given.
  absl::Status RestartCoordinator();
  absl::Status RestartCoordinator(const std::vector<std::string>& extra);

  // Starts `n` more data servers (`extra` flags after the cluster's) and
  // waits until the coordinator counts every data server live.
  absl::Status StartDataServers(int n, const std::vector<std::string>& extra =
                                           std::vector<std::string>());
  // Starts one more data server and waits until it listens (not until it
  // registered).
  absl::Status AddDataServer(
      const std::vector<std::string>& extra = std::vector<std::string>());
  // Stops data server `i` unless it is down already (SIGTERM, then SIGKILL
  // after 15 s) and starts it again with the same command: a new process on
  // a new port, with the same cache. Waits until it listens.
  absl::Status RestartDataServer(size_t i);
  // Drains the newest data server (SIGTERM: it hands back what its readers
  // have not read, then exits; Reap collects it) and returns its address.
  std::string DrainDataServer();
  // Collects the drained data servers that have exited.
  void Reap();
  // Stops every process (SIGTERM, then SIGKILL after 15 s).
  void Stop();

  // The address trainers use: the coordinator's, or with `ha` both
  // coordinators' ("LEADER,STANDBY").
  const std::string& coordinator_address() const { return address_; }
  ServerProcess& coordinator() { return coordinator_; }
  // With `ha`: the standby coordinator.
  ServerProcess& standby() { return standby_; }
  std::vector<ServerProcess>& data_servers() { return data_; }
  const LocalClusterOptions& options() const { return options_; }

 private:
  absl::StatusOr<ServerProcess> StartCoordinatorProcess(
      const std::string& name, const std::string& listen);

  const LocalClusterOptions options_;
  std::vector<std::string> journal_flags_;
  std::vector<std::string> coordinator_extra_;
  Subprocess etcd_;
  ServerProcess coordinator_;
  ServerProcess standby_;
  std::string address_;
  std::vector<ServerProcess> data_;
  std::vector<ServerProcess> leaving_;  // drained, not yet exited
  int next_data_index_ = 0;
};

}  // namespace sluice::cli

#endif  // SLUICE_CLIENT_CLI_LOCAL_CLUSTER_H_
