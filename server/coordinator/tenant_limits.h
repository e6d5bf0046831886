// Per-tenant limits (JobSpec.tenant): how many jobs a tenant may hold and
// how many sessions may be open over all its jobs. Pure functions of the
// coordinator's jobs and open-session counts, so the service asks them
// under its lock and the tests ask them directly.
#ifndef SLUICE_SERVER_COORDINATOR_TENANT_LIMITS_H_
#define SLUICE_SERVER_COORDINATOR_TENANT_LIMITS_H_

#include <cstdint>
#include <map>
#include <string>

#include "absl/status/status.h"
#include "server/coordinator/coordinator_state.h"

namespace sluice {

// RESOURCE_EXHAUSTED naming the tenant and the limit when `tenant` already
// holds `limit` jobs of `jobs` (another job would pass it); OK otherwise or
// when `limit` is 0 (none).
absl::Status CheckTenantJobs(const std::map<std::string, JobData>& jobs,
                             const std::string& tenant, int64_t limit);

// RESOURCE_EXHAUSTED naming the tenant and the limit when the sessions open
// over `tenant`'s jobs (`open`: open sessions by job) already number
// `limit`; OK otherwise or when `limit` is 0 (none).
absl::Status CheckTenantSessions(const std::map<std::string, JobData>& jobs,
                                 const std::map<std::string, int64_t>& open,
                                 const std::string& tenant, int64_t limit);

}  // namespace sluice

#endif  // SLUICE_SERVER_COORDINATOR_TENANT_LIMITS_H_
