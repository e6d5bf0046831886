// DecodeMemoryBudget: bounds the memory of samples being decoded, across
// every stream of a data server (--max_decode_memory).
//
// A stream reserves a sample's estimated decode memory before the sample
// goes to the decoding pool and gives it back once the sample is framed
// into a message. Reservations are granted strictly in the order they were
// asked for, so a stream's samples are granted in its own order: every
// granted sample's predecessors are granted too, so granted memory always
// comes back (a sample waiting for memory never sits behind one that waits
// for it). A request larger than the whole budget is granted when nothing
// else is reserved, so one oversized sample still decodes, alone.
#ifndef SLUICE_SERVER_DATASERVER_DECODE_BUDGET_H_
#define SLUICE_SERVER_DATASERVER_DECODE_BUDGET_H_

#include <cstdint>
#include <deque>
#include <functional>

#include "absl/synchronization/mutex.h"

namespace sluice::dataserver {

class DecodeMemoryBudget {
 public:
  // capacity <= 0: no bound (every request is granted at once).
  explicit DecodeMemoryBudget(int64_t capacity) : capacity_(capacity) {}

  // Reserves `bytes` and calls `granted` -- at once on this thread when
  // they fit and nobody is waiting, else later, on the thread of the
  // Release that frees enough (never under a lock of this class).
  void Reserve(int64_t bytes, std::function<void()> granted);
  void Release(int64_t bytes);

  int64_t capacity() const { return capacity_; }
  int64_t in_use() const;
  // The most ever reserved at once.
  int64_t peak() const;
  // Requests that had to wait.
  int64_t waits() const;

 private:
  struct Waiter {
    int64_t bytes;
    std::function<void()> granted;
  };
  bool FitsLocked(int64_t bytes) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int64_t capacity_;
  mutable absl::Mutex mu_;
  int64_t in_use_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t peak_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t waits_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<Waiter> waiting_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sluice::dataserver

#endif  // SLUICE_SERVER_DATASERVER_DECODE_BUDGET_H_
