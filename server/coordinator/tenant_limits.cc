#include "server/coordinator/tenant_limits.h"

#include "absl/strings/str_cat.h"
#include "server/common/quote.h"

namespace sluice {
namespace {

std::string TenantName(const std::string& tenant) {
  return tenant.empty() ? "the default tenant"
                        : absl::StrCat("tenant ", QuotePrefix(tenant));
}

}  // namespace

absl::Status CheckTenantJobs(const std::map<std::string, JobData>& jobs,
                             const std::string& tenant, int64_t limit) {
  if (limit <= 0) return absl::OkStatus();
  int64_t held = 0;
  for (const auto& [name, job] : jobs) held += job.spec.tenant() == tenant;
  if (held < limit) return absl::OkStatus();
  return absl::ResourceExhaustedError(
      absl::StrCat(TenantName(tenant), " has ", held, " jobs; the limit is ",
                   limit, " (--max_jobs_per_tenant)"));
}

absl::Status CheckTenantSessions(const std::map<std::string, JobData>& jobs,
                                 const std::map<std::string, int64_t>& open,
                                 const std::string& tenant, int64_t limit) {
  if (limit <= 0) return absl::OkStatus();
  int64_t sessions = 0;
  for (const auto& [job, count] : open) {
    auto it = jobs.find(job);
    if (it != jobs.end() && it->second.spec.tenant() == tenant)
      sessions += count;
  }
  if (sessions < limit) return absl::OkStatus();
  return absl::ResourceExhaustedError(
      absl::StrCat(TenantName(tenant), " has ", sessions,
                   " open sessions over its jobs; the limit is ", limit,
                   " (--max_sessions_per_tenant)"));
}

}  // namespace sluice
