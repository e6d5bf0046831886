#include "server/common/live_calls.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "grpc/health/v1/health.grpc.pb.h"

namespace sluice {
namespace {

using ::grpc::health::v1::Health;
using ::grpc::health::v1::HealthCheckRequest;
using ::grpc::health::v1::HealthCheckResponse;

// A real gRPC server on 127.0.0.1 with the default health service, whose
// calls `calls` counts.
struct CountedServer {
  explicit CountedServer(LiveCalls* calls) {
    grpc::EnableDefaultHealthCheckService(true);
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                             &port);
    std::vector<
        std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
        interceptors;
    interceptors.push_back(calls->InterceptorFactory());
    builder.experimental().SetInterceptorCreators(std::move(interceptors));
    server = builder.BuildAndStart();
    channel = grpc::CreateChannel("127.0.0.1:" + std::to_string(port),
                                  grpc::InsecureChannelCredentials());
  }
  ~CountedServer() { server->Shutdown(std::chrono::system_clock::now()); }
  std::unique_ptr<grpc::Server> server;
  std::shared_ptr<grpc::Channel> channel;
};

absl::Time In10s() { return absl::Now() + absl::Seconds(10); }

TEST(LiveCallsTest, AStreamIsLiveUntilItEnds) {
  LiveCalls calls;
  CountedServer server(&calls);
  auto stub = Health::NewStub(server.channel);
  EXPECT_EQ(calls.live(), 0);

  grpc::ClientContext watch;
  auto stream = stub->Watch(&watch, HealthCheckRequest());
  HealthCheckResponse first;
  // The server's handler has answered: its call (and interceptor) exists.
  ASSERT_TRUE(stream->Read(&first));
  EXPECT_EQ(calls.live(), 1);
  EXPECT_FALSE(calls.AwaitNoneLive(absl::Now()));

  watch.TryCancel();
  EXPECT_FALSE(stream->Read(&first));
  EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_TRUE(calls.AwaitNoneLive(In10s()));
  EXPECT_EQ(calls.live(), 0);
}

TEST(LiveCallsTest, FinishedUnaryCallsAreNotLive) {
  LiveCalls calls;
  CountedServer server(&calls);
  auto stub = Health::NewStub(server.channel);
  for (int i = 0; i < 3; ++i) {
    grpc::ClientContext ctx;
    HealthCheckResponse resp;
    ASSERT_TRUE(stub->Check(&ctx, HealthCheckRequest(), &resp).ok());
  }
  EXPECT_TRUE(calls.AwaitNoneLive(In10s()));
  EXPECT_EQ(calls.live(), 0);
}

TEST(LiveCallsTest, StopEndsTheWaitsWhileACallIsLive) {
  LiveCalls calls;
  calls.Started();
  EXPECT_FALSE(calls.AwaitStopped(absl::Now()));
  calls.Stop();
  EXPECT_FALSE(calls.AwaitNoneLive(absl::InfiniteFuture()));
  EXPECT_TRUE(calls.AwaitStopped(absl::InfiniteFuture()));
  EXPECT_TRUE(calls.stopped());
  calls.Finished();
  EXPECT_TRUE(calls.AwaitNoneLive(absl::InfiniteFuture()));
}

}  // namespace
}  // namespace sluice
