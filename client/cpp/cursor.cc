#include "client/cpp/cursor.h"

#include <algorithm>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "sluice/reader.h"

namespace sluice {
namespace client_internal {

v1::Cursor PositionCursor(const ReaderPosition& p) {
  v1::Cursor cursor;
  cursor.set_job(p.job);
  cursor.set_epoch(p.epoch);
  for (const std::string& name : p.source_names) cursor.add_sources(name);
  cursor.set_world_size(p.world_size);
  const int32_t workers = std::max(p.num_workers, 1);
  for (int32_t r = 0; r < std::max(p.world_size, 1); ++r) {
    cursor.add_consumed_per_rank(r == p.rank && workers == 1 ? p.consumed : -1);
    if (workers == 1) continue;
    cursor.set_workers_per_rank(workers);
    for (int32_t w = 0; w < workers; ++w) {
      cursor.add_consumed_per_worker(r == p.rank && w == p.worker ? p.consumed
                                                                  : -1);
    }
  }
  return cursor;
}

}  // namespace client_internal

absl::StatusOr<v1::Cursor> MergeCursors(
    const std::vector<v1::Cursor>& cursors) {
  if (cursors.empty())
    return absl::InvalidArgumentError("MergeCursors: no cursors");
  v1::Cursor merged = cursors.front();
  for (size_t i = 1; i < cursors.size(); ++i) {
    const v1::Cursor& c = cursors[i];
    if (c.job() != merged.job() || c.epoch() != merged.epoch() ||
        c.world_size() != merged.world_size() ||
        c.consumed_per_rank_size() != merged.consumed_per_rank_size() ||
        c.workers_per_rank() != merged.workers_per_rank() ||
        c.consumed_per_worker_size() != merged.consumed_per_worker_size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "MergeCursors: cursor ", i, " is job ", c.job(), " epoch ", c.epoch(),
          " world_size ", c.world_size(), " workers_per_rank ",
          c.workers_per_rank(), ", cursor 0 is job ", merged.job(), " epoch ",
          merged.epoch(), " world_size ", merged.world_size(),
          " workers_per_rank ", merged.workers_per_rank()));
    }
    // Source names: each cursor knows those its reader's leases named.
    for (int k = 0; k < c.sources_size(); ++k) {
      if (k >= merged.sources_size()) merged.add_sources();
      const std::string& theirs = c.sources(k);
      if (theirs.empty()) continue;
      if (!merged.sources(k).empty() && merged.sources(k) != theirs) {
        return absl::InvalidArgumentError(absl::StrCat(
            "MergeCursors: cursor ", i, " names source ", k, " \"", theirs,
            "\", another cursor \"", merged.sources(k), "\""));
      }
      merged.set_sources(k, theirs);
    }
    for (int r = 0; r < c.consumed_per_worker_size(); ++r) {
      const int64_t mine = merged.consumed_per_worker(r),
                    theirs = c.consumed_per_worker(r);
      if (theirs < 0) continue;
      if (mine >= 0 && mine != theirs) {
        return absl::InvalidArgumentError(
            absl::StrCat("MergeCursors: worker slot ", r, " has two counts, ",
                         mine, " and ", theirs));
      }
      merged.set_consumed_per_worker(r, theirs);
    }
    for (int r = 0; r < c.consumed_per_rank_size(); ++r) {
      const int64_t mine = merged.consumed_per_rank(r),
                    theirs = c.consumed_per_rank(r);
      if (theirs < 0) continue;
      if (mine >= 0 && mine != theirs) {
        return absl::InvalidArgumentError(absl::StrCat("MergeCursors: rank ", r,
                                                       " has two counts, ",
                                                       mine, " and ", theirs));
      }
      merged.set_consumed_per_rank(r, theirs);
    }
  }
  // With workers, a rank's count is the sum of its workers' once all are known.
  const int32_t workers = merged.workers_per_rank();
  for (int r = 0; workers > 1 && r < merged.consumed_per_rank_size(); ++r) {
    int64_t sum = 0;
    for (int w = 0; w < workers && sum >= 0; ++w) {
      const int64_t n = merged.consumed_per_worker(r * workers + w);
      sum = n < 0 ? -1 : sum + n;
    }
    merged.set_consumed_per_rank(r, sum);
  }
  return merged;
}

}  // namespace sluice
