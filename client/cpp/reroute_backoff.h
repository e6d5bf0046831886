// How long a Reader waits before re-routing a unit whose stream failed.
//
// The more streams of one shard from one data server failed in a row, the
// longer the wait: the first failure re-routes at once, the second after
// `initial`, then doubling up to `max`. A shard a server cannot serve
// (missing there, unreadable) thus never becomes a grant/re-route loop as
// fast as the machine allows. A batch received from that server for that
// shard ends the run of failures.
//
// Not thread-safe: the Reader guards it with its state mutex.
#ifndef SLUICE_CLIENT_CPP_REROUTE_BACKOFF_H_
#define SLUICE_CLIENT_CPP_REROUTE_BACKOFF_H_

#include <map>
#include <string>
#include <utility>

#include "absl/time/time.h"

namespace sluice::client_internal {

class RerouteBackoff {
 public:
  static constexpr absl::Duration kInitial = absl::Milliseconds(50);
  static constexpr absl::Duration kMax = absl::Seconds(2);

  explicit RerouteBackoff(absl::Duration initial = kInitial,
                          absl::Duration max = kMax)
      : initial_(initial), max_(max) {}

  struct Decision {
    int failures_in_a_row = 0;
    absl::Duration wait;  // before re-routing; zero for the first
    bool log = false;     // the first failure and every tenth
  };
  // A stream of `shard` from `data_server` failed.
  Decision Failed(const std::string& data_server, const std::string& shard);
  // A batch of `shard` arrived from `data_server`.
  void Succeeded(const std::string& data_server, const std::string& shard);

 private:
  const absl::Duration initial_;
  const absl::Duration max_;
  std::map<std::pair<std::string, std::string>, int> failures_;
};

}  // namespace sluice::client_internal

#endif  // SLUICE_CLIENT_CPP_REROUTE_BACKOFF_H_
