// CoordinatorService: Input-wait reports and the service lock's own metrics.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <atomic>
#include <deque>
#include <limits>
#include <map>
#include <set>
#include <thread>
#include <tuple>

#include "absl/cleanup/cleanup.h"
#include "absl/synchronization/notification.h"
#include "server/common/lease_token.h"
#include "server/coordinator/coordinator_metrics.h"
#include "server/coordinator/coordinator_service.h"
#include "tests/testing/coordinator_fixture.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/gated_journal.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/wait.h"

namespace sluice {
namespace {

using ::sluice::testing::FakeClock;
using ::sluice::testing::Hello;
using ::sluice::testing::RecordingSink;
using ::sluice::testing::Spec;
using ::sluice::testing::StatusIs;
using ::testing::HasSubstr;

v1::TrainerMessage Beat(std::vector<uint64_t> counts, double sum) {
  v1::TrainerMessage m;
  auto* w = m.mutable_heartbeat()->mutable_input_wait();
  for (uint64_t c : counts) w->add_bucket_counts(c);
  w->set_sum_seconds(sum);
  return m;
}

// A service exporting its metrics into `registry_`.
class CoordinatorInputWaitTest : public ::testing::Test {
 protected:
  void SetUp() override {
    CoordinatorOptions options;
    options.clock = &clock_;
    options.wait_for_data_servers = false;
    options.metrics = &metrics_;
    auto service = CoordinatorService::Create(options);
    ASSERT_OK(service);
    service_ = std::move(*service);
  }
  FakeClock clock_;
  prometheus::Registry registry_;
  CoordinatorMetrics metrics_{registry_};
  std::unique_ptr<CoordinatorService> service_;
};

// Heartbeats' input waits add up per rank in the job's status and in the
// job's sluice_trainer_input_wait_seconds histogram.
TEST_F(CoordinatorInputWaitTest, HeartbeatsFeedTheRankTotalAndTheHistogram) {
  ASSERT_OK(service_->CreateJob(Spec("j", {10, 10}, 2, 1)));
  std::vector<std::shared_ptr<RecordingSink>> sinks;
  std::vector<int64_t> ids;
  for (int rank = 0; rank < 2; ++rank) {
    sinks.push_back(std::make_shared<RecordingSink>());
    ids.push_back(service_->OpenSession(sinks.back()));
    service_->OnMessage(ids.back(),
                        Hello("j", rank, "t" + std::to_string(rank)));
  }
  // Rank 0: 3 samples buffered (bucket 0), one after 0.02 s (bucket 3);
  // then 2 more after 0.5 s each (bucket 5). Rank 1: only the 1st bucket.
  service_->OnMessage(ids[0], Beat({3, 0, 0, 1}, 0.02));
  service_->OnMessage(ids[0], Beat({0, 0, 0, 0, 0, 2}, 1.0));
  service_->OnMessage(ids[1], Beat({5}, 0));
  for (const auto& sink : sinks) EXPECT_FALSE(sink->finished.has_value());

  auto job = service_->GetJob("j", false);
  ASSERT_OK(job);
  ASSERT_EQ(job->status().ranks_size(), 2);
  EXPECT_DOUBLE_EQ(job->status().ranks(0).input_wait_seconds(), 1.02);
  EXPECT_DOUBLE_EQ(job->status().ranks(1).input_wait_seconds(), 0);

  const prometheus::ClientMetric::Histogram* h = nullptr;
  std::vector<prometheus::MetricFamily> families = registry_.Collect();
  for (const auto& f : families) {
    if (f.name != "sluice_trainer_input_wait_seconds") continue;
    ASSERT_EQ(f.metric.size(), 1u);
    EXPECT_EQ(f.metric[0].label[0].value, "j");
    h = &f.metric[0].histogram;
  }
  ASSERT_NE(h, nullptr);
  EXPECT_EQ(h->sample_count, 11u);
  EXPECT_DOUBLE_EQ(h->sample_sum, 1.02);
  // Cumulative counts at le = 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, ...
  std::vector<uint64_t> cumulative;
  for (const auto& b : h->bucket) cumulative.push_back(b.cumulative_count);
  EXPECT_EQ(cumulative,
            (std::vector<uint64_t>{8, 8, 8, 9, 9, 11, 11, 11, 11, 11}));
}

// Every call that takes the state lock is timed: one wait, one hold and one
// hold-CPU observation each (CreateJob, the planning thread offering the
// next epoch's plan, OpenSession, the Hello, a heartbeat).
TEST_F(CoordinatorInputWaitTest, EveryLockTakingIsTimed) {
  auto count = [&](const std::string& name) -> uint64_t {
    for (const auto& f : registry_.Collect()) {
      if (f.name == name) return f.metric[0].histogram.sample_count;
    }
    ADD_FAILURE() << name << " not exported";
    return 0;
  };
  const uint64_t holds = count("sluice_coordinator_lock_hold_seconds");
  const uint64_t waits = count("sluice_coordinator_lock_wait_seconds");
  const uint64_t cpu = count("sluice_coordinator_lock_hold_cpu_seconds");
  ASSERT_OK(service_->CreateJob(Spec("j", {10}, 1, 1)));
  service_->WaitForPlansAhead();
  auto sink = std::make_shared<RecordingSink>();
  const int64_t id = service_->OpenSession(sink);
  service_->OnMessage(id, Hello("j", 0, "t"));
  service_->OnMessage(id, Beat({1}, 0));
  EXPECT_EQ(count("sluice_coordinator_lock_hold_seconds"), holds + 5);
  EXPECT_EQ(count("sluice_coordinator_lock_wait_seconds"), waits + 5);
  EXPECT_EQ(count("sluice_coordinator_lock_hold_cpu_seconds"), cpu + 5);
}

// The CPU time under the lock is counted per session message kind: one
// series per TrainerMessage kind, and a message adds to its own kind's only.
TEST_F(CoordinatorInputWaitTest, LockCpuIsCountedPerMessageKind) {
  auto by_kind = [&] {
    std::map<std::string, double> out;
    for (const auto& f : registry_.Collect()) {
      if (f.name != "sluice_coordinator_message_lock_cpu_seconds_total")
        continue;
      for (const auto& m : f.metric) out[m.label[0].value] = m.counter.value;
    }
    return out;
  };
  std::map<std::string, double> before = by_kind();
  const auto* kinds = v1::TrainerMessage::descriptor()->FindOneofByName("msg");
  ASSERT_NE(kinds, nullptr);
  ASSERT_EQ(before.size(), static_cast<size_t>(kinds->field_count()));
  for (int i = 0; i < kinds->field_count(); ++i) {
    EXPECT_EQ(before.count(kinds->field(i)->name()), 1u)
        << kinds->field(i)->name();
  }
  ASSERT_OK(service_->CreateJob(Spec("j", {10}, 1, 1)));
  auto sink = std::make_shared<RecordingSink>();
  const int64_t id = service_->OpenSession(sink);
  service_->OnMessage(id, Hello("j", 0, "t"));
  std::map<std::string, double> after_hello = by_kind();
  EXPECT_GT(after_hello["hello"], before["hello"]);
  after_hello.erase("hello");
  before.erase("hello");
  EXPECT_EQ(after_hello, before);
  service_->OnMessage(id, Beat({1}, 0));
  std::map<std::string, double> after_beat = by_kind();
  EXPECT_GT(after_beat["heartbeat"], before["heartbeat"]);
  EXPECT_EQ(after_beat["want"], before["want"]);
  EXPECT_EQ(after_beat["complete"], before["complete"]);
}

// A report that is not one: too many buckets, a negative or non-finite sum,
// absurd counts. The session ends with INVALID_ARGUMENT naming the field;
// nothing is recorded.
TEST_F(CoordinatorInputWaitTest, HostileReportsEndTheSessionNamingTheField) {
  ASSERT_OK(service_->CreateJob(Spec("j", {10}, 1, 1)));
  const std::vector<std::pair<v1::TrainerMessage, std::string>> cases = {
      {Beat(std::vector<uint64_t>(11, 1), 0),
       "heartbeat.input_wait.bucket_counts has 11 entries"},
      {Beat({1}, -1), "heartbeat.input_wait.sum_seconds"},
      {Beat({1}, std::numeric_limits<double>::quiet_NaN()),
       "heartbeat.input_wait.sum_seconds"},
      {Beat({1}, std::numeric_limits<double>::infinity()),
       "heartbeat.input_wait.sum_seconds"},
      {Beat({uint64_t{1} << 41}, 1), "heartbeat.input_wait.bucket_counts"},
      {Beat({uint64_t{1} << 39, uint64_t{1} << 39, uint64_t{1} << 39}, 1),
       "heartbeat.input_wait.bucket_counts"},
  };
  for (const auto& [message, field] : cases) {
    auto sink = std::make_shared<RecordingSink>();
    const int64_t id = service_->OpenSession(sink);
    service_->OnMessage(id, Hello("j", 0, "t"));
    service_->OnMessage(id, message);
    ASSERT_TRUE(sink->finished.has_value()) << field;
    EXPECT_THAT(*sink->finished,
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(field)));
    service_->CloseSession(id);
  }
  auto job = service_->GetJob("j", false);
  ASSERT_OK(job);
  EXPECT_EQ(job->status().ranks(0).input_wait_seconds(), 0);
}

}  // namespace
}  // namespace sluice
