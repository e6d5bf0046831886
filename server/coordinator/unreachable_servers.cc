#include "server/coordinator/unreachable_servers.h"

#include <algorithm>

namespace sluice {

absl::Time UnreachableServers::Failed(const std::string& address,
                                      absl::Time now) {
  auto [it, added] = servers_.try_emplace(address);
  Mark& m = it->second;
  if (added) {
    m.wait = initial_;
  } else if (now >= m.until) {
    // Routed there again after the wait, and failed again.
    m.wait = std::min(m.wait * 2, max_);
  }
  // A failure reported while still passed over (a unit granted there
  // before the first report) does not lengthen the wait.
  m.until = std::max(m.until, now + m.wait);
  return m.until;
}

bool UnreachableServers::Avoids(const std::string& address,
                                absl::Time now) const {
  auto it = servers_.find(address);
  return it != servers_.end() && now < it->second.until;
}

}  // namespace sluice
