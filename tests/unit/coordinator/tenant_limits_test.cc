#include "server/coordinator/tenant_limits.h"

#include <map>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace sluice {
namespace {

using ::sluice::testing::StatusIs;
using ::testing::HasSubstr;

std::map<std::string, JobData> Jobs(
    const std::map<std::string, std::string>& tenant_of) {
  std::map<std::string, JobData> jobs;
  for (const auto& [name, tenant] : tenant_of) {
    jobs[name].spec.set_name(name);
    jobs[name].spec.set_tenant(tenant);
  }
  return jobs;
}

TEST(TenantLimitsTest, JobsAreCountedPerTenant) {
  const auto jobs = Jobs({{"a1", "a"}, {"a2", "a"}, {"b1", "b"}, {"d", ""}});
  EXPECT_THAT(CheckTenantJobs(jobs, "a", 2),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("tenant \"a\" has 2 jobs; the limit is 2 "
                                 "(--max_jobs_per_tenant)")));
  EXPECT_OK(CheckTenantJobs(jobs, "a", 3));
  EXPECT_OK(CheckTenantJobs(jobs, "b", 2));
  EXPECT_OK(CheckTenantJobs(jobs, "new", 1));
  EXPECT_THAT(CheckTenantJobs(jobs, "", 1),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("the default tenant has 1 jobs")));
  EXPECT_OK(CheckTenantJobs(jobs, "a", 0));  // no limit
}

TEST(TenantLimitsTest, SessionsAreCountedOverTheTenantsJobs) {
  const auto jobs = Jobs({{"a1", "a"}, {"a2", "a"}, {"b1", "b"}});
  const std::map<std::string, int64_t> open = {
      {"a1", 2}, {"a2", 1}, {"b1", 5}, {"gone", 9}};
  EXPECT_THAT(CheckTenantSessions(jobs, open, "a", 3),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("tenant \"a\" has 3 open sessions over its "
                                 "jobs; the limit is 3 "
                                 "(--max_sessions_per_tenant)")));
  EXPECT_OK(CheckTenantSessions(jobs, open, "a", 4));
  EXPECT_OK(CheckTenantSessions(jobs, open, "b", 6));
  EXPECT_OK(CheckTenantSessions(jobs, open, "a", 0));  // no limit
}

}  // namespace
}  // namespace sluice
