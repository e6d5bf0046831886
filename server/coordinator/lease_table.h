// LeaseTable: the coordinator's live shard leases and their expiry.
//
// Modelled on etcd's lessor: a minimum TTL; expiry kept in a min-heap on an
// injected Clock; finding expired leases (FindExpired) is separate from
// reclaiming them (Remove), so the caller can journal and re-queue each one;
// renewals are not journaled and happen per holder (one heartbeat renews every
// lease the trainer holds); after recovery RefreshAll gives every lease a
// fresh TTL.
//
// Renewal is in place: each lease has one live heap entry, armed at or
// before its expiry, and a renewal only moves the lease's expires_at. When
// an armed time comes and the lease was renewed meanwhile, the entry is
// re-armed at the lease's expiry (at most once per TTL per lease, however
// often its holder heartbeats). A removed lease's entry is dropped when it
// reaches the top, and the heap is rebuilt from the live leases when such
// entries outnumber them.
//
// Not thread-safe: owned by CoordinatorService and used under its mutex.
#ifndef SLUICE_SERVER_COORDINATOR_LEASE_TABLE_H_
#define SLUICE_SERVER_COORDINATOR_LEASE_TABLE_H_

#include <cstdint>
#include <deque>
#include <map>
#include <queue>
#include <set>
#include <string>
#include <vector>

#include "absl/container/btree_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/common/clock.h"

namespace sluice {

struct LeaseEntry {
  std::string lease_id;
  uint64_t fence = 0;
  std::string job;
  int64_t epoch = 0;
  int32_t rank = 0;
  int32_t worker = 0;  // the reader within the rank whose slot it counts to
  int32_t shard_index = 0;
  int64_t begin = 0;
  int64_t end = 0;
  int64_t sequence = 0;
  std::string holder;       // trainer_id
  std::string data_server;  // where the holder reads it
  // The shard it reads, when its unit is a range of one shard ("" for
  // window and mixed units): what other jobs' grants are steered towards.
  std::string shard_url;
  int64_t consumed = 0;  // from the last accepted Progress
  absl::Time expires_at;
  // The expiry signed into the token the holder has (see lease_token.h).
  absl::Time token_expires_at;
  int64_t remaining() const { return end - begin - consumed; }
};

class LeaseTable {
 public:
  static constexpr absl::Duration kMinTtl = absl::Milliseconds(500);

  explicit LeaseTable(Clock* clock) : clock_(clock) {}

  // Adds `lease`, expiring max(ttl, kMinTtl) from now. Replaces nothing:
  // ALREADY_EXISTS if the id is taken.
  absl::Status Add(LeaseEntry lease, absl::Duration ttl);

  // The lease if `fence` is current: NOT_FOUND for an unknown id (expired and
  // reclaimed leases are unknown), ABORTED for a stale fence.
  absl::StatusOr<const LeaseEntry*> Check(const std::string& lease_id,
                                          uint64_t fence) const;

  // Records cumulative progress. INVALID_ARGUMENT if `consumed` goes
  // backwards or past the unit's size.
  absl::Status SetProgress(const std::string& lease_id, uint64_t fence,
                           int64_t consumed);

  // Removes the lease (complete, release, reroute, expiry) and returns it.
  absl::StatusOr<LeaseEntry> Remove(const std::string& lease_id);

  // Extends every lease of `holder` to now + ttl. Returns how many.
  int RenewHolder(const std::string& holder, absl::Duration ttl);
  // Renews one lease; false if it is not held.
  bool Renew(const std::string& lease_id, absl::Duration ttl);

  // Ids of leases whose expiry has passed, soonest first, at most `limit`.
  // Does not remove them.
  std::vector<std::string> FindExpired(size_t limit);

  // Gives every lease a fresh TTL (after coordinator recovery).
  void RefreshAll(absl::Duration ttl);

  // When to look for expired leases next: at or before the earliest expiry
  // among live leases (a renewed lease's entry comes due at its old time
  // once, to re-arm); InfiniteFuture when none.
  absl::Time NextExpiry();

  const LeaseEntry* Find(const std::string& lease_id) const;
  // Records the expiry of the token last sent for the lease (no-op if gone).
  void SetTokenExpiry(const std::string& lease_id, absl::Time at);
  std::vector<const LeaseEntry*> HeldBy(const std::string& holder) const;
  // The holders of leases read from `data_server` (a walk of every lease:
  // for rare events, a data server leaving).
  std::set<std::string> HoldersOn(const std::string& data_server) const;
  // HeldBy(holder).size(), without building it.
  size_t CountHeldBy(const std::string& holder) const {
    auto it = by_holder_.find(holder);
    return it == by_holder_.end() ? 0 : it->second.size();
  }
  size_t size() const { return leases_.size(); }
  // Jobs other than `job` holding live leases.
  size_t OtherJobs(const std::string& job) const {
    return jobs_.size() - jobs_.count(job);
  }
  // Whether a live lease of a job other than `job` reads some of samples
  // [begin, end) of shard `url`.
  bool ReadByOtherJob(const std::string& url, const std::string& job,
                      int64_t begin, int64_t end) const;
  // Expiry heap entries, removed leases' included (at most 2 * size() + 64
  // after any call that adds or renews).
  size_t heap_entries() const { return heap_.size(); }

 private:
  struct HeapEntry {
    absl::Time expires_at;
    std::string lease_id;
    uint64_t generation;
    bool operator>(const HeapEntry& o) const {
      return expires_at > o.expires_at;
    }
  };
  void Schedule(LeaseEntry& lease, absl::Duration ttl);
  // Drops removed leases' entries from the top and re-arms the entries due
  // by `now` whose lease was renewed since: then the top, if any, is a live
  // lease's entry, not due or due and expired.
  void SettleTop(absl::Time now);
  void CompactHeap();

  // Stale heap entries tolerated beyond twice the live leases.
  static constexpr size_t kHeapSlack = 64;

  Clock* const clock_;
  // Ordered containers, not hash maps: a hash map that doubles rehashes
  // every entry under the coordinator's lock (milliseconds at tens of
  // thousands of leases, in whichever grant crosses the size), a tree adds
  // one node. std::map keeps the entries' addresses stable (Find and HeldBy
  // hand out pointers).
  std::map<std::string, LeaseEntry> leases_;
  // Each live lease's heap entry: its generation and when it is armed for
  // (never after the lease's expires_at).
  struct Armed {
    uint64_t generation;
    absl::Time at;
  };
  absl::btree_map<std::string, Armed> armed_;
  absl::btree_map<std::string, std::vector<std::string>> by_holder_;
  // Live leases per job; lease ids per shard_url (those that have one).
  std::map<std::string, int> jobs_;
  std::map<std::string, std::set<std::string>> by_url_;
  // A deque: growing it never moves the entries it has.
  std::priority_queue<HeapEntry, std::deque<HeapEntry>, std::greater<HeapEntry>>
      heap_;
  uint64_t next_generation_ = 1;
};

}  // namespace sluice

#endif  // SLUICE_SERVER_COORDINATOR_LEASE_TABLE_H_
