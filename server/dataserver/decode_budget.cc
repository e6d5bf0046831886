#include "server/dataserver/decode_budget.h"

#include <algorithm>
#include <utility>
#include <vector>

namespace sluice::dataserver {

bool DecodeMemoryBudget::FitsLocked(int64_t bytes) const {
  return capacity_ <= 0 || in_use_ == 0 || in_use_ + bytes <= capacity_;
}

void DecodeMemoryBudget::Reserve(absl::string_view flow, int32_t weight,
                                 int64_t bytes, std::function<void()> granted) {
  bytes = std::max<int64_t>(bytes, 0);
  std::vector<std::function<void()>> run;
  {
    absl::MutexLock lock(&mu_);
    Flow& f = flows_[flow];
    f.weight = std::max(weight, 1);
    if (waiting_ == 0 && FitsLocked(bytes)) {
      f.in_use += bytes;
      in_use_ += bytes;
      peak_ = std::max(peak_, in_use_);
      run.push_back(std::move(granted));
    } else {
      ++waits_;
      ++waiting_;
      f.waiting.push_back({bytes, next_order_++, std::move(granted)});
      GrantLocked(&run);
    }
  }
  for (auto& g : run) g();
}

void DecodeMemoryBudget::Release(absl::string_view flow, int64_t bytes) {
  std::vector<std::function<void()>> run;
  {
    absl::MutexLock lock(&mu_);
    bytes = std::max<int64_t>(bytes, 0);
    in_use_ -= bytes;
    if (auto it = flows_.find(flow); it != flows_.end()) {
      it->second.in_use -= bytes;
      if (it->second.in_use <= 0 && it->second.waiting.empty())
        flows_.erase(it);
    }
    GrantLocked(&run);
  }
  for (auto& g : run) g();
}

void DecodeMemoryBudget::GrantLocked(std::vector<std::function<void()>>* run) {
  while (waiting_ > 0) {
    // The waiting flow with the least memory for its weight.
    Flow* next = nullptr;
    for (auto& [name, f] : flows_) {
      if (f.waiting.empty()) continue;
      if (next == nullptr) {
        next = &f;
        continue;
      }
      // f.in_use / f.weight against next's, without dividing.
      const int64_t mine = f.in_use * next->weight;
      const int64_t theirs = next->in_use * f.weight;
      if (mine < theirs ||
          (mine == theirs &&
           f.waiting.front().order < next->waiting.front().order)) {
        next = &f;
      }
    }
    if (next == nullptr || !FitsLocked(next->waiting.front().bytes)) return;
    Waiter w = std::move(next->waiting.front());
    next->waiting.pop_front();
    --waiting_;
    next->in_use += w.bytes;
    in_use_ += w.bytes;
    peak_ = std::max(peak_, in_use_);
    run->push_back(std::move(w.granted));
  }
}

int64_t DecodeMemoryBudget::in_use() const {
  absl::MutexLock lock(&mu_);
  return in_use_;
}

int64_t DecodeMemoryBudget::peak() const {
  absl::MutexLock lock(&mu_);
  return peak_;
}

int64_t DecodeMemoryBudget::waits() const {
  absl::MutexLock lock(&mu_);
  return waits_;
}

}  // namespace sluice::dataserver
