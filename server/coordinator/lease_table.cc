#include "server/coordinator/lease_table.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace sluice {

void LeaseTable::Schedule(LeaseEntry& lease, absl::Duration ttl) {
  lease.expires_at = clock_->Now() + std::max(ttl, kMinTtl);
  auto armed = armed_.find(lease.lease_id);
  // Armed at or before the new expiry: the entry re-arms when it comes due.
  if (armed != armed_.end() && armed->second.at <= lease.expires_at) return;
  const uint64_t generation = next_generation_++;
  armed_[lease.lease_id] = Armed{generation, lease.expires_at};
  heap_.push(HeapEntry{lease.expires_at, lease.lease_id, generation});
  // Removed leases leave entries behind, which only leave from the top: past
  // twice the live leases, rebuild from them (memory bounded by the live
  // leases whatever the pattern of grants and completions).
  if (heap_.size() > 2 * leases_.size() + kHeapSlack) CompactHeap();
}

void LeaseTable::CompactHeap() {
  std::deque<HeapEntry> live;
  for (const auto& [id, lease] : leases_) {
    auto armed = armed_.find(id);
    if (armed == armed_.end()) continue;
    armed->second.at = lease.expires_at;
    live.push_back(HeapEntry{lease.expires_at, id, armed->second.generation});
  }
  heap_ = decltype(heap_)(std::greater<HeapEntry>(), std::move(live));
}

absl::Status LeaseTable::Add(LeaseEntry lease, absl::Duration ttl) {
  if (leases_.count(lease.lease_id) != 0) {
    return absl::AlreadyExistsError(
        absl::StrCat("lease ", lease.lease_id, " exists"));
  }
  const std::string id = lease.lease_id;
  by_holder_[lease.holder].push_back(id);
  ++jobs_[lease.job];
  if (!lease.shard_url.empty()) by_url_[lease.shard_url].insert(id);
  LeaseEntry& stored = leases_.emplace(id, std::move(lease)).first->second;
  Schedule(stored, ttl);
  return absl::OkStatus();
}

absl::StatusOr<const LeaseEntry*> LeaseTable::Check(const std::string& lease_id,
                                                    uint64_t fence) const {
  auto it = leases_.find(lease_id);
  if (it == leases_.end()) {
    return absl::NotFoundError(
        absl::StrCat("lease ", lease_id,
                     " is not held (expired, completed or never granted)"));
  }
  if (it->second.fence != fence) {
    return absl::AbortedError(absl::StrCat("lease ", lease_id, ": stale fence ",
                                           fence, " (current ",
                                           it->second.fence, ")"));
  }
  return &it->second;
}

absl::Status LeaseTable::SetProgress(const std::string& lease_id,
                                     uint64_t fence, int64_t consumed) {
  absl::StatusOr<const LeaseEntry*> lease = Check(lease_id, fence);
  if (!lease.ok()) return lease.status();
  LeaseEntry& entry = leases_.find(lease_id)->second;
  if (consumed < entry.consumed || consumed > entry.end - entry.begin) {
    return absl::InvalidArgumentError(absl::StrCat(
        "lease ", lease_id, ": progress.consumed=", consumed, " must be in [",
        entry.consumed, ", ", entry.end - entry.begin, "]"));
  }
  entry.consumed = consumed;
  return absl::OkStatus();
}

absl::StatusOr<LeaseEntry> LeaseTable::Remove(const std::string& lease_id) {
  auto it = leases_.find(lease_id);
  if (it == leases_.end()) {
    return absl::NotFoundError(
        absl::StrCat("lease ", lease_id, " is not held"));
  }
  LeaseEntry lease = std::move(it->second);
  leases_.erase(it);
  armed_.erase(lease_id);  // its heap entry is now stale
  auto holder = by_holder_.find(lease.holder);
  if (holder != by_holder_.end()) {
    auto& ids = holder->second;
    ids.erase(std::remove(ids.begin(), ids.end(), lease_id), ids.end());
    if (ids.empty()) by_holder_.erase(holder);
  }
  if (auto job = jobs_.find(lease.job);
      job != jobs_.end() && --job->second <= 0) {
    jobs_.erase(job);
  }
  if (!lease.shard_url.empty()) {
    auto url = by_url_.find(lease.shard_url);
    if (url != by_url_.end()) {
      url->second.erase(lease_id);
      if (url->second.empty()) by_url_.erase(url);
    }
  }
  return lease;
}

bool LeaseTable::ReadByOtherJob(const std::string& url, const std::string& job,
                                int64_t begin, int64_t end) const {
  auto it = by_url_.find(url);
  if (it == by_url_.end()) return false;
  for (const std::string& id : it->second) {
    const LeaseEntry& other = leases_.at(id);
    if (other.job != job && other.begin < end && begin < other.end) return true;
  }
  return false;
}

void LeaseTable::SetTokenExpiry(const std::string& lease_id, absl::Time at) {
  auto it = leases_.find(lease_id);
  if (it != leases_.end()) it->second.token_expires_at = at;
}

int LeaseTable::RenewHolder(const std::string& holder, absl::Duration ttl) {
  auto it = by_holder_.find(holder);
  if (it == by_holder_.end()) return 0;
  for (const std::string& id : it->second) Schedule(leases_.at(id), ttl);
  return static_cast<int>(it->second.size());
}

bool LeaseTable::Renew(const std::string& lease_id, absl::Duration ttl) {
  auto it = leases_.find(lease_id);
  if (it == leases_.end()) return false;
  Schedule(it->second, ttl);
  return true;
}

void LeaseTable::RefreshAll(absl::Duration ttl) {
  for (auto& [id, lease] : leases_) Schedule(lease, ttl);
}

void LeaseTable::SettleTop(absl::Time now) {
  while (!heap_.empty()) {
    const HeapEntry& top = heap_.top();
    auto armed = armed_.find(top.lease_id);
    if (armed == armed_.end() || armed->second.generation != top.generation) {
      heap_.pop();  // a removed lease's
      continue;
    }
    if (top.expires_at > now) return;
    const absl::Time expires_at = leases_.at(top.lease_id).expires_at;
    if (expires_at <= now) return;  // due and expired
    HeapEntry rearmed = top;        // renewed since it was armed
    heap_.pop();
    rearmed.expires_at = expires_at;
    armed->second.at = expires_at;
    heap_.push(std::move(rearmed));
  }
}

std::vector<std::string> LeaseTable::FindExpired(size_t limit) {
  std::vector<std::string> expired;
  const absl::Time now = clock_->Now();
  std::vector<HeapEntry> keep;
  while (expired.size() < limit) {
    SettleTop(now);
    if (heap_.empty() || heap_.top().expires_at > now) break;
    expired.push_back(heap_.top().lease_id);
    keep.push_back(heap_.top());
    heap_.pop();
  }
  // Finding is not reclaiming: the entries stay until Remove or renewal.
  for (HeapEntry& e : keep) heap_.push(std::move(e));
  return expired;
}

absl::Time LeaseTable::NextExpiry() {
  SettleTop(clock_->Now());
  // The earliest armed time: at or before the earliest expiry.
  return heap_.empty() ? absl::InfiniteFuture() : heap_.top().expires_at;
}

const LeaseEntry* LeaseTable::Find(const std::string& lease_id) const {
  auto it = leases_.find(lease_id);
  return it == leases_.end() ? nullptr : &it->second;
}

std::vector<const LeaseEntry*> LeaseTable::HeldBy(
    const std::string& holder) const {
  std::vector<const LeaseEntry*> result;
  auto it = by_holder_.find(holder);
  if (it == by_holder_.end()) return result;
  for (const std::string& id : it->second) result.push_back(&leases_.at(id));
  return result;
}

std::set<std::string> LeaseTable::HoldersOn(
    const std::string& data_server) const {
  std::set<std::string> holders;
  for (const auto& [id, lease] : leases_) {
    if (lease.data_server == data_server) holders.insert(lease.holder);
  }
  return holders;
}

}  // namespace sluice
