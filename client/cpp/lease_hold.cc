#include "client/cpp/lease_hold.h"

namespace sluice::client_internal {

void LeaseHold::Disconnected() {
  if (disconnected_at_ == absl::InfinitePast())
    disconnected_at_ = clock_->Now();
}

void LeaseHold::Reconnected(uint64_t sync_id) {
  revalidating_ = sync_id != 0 && DownTooLong();
  revalidate_id_ = sync_id;
  if (sync_id != 0) disconnected_at_ = absl::InfinitePast();
}

void LeaseHold::Synced(uint64_t id) {
  if (id >= revalidate_id_) revalidating_ = false;
}

bool LeaseHold::MayHaveLostLeases() const {
  return revalidating_ || DownTooLong();
}

bool LeaseHold::DownTooLong() const {
  return disconnected_at_ != absl::InfinitePast() &&
         clock_->Now() - disconnected_at_ > lease_ttl_ / 2;
}

}  // namespace sluice::client_internal
