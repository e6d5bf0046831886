#include "client/cpp/input_wait.h"

namespace sluice::client_internal {

void InputWaitHistogram::Observe(double seconds) {
  size_t bucket = 0;
  while (bucket < kBounds.size() && seconds > kBounds[bucket]) ++bucket;
  ++counts_[bucket];
  sum_ += seconds;
}

bool InputWaitHistogram::Take(v1::InputWait* out) {
  out->Clear();
  bool any = false;
  for (uint64_t& c : counts_) {
    any = any || c != 0;
    out->add_bucket_counts(c);
    c = 0;
  }
  out->set_sum_seconds(sum_);
  sum_ = 0;
  if (!any) out->Clear();
  return any;
}

}  // namespace sluice::client_internal
