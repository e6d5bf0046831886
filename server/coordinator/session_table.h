// SessionTable: the coordinator's trainer sessions, one per Session stream
// from OpenSession to CloseSession.
//
// A session past its Hello reads one job as one reader (rank, worker, slot)
// for one trainer, the holder of its leases ("job/trainer_id"). Until it
// finishes it is one of its job's open sessions: counted per reader slot
// and per rank (what Hello's session limit, GetJob's session counts and a
// slot's remainders look at), and in the job's wanting set while it may
// take more work (what a pump visits when work comes back), so that no
// per-job question visits every session of every job. One session per
// trainer: the trainer's newest session replaces its older one (Join).
//
// Not thread-safe: CoordinatorService keeps it under its lock.
#ifndef SLUICE_SERVER_COORDINATOR_SESSION_TABLE_H_
#define SLUICE_SERVER_COORDINATOR_SESSION_TABLE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "server/coordinator/durable_outbox.h"
#include "server/coordinator/unreachable_servers.h"

namespace sluice {

struct Session {
  int64_t id = 0;
  std::shared_ptr<SessionSink> sink;
  bool hello = false;
  std::string job;
  int32_t rank = 0;
  int32_t worker = 0;
  int32_t num_workers = 1;  // readers per rank this session reads with
  std::string node;         // the reader's node (Hello.node), "" = unknown
  std::string pool;         // the job's data-server pool (JobSpec.pool)
  int32_t slot = 0;         // its reader slot in the job's plan (at Hello)
  std::string trainer_id;   // "job/trainer_id": the holder of its leases
  int32_t credits = 0;
  int64_t announced_epoch = -1;
  std::string waiting;
  bool finished = false;
  // Data servers this session's reader reported it cannot reach: its
  // grants are routed elsewhere while any other server is live.
  UnreachableServers unreachable;
};

class SessionTable {
 public:
  // A job's open sessions: past Hello and not finished.
  struct Open {
    std::set<int64_t> all;
    // Those that may take more work: held fewer leases than their credits
    // when last pumped, or had a lease end without a message of their own.
    std::set<int64_t> wanting;
    std::map<int32_t, int32_t> per_slot;  // slot -> how many of `all`
    std::map<int32_t, int32_t> per_rank;  // rank -> how many of `all`
  };

  // A new session on `sink`, with a fresh id.
  Session& Add(std::shared_ptr<SessionSink> sink);
  // The session `id`, or null when there is none (closed, never opened).
  Session* Find(int64_t id);
  // The unfinished session of lease holder `trainer_id`, or null.
  Session* SessionOf(const std::string& trainer_id);
  // `s`, its Hello accepted (job, rank, slot and trainer_id set), joins its
  // job's open sessions and becomes its trainer's session. Returns the
  // trainer's previous session, if it had another (the caller ends it).
  Session* Join(Session& s);
  // `s` leaves its job's open sessions (it finished or closed). Returns
  // whether that left its slot without an open session.
  bool Leave(const Session& s);
  // Forgets session `id` (its stream ended), leaving its job's open
  // sessions first. Returns whether that left its slot without one.
  bool Remove(int64_t id);

  // The open sessions of `job`, or null when it has none.
  const Open* OpenOf(const std::string& job) const;
  int64_t OpenCount(const std::string& job) const;
  bool SlotHasOpenSession(const std::string& job, int32_t slot) const;
  // The ids of `job`'s open sessions (copied: sessions may finish while the
  // caller visits them), or only of the wanting ones.
  std::vector<int64_t> OpenIds(const std::string& job, bool wanting) const;
  // Marks open session `s` as wanting more work, or not; a session not
  // open is left alone.
  void SetWanting(const Session& s, bool wanting);
  // Every job with an open session, and how many.
  std::map<std::string, int64_t> OpenCounts() const;
  // Whether `matches` holds for a job other than `job` with an open session.
  bool AnyOtherJobOpen(
      const std::string& job,
      absl::FunctionRef<bool(const std::string& other)> matches) const;
  // Every session's id, in order.
  std::vector<int64_t> Ids() const;

 private:
  std::map<int64_t, Session> sessions_;
  std::map<std::string, int64_t> session_of_trainer_;
  std::map<std::string, Open> open_;  // by job
  int64_t next_id_ = 1;
};

}  // namespace sluice

#endif  // SLUICE_SERVER_COORDINATOR_SESSION_TABLE_H_
