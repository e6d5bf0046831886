// DecodeMemoryBudget: bounds the memory of samples being decoded, across
// every stream of a data server (--max_decode_memory).
//
// A stream reserves a sample's estimated decode memory before the sample
// goes to the decoding pool and gives it back once the sample is framed
// into a message. Requests wait per flow (a job), in the order its streams
// asked, so a stream's samples are granted in its own order: every granted
// sample's predecessors are granted too, so granted memory always comes
// back (a sample waiting for memory never sits behind one that waits for
// it). When memory frees, the flow holding the least memory for its weight
// (JobSpec.weight; ties to the request asked first) is granted its next
// request if it fits; if it does not, nothing is granted until more memory
// frees, so a large request is never overtaken for ever. A greedy job's
// queued samples therefore do not hold back a light job's, which gets its
// share of the memory as of the decoding threads (fair_pool.h). A request
// larger than the whole budget is granted when nothing else is reserved, so
// one oversized sample still decodes, alone.
#ifndef SLUICE_SERVER_DATASERVER_DECODE_BUDGET_H_
#define SLUICE_SERVER_DATASERVER_DECODE_BUDGET_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace sluice::dataserver {

class DecodeMemoryBudget {
 public:
  // capacity <= 0: no bound (every request is granted at once).
  explicit DecodeMemoryBudget(int64_t capacity) : capacity_(capacity) {}

  // Reserves `bytes` for `flow` (of `weight`; below 1 counts as 1) and
  // calls `granted` -- at once on this thread when they fit and nobody is
  // waiting, else later, on the thread of the Release that frees enough
  // (never under a lock of this class).
  void Reserve(absl::string_view flow, int32_t weight, int64_t bytes,
               std::function<void()> granted);
  void Release(absl::string_view flow, int64_t bytes);
  // The unnamed flow, weight 1.
  void Reserve(int64_t bytes, std::function<void()> granted) {
    Reserve("", 1, bytes, std::move(granted));
  }
  void Release(int64_t bytes) { Release("", bytes); }

  int64_t capacity() const { return capacity_; }
  int64_t in_use() const;
  // The most ever reserved at once.
  int64_t peak() const;
  // Requests that had to wait.
  int64_t waits() const;

 private:
  struct Waiter {
    int64_t bytes;
    uint64_t order;  // when it was asked, over all flows
    std::function<void()> granted;
  };
  struct Flow {
    int32_t weight = 1;
    int64_t in_use = 0;
    std::deque<Waiter> waiting;
  };
  bool FitsLocked(int64_t bytes) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Grants what the rule above allows now; the callbacks go to `run`.
  void GrantLocked(std::vector<std::function<void()>>* run)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int64_t capacity_;
  mutable absl::Mutex mu_;
  int64_t in_use_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t peak_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t waits_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t waiting_ ABSL_GUARDED_BY(mu_) = 0;  // requests, over all flows
  uint64_t next_order_ ABSL_GUARDED_BY(mu_) = 0;
  // Flows holding memory or waiting for it.
  absl::flat_hash_map<std::string, Flow> flows_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sluice::dataserver

#endif  // SLUICE_SERVER_DATASERVER_DECODE_BUDGET_H_
