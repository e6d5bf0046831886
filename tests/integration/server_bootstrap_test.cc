// Both real server binaries: ports read back from --port_file, health and
// readiness, reflection, /metrics, SIGTERM, bad flags, TLS and mutual TLS.
#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "grpc/health/v1/health.grpc.pb.h"
#include "grpc/reflection/v1alpha/reflection.grpc.pb.h"
#include "tests/testing/http.h"
#include "tests/testing/process.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/tls_fixture.h"

namespace sluice {
namespace {

using ::grpc::health::v1::Health;
using ::grpc::health::v1::HealthCheckRequest;
using ::grpc::health::v1::HealthCheckResponse;
using ::sluice::testing::ChildProcess;
using ::sluice::testing::ReadWholeFile;
using ::sluice::testing::ServerProcess;
using ::sluice::testing::TempDir;
using ::testing::Contains;
using ::testing::HasSubstr;

// Returns the health status, or the RPC's error code as a negative number.
int CheckHealth(const std::shared_ptr<grpc::Channel>& channel,
                const std::string& service) {
  auto stub = Health::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  HealthCheckRequest req;
  req.set_service(service);
  HealthCheckResponse resp;
  grpc::Status s = stub->Check(&ctx, req, &resp);
  if (!s.ok()) return -static_cast<int>(s.error_code());
  return resp.status();
}

std::vector<std::string> ListServices(
    const std::shared_ptr<grpc::Channel>& channel) {
  using namespace ::grpc::reflection::v1alpha;
  auto stub = ServerReflection::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  auto stream = stub->ServerReflectionInfo(&ctx);
  ServerReflectionRequest req;
  req.set_list_services("");
  std::vector<std::string> names;
  if (!stream->Write(req)) return names;
  stream->WritesDone();
  ServerReflectionResponse resp;
  while (stream->Read(&resp)) {
    for (const auto& s : resp.list_services_response().service())
      names.push_back(s.name());
  }
  stream->Finish().IgnoreError();
  return names;
}

struct BinaryCase {
  std::string binary;
  std::string service;
};

void PrintTo(const BinaryCase& c, std::ostream* os) { *os << c.binary; }

class ServerBootstrapTest : public ::testing::TestWithParam<BinaryCase> {};

TEST_P(ServerBootstrapTest, ServesHealthReflectionMetricsAndStopsOnSigterm) {
  TempDir dir;
  auto server = testing::StartServer(GetParam().binary, dir.path());
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_THAT(server->grpc_address, HasSubstr("127.0.0.1:"));
  EXPECT_NE(server->grpc_address, "127.0.0.1:0");

  auto channel = grpc::CreateChannel(server->grpc_address,
                                     grpc::InsecureChannelCredentials());
  EXPECT_EQ(CheckHealth(channel, ""), HealthCheckResponse::SERVING);
  EXPECT_EQ(CheckHealth(channel, "readiness"), HealthCheckResponse::SERVING);
  EXPECT_EQ(CheckHealth(channel, "no.such.Service"),
            -grpc::StatusCode::NOT_FOUND);

  const std::vector<std::string> services = ListServices(channel);
  EXPECT_THAT(services, Contains(GetParam().service));
  EXPECT_THAT(services, Contains("grpc.health.v1.Health"));
  EXPECT_THAT(services, Contains("grpc.reflection.v1alpha.ServerReflection"));

  auto metrics =
      testing::HttpGet("http://" + server->metrics_address + "/metrics");
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  EXPECT_EQ(metrics->code, 200);
  EXPECT_THAT(metrics->body, HasSubstr("sluice_build_info{program=\"" +
                                       GetParam().binary + "\""));

  server->process.Signal(SIGTERM);
  auto exit_code = server->process.Wait(absl::Seconds(15));
  ASSERT_TRUE(exit_code.ok()) << exit_code.status();
  EXPECT_EQ(*exit_code, 0);
  EXPECT_THAT(ReadWholeFile(server->log_path).value_or(""),
              HasSubstr("draining"));
}

// Opens a TCP connection to `address` (HOST:PORT), speaks the HTTP/2
// client preface and an empty SETTINGS frame, and reads the server's first
// frame header (so the server has set the connection up), then reads
// nothing more: a client that is not polling its connection. Returns the
// socket, or -1.
int OpenSilentHttp2Connection(const std::string& address) {
  const size_t colon = address.rfind(':');
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port =
      htons(static_cast<uint16_t>(std::stoi(address.substr(colon + 1))));
  if (inet_pton(AF_INET, address.substr(0, colon).c_str(), &to.sin_addr) != 1)
    return -1;
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  static constexpr char kPreface[] =
      "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
      "\0\0\0\x04\0\0\0\0\0";  // SETTINGS, length 0, stream 0
  char header[9];
  size_t got = 0;
  if (connect(fd, reinterpret_cast<const sockaddr*>(&to), sizeof(to)) != 0 ||
      write(fd, kPreface, sizeof(kPreface) - 1) !=
          static_cast<ssize_t>(sizeof(kPreface) - 1)) {
    close(fd);
    return -1;
  }
  while (got < sizeof(header)) {
    const ssize_t n = read(fd, header + got, sizeof(header) - got);
    if (n <= 0) {
      close(fd);
      return -1;
    }
    got += static_cast<size_t>(n);
  }
  return fd;
}

// gRPC's shutdown waits for each client to close its connection after the
// server's GOAWAY; with no call left the server closes them itself, so a
// client that does not read (an idle channel, polled every 5 s; a stopped
// process) does not hold a draining server until --drain_timeout.
TEST_P(ServerBootstrapTest, SigtermExitsWithoutWaitingForIdleConnections) {
  TempDir dir;
  auto server = testing::StartServer(GetParam().binary, dir.path(),
                                     {"--drain_timeout=600s"});
  ASSERT_TRUE(server.ok()) << server.status();
  const int silent = OpenSilentHttp2Connection(server->grpc_address);
  ASSERT_GE(silent, 0) << "cannot connect to " << server->grpc_address;
  auto channel = grpc::CreateChannel(server->grpc_address,
                                     grpc::InsecureChannelCredentials());
  EXPECT_EQ(CheckHealth(channel, ""), HealthCheckResponse::SERVING);

  server->process.Signal(SIGTERM);
  // Without closing the connections: the server's keepalive (20 s + 10 s)
  // would drop the silent one at the earliest.
  auto exit_code = server->process.Wait(absl::Seconds(15));
  close(silent);
  ASSERT_TRUE(exit_code.ok()) << exit_code.status();
  EXPECT_EQ(*exit_code, 0);
}

TEST(CoordinatorAllocatorTest, RunsOnJemallocWhenBuiltWithIt) {
#if !SLUICE_JEMALLOC
  GTEST_SKIP() << "built with -DSLUICE_JEMALLOC=OFF";
#else
  // The link order decides whose malloc the process calls; the coordinator
  // logs the library it resolved to.
  TempDir dir;
  auto server = testing::StartServer("sluice-coordinator", dir.path(),
                                     {"--wait_for_data_servers=false"});
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_THAT(ReadWholeFile(server->log_path).value_or(""),
              HasSubstr("malloc: libjemalloc.so.2"));
#endif
}

TEST_P(ServerBootstrapTest, BadListenFlagExitsNonZeroNamingTheFlag) {
  TempDir dir;
  const std::string log = dir.File("bad.log");
  auto child = ChildProcess::Start(
      {testing::BinDir() + "/" + GetParam().binary, "--listen=nonsense"}, log);
  ASSERT_TRUE(child.ok());
  auto exit_code = child->Wait(absl::Seconds(10));
  ASSERT_TRUE(exit_code.ok()) << exit_code.status();
  EXPECT_EQ(*exit_code, 2);
  EXPECT_THAT(ReadWholeFile(log).value_or(""), HasSubstr("--listen=nonsense"));
}

// A bad command line exits 2, as documented; a known boolean's --noFLAG
// form is not unknown.
TEST_P(ServerBootstrapTest, UnknownFlagExitsTwoNamingIt) {
  TempDir dir;
  int n = 0;
  for (const char* flag : {"--no_such_flag=1", "-no_such_flag", "--notls"}) {
    const std::string log = dir.File("bad" + std::to_string(n++) + ".log");
    auto child = ChildProcess::Start(
        {testing::BinDir() + "/" + GetParam().binary, flag}, log);
    ASSERT_TRUE(child.ok());
    auto exit_code = child->Wait(absl::Seconds(10));
    ASSERT_TRUE(exit_code.ok());
    EXPECT_EQ(*exit_code, 2) << flag;
    const std::string name = std::string(flag).substr(
        flag[1] == '-' ? 2 : 1,
        std::string(flag).find('=') - (flag[1] == '-' ? 2 : 1));
    EXPECT_THAT(ReadWholeFile(log).value_or(""),
                HasSubstr("unknown flag --" + name))
        << flag;
  }
  const std::string log = dir.File("nobool.log");
  auto child = ChildProcess::Start({testing::BinDir() + "/" + GetParam().binary,
                                    "--notune_malloc", "--listen=nonsense"},
                                   log);
  ASSERT_TRUE(child.ok());
  auto exit_code = child->Wait(absl::Seconds(10));
  ASSERT_TRUE(exit_code.ok());
  // Past the flag check: the bad --listen is what fails.
  EXPECT_THAT(ReadWholeFile(log).value_or(""), HasSubstr("--listen=nonsense"));
}

TEST_P(ServerBootstrapTest, HelpDescribesEveryServerFlag) {
  TempDir dir;
  const std::string log = dir.File("help.log");
  auto child = ChildProcess::Start(
      {testing::BinDir() + "/" + GetParam().binary, "--help"}, log);
  ASSERT_TRUE(child.ok());
  ASSERT_TRUE(child->Wait(absl::Seconds(10)).ok());
  const std::string help = ReadWholeFile(log).value_or("");
  for (const char* flag :
       {"--listen", "--port_file", "--metrics_listen", "--tls_cert",
        "--tls_key", "--tls_client_ca", "--drain_timeout"}) {
    EXPECT_THAT(help, HasSubstr(flag));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Binaries, ServerBootstrapTest,
    ::testing::Values(BinaryCase{"sluice-coordinator", "sluice.v1.Coordinator"},
                      BinaryCase{"sluice-dataserver", "sluice.v1.DataServer"}),
    [](const auto& info) {
      return info.param.binary == "sluice-coordinator" ? "Coordinator"
                                                       : "DataServer";
    });

std::shared_ptr<grpc::Channel> TlsChannel(const std::string& address,
                                          const testing::TestPki& pki,
                                          bool with_client_cert) {
  grpc::SslCredentialsOptions options;
  options.pem_root_certs = *ReadWholeFile(pki.ca_cert);
  if (with_client_cert) {
    options.pem_cert_chain = *ReadWholeFile(pki.client_cert);
    options.pem_private_key = *ReadWholeFile(pki.client_key);
  }
  return grpc::CreateChannel(address, grpc::SslCredentials(options));
}

// Out-of-range fleet sizing flags and a bad pool name are a bad command
// line: exit 2 naming the flag, before anything is served.
TEST(ServerFlagsTest, BadFleetAndPoolFlagsExitTwoNamingThem) {
  TempDir dir;
  struct Case {
    std::vector<std::string> argv;
    std::string named;
  };
  const std::vector<Case> cases = {
      {{"sluice-coordinator", "--fleet_window=0s"}, "--fleet_window"},
      {{"sluice-coordinator", "--fleet_interval=-1s"}, "--fleet_interval"},
      {{"sluice-coordinator", "--fleet_max_servers=0"}, "--fleet_max_servers"},
      {{"sluice-dataserver", "--pool=no spaces", "--coordinator=127.0.0.1:1"},
       "--pool=no spaces"},
  };
  int n = 0;
  for (const Case& c : cases) {
    std::vector<std::string> argv = c.argv;
    argv[0] = testing::BinDir() + "/" + argv[0];
    argv.push_back("--listen=127.0.0.1:0");
    argv.push_back("--metrics_listen=127.0.0.1:0");
    argv.push_back("--journal_dir=" + dir.File("journal" + std::to_string(n)));
    if (c.argv[0] == "sluice-dataserver") argv.back() = "--roots=" + dir.path();
    const std::string log = dir.File("flags" + std::to_string(n++) + ".log");
    auto child = ChildProcess::Start(argv, log);
    ASSERT_TRUE(child.ok());
    auto exit_code = child->Wait(absl::Seconds(10));
    ASSERT_TRUE(exit_code.ok()) << c.named;
    EXPECT_EQ(*exit_code, 2) << c.named;
    EXPECT_THAT(ReadWholeFile(log).value_or(""), HasSubstr(c.named));
  }
}

TEST(ServerTlsTest, TlsAcceptsTrustingClientsAndRefusesPlaintext) {
  TempDir dir;
  auto pki = testing::MakeTestPki(dir.path());
  ASSERT_TRUE(pki.ok()) << pki.status();
  auto server = testing::StartServer(
      "sluice-coordinator", dir.path(),
      {"--tls_cert=" + pki->server_cert, "--tls_key=" + pki->server_key});
  ASSERT_TRUE(server.ok()) << server.status();

  EXPECT_EQ(CheckHealth(TlsChannel(server->grpc_address, *pki, false), ""),
            HealthCheckResponse::SERVING);
  EXPECT_EQ(CheckHealth(grpc::CreateChannel(server->grpc_address,
                                            grpc::InsecureChannelCredentials()),
                        ""),
            -grpc::StatusCode::UNAVAILABLE);
}

TEST(ServerTlsTest, MutualTlsRefusesClientsWithoutACertificate) {
  TempDir dir;
  auto pki = testing::MakeTestPki(dir.path());
  ASSERT_TRUE(pki.ok()) << pki.status();
  auto server = testing::StartServer(
      "sluice-dataserver", dir.path(),
      {"--tls_cert=" + pki->server_cert, "--tls_key=" + pki->server_key,
       "--tls_client_ca=" + pki->ca_cert});
  ASSERT_TRUE(server.ok()) << server.status();

  EXPECT_EQ(CheckHealth(TlsChannel(server->grpc_address, *pki, true), ""),
            HealthCheckResponse::SERVING);
  EXPECT_EQ(CheckHealth(TlsChannel(server->grpc_address, *pki, false), ""),
            -grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(CheckHealth(grpc::CreateChannel(server->grpc_address,
                                            grpc::InsecureChannelCredentials()),
                        ""),
            -grpc::StatusCode::UNAVAILABLE);
}

TEST(ServerTlsTest, TlsFlagsMustComeTogether) {
  TempDir dir;
  const std::string log = dir.File("tls.log");
  auto child = ChildProcess::Start(
      {testing::BinDir() + "/sluice-coordinator", "--listen=127.0.0.1:0",
       "--tls_cert=/nonexistent.pem"},
      log);
  ASSERT_TRUE(child.ok());
  auto exit_code = child->Wait(absl::Seconds(10));
  ASSERT_TRUE(exit_code.ok());
  EXPECT_EQ(*exit_code, 2);
  EXPECT_THAT(ReadWholeFile(log).value_or(""), HasSubstr("--tls_key"));
}

}  // namespace
}  // namespace sluice
