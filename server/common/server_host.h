// Server bootstrap shared by sluice-coordinator and sluice-dataserver.
//
// Owns the gRPC server and the Prometheus endpoint:
//   * listens on --listen (port 0 picks a free port) and writes the bound
//     addresses to --port_file (atomically, as "grpc=HOST:PORT" and
//     "metrics=HOST:PORT" lines) so scripts and tests can read them back;
//   * gRPC health (grpc.health.v1) with a "readiness" service that is
//     NOT_SERVING until SetReady(true) and again while draining;
//   * server reflection; keepalive suited to long-lived streams;
//   * TLS / mutual TLS when --tls_cert/--tls_key (and --tls_client_ca) are set;
//   * Prometheus /metrics on --metrics_listen;
//   * optionally, a plaintext listener serving only gRPC health
//     (--health_listen), for probes that cannot speak TLS (Kubernetes' gRPC
//     probes) when the main listener is TLS;
//   * on SIGTERM/SIGINT: readiness NOT_SERVING, the services' drain hooks,
//     gRPC shutdown with a deadline (--drain_timeout); the client
//     connections are closed as soon as no call is left.
//
// Typical main():
//   BlockTerminationSignals();                 // before any thread starts
//   ASSIGN_OR_RETURN(auto config, ServerConfigFromFlags(kDefaultListen, ...));
//   ASSIGN_OR_RETURN(auto host, ServerHost::Start(config, {&service},
//   registry)); host->SetReady(true); host->RunUntilSignal([&] {
//   service.Drain(); });
//
// Thread-safety: SetReady and Shutdown may be called from any thread.
#ifndef SLUICE_SERVER_COMMON_SERVER_HOST_H_
#define SLUICE_SERVER_COMMON_SERVER_HOST_H_

#include <grpcpp/grpcpp.h>
#include <prometheus/exposer.h>
#include <prometheus/registry.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "server/common/live_calls.h"

namespace sluice {

struct HostPort {
  std::string host;
  int port = 0;
  std::string ToString() const;
};

// Parses "HOST:PORT", "[v6]:PORT" or ":PORT" (host defaults to 0.0.0.0).
// `flag` names the flag in the error, e.g. "--listen".
absl::StatusOr<HostPort> ParseHostPort(absl::string_view text,
                                       absl::string_view flag);

struct TlsConfig {
  std::string cert_file;       // PEM server certificate chain
  std::string key_file;        // PEM private key
  std::string client_ca_file;  // PEM CA; set = mutual TLS required
  bool enabled() const { return !cert_file.empty(); }
};

struct ServerConfig {
  std::string program;  // e.g. "sluice-coordinator"
  HostPort listen;
  std::string port_file;
  std::string metrics_listen;  // empty = no metrics endpoint
  std::string health_listen;   // empty = no separate health listener
  TlsConfig tls;
  absl::Duration drain_timeout = absl::Seconds(10);
};

// Builds a ServerConfig from the shared flags (--listen, --port_file,
// --metrics_listen, --health_listen, --tls_*, --drain_timeout), using the given
// defaults when --listen / --metrics_listen are not set. Errors name the flag.
absl::StatusOr<ServerConfig> ServerConfigFromFlags(
    absl::string_view program, absl::string_view default_listen,
    absl::string_view default_metrics_listen);

// Blocks SIGTERM and SIGINT in the calling thread and every thread it starts
// later, so that RunUntilSignal can wait for them synchronously. Call first
// thing in main().
void BlockTerminationSignals();

// Parses flags with Sluice's usage settings (--help lists the server flags
// too) and sets the log program name. Returns the positional arguments.
std::vector<char*> ParseServerFlags(int argc, char** argv,
                                    absl::string_view program,
                                    absl::string_view usage);

class ServerHost {
 public:
  // Starts the gRPC server with `services` and, when configured, the metrics
  // endpoint serving `registry`. Readiness starts NOT_SERVING.
  static absl::StatusOr<std::unique_ptr<ServerHost>> Start(
      const ServerConfig& config, const std::vector<grpc::Service*>& services,
      std::shared_ptr<prometheus::Registry> registry);

  ~ServerHost();

  // Marks the "readiness" health service SERVING (true) or NOT_SERVING.
  void SetReady(bool ready);

  // Blocks until SIGTERM or SIGINT, then drains: readiness NOT_SERVING,
  // `on_drain` (ends long-lived streams, given the drain timeout), Shutdown
  // with what is left of the drain timeout. Returns when the gRPC server has
  // stopped.
  void RunUntilSignal(const std::function<void(absl::Duration)>& on_drain);

  // Stops accepting calls and waits for live calls up to the drain timeout
  // (or `deadline`), then cancels the rest. Idempotent.
  void Shutdown();
  void Shutdown(absl::Time deadline);

  int grpc_port() const { return grpc_port_; }
  int metrics_port() const { return metrics_port_; }
  int health_port() const { return health_port_; }
  grpc::Server* server() { return server_.get(); }

 private:
  ServerHost() = default;
  absl::Status WritePortFile() const;
  // Stops the metrics endpoint (prometheus-cpp's Exposer, on civetweb).
  void StopExposer();
  // Runs while the gRPC server shuts down: closes its client connections
  // once no call is live (see live_calls.h), until Shutdown returns.
  void CloseConnectionsOnceIdle(absl::Time deadline);

  ServerConfig config_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<grpc::Server> health_server_;  // --health_listen
  std::unique_ptr<prometheus::Exposer> exposer_;
  int grpc_port_ = 0;
  int metrics_port_ = 0;
  int health_port_ = 0;
  bool shut_down_ = false;
  LiveCalls live_calls_;  // of server_
};

// What a server binary plugs into RunServerMain: its services, and how to
// end their long-lived streams when draining.
class ServiceSet {
 public:
  virtual ~ServiceSet() = default;
  virtual std::vector<grpc::Service*> services() = 0;
  // Called once on SIGTERM/SIGINT before gRPC shutdown, with the drain
  // timeout (--drain_timeout) it may take; ends streams that would otherwise
  // run until the drain deadline, when gRPC cancels what is left.
  virtual void Drain(absl::Duration timeout) { (void)timeout; }
  // Called once the server listens, before it is marked ready, with the
  // address it bound (the real port when --listen asked for port 0).
  virtual absl::Status Started(const HostPort& bound) {
    (void)bound;
    return absl::OkStatus();
  }
  // False: the server is not marked ready after Started; the set marks it
  // itself, through set_ready(), when it is (a standby coordinator, once it
  // leads).
  virtual bool ReadyWhenStarted() const { return true; }

  // Given by RunServerMain before Started: marks readiness (thread-safe).
  void SetReadinessHook(std::function<void(bool)> hook) {
    set_ready_ = std::move(hook);
  }

 protected:
  void set_ready(bool ready) const {
    if (set_ready_) set_ready_(ready);
  }

 private:
  std::function<void(bool)> set_ready_;
};

struct ServerMainOptions {
  std::string program;  // "sluice-coordinator"
  std::string usage;    // first lines of --help
  std::string default_listen;
  std::string default_metrics_listen;
  // Builds the services once flags are parsed; metrics go into `registry`.
  std::function<absl::StatusOr<std::unique_ptr<ServiceSet>>(
      std::shared_ptr<prometheus::Registry> registry)>
      make_services;
};

// The whole main() of a Sluice server: blocks termination signals, parses
// flags, builds the services, starts the host, marks it ready and runs until
// SIGTERM/SIGINT. Returns the process exit code: 0 after a clean drain, 2 for
// a bad flag, 1 when the server cannot start.
int RunServerMain(int argc, char** argv, const ServerMainOptions& options);

}  // namespace sluice

#endif  // SLUICE_SERVER_COMMON_SERVER_HOST_H_
