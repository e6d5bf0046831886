// sluice/jobs.h against a real coordinator: a job's figures, and the job copy
// a run with another number of ranks reads.
#include "sluice/jobs.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "tests/testing/coordinator_client.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/test_cluster.h"

namespace sluice {
namespace {

using ::testing::HasSubstr;

class JobsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (int s = 0; s < 3; ++s) {
      urls_.push_back(cluster_.WriteShard(
          std::to_string(s), 10, [&](testing::TarWriter& tar, int i) {
            tar.File(absl::StrCat("s", s, "_", i, ".cls"), std::to_string(i));
          }));
    }
    ASSERT_TRUE(cluster_.StartCoordinator().ok());
    query_.coordinator = cluster_.coordinator().grpc_address;
    query_.timeout = absl::Seconds(30);
  }

  void CreateJob(const std::string& name, int world) {
    v1::JobSpec spec;
    spec.set_name(name);
    for (const std::string& url : urls_) {
      auto* s = spec.mutable_manifest()->add_shards();
      s->set_url(url);
      s->set_num_samples(10);
    }
    spec.set_world_size(world);
    const absl::Status created =
        testing::CreateJob(cluster_.coordinator().grpc_address, spec);
    ASSERT_TRUE(created.ok()) << created;
  }

  testing::TempDir dir_;
  testing::TestCluster cluster_{dir_.path()};
  std::vector<std::string> urls_;
  JobQuery query_;
};

TEST_F(JobsTest, DescribeJobGivesTheSamplesEachRankGets) {
  CreateJob("two-ranks", 2);
  absl::StatusOr<v1::Job> job = DescribeJob(query_, "two-ranks");
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->spec().world_size(), 2);
  EXPECT_EQ(job->status().samples_per_rank(), 15);
}

TEST_F(JobsTest, ARunOfTheJobsWorldSizeReadsTheJobItself) {
  CreateJob("fixed", 2);
  CreateJob("any", 0);
  absl::StatusOr<std::string> same = JobForWorldSize(query_, "fixed", 2);
  ASSERT_TRUE(same.ok()) << same.status();
  EXPECT_EQ(*same, "fixed");
  absl::StatusOr<std::string> any = JobForWorldSize(query_, "any", 5);
  ASSERT_TRUE(any.ok()) << any.status();
  EXPECT_EQ(*any, "any");
  EXPECT_FALSE(DescribeJob(query_, "any.w5").ok());
}

TEST_F(JobsTest, ARunOfAnotherWorldSizeReadsItsCopyCreatedOnce) {
  CreateJob("elastic", 2);
  for (int attempt = 0; attempt < 2;
       ++attempt) {  // the copy exists the 2nd time
    absl::StatusOr<std::string> reading = JobForWorldSize(query_, "elastic", 3);
    ASSERT_TRUE(reading.ok()) << reading.status();
    EXPECT_EQ(*reading, "elastic.w3");
  }
  absl::StatusOr<v1::Job> copy = DescribeJob(query_, "elastic.w3");
  ASSERT_TRUE(copy.ok()) << copy.status();
  EXPECT_EQ(copy->spec().world_size(), 3);
  EXPECT_EQ(copy->status().samples_per_rank(), 10);
}

TEST_F(JobsTest, ErrorsNameTheJobAndTheRun) {
  absl::StatusOr<v1::Job> unknown = DescribeJob(query_, "nope");
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(unknown.status().message(), HasSubstr("sluice job nope: "));
  absl::StatusOr<std::string> run = JobForWorldSize(query_, "nope", 2);
  EXPECT_EQ(run.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(run.status().message(),
              HasSubstr("sluice job nope for a run of 2 ranks: "));
  CreateJob("real", 2);
  EXPECT_EQ(JobForWorldSize(query_, "real", 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  JobQuery no_coordinator;
  EXPECT_EQ(DescribeJob(no_coordinator, "real").status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace sluice
