#include "server/common/server_host.h"

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "grpc/health/v1/health.grpc.pb.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/tls_fixture.h"

namespace sluice {
namespace {

using ::sluice::testing::StatusIs;
using ::testing::HasSubstr;

TEST(ParseHostPortTest, AcceptsHostPortForms) {
  auto a = ParseHostPort("127.0.0.1:0", "--listen");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->host, "127.0.0.1");
  EXPECT_EQ(a->port, 0);
  auto b = ParseHostPort("[::1]:7070", "--listen");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->host, "::1");
  EXPECT_EQ(b->port, 7070);
  EXPECT_EQ(b->ToString(), "[::1]:7070");
  auto c = ParseHostPort(":9090", "--metrics_listen");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->ToString(), "0.0.0.0:9090");
}

TEST(ParseHostPortTest, RejectsNonsenseNamingTheFlag) {
  for (const char* bad : {"nonsense", "host:", "host:http", "1.2.3.4:65536",
                          "::1:80", "[::1]80", "host:-1"}) {
    EXPECT_THAT(ParseHostPort(bad, "--listen"),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr(std::string("--listen=") + bad)))
        << bad;
  }
}

// In-process: readiness is NOT_SERVING until SetReady(true), and again after
// SetReady(false) (draining), while the server itself stays SERVING.

int Readiness(const std::string& address, const std::string& service) {
  auto stub = grpc::health::v1::Health::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  grpc::health::v1::HealthCheckRequest req;
  req.set_service(service);
  grpc::health::v1::HealthCheckResponse resp;
  if (!stub->Check(&ctx, req, &resp).ok()) return -1;
  return resp.status();
}

TEST(ServerHostTest, ReadinessFollowsSetReady) {
  ServerConfig config;
  config.program = "test";
  config.listen = {"127.0.0.1", 0};
  config.drain_timeout = absl::Seconds(1);
  auto host =
      ServerHost::Start(config, {}, std::make_shared<prometheus::Registry>());
  ASSERT_TRUE(host.ok()) << host.status();
  ASSERT_GT((*host)->grpc_port(), 0);
  const std::string address =
      "127.0.0.1:" + std::to_string((*host)->grpc_port());
  using Resp = grpc::health::v1::HealthCheckResponse;
  EXPECT_EQ(Readiness(address, "readiness"), Resp::NOT_SERVING);
  EXPECT_EQ(Readiness(address, ""), Resp::SERVING);
  (*host)->SetReady(true);
  EXPECT_EQ(Readiness(address, "readiness"), Resp::SERVING);
  (*host)->SetReady(false);
  EXPECT_EQ(Readiness(address, "readiness"), Resp::NOT_SERVING);
  (*host)->Shutdown();
}

TEST(ServerHostTest, PortInUseIsUnavailableNamingTheFlag) {
  ServerConfig config;
  config.program = "test";
  config.listen = {"127.0.0.1", 0};
  auto first =
      ServerHost::Start(config, {}, std::make_shared<prometheus::Registry>());
  ASSERT_TRUE(first.ok());
  config.listen.port = (*first)->grpc_port();
  auto second =
      ServerHost::Start(config, {}, std::make_shared<prometheus::Registry>());
  EXPECT_THAT(second, testing::StatusIs(absl::StatusCode::kUnavailable,
                                        HasSubstr("--listen=127.0.0.1:")));
}

// --health_listen: a TLS server's readiness is readable in plaintext on its
// own port, and follows SetReady there too.

TEST(ServerHostTest, HealthListenerServesReadinessInPlaintextBesideTls) {
  testing::TempDir dir;
  auto pki = testing::MakeTestPki(dir.path());
  ASSERT_TRUE(pki.ok()) << pki.status();
  ServerConfig config;
  config.program = "test";
  config.listen = {"127.0.0.1", 0};
  config.health_listen = "127.0.0.1:0";
  config.tls.cert_file = pki->server_cert;
  config.tls.key_file = pki->server_key;
  config.drain_timeout = absl::Seconds(1);
  auto host =
      ServerHost::Start(config, {}, std::make_shared<prometheus::Registry>());
  ASSERT_TRUE(host.ok()) << host.status();
  ASSERT_GT((*host)->health_port(), 0);
  const std::string tls_address =
      "127.0.0.1:" + std::to_string((*host)->grpc_port());
  const std::string health_address =
      "127.0.0.1:" + std::to_string((*host)->health_port());
  using Resp = grpc::health::v1::HealthCheckResponse;
  EXPECT_EQ(Readiness(tls_address, "readiness"), -1);  // plaintext refused
  EXPECT_EQ(Readiness(health_address, "readiness"), Resp::NOT_SERVING);
  EXPECT_EQ(Readiness(health_address, ""), Resp::SERVING);
  (*host)->SetReady(true);
  EXPECT_EQ(Readiness(health_address, "readiness"), Resp::SERVING);
  (*host)->SetReady(false);
  EXPECT_EQ(Readiness(health_address, "readiness"), Resp::NOT_SERVING);
  (*host)->Shutdown();
}

}  // namespace
}  // namespace sluice
