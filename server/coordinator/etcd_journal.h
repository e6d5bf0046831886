// EtcdJournal: the coordinator's journal kept in etcd v3 (over etcd's own
// gRPC API, generated from Debian's golang-etcd-server-dev protos), so the
// state outlives the coordinator's machine and its disk.
//
// Keys under PREFIX (what a reimplementation needs):
//   PREFIX/format              "sluice-journal 1"; anything else is refused
//   PREFIX/leader              the leading coordinator's identity, bound to
//                              its etcd lease (TTL = election_ttl)
//   PREFIX/log/<seq:%020d>     one chunk of the log: [u8 flags][bytes], flags
//                              bit 0 = first chunk of a group commit, bit 1 =
//                              last. The bytes of a commit's chunks, in
//                              order, are frames [u32 LE length][serialized
//                              JournalRecord]. A chunk holds at most 1 MiB, a
//                              transaction one chunk (etcd refuses requests
//                              over 1.5 MiB): a group commit is one
//                              transaction unless it is larger.
//   PREFIX/snap                "<gen>": the snapshot in force
//   PREFIX/snapdata/<gen:%020d>/<i:%06d>  its chunks, frames as above: the
//                              Snapshot record, then the records appended
//                              while it was written
// A compaction writes snapdata/<gen>/ (gen above every log sequence written
// so far and the snapshot in force) beside the appends, then, in one
// transaction, points snap at it and deletes the whole log (the records
// appended meanwhile are in snapdata too) and the older snapshots.
//
// Fencing: Open campaigns for PREFIX/leader (a transaction creating it only
// if absent) and blocks while another coordinator holds it. Every write
// after that is a transaction conditioned on the leader key's creation
// revision being ours, so a deposed leader (paused, partitioned, its lease
// expired) can never write again: its writes fail with FAILED_PRECONDITION
// and `on_leadership_lost` is called, as it is when the lease cannot be
// kept alive for a whole TTL.
//
// Replay: the snapshot's records, then every complete group commit of the
// log; a standby keeps doing so while it waits. A torn last commit (a crash
// between its transactions: never acknowledged) is deleted; an incomplete
// commit before the last, or a frame that does not parse, is DATA_LOSS naming
// the key.
//
// Thread-safe, like every Journal.
#ifndef SLUICE_SERVER_COORDINATOR_ETCD_JOURNAL_H_
#define SLUICE_SERVER_COORDINATOR_ETCD_JOURNAL_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "etcd/etcdserver/etcdserverpb/rpc.grpc.pb.h"
#include "server/coordinator/group_commit_journal.h"

namespace sluice {

struct EtcdJournalOptions {
  std::vector<std::string> endpoints;  // host:port of etcd's client port
  std::string prefix;                  // "/sluice/prod": no trailing '/'
  // The leader key's lease: a dead leader is replaced this long after its
  // last keep-alive.
  absl::Duration election_ttl = absl::Seconds(2);
  // Written as the leader key's value (the coordinator's address).
  std::string identity;
  std::shared_ptr<grpc::ChannelCredentials> credentials;  // null = plaintext
  // How long Open waits for etcd to answer at all.
  absl::Duration connect_timeout = absl::Seconds(10);
  // Called once, from a journal thread, when this coordinator stops being
  // the leader (lease lost or a fenced write refused).
  std::function<void(const absl::Status&)> on_leadership_lost;
  // Each commit transaction's duration in seconds (a metrics histogram).
  FsyncObserver on_commit;
  // Called while Open waits for another coordinator's leadership to end,
  // with the leader key's value (once per change).
  std::function<void(const std::string& leader)> on_standby;
  // Set (by another thread) = Open stops waiting as a standby and returns
  // CANCELLED.
  const std::atomic<bool>* cancel = nullptr;
};

// "etcd://HOST:PORT[,HOST:PORT...]/PREFIX" -> endpoints and prefix
// (INVALID_ARGUMENT naming `flag` otherwise). The prefix is "/" + PREFIX.
absl::StatusOr<EtcdJournalOptions> ParseEtcdJournalUrl(absl::string_view url,
                                                       absl::string_view flag);

class EtcdJournal final : public GroupCommitJournal {
 public:
  // Replays into `apply` while waiting as a standby (a warm standby: the
  // leader's commits are applied as they land, every few hundred ms), then
  // campaigns, and returns once leading with everything applied. When the
  // leader compacts meanwhile, `reset` is called to clear what was applied
  // and the new snapshot is applied from the start.
  static absl::StatusOr<std::unique_ptr<EtcdJournal>> Open(
      EtcdJournalOptions options,
      const std::function<absl::Status(const JournalRecord&)>& apply,
      const std::function<void()>& reset = nullptr);
  // Stops keeping the lease alive and revokes it: a standby takes over at
  // once.
  ~EtcdJournal() override;

  int64_t replayed_records() const { return replayed_; }
  // The leader key's creation revision: every write is conditioned on it.
  int64_t leader_revision() const { return leader_revision_; }
  int64_t lease_id() const { return lease_id_; }
  // OK while this coordinator leads.
  absl::Status leadership() const;

 private:
  explicit EtcdJournal(EtcdJournalOptions options);
  std::string Key(absl::string_view rest) const {
    return absl::StrCat(prefix_, rest);
  }
  // snapdata/<staged_gen_>/
  std::string StagedDir() const;
  // Blocks until leading, calling `while_waiting` between attempts.
  absl::Status Campaign(const std::function<absl::Status()>& while_waiting);
  // Refuses a prefix holding another format or foreign keys; `found`: the
  // format key is there.
  absl::Status CheckFormat(bool* found);
  // Applies the snapshot (when new) and the complete commits after the
  // last applied one, all read at one etcd revision. `leading`: also delete
  // a torn last commit and set up appending after the log's end.
  absl::Status CatchUp(
      const std::function<absl::Status(const JournalRecord&)>& apply,
      const std::function<void()>& reset, bool leading);
  // Every key in [begin, end), in key order, `fn` called on each.
  absl::Status RangeAll(
      const std::string& begin, const std::string& end, int64_t revision,
      const std::function<absl::Status(const mvccpb::KeyValue&)>& fn);
  // One transaction of `ops`, conditioned on our leadership.
  absl::Status FencedTxn(const std::vector<etcdserverpb::RequestOp>& ops);
  // Writes `framed` as the chunks of one commit under log/ (or `dir`).
  absl::Status WriteChunks(const std::string& framed, const std::string& dir,
                           uint64_t* next_seq, bool numbered_by_six);
  absl::Status WriteBatch(const std::string& frames) override;
  absl::Status StageCompacted(const std::string& frames) override;
  absl::Status InstallCompacted(const std::string& tail) override;
  void DiscardCompacted() override;
  void KeepAlive();
  void LoseLeadership(const absl::Status& why);
  std::unique_ptr<grpc::ClientContext> Context(absl::Duration timeout) const;
  absl::Status Unavailable(absl::string_view what,
                           const grpc::Status& status) const;

  const EtcdJournalOptions options_;
  const std::string prefix_;  // options_.prefix + "/"
  std::string endpoints_text_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<etcdserverpb::KV::Stub> kv_;
  std::unique_ptr<etcdserverpb::Lease::Stub> lease_;
  int64_t lease_id_ = 0;
  // When the request that last extended the lease was sent (its grant or
  // an acknowledged keep-alive): etcd received it no earlier, so the lease
  // lasts at least the election TTL from then.
  absl::Time lease_renewed_at_;
  int64_t leader_revision_ = 0;
  // What CatchUp applied: records, the snapshot generation, the last log
  // sequence, their bytes (only Open's thread touches these).
  int64_t replayed_ = 0;
  uint64_t replayed_gen_ = 0;
  uint64_t replayed_seq_ = 0;
  int64_t replayed_bytes_ = 0;
  std::thread keepalive_;
  std::atomic<bool> stopping_{false};
  absl::Mutex keepalive_mu_;
  grpc::ClientContext* keepalive_ctx_ ABSL_GUARDED_BY(keepalive_mu_) = nullptr;

  mutable absl::Mutex mu_;
  absl::Status leadership_ ABSL_GUARDED_BY(mu_);
  bool lost_reported_ ABSL_GUARDED_BY(mu_) = false;
  // The next log sequence to write (the writer role's; read by a staging
  // compaction).
  uint64_t next_log_seq_ ABSL_GUARDED_BY(mu_) = 1;
  // The generation of the snapshot in force (0 = none).
  uint64_t snap_gen_ ABSL_GUARDED_BY(mu_) = 0;
  // A staged compaction: its generation and the chunks written so far (0
  // when none is staged). Only the compacting thread touches these.
  uint64_t staged_gen_ = 0;
  uint64_t staged_chunks_ = 0;
};

}  // namespace sluice

#endif  // SLUICE_SERVER_COORDINATOR_ETCD_JOURNAL_H_
