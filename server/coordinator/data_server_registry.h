// The coordinator's registry of data servers: soft state, never journaled
// (servers re-register after a coordinator restart). A server is live while
// it heartbeats within `timeout`; grants name a live server chosen by
// rendezvous (highest random weight) hashing of the shard URL, weighted by
// capacity, so a shard keeps going to the same server while the set of
// servers is stable, and removing a server moves only the shards it had.
// A server a trainer reported failing is passed over until `timeout` after
// the report, unless no other server is live; for that trainer's own
// grants, as long as its UnreachableServers says. A reader that names its
// node gets a server registered on the same node when one is live (the
// node-local layout: its bytes stay on the node), by rendezvous among them.
// Every server serves one pool ("" = the default pool); a pick is among the
// servers of the job's pool only.
//
// Thread-safe, under a lock of its own: the coordinator records heartbeats
// without taking its state lock, so no session work can delay them past a
// server's timeout.
#ifndef SLUICE_SERVER_COORDINATOR_DATA_SERVER_REGISTRY_H_
#define SLUICE_SERVER_COORDINATOR_DATA_SERVER_REGISTRY_H_

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/common/clock.h"
#include "sluice/v1/coordinator.pb.h"

namespace sluice {

// Where the coordinator sends messages to one registered data server (the
// registration stream). Send must not block; it is called under the
// coordinator's lock.
class DataServerSink {
 public:
  virtual ~DataServerSink() = default;
  virtual void Send(const v1::CoordinatorToDataServer& message) = 0;
};

class DataServerRegistry {
 public:
  // Shard URLs remembered as hinted per server (oldest forgotten first).
  static constexpr size_t kRememberedHints = 4096;

  DataServerRegistry(Clock* clock, absl::Duration timeout)
      : clock_(clock), timeout_(timeout) {}

  // A new registration, live from now; returns its id (never 0). A
  // capacity <= 0 counts as 1.
  int64_t Add(const std::string& address, int32_t capacity,
              std::shared_ptr<DataServerSink> sink,
              const std::string& node = "", const std::string& pool = "");
  // What a server reports of its load (DataServerHeartbeat), cumulative.
  struct Load {
    int64_t samples_served = 0;
    double cpu_seconds = 0;
    int32_t cores = 0;
  };
  // Marks `id` seen now; false if it is not registered. `none_was_live`
  // (optional) tells whether no registration of its pool was live just
  // before; `load` (optional) is the server's report.
  bool Heartbeat(int64_t id, bool* none_was_live = nullptr,
                 const Load* load = nullptr);
  // Per pool (every pool with a live server that reported), its live
  // servers' load since the previous call: samples served and CPU seconds
  // summed (a server counts from its second report on), and their mean
  // cores.
  std::map<std::string, Load> TakeLoadByPool();
  // Marks every registration seen now (after the coordinator itself
  // stalled: their heartbeats could not be read).
  void MarkAllSeen();
  void Remove(int64_t id);
  // `id` is leaving (DataServerDraining): not live from now on, so nothing
  // new is routed to it; it stays registered until Remove. Its address, or
  // nullopt if it is not registered.
  std::optional<std::string> SetDraining(int64_t id);
  // Registrations draining now.
  int DrainingCount() const;

  bool empty() const {
    absl::MutexLock lock(&mu_);
    return servers_.empty();
  }
  bool AnyLive() const;
  // Whether a server of `pool` is live.
  bool AnyLiveIn(const std::string& pool) const;
  int LiveCount() const;
  // Live and draining servers per pool (every pool with a registration).
  struct PoolCounts {
    int32_t live = 0;
    int32_t draining = 0;
  };
  std::map<std::string, PoolCounts> CountsByPool() const;
  std::vector<std::string> LiveAddresses() const;
  // The live servers of `pool`.
  std::vector<std::string> LiveAddressesIn(const std::string& pool) const;

  // Passes over every registration at `address` until `timeout` from now.
  void MarkSuspect(const std::string& address);

  // The live server for `shard_url` (the best one not suspect, else the best
  // live one) of the default pool; empty when none is live.
  std::string Pick(const std::string& shard_url) const;
  // The same for a reader on `node` ("" = unknown) that cannot reach the
  // servers `avoid` returns true for: the best live server on `node`
  // neither suspect nor avoided, else the best live server neither suspect
  // nor avoided, else the best one not avoided, else the best live one.
  // `*same_node` (optional) tells whether the pick is on `node`. Only
  // servers of `pool` are considered.
  std::string Pick(const std::string& shard_url,
                   absl::FunctionRef<bool(const std::string&)> avoid,
                   const std::string& node = "", bool* same_node = nullptr,
                   const std::string& pool = "") const;

  // Records that `shard_url` is hinted to the server registered at
  // `address`: returns that registration's id and sink the first time
  // (within the last kRememberedHints hints), nullopt when it was hinted
  // already or the server has no sink.
  struct HintTarget {
    int64_t id;
    std::shared_ptr<DataServerSink> sink;
  };
  std::optional<HintTarget> NoteHint(const std::string& address,
                                     const std::string& shard_url);

 private:
  struct Server {
    std::string address;
    std::string node;
    std::string pool;
    int32_t capacity = 1;
    absl::Time last_seen;
    absl::Time suspect_until = absl::InfinitePast();
    bool draining = false;
    std::shared_ptr<DataServerSink> sink;
    std::optional<Load> reported;  // the latest load report
    std::optional<Load> taken;     // the report TakeLoad last counted to
    std::deque<std::string> hinted;
    std::set<std::string> hinted_set;
  };
  bool Live(const Server& s, absl::Time now) const {
    return !s.draining && now - s.last_seen <= timeout_;
  }
  // Any live server (of `*pool` when not null).
  bool AnyLiveLocked(absl::Time now, const std::string* pool) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Clock* const clock_;
  const absl::Duration timeout_;
  mutable absl::Mutex mu_;
  std::map<int64_t, Server> servers_ ABSL_GUARDED_BY(mu_);
  int64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
};

}  // namespace sluice

#endif  // SLUICE_SERVER_COORDINATOR_DATA_SERVER_REGISTRY_H_
