#include "client/python/core/local_cluster_bindings.h"

#include <grpcpp/security/credentials.h>
#include <pybind11/stl.h>

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "client/cli/local_cluster.h"
#include "server/common/tls_files.h"

namespace sluice {
namespace {

namespace py = pybind11;
using cli::LocalCluster;
using cli::LocalClusterOptions;
using cli::ServerProcess;

void Check(const absl::Status& status) {
  if (status.ok()) return;
  if (status.code() == absl::StatusCode::kDeadlineExceeded) {
    PyErr_SetString(PyExc_TimeoutError, status.ToString().c_str());
    throw py::error_already_set();
  }
  if (status.code() == absl::StatusCode::kOutOfRange) {
    throw py::index_error(status.ToString());
  }
  throw std::runtime_error(status.ToString());
}

absl::Duration Seconds(std::optional<double> seconds) {
  return seconds.has_value() ? absl::Seconds(*seconds)
                             : absl::InfiniteDuration();
}

// A server started alone, or one of a cluster's: the cluster's are looked
// up at every call (a handle outlives a restart, and adding or draining
// data servers moves them), so a handle never points at a server that
// moved. A handle of a drained data server raises IndexError.
class PyServer {
 public:
  enum class Role { kCoordinator, kStandby, kDataServer };

  explicit PyServer(ServerProcess server)
      : alone_(std::make_shared<ServerProcess>(std::move(server))) {}
  PyServer(std::shared_ptr<LocalCluster> cluster, Role role, size_t index)
      : cluster_(std::move(cluster)), role_(role), index_(index) {}

  ServerProcess& get() const {
    if (alone_ != nullptr) return *alone_;
    switch (role_) {
      case Role::kCoordinator:
        return cluster_->coordinator();
      case Role::kStandby:
        return cluster_->standby();
      case Role::kDataServer:
        break;
    }
    if (index_ >= cluster_->data_servers().size()) {
      throw py::index_error("the cluster has no data server " +
                            std::to_string(index_));
    }
    return cluster_->data_servers()[index_];
  }

 private:
  std::shared_ptr<ServerProcess> alone_;
  std::shared_ptr<LocalCluster> cluster_;
  Role role_ = Role::kCoordinator;
  size_t index_ = 0;
};

// The environment variables `import sluice` set for this process's gRPC
// (sluice/__init__.py): the servers started here do not inherit them, as
// servers started any other way would not have them.
std::vector<std::string> SetBySluice() {
  return py::module_::import("sluice")
      .attr("_GRPC_ENV_SET_BY_SLUICE")
      .cast<std::vector<std::string>>();
}

std::shared_ptr<LocalCluster> MakeCluster(
    const std::string& dir, const std::string& bin_dir,
    const std::string& shards_dir,
    const std::vector<std::string>& coordinator_flags,
    const std::vector<std::string>& data_server_flags, bool ha,
    const std::string& ca_cert, const std::string& client_cert,
    const std::string& client_key) {
  LocalClusterOptions options;
  options.dir = dir;
  options.bin_dir = bin_dir;
  options.shards_dir = shards_dir;
  options.coordinator_flags = coordinator_flags;
  options.data_server_flags = data_server_flags;
  options.ha = ha;
  options.unset_env = SetBySluice();
  if (!ca_cert.empty()) {
    ClientTlsFiles files;
    files.ca = ca_cert, files.cert = client_cert, files.key = client_key;
    files.ca_flag = "ca_cert", files.cert_flag = "client_cert";
    files.key_flag = "client_key";
    absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
        ClientCredentialsFromFiles(files);
    Check(credentials.status());
    options.credentials = *std::move(credentials);
  }
  return std::make_shared<LocalCluster>(std::move(options));
}

}  // namespace

void BindLocalCluster(py::module_& m, void (*note_grpc_use)()) {
  py::class_<PyServer>(m, "ServerProcess",
                       "A server process: its PID, addresses and log.")
      .def_property_readonly(
          "pid", [](const PyServer& s) { return s.get().process.pid(); })
      .def_property_readonly(
          "address", [](const PyServer& s) { return s.get().grpc_address; })
      .def_property_readonly(
          "metrics", [](const PyServer& s) { return s.get().metrics_address; })
      .def_property_readonly("log_path",
                             [](const PyServer& s) { return s.get().log_path; })
      .def_property_readonly("argv",
                             [](const PyServer& s) { return s.get().argv; })
      .def(
          "signal",
          [](const PyServer& s, int signo) { s.get().process.Signal(signo); },
          py::arg("signo"), "Sends `signo` unless the process has exited.")
      .def(
          "poll", [](const PyServer& s) { return s.get().process.Poll(); },
          "The exit code once the process has exited, else None.")
      .def(
          "wait",
          [](const PyServer& s, std::optional<double> timeout) {
            ServerProcess& server = s.get();
            absl::StatusOr<int> code;
            {
              py::gil_scoped_release unlocked;
              code = server.process.Wait(Seconds(timeout));
            }
            Check(code.status());
            return *code;
          },
          py::arg("timeout") = py::none(),
          "The exit code (128+signal when killed); TimeoutError after "
          "`timeout` seconds.")
      .def(
          "stop",
          [](const PyServer& s, double grace) {
            ServerProcess& server = s.get();
            py::gil_scoped_release unlocked;
            server.process.Stop(absl::Seconds(grace));
          },
          py::arg("grace") = 15.0,
          "SIGTERM, then SIGKILL after `grace` seconds; waits for the exit.")
      .def(
          "kill",
          [](const PyServer& s) {
            ServerProcess& server = s.get();
            py::gil_scoped_release unlocked;
            server.process.Kill();
          },
          "SIGKILL and reap (a crash).");

  m.def(
      "start_server",
      [](const std::vector<std::string>& argv, const std::string& port_file,
         const std::string& log_path, double timeout) {
        absl::StatusOr<ServerProcess> server;
        const std::vector<std::string> unset_env = SetBySluice();
        {
          py::gil_scoped_release unlocked;
          server = cli::StartServer(argv, port_file, log_path,
                                    absl::Seconds(timeout), unset_env);
        }
        Check(server.status());
        return PyServer(*std::move(server));
      },
      py::arg("argv"), py::arg("port_file"), py::arg("log_path"),
      py::arg("timeout") = 20.0,
      "Starts a server binary (argv: its path and flags) with "
      "--metrics_listen=127.0.0.1:0 and --port_file put first, its output "
      "appended to log_path, and waits until it listens "
      "(client/cli/local_cluster.h: StartServer); without the environment "
      "variables `import sluice` set for its own gRPC.");

  using Role = PyServer::Role;
  py::class_<LocalCluster, std::shared_ptr<LocalCluster>>(
      m, "LocalCluster",
      "A local cluster of real server processes "
      "(client/cli/local_cluster.h); TLS: PEM paths its own checks use.")
      .def(py::init(&MakeCluster), py::arg("dir"), py::arg("bin_dir"),
           py::arg("shards_dir"),
           py::arg("coordinator_flags") = std::vector<std::string>{},
           py::arg("data_server_flags") = std::vector<std::string>{},
           py::arg("ha") = false, py::arg("ca_cert") = "",
           py::arg("client_cert") = "", py::arg("client_key") = "")
      .def(
          "start_coordinator",
          [note_grpc_use](LocalCluster& c,
                          const std::vector<std::string>& extra) {
            note_grpc_use();
            absl::Status started;
            {
              py::gil_scoped_release unlocked;
              started = c.StartCoordinator(extra);
            }
            Check(started);
          },
          py::arg("extra") = std::vector<std::string>{})
      .def(
          "restart_coordinator",
          [note_grpc_use](
              LocalCluster& c,
              const std::optional<std::vector<std::string>>& extra) {
            note_grpc_use();
            absl::Status restarted;
            {
              py::gil_scoped_release unlocked;
              restarted = extra.has_value() ? c.RestartCoordinator(*extra)
                                            : c.RestartCoordinator();
            }
            Check(restarted);
          },
          py::arg("extra") = py::none(),
          "Kills the coordinator unless it is down and starts it again on "
          "the same address and journal; `extra` replaces its extra flags.")
      .def(
          "start_data_servers",
          [note_grpc_use](LocalCluster& c, int n,
                          const std::vector<std::string>& extra) {
            note_grpc_use();
            absl::Status started;
            {
              py::gil_scoped_release unlocked;
              started = c.StartDataServers(n, extra);
            }
            Check(started);
          },
          py::arg("n"), py::arg("extra") = std::vector<std::string>{},
          "Starts n more data servers and waits until every one is live.")
      .def(
          "restart_data_server",
          [](LocalCluster& c, size_t i) {
            absl::Status restarted;
            {
              py::gil_scoped_release unlocked;
              restarted = c.RestartDataServer(i);
            }
            Check(restarted);
          },
          py::arg("index"))
      .def("stop",
           [](LocalCluster& c) {
             py::gil_scoped_release unlocked;
             c.Stop();
           })
      .def_property_readonly("coordinator_address",
                             &LocalCluster::coordinator_address)
      .def_property_readonly("coordinator",
                             [](std::shared_ptr<LocalCluster> c) {
                               return PyServer(std::move(c), Role::kCoordinator,
                                               0);
                             })
      .def_property_readonly("standby",
                             [](std::shared_ptr<LocalCluster> c) {
                               return PyServer(std::move(c), Role::kStandby, 0);
                             })
      .def_property_readonly(
          "data_servers", [](std::shared_ptr<LocalCluster> c) {
            std::vector<PyServer> servers;
            for (size_t i = 0; i < c->data_servers().size(); ++i) {
              servers.emplace_back(c, Role::kDataServer, i);
            }
            return servers;
          });
}

}  // namespace sluice
