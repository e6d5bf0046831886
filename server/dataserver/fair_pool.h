// FairPool: the data server's reading and decoding threads, shared between
// jobs by weight (JobSpec.weight, carried in each lease).
//
// Every task belongs to a flow (a job) of some weight, and a flow's tasks
// run in the order they were scheduled. Across flows the pool is a
// start-time fair queue: a task gets the start tag S = max(V, F), where V is
// the start tag of the task started last and F the finish tag of its flow's
// previous task, and the finish tag S + 1 / weight; a free thread runs the
// waiting task with the smallest start tag (ties to the task queued first).
// While several flows have tasks waiting, each is started in proportion to
// its weight; a flow with nothing waiting leaves its share to the others
// (work-conserving) and banks no credit for when it returns. Every task
// counts as one unit of work, a read turn and a decode alike.
//
// Thread-safe. The destructor runs what is queued, then joins.
#ifndef SLUICE_SERVER_DATASERVER_FAIR_POOL_H_
#define SLUICE_SERVER_DATASERVER_FAIR_POOL_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace sluice::dataserver {

class FairPool {
 public:
  // 0 threads = one per usable core.
  explicit FairPool(int threads);
  ~FairPool();
  FairPool(const FairPool&) = delete;
  FairPool& operator=(const FairPool&) = delete;

  // Queues `task` in `flow`; a weight below 1 counts as 1. A flow's weight
  // is the one its latest task was scheduled with.
  void Schedule(absl::string_view flow, int32_t weight,
                std::function<void()> task);
  // A task of the unnamed flow, weight 1 (work that belongs to no job).
  void Schedule(std::function<void()> task) {
    Schedule("", 1, std::move(task));
  }

  int size() const { return static_cast<int>(threads_.size()); }

 private:
  struct Task {
    double start = 0;
    uint64_t order = 0;
    std::function<void()> run;
  };
  struct Flow {
    double last_finish = 0;
    std::deque<Task> waiting;
  };
  void Work();
  // The flow whose first waiting task starts next; nullptr when none waits.
  Flow* NextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  // Flows with tasks waiting, and idle ones whose finish tag is still ahead
  // of the virtual time (forgetting them earlier would hand them credit).
  std::map<std::string, Flow, std::less<>> flows_ ABSL_GUARDED_BY(mu_);
  double virtual_time_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_order_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t waiting_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace sluice::dataserver

#endif  // SLUICE_SERVER_DATASERVER_FAIR_POOL_H_
