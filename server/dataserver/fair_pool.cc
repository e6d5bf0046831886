#include "server/dataserver/fair_pool.h"

#include <algorithm>
#include <utility>

#include "server/common/usable_cores.h"

namespace sluice::dataserver {

FairPool::FairPool(int threads) {
  if (threads <= 0) threads = UsableCores();
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Work(); });
}

FairPool::~FairPool() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& t : threads_) t.join();
}

void FairPool::Schedule(absl::string_view flow, int32_t weight,
                        std::function<void()> task) {
  absl::MutexLock lock(&mu_);
  auto it = flows_.find(flow);
  if (it == flows_.end()) it = flows_.emplace(std::string(flow), Flow()).first;
  Flow& f = it->second;
  Task t;
  t.start = std::max(virtual_time_, f.last_finish);
  t.order = next_order_++;
  t.run = std::move(task);
  f.last_finish = t.start + 1.0 / std::max(weight, 1);
  f.waiting.push_back(std::move(t));
  ++waiting_;
}

FairPool::Flow* FairPool::NextLocked() {
  Flow* best = nullptr;
  for (auto it = flows_.begin(); it != flows_.end();) {
    Flow& f = it->second;
    if (f.waiting.empty()) {
      // Idle, and its finish tag is behind the clock: nothing to remember.
      if (f.last_finish <= virtual_time_) {
        it = flows_.erase(it);
      } else {
        ++it;
      }
      continue;
    }
    const Task& head = f.waiting.front();
    if (best == nullptr || head.start < best->waiting.front().start ||
        (head.start == best->waiting.front().start &&
         head.order < best->waiting.front().order)) {
      best = &f;
    }
    ++it;
  }
  return best;
}

void FairPool::Work() {
  while (true) {
    std::function<void()> task;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](FairPool* p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(p->mu_) {
            return p->stopping_ || p->waiting_ > 0;
          },
          this));
      if (waiting_ == 0) return;  // stopping and drained
      Flow* next = NextLocked();
      Task& head = next->waiting.front();
      virtual_time_ = std::max(virtual_time_, head.start);
      task = std::move(head.run);
      next->waiting.pop_front();
      --waiting_;
    }
    task();
  }
}

}  // namespace sluice::dataserver
