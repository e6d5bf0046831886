#include "client/cli/local_cluster.h"

#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/common/status_macros.h"
#include "sluice/v1/coordinator.grpc.pb.h"

namespace sluice::cli {
namespace {

// `status` with the last line `log` holds (what a server that exited at
// start-up said: a port in use, a bad flag).
absl::Status WithLastLogLine(const absl::Status& status,
                             const std::string& log) {
  std::ifstream in(log);
  std::string line, last;
  while (std::getline(in, line)) {
    if (!line.empty()) last = line;
  }
  if (last.empty()) return status;
  return absl::Status(status.code(), absl::StrCat(status.message(), ": ", last,
                                                  " (", log, ")"));
}

// A single-member etcd in DIR/etcd, ports chosen by the kernel and read back
// from its log.
absl::StatusOr<std::string> StartEtcd(const std::string& dir,
                                      Subprocess* etcd) {
  const std::string log = dir + "/logs/etcd.log";
  unlink(log.c_str());
  const std::string any = "http://127.0.0.1:0";
  absl::StatusOr<Subprocess> spawned = Subprocess::Spawn(
      {"/usr/bin/env", "etcd", "--name", "sluicectl-up", "--data-dir",
       dir + "/etcd", "--listen-client-urls", any, "--advertise-client-urls",
       any, "--listen-peer-urls", any, "--initial-advertise-peer-urls", any,
       "--initial-cluster", "sluicectl-up=" + any},
      "", log);
  if (!spawned.ok()) return spawned.status();
  *etcd = std::move(*spawned);
  const std::string marker = "serving insecure client requests on ";
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (absl::Now() < deadline) {
    std::ifstream in(log);
    std::string line;
    while (std::getline(in, line)) {
      const size_t at = line.find(marker);
      if (at == std::string::npos) continue;
      std::string endpoint = line.substr(at + marker.size());
      endpoint = endpoint.substr(0, endpoint.find_first_of(", "));
      return endpoint;
    }
    if (etcd->Poll().has_value()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "etcd exited before serving (is Debian's etcd-server installed? "
          "see ",
          log, ")"));
    }
    absl::SleepFor(absl::Milliseconds(50));  // poll its log
  }
  return absl::DeadlineExceededError("etcd did not start serving in 30 s");
}

}  // namespace

std::string JoinHostPort(const std::string& host, int port) {
  const bool v6 = host.find(':') != std::string::npos && host[0] != '[';
  return absl::StrCat(v6 ? "[" : "", host, v6 ? "]" : "", ":", port);
}

absl::StatusOr<ServerProcess> StartServer(
    std::vector<std::string> argv, const std::string& port_file,
    const std::string& log_path, absl::Duration timeout,
    const std::vector<std::string>& unset_env) {
  unlink(port_file.c_str());  // an earlier run's file names old ports
  if (argv.empty()) return absl::InvalidArgumentError("no server to start");
  ServerProcess server;
  server.argv = argv;
  server.log_path = log_path;
  server.port_file = port_file;
  server.unset_env = unset_env;
  // Right after the binary: a flag the caller gives wins.
  argv.insert(argv.begin() + 1,
              {"--metrics_listen=127.0.0.1:0", "--port_file=" + port_file});
  ASSIGN_OR_RETURN(server.process,
                   Subprocess::Spawn(argv, "", log_path, false, unset_env));
  absl::StatusOr<std::map<std::string, std::string>> ports =
      WaitForPortFile(port_file, server.process, timeout);
  if (!ports.ok()) return WithLastLogLine(ports.status(), log_path);
  server.grpc_address = (*ports)["grpc"];
  server.metrics_address = (*ports)["metrics"];
  return server;
}

LocalCluster::LocalCluster(LocalClusterOptions options)
    : options_(std::move(options)) {
  mkdir(options_.dir.c_str(), 0755);
  mkdir((options_.dir + "/logs").c_str(), 0755);
}

absl::StatusOr<ServerProcess> LocalCluster::StartCoordinatorProcess(
    const std::string& name, const std::string& listen) {
  std::vector<std::string> argv = {options_.bin_dir + "/sluice-coordinator",
                                   "--listen=" + listen};
  argv.insert(argv.end(), journal_flags_.begin(), journal_flags_.end());
  argv.insert(argv.end(), options_.coordinator_flags.begin(),
              options_.coordinator_flags.end());
  argv.insert(argv.end(), coordinator_extra_.begin(), coordinator_extra_.end());
  return StartServer(argv, absl::StrCat(options_.dir, "/", name, ".ports"),
                     absl::StrCat(options_.dir, "/logs/", name, ".log"),
                     absl::Seconds(20), options_.unset_env);
}

absl::Status LocalCluster::StartCoordinator(
    const std::vector<std::string>& extra) {
  coordinator_extra_ = extra;
  journal_flags_ = {"--journal_dir=" + options_.dir + "/journal"};
  if (options_.ha) {
    ASSIGN_OR_RETURN(const std::string endpoint,
                     StartEtcd(options_.dir, &etcd_));
    journal_flags_ = {absl::StrCat("--journal=etcd://", endpoint, "/sluice")};
  }
  ASSIGN_OR_RETURN(coordinator_,
                   StartCoordinatorProcess("coordinator", options_.listen));
  address_ = coordinator_.grpc_address;
  // With `ha` it listens at once, as a standby, and is ready once it leads.
  if (absl::Status ready =
          WaitForReadiness(coordinator_.grpc_address, coordinator_.process,
                           absl::Seconds(30), options_.credentials);
      !ready.ok()) {
    return WithLastLogLine(ready, coordinator_.log_path);
  }
  if (options_.ha) {
    // The standby listens too (readiness NOT_SERVING, UNAVAILABLE naming
    // the leader); clients are given both addresses.
    ASSIGN_OR_RETURN(standby_,
                     StartCoordinatorProcess("coordinator-standby",
                                             JoinHostPort(options_.host, 0)));
    address_ = coordinator_.grpc_address + "," + standby_.grpc_address;
  }
  return absl::OkStatus();
}

void LocalCluster::KillCoordinator() { coordinator_.process.Kill(); }

absl::Status LocalCluster::RestartCoordinator(
    const std::vector<std::string>& extra) {
  coordinator_extra_ = extra;
  return RestartCoordinator();
}

absl::Status LocalCluster::RestartCoordinator() {
  KillCoordinator();
  ASSIGN_OR_RETURN(coordinator_, StartCoordinatorProcess(
                                     "coordinator", coordinator_.grpc_address));
  if (absl::Status ready =
          WaitForReadiness(coordinator_.grpc_address, coordinator_.process,
                           absl::Seconds(30), options_.credentials);
      !ready.ok()) {
    return WithLastLogLine(ready, coordinator_.log_path);
  }
  return absl::OkStatus();
}

absl::Status LocalCluster::AddDataServer(
    const std::vector<std::string>& extra) {
  const int i = next_data_index_++;
  std::vector<std::string> argv = {
      options_.bin_dir + "/sluice-dataserver",
      "--listen=" + JoinHostPort(options_.host, 0),
      "--roots=" + options_.shards_dir,
      absl::StrCat("--cache_dir=", options_.dir, "/cache-", i),
      "--coordinator=" + address_};
  argv.insert(argv.end(), options_.data_server_flags.begin(),
              options_.data_server_flags.end());
  argv.insert(argv.end(), extra.begin(), extra.end());
  ASSIGN_OR_RETURN(
      ServerProcess server,
      StartServer(argv, absl::StrCat(options_.dir, "/dataserver-", i, ".ports"),
                  absl::StrCat(options_.dir, "/logs/dataserver-", i, ".log"),
                  absl::Seconds(20), options_.unset_env));
  data_.push_back(std::move(server));
  return absl::OkStatus();
}

absl::Status LocalCluster::StartDataServers(
    int n, const std::vector<std::string>& extra) {
  for (int i = 0; i < n; ++i) RETURN_IF_ERROR(AddDataServer(extra));
  // Until every data server has registered, grants would name none: ask
  // the (leading) coordinator which are live.
  auto stub = v1::Coordinator::NewStub(grpc::CreateChannel(
      coordinator_.grpc_address, options_.credentials != nullptr
                                     ? options_.credentials
                                     : grpc::InsecureChannelCredentials()));
  const int want = static_cast<int>(data_.size());
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  int live = 0;
  while (absl::Now() < deadline) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
    v1::ListJobsResponse listed;
    if (stub->ListJobs(&ctx, v1::ListJobsRequest(), &listed).ok()) {
      live = listed.live_data_servers_size();
      if (live >= want) return absl::OkStatus();
    }
    absl::SleepFor(absl::Milliseconds(50));  // poll
  }
  return absl::DeadlineExceededError(
      absl::StrCat("the coordinator counts ", live, " live data servers of ",
                   want, " after 30 s (logs in ", options_.dir, "/logs)"));
}

absl::Status LocalCluster::RestartDataServer(size_t i) {
  if (i >= data_.size()) {
    return absl::OutOfRangeError(
        absl::StrCat("no data server ", i, " of ", data_.size()));
  }
  ServerProcess& server = data_[i];
  server.process.Stop(absl::Seconds(15));
  const std::string port_file = server.port_file, log = server.log_path;
  const std::vector<std::string> unset_env = server.unset_env;
  ASSIGN_OR_RETURN(server, StartServer(server.argv, port_file, log,
                                       absl::Seconds(20), unset_env));
  return absl::OkStatus();
}

std::string LocalCluster::DrainDataServer() {
  ServerProcess& newest = data_.back();
  newest.process.Signal(SIGTERM);
  std::string address = newest.grpc_address;
  leaving_.push_back(std::move(newest));
  data_.pop_back();
  return address;
}

void LocalCluster::Reap() {
  for (auto it = leaving_.begin(); it != leaving_.end();) {
    it = it->process.Poll().has_value() ? leaving_.erase(it) : it + 1;
  }
}

void LocalCluster::Stop() {
  for (ServerProcess& s : leaving_) s.process.Stop(absl::Seconds(15));
  for (ServerProcess& s : data_) s.process.Stop(absl::Seconds(15));
  standby_.process.Stop(absl::Seconds(15));
  coordinator_.process.Stop(absl::Seconds(15));
  etcd_.Stop(absl::Seconds(15));
}

}  // namespace sluice::cli
