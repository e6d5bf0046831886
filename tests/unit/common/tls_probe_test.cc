#include "server/common/tls_probe.h"

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "server/common/loopback_port.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/tls_fixture.h"

namespace sluice {
namespace {

using ::sluice::testing::StatusIs;
using ::testing::HasSubstr;

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// A real gRPC server (no services: the transport is what is probed).
struct Listening {
  std::unique_ptr<grpc::Server> server;
  std::string address;
};

Listening Listen(std::shared_ptr<grpc::ServerCredentials> creds) {
  Listening l;
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", std::move(creds), &port);
  l.server = builder.BuildAndStart();
  l.address = "127.0.0.1:" + std::to_string(port);
  return l;
}

class TlsProbeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto pki = testing::MakeTestPki(dir_.path());
    ASSERT_TRUE(pki.ok()) << pki.status();
    pki_ = *pki;
    plain_ = Listen(grpc::InsecureServerCredentials());
    grpc::SslServerCredentialsOptions options;
    options.pem_key_cert_pairs.push_back(
        {ReadAll(pki_.server_key), ReadAll(pki_.server_cert)});
    tls_ = Listen(grpc::SslServerCredentials(options));
    // Mutual TLS: the server asks for a client certificate this probe does
    // not have, and still shows its own first.
    options.pem_root_certs = ReadAll(pki_.ca_cert);
    options.client_certificate_request =
        GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
    mtls_ = Listen(grpc::SslServerCredentials(options));
  }

  testing::TempDir dir_;
  testing::TestPki pki_;
  Listening plain_, tls_, mtls_;
};

TEST_F(TlsProbeTest, TellsTlsFromPlaintext) {
  EXPECT_EQ(ProbeTransport(plain_.address, absl::Seconds(5)),
            Transport::kPlaintext);
  EXPECT_EQ(ProbeTransport(tls_.address, absl::Seconds(5)), Transport::kTls);
  EXPECT_EQ(ProbeTransport(mtls_.address, absl::Seconds(5)), Transport::kTls);
}

TEST_F(TlsProbeTest, AcceptsTheTargetFormsClientsTake) {
  const std::string port = tls_.address.substr(tls_.address.rfind(':') + 1);
  EXPECT_EQ(ProbeTransport("localhost:" + port, absl::Seconds(5)),
            Transport::kTls);
  EXPECT_EQ(ProbeTransport("dns:///localhost:" + port, absl::Seconds(5)),
            Transport::kTls);
  EXPECT_EQ(ProbeTransport("ipv4:" + tls_.address, absl::Seconds(5)),
            Transport::kTls);
  // Several addresses: the first that answers decides.
  const int closed = ReserveLoopbackPort();
  EXPECT_EQ(ProbeTransport("ipv4:127.0.0.1:" + std::to_string(closed) + "," +
                               plain_.address,
                           absl::Seconds(5)),
            Transport::kPlaintext);
}

TEST_F(TlsProbeTest, NothingListeningOrNoAddressSaysNothing) {
  const int closed = ReserveLoopbackPort();
  EXPECT_EQ(
      ProbeTransport("127.0.0.1:" + std::to_string(closed), absl::Seconds(5)),
      Transport::kUnknown);
  EXPECT_EQ(ProbeTransport("unix:/tmp/none", absl::Seconds(5)),
            Transport::kUnknown);
  EXPECT_EQ(ProbeTransport("no-port", absl::Seconds(5)), Transport::kUnknown);
  EXPECT_TRUE(CheckTransport("coordinator",
                             "127.0.0.1:" + std::to_string(closed), false,
                             "--ca_cert")
                  .ok());
}

TEST_F(TlsProbeTest, AListenerThatNeverAnswersIsNeither) {
  // Connections complete in the kernel's backlog; nothing reads or writes.
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(fd, 8), 0);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  EXPECT_EQ(ProbeTransport("127.0.0.1:" + std::to_string(ntohs(addr.sin_port)),
                           absl::Milliseconds(200)),
            Transport::kUnknown);
  close(fd);
}

TEST_F(TlsProbeTest, CheckTransportNamesTheMismatch) {
  EXPECT_THAT(
      CheckTransport("coordinator", tls_.address, false, "--ca_cert"),
      StatusIs(absl::StatusCode::kFailedPrecondition,
               HasSubstr("coordinator " + tls_.address +
                         " speaks TLS, but this client connects in "
                         "plaintext: give it the CA that signed the server's "
                         "certificate (--ca_cert)")));
  EXPECT_THAT(CheckTransport("data server", plain_.address, true, "--ca_cert"),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("data server " + plain_.address +
                                 " speaks plaintext, but this client connects "
                                 "with TLS (--ca_cert is set)")));
  EXPECT_TRUE(CheckTransport("coordinator", tls_.address, true, "x").ok());
  EXPECT_TRUE(CheckTransport("coordinator", plain_.address, false, "x").ok());
}

}  // namespace
}  // namespace sluice
