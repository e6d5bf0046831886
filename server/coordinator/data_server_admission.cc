#include "server/coordinator/data_server_admission.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "server/common/lease_token.h"
#include "server/common/pool_name.h"
#include "server/common/quote.h"
#include "server/common/status_macros.h"
#include "server/coordinator/coordinator_service_internal.h"

namespace sluice {

using coordinator_internal::Invalid;
using coordinator_internal::kMaxDataServerCapacity;
using coordinator_internal::kMaxFenceSeen;
using coordinator_internal::kMaxIdBytes;

absl::Status CheckDataServerRegistration(const v1::RegisterDataServer& r,
                                         absl::string_view lease_secret) {
  // Who is asking first: an unauthenticated caller learns nothing more.
  if (!lease_secret.empty()) {
    RETURN_IF_ERROR(
        VerifyRegistration(r.address(), r.credential(), lease_secret));
  }
  if (r.address().empty() || r.address().size() > kMaxIdBytes ||
      r.address().find(':') == std::string::npos) {
    return Invalid(
        "register.address",
        absl::StrCat(QuotePrefix(r.address()), " is not host:port (at most ",
                     kMaxIdBytes, " bytes)"));
  }
  if (r.node().size() > kMaxIdBytes) {
    return Invalid("register.node",
                   absl::StrCat(QuotePrefix(r.node()), " is longer than ",
                                kMaxIdBytes, " bytes"));
  }
  if (!ValidPoolName(r.pool())) {
    return Invalid("register.pool", absl::StrCat(QuotePrefix(r.pool()),
                                                 " must be 0-64 characters of "
                                                 "[A-Za-z0-9._-]"));
  }
  if (r.capacity() < 0 || r.capacity() > kMaxDataServerCapacity) {
    return Invalid("register.capacity",
                   absl::StrCat(r.capacity(), " is outside [0, ",
                                kMaxDataServerCapacity, "]"));
  }
  return CheckFenceSeen("register.max_fence_seen", r.max_fence_seen());
}

absl::Status CheckFenceSeen(absl::string_view field, uint64_t max_fence_seen) {
  if (max_fence_seen > kMaxFenceSeen) {
    return Invalid(field, absl::StrCat(max_fence_seen,
                                       " is beyond the fence space (at most ",
                                       kMaxFenceSeen, ")"));
  }
  return absl::OkStatus();
}

}  // namespace sluice
