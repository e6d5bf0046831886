#include "server/common/grpc_stream_writer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include "sluice/v1/coordinator.pb.h"

namespace sluice {
namespace {

using ::testing::HasSubstr;

// Records what the writer asks of its reactor; the test plays gRPC by
// calling OnWriteDone.
struct FakeReactor {
  void StartWrite(const v1::OnceResponse* m) {
    started.push_back(m->wait().runner());
  }
  void Finish(const grpc::Status& s) {
    ++finishes;
    status = s;
  }
  std::vector<std::string> started;
  int finishes = 0;
  std::optional<grpc::Status> status;
};

v1::OnceResponse Wait(const std::string& runner) {
  v1::OnceResponse m;
  m.mutable_wait()->set_runner(runner);
  return m;
}

using Writer = StreamWriter<FakeReactor, v1::OnceResponse>;

TEST(StreamWriterTest, OneWriteInFlightInOrderAndFinishAfterTheQueue) {
  FakeReactor r;
  Writer w(&r);
  w.Send(Wait("a"));
  w.Send(Wait("b"));
  w.Finish(grpc::Status(grpc::StatusCode::NOT_FOUND, "gone"));
  w.Send(Wait("late"));  // after Finish: dropped
  EXPECT_EQ(r.started, (std::vector<std::string>{"a"}));
  EXPECT_TRUE(w.finishing());
  EXPECT_EQ(r.finishes, 0);
  w.OnWriteDone(true);
  EXPECT_EQ(r.started, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(r.finishes, 0);
  w.OnWriteDone(true);
  EXPECT_EQ(r.finishes, 1);
  EXPECT_EQ(r.status->error_code(), grpc::StatusCode::NOT_FOUND);
  w.Finish(grpc::Status::OK);  // only the first Finish counts
  w.OnWriteDone(true);
  EXPECT_EQ(r.finishes, 1);
}

TEST(StreamWriterTest, AClientThatDoesNotReadIsEndedAtTheLimit) {
  FakeReactor r;
  Writer w(&r, /*max_messages=*/3, /*max_bytes=*/1 << 20);
  for (const char* who : {"a", "b", "c", "d"}) w.Send(Wait(who));
  // "a" is in flight; b, c, d queued is within 3. One more is past it.
  EXPECT_FALSE(w.finishing());
  w.Send(Wait("e"));
  EXPECT_TRUE(w.finishing());
  w.OnWriteDone(true);  // the write in flight completes: nothing else is sent
  EXPECT_EQ(r.started, (std::vector<std::string>{"a"}));
  ASSERT_EQ(r.finishes, 1);
  EXPECT_EQ(r.status->error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(r.status->error_message(), HasSubstr("has not read 4 messages"));
  EXPECT_THAT(r.status->error_message(),
              HasSubstr("limits: 3 messages, 1048576 bytes"));
}

TEST(StreamWriterTest, TheByteLimitCountsToo) {
  FakeReactor r;
  Writer w(&r, /*max_messages=*/100, /*max_bytes=*/10);
  w.Send(Wait("in-flight"));
  w.Send(Wait("0123456789"));  // 14 bytes queued
  EXPECT_TRUE(w.finishing());
  w.OnWriteDone(true);
  ASSERT_EQ(r.finishes, 1);
  EXPECT_EQ(r.status->error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
}

TEST(StreamWriterTest, AFailedWriteDropsTheQueueButStillFinishes) {
  FakeReactor r;
  Writer w(&r);
  w.Send(Wait("a"));
  w.Send(Wait("b"));
  w.Finish(grpc::Status::OK);
  w.OnWriteDone(false);  // the peer is gone
  EXPECT_EQ(r.started, (std::vector<std::string>{"a"}));
  EXPECT_EQ(r.finishes, 1);
}

TEST(StreamWriterTest, NothingReachesADetachedReactor) {
  FakeReactor r;
  Writer w(&r);
  w.Send(Wait("a"));
  w.Detach();
  w.OnWriteDone(true);
  w.Send(Wait("b"));
  w.Finish(grpc::Status::OK);
  EXPECT_EQ(r.started, (std::vector<std::string>{"a"}));
  EXPECT_EQ(r.finishes, 0);
}

}  // namespace
}  // namespace sluice
