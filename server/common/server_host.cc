#include "server/common/server_host.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <netdb.h>
#include <prometheus/gauge.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "server/common/logging.h"
#include "server/common/malloc_tuning.h"
#include "server/common/status_macros.h"
#include "server/common/tls_files.h"

ABSL_FLAG(std::string, listen, "",
          "gRPC listen address HOST:PORT; port 0 picks a free port (see "
          "--port_file). Default: 0.0.0.0:7070 for the coordinator, "
          "0.0.0.0:7071 for the data server.");
ABSL_FLAG(std::string, port_file, "",
          "If set, write the bound addresses here once listening, as lines "
          "\"grpc=HOST:PORT\" and \"metrics=HOST:PORT\" (written atomically).");
ABSL_FLAG(std::string, metrics_listen, "",
          "Prometheus /metrics listen address HOST:PORT (port 0 allowed); "
          "\"off\" disables it. Default: 0.0.0.0:9070 for the coordinator, "
          "0.0.0.0:9071 for the data server.");
ABSL_FLAG(std::string, health_listen, "",
          "If set, a second, plaintext listener HOST:PORT serving only gRPC "
          "health (grpc.health.v1: \"\" and \"readiness\"), for probes that "
          "cannot speak TLS, such as Kubernetes' gRPC probes. The port file "
          "gets a \"health=HOST:PORT\" line.");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate chain for TLS on the gRPC listener (needs "
          "--tls_key). Unset: plaintext.");
ABSL_FLAG(std::string, tls_key, "", "PEM private key for --tls_cert.");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM CA bundle; when set, clients must present a certificate "
          "signed by it (mutual TLS). Needs --tls_cert.");
ABSL_FLAG(bool, tune_malloc, true,
          "Keep up to 64 MiB of freed memory per malloc arena instead of "
          "handing it back to the kernel after every megabyte buffer (see "
          "server/common/malloc_tuning.h: the page faults cost 25-35 % of "
          "streaming throughput). false keeps glibc's defaults.");
ABSL_FLAG(absl::Duration, drain_timeout, absl::Seconds(10),
          "On SIGTERM/SIGINT, how long live calls may take to finish before "
          "they are cancelled.");

namespace sluice {
namespace {

constexpr char kReadinessService[] = "readiness";

}  // namespace

std::string HostPort::ToString() const {
  if (absl::StrContains(host, ':')) return absl::StrCat("[", host, "]:", port);
  return absl::StrCat(host, ":", port);
}

absl::StatusOr<HostPort> ParseHostPort(absl::string_view text,
                                       absl::string_view flag) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid ", flag, "=", text, ": ", why,
                     " (expected HOST:PORT, e.g. 127.0.0.1:0 or [::1]:7070)"));
  };
  HostPort result;
  absl::string_view port_text;
  if (absl::StartsWith(text, "[")) {
    const size_t close = text.find(']');
    if (close == absl::string_view::npos || close + 1 >= text.size() ||
        text[close + 1] != ':') {
      return bad("malformed IPv6 address");
    }
    result.host = std::string(text.substr(1, close - 1));
    port_text = text.substr(close + 2);
  } else {
    const size_t colon = text.rfind(':');
    if (colon == absl::string_view::npos) return bad("no port");
    result.host = std::string(text.substr(0, colon));
    if (absl::StrContains(result.host, ':')) {
      return bad("IPv6 hosts need brackets");
    }
    port_text = text.substr(colon + 1);
  }
  if (result.host.empty()) result.host = "0.0.0.0";
  if (!absl::SimpleAtoi(port_text, &result.port) || result.port < 0 ||
      result.port > 65535) {
    return bad("port must be a number from 0 to 65535");
  }
  return result;
}

absl::StatusOr<ServerConfig> ServerConfigFromFlags(
    absl::string_view program, absl::string_view default_listen,
    absl::string_view default_metrics_listen) {
  ServerConfig config;
  config.program = std::string(program);
  std::string listen = absl::GetFlag(FLAGS_listen);
  if (listen.empty()) listen = std::string(default_listen);
  ASSIGN_OR_RETURN(config.listen, ParseHostPort(listen, "--listen"));

  std::string metrics = absl::GetFlag(FLAGS_metrics_listen);
  if (metrics.empty()) metrics = std::string(default_metrics_listen);
  if (metrics != "off") {
    ASSIGN_OR_RETURN(HostPort metrics_hp,
                     ParseHostPort(metrics, "--metrics_listen"));
    config.metrics_listen = metrics_hp.ToString();
  }
  const std::string health = absl::GetFlag(FLAGS_health_listen);
  if (!health.empty()) {
    ASSIGN_OR_RETURN(HostPort health_hp,
                     ParseHostPort(health, "--health_listen"));
    config.health_listen = health_hp.ToString();
  }
  config.port_file = absl::GetFlag(FLAGS_port_file);
  config.tls.cert_file = absl::GetFlag(FLAGS_tls_cert);
  config.tls.key_file = absl::GetFlag(FLAGS_tls_key);
  config.tls.client_ca_file = absl::GetFlag(FLAGS_tls_client_ca);
  if (config.tls.cert_file.empty() != config.tls.key_file.empty()) {
    return absl::InvalidArgumentError(
        "--tls_cert and --tls_key must be given together");
  }
  if (!config.tls.client_ca_file.empty() && config.tls.cert_file.empty()) {
    return absl::InvalidArgumentError(
        "--tls_client_ca (mutual TLS) needs --tls_cert and --tls_key");
  }
  config.drain_timeout = absl::GetFlag(FLAGS_drain_timeout);
  if (config.drain_timeout < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--drain_timeout must not be negative");
  }
  return config;
}

void BlockTerminationSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

std::vector<char*> ParseServerFlags(int argc, char** argv,
                                    absl::string_view program,
                                    absl::string_view usage) {
  SetLogProgramName(program);
  absl::FlagsUsageConfig usage_config;
  // --help lists Sluice's own flags (those defined under server/ and
  // client/), not Abseil's internal ones; --helpfull lists everything.
  usage_config.contains_help_flags = [](absl::string_view file) {
    return absl::StrContains(file, "server/") ||
           absl::StrContains(file, "client/");
  };
  usage_config.contains_helpshort_flags = usage_config.contains_help_flags;
  usage_config.version_string = [] { return std::string("sluice 0.1.0\n"); };
  // Repository-relative file names in --helpfull, not this build's paths.
  usage_config.normalize_filename = [](absl::string_view file) {
    for (absl::string_view root : {"server/", "client/", "absl/"}) {
      const size_t at = file.find(root);
      if (at != absl::string_view::npos) return std::string(file.substr(at));
    }
    return std::string(file);
  };
  absl::SetFlagsUsageConfig(usage_config);
  absl::SetProgramUsageMessage(usage);
  // An unknown flag is a bad command line: exit 2 naming it (Abseil's parser
  // would exit 1).
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (arg == "--") break;
    if (!absl::ConsumePrefix(&arg, "--") && !absl::ConsumePrefix(&arg, "-")) {
      continue;
    }
    const absl::string_view name = arg.substr(0, arg.find('='));
    if (name.empty() || absl::FindCommandLineFlag(name) != nullptr) continue;
    // Abseil's own (--help, --helpfull, --version, --flagfile ...), which
    // the flag registry does not list.
    static constexpr absl::string_view kAbseilFlags[] = {
        "help",     "helpfull",  "helpshort",  "helppackage",
        "helpon",   "helpmatch", "version",    "only_check_args",
        "flagfile", "fromenv",   "tryfromenv", "undefok"};
    if (std::find(std::begin(kAbseilFlags), std::end(kAbseilFlags), name) !=
        std::end(kAbseilFlags)) {
      continue;
    }
    // --noFLAG for a boolean flag.
    if (absl::StartsWith(name, "no")) {
      const absl::CommandLineFlag* flag =
          absl::FindCommandLineFlag(name.substr(2));
      if (flag != nullptr && flag->IsOfType<bool>()) continue;
    }
    std::fprintf(stderr, "%s: unknown flag --%s (%s --help lists them)\n",
                 std::string(program).c_str(), std::string(name).c_str(),
                 std::string(program).c_str());
    std::exit(2);
  }
  return absl::ParseCommandLine(argc, argv);
}

absl::StatusOr<std::unique_ptr<ServerHost>> ServerHost::Start(
    const ServerConfig& config, const std::vector<grpc::Service*>& services,
    std::shared_ptr<prometheus::Registry> registry) {
  std::unique_ptr<ServerHost> host(new ServerHost());
  host->config_ = config;

  std::shared_ptr<grpc::ServerCredentials> creds;
  if (config.tls.enabled()) {
    grpc::SslServerCredentialsOptions options;
    grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
    ASSIGN_OR_RETURN(pair.cert_chain,
                     ReadPemFile(config.tls.cert_file, "--tls_cert"));
    ASSIGN_OR_RETURN(pair.private_key,
                     ReadPemFile(config.tls.key_file, "--tls_key"));
    options.pem_key_cert_pairs.push_back(std::move(pair));
    if (!config.tls.client_ca_file.empty()) {
      ASSIGN_OR_RETURN(
          options.pem_root_certs,
          ReadPemFile(config.tls.client_ca_file, "--tls_client_ca"));
      options.client_certificate_request =
          GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
    }
    creds = grpc::SslServerCredentials(options);
  } else {
    creds = grpc::InsecureServerCredentials();
  }

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(config.listen.ToString(), creds, &host->grpc_port_);
  // Long-lived streams (sessions, registrations) must notice dead peers and
  // survive idle NATs/load balancers. Clients ping every 2 s
  // (SetStreamKeepalive, grpc_target.h) to notice a stopped server: accept
  // pings that often, and never close a connection for pinging.
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 20000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 10000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(
      GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 1000);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  // Inline manifests of large datasets arrive in one CreateJob.
  builder.SetMaxReceiveMessageSize(256 << 20);
  // gRPC sets SO_REUSEPORT by default: a second server on the same port would
  // silently share it. A busy port must be an error.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  for (grpc::Service* service : services) builder.RegisterService(service);
  std::vector<
      std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
      interceptors;
  interceptors.push_back(host->live_calls_.InterceptorFactory());
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  host->server_ = builder.BuildAndStart();
  if (host->server_ == nullptr || host->grpc_port_ == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on --listen=", config.listen.ToString(),
                     " (address in use, or not an address of this host?)"));
  }
  if (!config.health_listen.empty()) {
    // Its own server: the default health service is per server, and only
    // health is registered here (SetReady updates both).
    grpc::ServerBuilder health_builder;
    health_builder.AddListeningPort(config.health_listen,
                                    grpc::InsecureServerCredentials(),
                                    &host->health_port_);
    health_builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
    host->health_server_ = health_builder.BuildAndStart();
    if (host->health_server_ == nullptr || host->health_port_ == 0) {
      return absl::UnavailableError(absl::StrCat(
          "cannot listen on --health_listen=", config.health_listen,
          " (address in use?)"));
    }
  }
  host->SetReady(false);

  if (!config.metrics_listen.empty()) {
    try {
      host->exposer_ =
          std::make_unique<prometheus::Exposer>(config.metrics_listen);
    } catch (const std::exception& e) {
      return absl::UnavailableError(absl::StrCat(
          "cannot listen on --metrics_listen=", config.metrics_listen, ": ",
          e.what()));
    }
    host->exposer_->RegisterCollectable(registry);
    const std::vector<int> ports = host->exposer_->GetListeningPorts();
    host->metrics_port_ = ports.empty() ? 0 : ports.front();
  }
  RETURN_IF_ERROR(host->WritePortFile());
  LogInfo(
      "listening on %s:%d (%s)%s%s", config.listen.host, host->grpc_port_,
      config.tls.enabled()
          ? (config.tls.client_ca_file.empty() ? "TLS" : "mutual TLS")
          : "plaintext",
      host->exposer_
          ? absl::StrFormat(", metrics on port %d", host->metrics_port_)
          : std::string(),
      host->health_server_
          ? absl::StrFormat(", plaintext health on port %d", host->health_port_)
          : std::string());
  return host;
}

absl::Status ServerHost::WritePortFile() const {
  if (config_.port_file.empty()) return absl::OkStatus();
  HostPort grpc_addr{config_.listen.host, grpc_port_};
  std::string text = absl::StrCat("grpc=", grpc_addr.ToString(), "\n");
  if (exposer_) {
    HostPort metrics_addr = *ParseHostPort(config_.metrics_listen, "");
    metrics_addr.port = metrics_port_;
    absl::StrAppend(&text, "metrics=", metrics_addr.ToString(), "\n");
  }
  if (health_server_) {
    HostPort health_addr = *ParseHostPort(config_.health_listen, "");
    health_addr.port = health_port_;
    absl::StrAppend(&text, "health=", health_addr.ToString(), "\n");
  }
  // Temp file + rename: a reader polling for the file never sees half of it.
  const std::string tmp = absl::StrCat(config_.port_file, ".tmp.", getpid());
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << text;
    if (!out.flush()) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot write --port_file=", config_.port_file));
    }
  }
  if (std::rename(tmp.c_str(), config_.port_file.c_str()) != 0) {
    std::remove(tmp.c_str());
    return absl::InvalidArgumentError(
        absl::StrCat("cannot write --port_file=", config_.port_file));
  }
  return absl::OkStatus();
}

ServerHost::~ServerHost() { Shutdown(); }

void ServerHost::SetReady(bool ready) {
  if (server_ == nullptr) return;
  for (grpc::Server* server : {server_.get(), health_server_.get()}) {
    if (server == nullptr) continue;
    grpc::HealthCheckServiceInterface* health = server->GetHealthCheckService();
    if (health != nullptr) health->SetServingStatus(kReadinessService, ready);
  }
}

void ServerHost::RunUntilSignal(
    const std::function<void(absl::Duration)>& on_drain) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  int signal_number = 0;
  while (sigwait(&set, &signal_number) != 0) {
  }
  LogInfo("received %s; draining (up to %s)", strsignal(signal_number),
          absl::FormatDuration(config_.drain_timeout));
  SetReady(false);
  const absl::Time deadline = absl::Now() + config_.drain_timeout;
  if (on_drain) on_drain(config_.drain_timeout);
  Shutdown(deadline);
  LogInfo("stopped");
}

void ServerHost::Shutdown() { Shutdown(absl::Now() + config_.drain_timeout); }

void ServerHost::Shutdown(absl::Time deadline) {
  if (shut_down_ || server_ == nullptr) return;
  shut_down_ = true;
  SetReady(false);
  // Health watchers see NOT_SERVING for everything from here on.
  if (auto* health = server_->GetHealthCheckService()) health->Shutdown();
  std::thread closer([this, deadline] { CloseConnectionsOnceIdle(deadline); });
  server_->Shutdown(absl::ToChronoTime(deadline));
  server_->Wait();
  live_calls_.Stop();
  closer.join();
  if (health_server_) {
    if (auto* health = health_server_->GetHealthCheckService()) {
      health->Shutdown();
    }
    health_server_->Shutdown(absl::ToChronoTime(absl::Now()));
    health_server_->Wait();
  }
  StopExposer();
}

void ServerHost::CloseConnectionsOnceIdle(absl::Time deadline) {
  // gRPC's shutdown also waits for every client connection to close after
  // its GOAWAY, which an idle client reads only when it next polls (and one
  // that never reads, not before the deadline). Once no call is live there
  // is nothing left to drain: close them. Again every 100 ms, for a
  // connection opened just before gRPC stopped accepting them.
  while (live_calls_.AwaitNoneLive(deadline) && !live_calls_.stopped()) {
    grpc_server_cancel_all_calls(server_->c_server());
    if (live_calls_.AwaitStopped(
            std::min(deadline, absl::Now() + absl::Milliseconds(100)))) {
      return;
    }
  }
}

namespace {
// Opens and closes a TCP connection to host:port (errors ignored).
void Poke(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) !=
      0) {
    return;
  }
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (fd < 0) continue;
    const bool connected = connect(fd, a->ai_addr, a->ai_addrlen) == 0;
    close(fd);
    if (connected) break;
  }
  freeaddrinfo(found);
}
}  // namespace

void ServerHost::StopExposer() {
  if (!exposer_) return;
  // civetweb's listening thread polls its sockets with a 2 s timeout and
  // sees a stop only when a poll returns, so stopping the metrics endpoint
  // took up to 2 s: a connection while it stops ends that wait.
  absl::StatusOr<HostPort> listen = ParseHostPort(config_.metrics_listen, "");
  std::string host = listen.ok() ? listen->host : "";
  if (host.empty() || host == "0.0.0.0") host = "127.0.0.1";
  if (host == "::" || host == "[::]") host = "::1";
  const std::vector<int> ports = exposer_->GetListeningPorts();
  std::atomic<bool> stopped{false};
  std::thread poke([&] {
    while (!stopped.load()) {
      for (int port : ports) Poke(host, port);
      absl::SleepFor(absl::Milliseconds(20));
    }
  });
  exposer_.reset();
  stopped = true;
  poke.join();
}

int RunServerMain(int argc, char** argv, const ServerMainOptions& options) {
  // Abseil's mutex deadlock detection keeps a lock graph updated on every
  // acquisition (measured: ~2 % of the coordinator's CPU under load). The
  // tests' lock-order checking comes from the unit tests (and TSan);
  // SLUICE_MUTEX_DEADLOCK_DETECTION=1 turns it back on in a server.
  const char* detect = std::getenv("SLUICE_MUTEX_DEADLOCK_DETECTION");
  if (detect == nullptr || std::string(detect) != "1") {
    absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  }
  BlockTerminationSignals();
  ParseServerFlags(argc, argv, options.program, options.usage);
  if (!GlibcMallocInUse()) {
    LogInfo("malloc: %s (--tune_malloc applies to glibc's malloc only)",
            MallocProvider());
  } else if (absl::GetFlag(FLAGS_tune_malloc) && !TuneMallocForStreaming()) {
    LogWarning(
        "--tune_malloc: glibc's malloc refused the mallopt settings; running "
        "with its "
        "defaults");
  }
  absl::StatusOr<ServerConfig> config = ServerConfigFromFlags(
      options.program, options.default_listen, options.default_metrics_listen);
  if (!config.ok()) {
    LogError("%s", config.status().message());
    return 2;
  }
  auto registry = std::make_shared<prometheus::Registry>();
  prometheus::BuildGauge()
      .Name("sluice_build_info")
      .Help("Always 1; labels say which Sluice program and version this is.")
      .Register(*registry)
      .Add({{"program", options.program}, {"version", "0.1.0"}})
      .Set(1);
  absl::StatusOr<std::unique_ptr<ServiceSet>> services =
      options.make_services(registry);
  if (!services.ok()) {
    LogError("%s", services.status().message());
    return services.status().code() == absl::StatusCode::kInvalidArgument ? 2
                                                                          : 1;
  }
  absl::StatusOr<std::unique_ptr<ServerHost>> host =
      ServerHost::Start(*config, (*services)->services(), registry);
  if (!host.ok()) {
    LogError("%s", host.status().message());
    return 1;
  }
  ServerHost* started_host = host->get();
  (*services)->SetReadinessHook(
      [started_host](bool ready) { started_host->SetReady(ready); });
  absl::Status started =
      (*services)->Started(HostPort{config->listen.host, (*host)->grpc_port()});
  if (!started.ok()) {
    LogError("%s", started.message());
    (*host)->Shutdown();
    return started.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  if ((*services)->ReadyWhenStarted()) (*host)->SetReady(true);
  (*host)->RunUntilSignal(
      [&](absl::Duration timeout) { (*services)->Drain(timeout); });
  return 0;
}

}  // namespace sluice
