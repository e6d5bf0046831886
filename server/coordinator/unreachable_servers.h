// The data servers one reader could not reach, as it reported them
// (Reroute with failed_data_server): the coordinator passes them over when
// routing that reader's grants, while other readers keep reading from them.
// A network can cut one trainer host from one data server and no other
// (a partition, a firewall rule, a broken route); the server stays live in
// the registry, since it heartbeats to the coordinator, so global liveness
// alone would keep sending that trainer's units where its streams can only
// fail.
//
// A server is passed over for `initial` after the reader's first report,
// then routed to again to see whether it is back: a failure from there
// doubles the wait, up to `max`; samples read from it (a Progress or
// Complete of a lease it served) forget it.
//
// Not thread-safe: the coordinator keeps one per session, under its lock.
#ifndef SLUICE_SERVER_COORDINATOR_UNREACHABLE_SERVERS_H_
#define SLUICE_SERVER_COORDINATOR_UNREACHABLE_SERVERS_H_

#include <map>
#include <string>

#include "absl/time/time.h"

namespace sluice {

class UnreachableServers {
 public:
  static constexpr absl::Duration kInitial = absl::Seconds(10);
  static constexpr absl::Duration kMax = absl::Minutes(3);

  explicit UnreachableServers(absl::Duration initial = kInitial,
                              absl::Duration max = kMax)
      : initial_(initial), max_(max) {}

  // The reader failed to reach `address` at `now`: passed over until the
  // returned time.
  absl::Time Failed(const std::string& address, absl::Time now);
  // The reader read samples from `address`: no longer passed over.
  void Reached(const std::string& address) { servers_.erase(address); }
  // Whether grants for this reader pass `address` over at `now`.
  bool Avoids(const std::string& address, absl::Time now) const;
  bool empty() const { return servers_.empty(); }

 private:
  struct Mark {
    absl::Time until;
    absl::Duration wait;
  };
  absl::Duration initial_;
  absl::Duration max_;
  std::map<std::string, Mark> servers_;
};

}  // namespace sluice

#endif  // SLUICE_SERVER_COORDINATOR_UNREACHABLE_SERVERS_H_
