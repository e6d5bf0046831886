#include "server/dataserver/decode_budget.h"

#include <algorithm>
#include <utility>
#include <vector>

namespace sluice::dataserver {

bool DecodeMemoryBudget::FitsLocked(int64_t bytes) const {
  return capacity_ <= 0 || in_use_ == 0 || in_use_ + bytes <= capacity_;
}

void DecodeMemoryBudget::Reserve(int64_t bytes, std::function<void()> granted) {
  bytes = std::max<int64_t>(bytes, 0);
  {
    absl::MutexLock lock(&mu_);
    if (!waiting_.empty() || !FitsLocked(bytes)) {
      ++waits_;
      waiting_.push_back({bytes, std::move(granted)});
      return;
    }
    in_use_ += bytes;
    peak_ = std::max(peak_, in_use_);
  }
  granted();
}

void DecodeMemoryBudget::Release(int64_t bytes) {
  std::vector<std::function<void()>> run;
  {
    absl::MutexLock lock(&mu_);
    in_use_ -= std::max<int64_t>(bytes, 0);
    while (!waiting_.empty() && FitsLocked(waiting_.front().bytes)) {
      in_use_ += waiting_.front().bytes;
      peak_ = std::max(peak_, in_use_);
      run.push_back(std::move(waiting_.front().granted));
      waiting_.pop_front();
    }
  }
  for (auto& f : run) f();
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
