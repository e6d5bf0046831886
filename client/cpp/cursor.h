// Resume cursors (G7): the one a Reader gives for its own position, and the
// merge of every rank's (and worker's) into one.
#ifndef SLUICE_CLIENT_CPP_CURSOR_H_
#define SLUICE_CLIENT_CPP_CURSOR_H_

#include <cstdint>
#include <string>
#include <vector>

#include "sluice/v1/coordinator.pb.h"

namespace sluice::client_internal {

// Where one Reader stands: `consumed` samples of `epoch` handed out by
// (rank, worker) of a world of `world_size` ranks with `num_workers`
// workers each (0 or 1: no workers).
struct ReaderPosition {
  std::string job;
  int64_t epoch = 0;
  int32_t world_size = 0;
  int32_t rank = 0;
  int32_t worker = 0;
  int32_t num_workers = 0;
  int64_t consumed = 0;
  // A job with sources: their names, "" for one not seen yet.
  std::vector<std::string> source_names;
};

// The cursor of one Reader: its own entry set, every other -1 (unknown),
// for MergeCursors to fill in from the others' cursors.
v1::Cursor PositionCursor(const ReaderPosition& position);

}  // namespace sluice::client_internal

#endif  // SLUICE_CLIENT_CPP_CURSOR_H_
