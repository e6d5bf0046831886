// CoordinatorService: Limits, defaults and fences: what the service refuses or
// fills in.
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

using ::sluice::testing::CoordinatorServiceTest;
using ::sluice::testing::FakeClock;
using ::sluice::testing::Hello;
using ::sluice::testing::OpenAndWantOne;
using ::sluice::testing::RecordingSink;
using ::sluice::testing::SimTrainer;
using ::sluice::testing::Spec;
using ::sluice::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::Optional;

// Opens a session per entry of `jobs` (a Hello from rank 0, trainer t1,
// t2, ...); returns, per session, the status it was ended with, if any.
std::vector<std::optional<absl::Status>> HelloEach(
    CoordinatorService& service, std::initializer_list<const char*> jobs) {
  std::vector<std::optional<absl::Status>> ended;
  for (const char* job : jobs) {
    auto sink = std::make_shared<RecordingSink>();
    service.OnMessage(service.OpenSession(sink),
                      Hello(job, 0, absl::StrCat("t", ended.size() + 1)));
    ended.push_back(sink->finished);
  }
  return ended;
}

// The planning limits are the operator's (flags): lowered, they apply.
TEST(CoordinatorLimitsTest, JobLimitsComeFromTheOptions) {
  FakeClock clock;
  CoordinatorOptions options;
  options.clock = &clock;
  options.job_limits.max_world_size = 2;
  options.job_limits.max_units_per_epoch = 5;
  auto service = CoordinatorService::Create(options);
  ASSERT_OK(service);
  EXPECT_THAT(
      (*service)->CreateJob(Spec("w", {10}, 3, 1)),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("3 is above the limit of 2 (--max_world_size)")));
  v1::JobSpec units = Spec("u", {10}, 1, 1);
  units.set_max_samples_per_lease(1);
  EXPECT_THAT((*service)->CreateJob(units),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("more than 5 units (--max_units_per_epoch)")));
  units.set_max_samples_per_lease(5);
  EXPECT_OK((*service)->CreateJob(units));
}

TEST(CoordinatorLimitsTest, SessionsPerJobAreCapped) {
  FakeClock clock;
  CoordinatorOptions options;
  options.clock = &clock;
  options.wait_for_data_servers = false;
  options.max_sessions_per_job = 2;
  auto service = CoordinatorService::Create(options);
  ASSERT_OK(service);
  ASSERT_OK((*service)->CreateJob(Spec("j", {10}, 1, 1)));
  ASSERT_OK((*service)->CreateJob(Spec("k", {10}, 1, 1)));
  const auto ended = HelloEach(**service, {"j", "j", "j", "k"});
  EXPECT_FALSE(ended[0].has_value());
  EXPECT_FALSE(ended[1].has_value());
  EXPECT_THAT(ended[2],
              Optional(StatusIs(absl::StatusCode::kResourceExhausted,
                                HasSubstr("job j has 2 open sessions"))));
  EXPECT_FALSE(ended[3].has_value());  // another job's count
}

// Per-tenant limits: the next job, and the next session over a tenant's
// jobs, are refused naming the tenant; other tenants are not affected.
TEST(CoordinatorLimitsTest, TenantsAreCappedInJobsAndSessions) {
  FakeClock clock;
  CoordinatorOptions options;
  options.clock = &clock;
  options.wait_for_data_servers = false;
  options.max_jobs_per_tenant = 2;
  options.max_sessions_per_tenant = 2;
  auto service = CoordinatorService::Create(options);
  ASSERT_OK(service);
  auto spec = [](const char* name, const char* tenant) {
    v1::JobSpec s = Spec(name, {10}, 1, 1);
    s.set_tenant(tenant);
    return s;
  };
  ASSERT_OK((*service)->CreateJob(spec("a1", "a")));
  ASSERT_OK((*service)->CreateJob(spec("a2", "a")));
  EXPECT_THAT((*service)->CreateJob(spec("a3", "a")),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("tenant \"a\" has 2 jobs; the limit is 2")));
  ASSERT_OK((*service)->CreateJob(spec("a1", "a")));  // the same job again
  ASSERT_OK((*service)->CreateJob(spec("b1", "b")));
  EXPECT_THAT(
      (*service)->CreateJob(spec("bad", "a b")),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("spec.tenant")));

  const auto ended = HelloEach(**service, {"a1", "a2", "a1", "b1"});
  EXPECT_FALSE(ended[0].has_value());
  EXPECT_FALSE(ended[1].has_value());
  EXPECT_THAT(ended[2], Optional(StatusIs(
                            absl::StatusCode::kResourceExhausted,
                            HasSubstr("tenant \"a\" has 2 open sessions"))));
  EXPECT_FALSE(ended[3].has_value());  // another tenant's count
}

// A shuffled job without a window gets the default; a window out of range
// is refused naming the field.
TEST_F(CoordinatorServiceTest, ShuffleWindowDefaultsAndLimits) {
  v1::JobSpec spec = Spec("dflt", {3, 3}, 0, 1);
  spec.set_shuffle_window(0);
  auto job = service_->CreateJob(spec);
  ASSERT_OK(job);
  EXPECT_EQ(job->spec().shuffle_window(), 32);
  spec.set_name("neg");
  spec.set_shuffle_window(-1);
  EXPECT_THAT(service_->CreateJob(spec).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("spec.shuffle_window")));
  spec.set_shuffle_window(1025);
  EXPECT_THAT(service_->CreateJob(spec).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("spec.shuffle_window")));
}

// A job's weight travels in every lease it is granted, under the token (a
// reader cannot raise its own share); 0 means 1, and above the limit is
// refused naming the field.
TEST_F(CoordinatorServiceTest, WeightIsInEveryLeaseAndBounded) {
  v1::JobSpec spec = Spec("heavy", {4}, 1, 1);
  spec.set_weight(3);
  ASSERT_OK(service_->CreateJob(spec));
  v1::JobSpec plain = Spec("plain", {4}, 1, 1);
  ASSERT_OK(service_->CreateJob(plain));
  SimTrainer heavy(*service_, "heavy", 0, "t0");
  SimTrainer light(*service_, "plain", 0, "t1");
  ASSERT_FALSE(heavy.held.empty());
  ASSERT_FALSE(light.held.empty());
  EXPECT_EQ(heavy.held.front().weight(), 3);
  EXPECT_EQ(light.held.front().weight(), 1);

  spec.set_name("over");
  spec.set_weight(1001);
  EXPECT_THAT(service_->CreateJob(spec).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("spec.weight: 1001 is outside [0, 1000]")));
  spec.set_weight(-1);
  EXPECT_THAT(
      service_->CreateJob(spec).status(),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("spec.weight")));
}

// A job without a lease TTL of its own follows the coordinator's
// --default_lease_ttl, in the Welcome and in the leases it is granted.
TEST(CoordinatorDefaultTtlTest, AJobWithoutATtlUsesTheCoordinatorsDefault) {
  FakeClock clock;
  CoordinatorOptions options;
  options.clock = &clock;
  options.wait_for_data_servers = false;
  options.default_lease_ttl = absl::Seconds(3);
  auto service = CoordinatorService::Create(options);
  ASSERT_OK(service);
  v1::JobSpec spec = Spec("j", {10}, 1, 1);
  spec.clear_lease_ttl_ms();
  ASSERT_OK((*service)->CreateJob(spec));
  auto sink = std::make_shared<RecordingSink>();
  OpenAndWantOne(**service, sink);
  (*service)->Flush();
  ASSERT_EQ(sink->Count(v1::CoordinatorMessage::kWelcome), 1);
  EXPECT_EQ(sink->inbox[0].welcome().lease_ttl_ms(), 3000);
  const std::vector<v1::Lease> held = sink->TakeGrants();
  ASSERT_EQ(held.size(), 1u);
  EXPECT_EQ(held[0].expires_at_unix_ms(),
            absl::ToUnixMillis(clock.Now() + absl::Seconds(3)));
  EXPECT_EQ((*service)->GetJob("j", false)->spec().lease_ttl_ms(), 0);
}

// Creating a job again with the same spec returns it. A TTL left unset
// matches a job journaled with 10,000 ms for it; another TTL is another spec.
TEST_F(CoordinatorServiceTest, RecreatingAJobWithoutItsTtlReturnsIt) {
  v1::JobSpec spec = Spec("j", {10}, 1, 1);
  spec.set_lease_ttl_ms(10000);
  ASSERT_OK(service_->CreateJob(spec));
  spec.clear_lease_ttl_ms();
  absl::StatusOr<v1::Job> again = service_->CreateJob(spec);
  ASSERT_OK(again);
  EXPECT_EQ(again->spec().lease_ttl_ms(), 10000);
  spec.set_lease_ttl_ms(3000);
  EXPECT_THAT(service_->CreateJob(spec),
              StatusIs(absl::StatusCode::kAlreadyExists,
                       HasSubstr("job j exists with a different spec")));
  v1::JobSpec unset = Spec("k", {10}, 1, 1);
  unset.clear_lease_ttl_ms();
  ASSERT_OK(service_->CreateJob(unset));
  EXPECT_OK(service_->CreateJob(unset));
  unset.set_lease_ttl_ms(10000);
  EXPECT_THAT(service_->CreateJob(unset),
              StatusIs(absl::StatusCode::kAlreadyExists));
}

// A data server claims to have seen fences near 2^64 (only a holder of the
// registration secret can): refused, naming the field. The largest claim
// accepted still leaves grants distinct, increasing fences.
TEST_F(CoordinatorServiceTest, FencesNeverWrapWhateverADataServerClaims) {
  v1::RegisterDataServer r;
  r.set_address("ds:1");
  r.set_max_fence_seen(~uint64_t{0} - 1);
  EXPECT_THAT(service_->CheckRegistration(r),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("register.max_fence_seen")));
  EXPECT_THAT(CheckFenceSeen("heartbeat.max_fence_seen", ~uint64_t{0}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("heartbeat.max_fence_seen")));
  r.set_max_fence_seen(uint64_t{1} << 62);
  EXPECT_OK(service_->CheckRegistration(r));
  service_->RegisterDataServer("ds:1", 1, nullptr, uint64_t{1} << 62);
  v1::JobSpec spec = Spec("j", {10}, 1, 1);
  spec.set_max_samples_per_lease(2);
  ASSERT_OK(service_->CreateJob(spec));
  SimTrainer t(*service_, "j", 0, "t");
  ASSERT_EQ(t.held.size(), 2u);
  EXPECT_EQ(t.held[0].fence(), (uint64_t{1} << 62) + 1);
  EXPECT_EQ(t.held[1].fence(), (uint64_t{1} << 62) + 2);
}

}  // namespace
}  // namespace sluice
