#include "client/cpp/reroute_backoff.h"

#include "server/common/backoff.h"

namespace sluice::client_internal {

RerouteBackoff::Decision RerouteBackoff::Failed(const std::string& data_server,
                                                const std::string& shard) {
  Decision d;
  d.failures_in_a_row = ++failures_[{data_server, shard}];
  d.wait = d.failures_in_a_row == 1
               ? absl::ZeroDuration()
               : Backoff::Nth(initial_, max_, d.failures_in_a_row - 1);
  d.log = d.failures_in_a_row == 1 || d.failures_in_a_row % 10 == 0;
  return d;
}

void RerouteBackoff::Succeeded(const std::string& data_server,
                               const std::string& shard) {
  if (!failures_.empty()) failures_.erase({data_server, shard});
}

}  // namespace sluice::client_internal
