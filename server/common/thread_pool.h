// A fixed-size pool of worker threads running closures in FIFO order.
// Thread-safe. The destructor runs what is queued, then joins.
#ifndef SLUICE_SERVER_COMMON_THREAD_POOL_H_
#define SLUICE_SERVER_COMMON_THREAD_POOL_H_

#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace sluice {

class ThreadPool {
 public:
  // 0 threads = one per usable core (UsableCores: the affinity mask and the
  // cgroup CPU quota).
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  void Schedule(std::function<void()> task);
  int size() const { return static_cast<int>(threads_.size()); }

 private:
  void Work();
  absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace sluice

#endif  // SLUICE_SERVER_COMMON_THREAD_POOL_H_
