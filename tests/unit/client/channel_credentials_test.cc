#include "client/cpp/channel_credentials.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>

#include "sluice/coordination.h"
#include "sluice/reader.h"
#include "sluice/tls.h"
#include "tests/testing/temp_dir.h"

namespace sluice {
namespace {

using ::testing::HasSubstr;

void Write(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

TEST(ReadClientTlsTest, ReadsEachPemFileWhole) {
  testing::TempDir dir;
  Write(dir.File("ca.crt"), "CA PEM\n");
  Write(dir.File("c.crt"), "CERT PEM\n");
  Write(dir.File("c.key"), "KEY PEM\n");
  auto tls = ReadClientTls(dir.File("ca.crt"));
  ASSERT_TRUE(tls.ok()) << tls.status();
  EXPECT_EQ(tls->ca_cert_pem, "CA PEM\n");
  EXPECT_EQ(tls->client_cert_pem, "");
  tls = ReadClientTls(dir.File("ca.crt"), dir.File("c.crt"), dir.File("c.key"));
  ASSERT_TRUE(tls.ok()) << tls.status();
  EXPECT_EQ(tls->client_cert_pem, "CERT PEM\n");
  EXPECT_EQ(tls->client_key_pem, "KEY PEM\n");
}

TEST(ReadClientTlsTest, NamesTheFileItCannotRead) {
  testing::TempDir dir;
  Write(dir.File("ca.crt"), "CA PEM\n");
  auto tls = ReadClientTls(dir.File("missing.crt"));
  EXPECT_EQ(tls.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(tls.status().message(),
              HasSubstr("cannot read ca_cert=" + dir.File("missing.crt")));
  tls = ReadClientTls(dir.File("ca.crt"), dir.File("c.crt"), dir.File("c.key"));
  EXPECT_THAT(tls.status().message(),
              HasSubstr("cannot read client_cert=" + dir.File("c.crt")));
}

TEST(ReadClientTlsTest, ACertificateNeedsItsKey) {
  testing::TempDir dir;
  Write(dir.File("ca.crt"), "CA PEM\n");
  Write(dir.File("c.crt"), "CERT PEM\n");
  auto tls = ReadClientTls(dir.File("ca.crt"), dir.File("c.crt"));
  EXPECT_EQ(tls.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(tls.status().message(),
              HasSubstr("client_cert and client_key together"));
}

TEST(ClientTlsOptionsTest, AReaderWithTlsButNoCaIsRefusedAtCreate) {
  ReaderOptions o;
  o.coordinator = "127.0.0.1:1";
  o.job = "j";
  o.tls = ClientTls{};
  auto reader = Reader::Create(o);
  EXPECT_EQ(reader.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(reader.status().message(),
              HasSubstr("ReaderOptions.tls.ca_cert_pem is empty"));
}

TEST(ClientTlsOptionsTest, OnceAndBarrierNameTheirHalfGivenCertificate) {
  ClientTls half;
  half.ca_cert_pem = "CA";
  half.client_cert_pem = "CERT";
  OnceOptions once;
  once.coordinator = "127.0.0.1:1";
  once.name = "n";
  once.tls = half;
  auto outcome =
      RunOnce(once, []() -> absl::StatusOr<std::string> { return ""; });
  EXPECT_EQ(outcome.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(outcome.status().message(), HasSubstr("OnceOptions.tls"));
  BarrierOptions barrier;
  barrier.coordinator = "127.0.0.1:1";
  barrier.name = "n";
  barrier.participant = "p";
  barrier.participants = 1;
  barrier.tls = half;
  auto arrived = WaitBarrier(barrier);
  EXPECT_EQ(arrived.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(arrived.status().message(), HasSubstr("BarrierOptions.tls"));
}

}  // namespace
}  // namespace sluice
