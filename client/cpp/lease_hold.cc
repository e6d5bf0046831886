#include "client/cpp/lease_hold.h"

#include <algorithm>

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
  // Ids go out in increasing order: Synced{id} confirms every Sync up to id.
  for (auto it = syncs_sent_.begin();
       it != syncs_sent_.end() && it->first <= id;) {
    confirmed_at_ = std::max(confirmed_at_, it->second);
    it = syncs_sent_.erase(it);
  }
}

void LeaseHold::HelloSent() { hello_sent_at_ = clock_->Now(); }

void LeaseHold::Welcomed() {
  confirmed_at_ = std::max(confirmed_at_, hello_sent_at_);
}

void LeaseHold::SyncSent(uint64_t id) {
  // Bounded: a coordinator that answers no Sync leaves at most a TTL's worth.
  if (syncs_sent_.size() >= 1024) syncs_sent_.erase(syncs_sent_.begin());
  syncs_sent_[id] = clock_->Now();
}

bool LeaseHold::MayHaveLostLeases() const {
  return revalidating_ || DownTooLong() || Silent();
}

bool LeaseHold::Silent() const {
  return confirmed_at_ != absl::InfinitePast() &&
         clock_->Now() - confirmed_at_ > lease_ttl_ * 3 / 4;
}

bool LeaseHold::DownTooLong() const {
  return disconnected_at_ != absl::InfinitePast() &&
         clock_->Now() - disconnected_at_ > lease_ttl_ / 2;
}

}  // namespace sluice::client_internal
