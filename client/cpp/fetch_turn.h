// The Reader's turn rule: one stream per data server carries data at a time.
//
// A unit's stream opens once every earlier unit routed to the same data
// server is about to finish fetching: its newest batch was at least as
// large as what it still lacks, so its next batch is probably its last and
// opening the next stream overlaps only that batch. Concurrent streams from
// one client to one server only compete for the same cores and connection
// (one stream already keeps the server's decode pool busy), and data fetched
// far ahead of delivery goes cold in memory. Earlier units are delivered
// first, so a unit never waits on one that waits on it. Units on different
// data servers stream in parallel.
#ifndef SLUICE_CLIENT_CPP_FETCH_TURN_H_
#define SLUICE_CLIENT_CPP_FETCH_TURN_H_

#include <cstdint>
#include <string_view>
#include <vector>

namespace sluice::client_internal {

// A held unit as the rule sees it.
struct FetchTurnView {
  int64_t order = 0;               // grant order
  std::string_view data_server;    // the lease's
  bool streaming = false;          // fetching now: not done, failed, dropped
                                   // or waiting to be re-routed
  int64_t remaining = 0;           // samples still to fetch
  int64_t last_batch_samples = 0;  // newest batch's size; 0 before the first
};

// Whether `unit`'s stream may open, given the units held (which may include
// `unit` itself).
bool FetchMayStart(const FetchTurnView& unit,
                   const std::vector<FetchTurnView>& held);

}  // namespace sluice::client_internal

#endif  // SLUICE_CLIENT_CPP_FETCH_TURN_H_
