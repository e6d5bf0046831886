#include "server/coordinator/leadership_gate.h"

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "server/coordinator/coordinator_service.h"
#include "server/coordinator/grpc_coordinator_service.h"
#include "tests/testing/coordinator_client.h"
#include "tests/testing/coordinator_fixture.h"

namespace sluice {
namespace {

using ::testing::HasSubstr;

TEST(LeadershipGateTest, AStandbyNamesTheLeaderOnceKnown) {
  LeadershipGate gate;
  EXPECT_EQ(gate.leading(), nullptr);
  absl::Status refused = gate.NotLeaderStatus();
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(refused.message(),
            "standby coordinator: no coordinator leads at the moment; retry");
  EXPECT_EQ(testing::NotLeaderHint(refused).value_or("?"), "");

  gate.SetLeader("10.0.0.7:7070");
  refused = gate.NotLeaderStatus();
  EXPECT_EQ(refused.message(),
            "standby coordinator: 10.0.0.7:7070 leads; call it");
  EXPECT_EQ(testing::NotLeaderHint(refused).value_or(""), "10.0.0.7:7070");
}

// The adapter over a gate: every call refused, naming the leader, while the
// gate stands by; served once it leads.
TEST(LeadershipGateTest, TheAdapterRefusesEveryCallUntilTheGateLeads) {
  LeadershipGate gate;
  gate.SetLeader("10.0.0.7:7070");
  GrpcCoordinatorService adapter(&gate);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                           &port);
  builder.RegisterService(&adapter);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  const std::string address = absl::StrCat("127.0.0.1:", port);

  const v1::JobSpec spec = testing::Spec("gated", {10, 10}, 1, 1);
  const absl::Status created = testing::CreateJob(address, spec);
  EXPECT_EQ(created.code(), absl::StatusCode::kUnavailable) << created;
  EXPECT_EQ(testing::NotLeaderHint(created).value_or(""), "10.0.0.7:7070");
  const auto job = testing::GetJob(address, "gated");
  EXPECT_EQ(job.status().code(), absl::StatusCode::kUnavailable);
  const auto grant = testing::FirstGrant(address, "gated", "trainer-1");
  ASSERT_FALSE(grant.ok());
  EXPECT_EQ(grant.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(grant.status().message(), HasSubstr("10.0.0.7:7070 leads"));

  CoordinatorOptions options;
  options.wait_for_data_servers = false;
  auto service = CoordinatorService::Create(options);
  ASSERT_TRUE(service.ok()) << service.status();
  gate.Lead(service->get());
  ASSERT_TRUE(testing::CreateJob(address, spec).ok());
  const auto leased = testing::FirstGrant(address, "gated", "trainer-1");
  ASSERT_TRUE(leased.ok()) << leased.status();
  EXPECT_EQ(leased->job(), "gated");
  adapter.Drain();
  server->Shutdown();
}

}  // namespace
}  // namespace sluice
