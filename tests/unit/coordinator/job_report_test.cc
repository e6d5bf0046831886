#include "server/coordinator/job_report.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace sluice {
namespace {

using ::testing::ElementsAre;

// A job of two ranks over three 10-sample shards, 10 samples per rank.
JobData MakeJob() {
  JobData job;
  job.spec.set_name("j");
  job.spec.set_world_size(2);
  for (int i = 0; i < 3; ++i) {
    v1::Shard* shard = job.spec.mutable_manifest()->add_shards();
    shard->set_url("/d/" + std::to_string(i) + ".tar");
    shard->set_num_samples(10);
    shard->set_size_bytes(1000 + i);
    shard->set_checksum("sha256:" + std::to_string(i));
  }
  job.shard_samples = std::make_shared<std::vector<int64_t>>(3, 10);
  job.plan.num_ranks = 2;
  job.plan.samples_per_rank = 10;
  job.plan.total_samples = 30;
  job.plan.dropped = 10;
  job.consumed_per_slot = {4, 10};
  job.consumed_total = 14;
  job.live_leases_by_rank = {{0, 1}};
  return job;
}

TEST(JobReportTest, AReportWithoutTheManifestLeavesTheJobsSpecWhole) {
  const JobData job = MakeJob();
  const v1::Job without = JobToProto(job, false, {});
  EXPECT_FALSE(without.spec().has_manifest());
  EXPECT_EQ(without.spec().name(), "j");
  EXPECT_EQ(without.spec().world_size(), 2);
  EXPECT_EQ(job.spec.manifest().shards_size(), 3);
  const v1::Job with = JobToProto(job, true, {});
  EXPECT_EQ(with.spec().manifest().shards_size(), 3);

  // A mixed job's sources keep everything but their manifests.
  JobData mixed = MakeJob();
  mixed.spec.clear_manifest();
  for (const char* name : {"a", "b"}) {
    v1::Source* source = mixed.spec.add_sources();
    source->set_name(name);
    source->set_weight(2);
    *source->mutable_manifest() = job.spec.manifest();
  }
  const v1::JobSpec spec = JobToProto(mixed, false, {}).spec();
  EXPECT_FALSE(spec.has_manifest());
  ASSERT_EQ(spec.sources_size(), 2);
  EXPECT_EQ(spec.sources(1).name(), "b");
  EXPECT_EQ(spec.sources(1).weight(), 2);
  EXPECT_FALSE(spec.sources(0).has_manifest());
  EXPECT_EQ(mixed.spec.sources(0).manifest().shards_size(), 3);
  EXPECT_EQ(
      JobToProto(mixed, true, {}).spec().sources(0).manifest().shards_size(),
      3);
}

TEST(JobReportTest, TheStatusCombinesTheStateWithTheCountsKeptWhileRunning) {
  const JobData job = MakeJob();
  v1::LeaseCounts counts;
  counts.set_granted(7);
  const std::map<int32_t, double> waits = {{1, 2.5}};
  const std::map<int32_t, int32_t> sessions = {{0, 2}, {5, 1}};  // 5: no rank
  JobSoftState soft;
  soft.live_data_servers = {"10.0.0.1:1"};
  soft.lease_counts = &counts;
  soft.input_wait_by_rank = &waits;
  soft.sessions_per_rank = &sessions;
  const v1::JobStatus st = JobToProto(job, false, soft).status();
  EXPECT_EQ(st.state(), v1::JOB_STATE_RUNNING);
  EXPECT_THAT(st.live_data_servers(), ElementsAre("10.0.0.1:1"));
  EXPECT_EQ(st.samples_per_epoch(), 20);
  EXPECT_EQ(st.consumed_in_epoch(), 14);
  EXPECT_EQ(st.dropped_per_epoch(), 10);
  EXPECT_EQ(st.num_shards(), 3);
  EXPECT_EQ(st.leases().granted(), 7);
  ASSERT_EQ(st.ranks_size(), 2);
  EXPECT_EQ(st.ranks(0).consumed(), 4);
  EXPECT_EQ(st.ranks(0).live_leases(), 1);
  EXPECT_EQ(st.ranks(0).sessions(), 2);
  EXPECT_EQ(st.ranks(0).input_wait_seconds(), 0);
  EXPECT_EQ(st.ranks(1).consumed(), 10);
  EXPECT_EQ(st.ranks(1).sessions(), 0);
  EXPECT_EQ(st.ranks(1).input_wait_seconds(), 2.5);

  JobData done = MakeJob();
  done.done = true;
  const v1::JobStatus finished = JobToProto(done, false, {}).status();
  EXPECT_EQ(finished.state(), v1::JOB_STATE_DONE);
  EXPECT_EQ(finished.consumed_in_epoch(), 20);
  EXPECT_EQ(finished.ranks(0).consumed(), 10);
}

TEST(JobReportTest, ALeaseNamesItsShardOrItsWindowsShards) {
  JobData job = MakeJob();
  LeaseEntry lease;
  lease.lease_id = "j/e0/f5";
  lease.fence = 5;
  lease.job = "j";
  lease.rank = 1;
  lease.shard_index = 2;
  lease.begin = 3;
  lease.end = 8;
  lease.sequence = 2;
  lease.data_server = "10.0.0.1:1";
  lease.expires_at = absl::FromUnixMillis(1234);
  v1::Lease out = LeaseToProto(lease, job, {});
  EXPECT_EQ(out.lease_id(), "j/e0/f5");
  EXPECT_EQ(out.rank(), 1);
  ASSERT_TRUE(out.unit().has_shard());
  EXPECT_EQ(out.unit().shard().shard_index(), 2);
  EXPECT_EQ(out.unit().shard().url(), "/d/2.tar");
  EXPECT_EQ(out.unit().shard().size_bytes(), 1002);
  EXPECT_EQ(out.unit().shard().checksum(), "sha256:2");
  EXPECT_EQ(out.unit().begin(), 3);
  EXPECT_EQ(out.unit().end(), 8);
  EXPECT_EQ(out.data_server(), "10.0.0.1:1");
  EXPECT_EQ(out.expires_at_unix_ms(), 1234);
  EXPECT_TRUE(out.token().empty());

  // Without a world size a lease names no rank; a window unit names the
  // window's shards in order.
  job.spec.set_world_size(0);
  job.options.shuffle = true;
  job.options.shuffle_window = 2;
  ShuffleWindow window;
  window.shards = {2, 0};
  window.order_seed = 99;
  lease.shard_index = 1;
  out = LeaseToProto(lease, job, {ShuffleWindow{}, window});
  EXPECT_EQ(out.rank(), -1);
  ASSERT_TRUE(out.unit().has_window());
  EXPECT_FALSE(out.unit().has_shard());
  EXPECT_EQ(out.unit().window().window_index(), 1);
  EXPECT_EQ(out.unit().window().window_order(), 99u);
  ASSERT_EQ(out.unit().window().pieces_size(), 2);
  EXPECT_EQ(out.unit().window().pieces(0).url(), "/d/2.tar");
  EXPECT_EQ(out.unit().window().pieces(1).url(), "/d/0.tar");
}

}  // namespace
}  // namespace sluice
