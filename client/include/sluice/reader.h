// sluice::Reader: a trainer's stream of samples for one (job, rank, worker).
//
// It runs the coordinator Session (Hello, Want credits = units in flight,
// heartbeats on its own thread), reads every granted unit from the data
// server the lease names (delivered one unit after another, each in sample
// order), reports Progress at most every `progress_interval` and Complete
// when a unit's last sample is handed out, and surfaces epoch boundaries as
// events.
//
// Streaming: the units in flight are held and buffered ahead of delivery;
// per data server one stream carries data at a time and the next unit's
// stream opens as the current one reaches its last batch, so unit
// boundaries cost no round trip (units on different data servers stream in
// parallel). All gRPC work runs on one I/O thread; a received batch reaches
// Next() with one thread hand-off.
//
//   ReaderOptions o;
//   o.coordinator = "head:7070"; o.job = "cifar"; o.rank = 3;
//   ASSIGN_OR_RETURN(auto reader, sluice::Reader::Create(o));
//   while (true) {
//     ASSIGN_OR_RETURN(sluice::ReaderEvent e, reader->Next());
//     if (e.kind == ReaderEvent::Kind::kDone) break;
//     if (e.kind == ReaderEvent::Kind::kSample) Train(e.sample);
//   }
//
// Failures: a data server that fails mid-unit -> the samples already fetched
// are delivered, then the unit is re-routed (Reroute with the exact count
// consumed) and its remainder arrives as a new grant on a live server. A
// shard whose streams keep failing on the same server (missing there,
// unreadable) is re-routed with back-off: the first at once, then 0.05 s
// doubling to 2 s, with a warning on stderr. The
// coordinator unreachable -> held units keep being read and delivered while
// the session reconnects with jittered backoff under the same trainer_id;
// reports are re-sent after reconnecting. A stale lease (ABORTED from the
// data server, Rejected or Revoke from the coordinator) -> the unit's
// undelivered samples are dropped, never delivered.
//
// Delivery guarantee (G2): a sample is acknowledged once a Progress or
// Complete covering it reached the coordinator; a trainer that dies loses at
// most the samples delivered since its last report, and those are delivered
// again to whoever takes over the lease.
//
// Resume (G7): Cursor() gives the position after the samples Next() has
// returned; store it (merged over ranks) in the training checkpoint and pass
// it as ReaderOptions::resume_from after a restart, also with another world
// size (a new job over the same data; the epoch's rest is re-balanced).
//
// Thread-safety: Next() and Cursor() must be called from one thread at a
// time; stats() and Close() may be called from any thread.
#ifndef SLUICE_CLIENT_INCLUDE_SLUICE_READER_H_
#define SLUICE_CLIENT_INCLUDE_SLUICE_READER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "sluice/tls.h"
#include "sluice/v1/common.pb.h"
#include "sluice/v1/dataserver.pb.h"

namespace sluice {

struct ReaderOptions {
  // "host:port", or several IPv4 "host:port"s comma-separated (or a host
  // name resolving to several): calls go to the one whose readiness is
  // SERVING (with an etcd journal, the leading coordinator).
  std::string coordinator;
  std::string job;
  int32_t rank = 0;
  // Readers sharing the rank (e.g. DataLoader workers; 0 = 1) and this
  // reader's index among them: each reads a fixed slot of the rank's quota.
  int32_t num_workers = 0;
  int32_t worker = 0;
  // Identifies this trainer across reconnects. Default:
  // "<hostname>-<pid>-r<rank>-w<worker>".
  std::string trainer_id;
  // The node (host) this reader runs on, for locality: a lease is read
  // from a data server on the same node when one is live. Default:
  // $SLUICE_NODE, else $SLURMD_NODENAME, else the host name.
  std::string node;
  // Units held (and buffered) at once: the Want credits.
  int32_t units_in_flight = 4;
  // Samples buffered per unit ahead of delivery (a stream stops reading
  // at this many; the batch that crosses it is kept whole).
  int32_t buffer_samples = 256;
  v1::DecodeSpec decode;
  std::vector<std::string> fields;  // empty = all
  int64_t max_batch_bytes = 0;      // 0 = the data server's default
  // Upper bound on the time between delivering a sample and reporting it.
  absl::Duration progress_interval = absl::Milliseconds(500);
  // A data-server stream that delivers nothing for this long is treated as
  // failed (the server hangs, or a network path is black-holed) and the
  // unit is re-routed.
  absl::Duration stall_timeout = absl::Seconds(60);
  // Give up (Next() fails UNAVAILABLE) after the coordinator has been
  // unreachable this long.
  absl::Duration reconnect_timeout = absl::Minutes(2);
  // TLS to the coordinator and the data servers (sluice/tls.h), or none
  // for plaintext. A coordinator or data server that speaks the other (TLS
  // vs plaintext) fails the reader at once with FAILED_PRECONDITION saying
  // so.
  std::optional<ClientTls> tls;
  // Resume from a checkpoint (G7): the first Hello carries this cursor
  // (every rank's entry known, see MergeCursors) and the job continues
  // right after the samples it counts. Every Reader created with a cursor is
  // a restore of it: a second Reader (another process, or this one again)
  // for the same rank and worker restores the same position again, and
  // Readers of other ranks and workers join the restore (protos/README.md,
  // "Resuming"). `resume_attempt` optionally names the restart, the same on
  // every rank (e.g. torchrun's run id and restart count).
  std::optional<v1::Cursor> resume_from;
  std::string resume_attempt;
  // Names this launch; empty: a random id made by Reader::Create. Readers
  // that stand for one process (e.g. a process's DataLoader-style workers
  // created again for each epoch) may pass the same id so that a second
  // Reader of a slot is not taken as a new restart.
  std::string launch_id;
};

struct Sample {
  int64_t epoch = 0;
  int32_t rank = 0;
  // The shard, in the job's manifest or (a job with sources) in `source`'s.
  int32_t shard_index = 0;
  std::string shard_url;
  // The source's name (JobSpec.sources); empty for a job of one manifest.
  std::string source;
  int64_t index = 0;  // within the shard
  std::string key;
  std::string data_server;  // where it was read from
  bool skipped = false;     // corrupt under on_corrupt=skip; fields empty
  std::string skip_reason;
  std::vector<v1::Field> fields;
};

struct ReaderEvent {
  enum class Kind { kSample, kEpochBegin, kEpochEnd, kDone };
  Kind kind = Kind::kSample;
  int64_t epoch = 0;
  // kEpochBegin: samples this rank gets in the epoch, and how many it had
  // already consumed (non-zero after a restart mid-epoch).
  int64_t samples_for_rank = 0;
  int64_t already_consumed = 0;
  // The same for this reader's slot of the rank (equal to the rank's with
  // num_workers <= 1).
  int64_t samples_for_worker = 0;
  int64_t already_consumed_by_worker = 0;
  // kDone: 'job "x" is done: all N epochs were consumed; ...'.
  std::string message;
  Sample sample;  // kSample
};

struct ReaderStats {
  int64_t delivered = 0;
  int64_t units_completed = 0;
  int64_t reroutes = 0;
  // Units a draining data server handed back (its stream ended early, not
  // failed): the rest went back to the coordinator with a Release and was
  // granted again elsewhere. Not re-routes.
  int64_t handed_back = 0;
  int64_t dropped_units = 0;
  int64_t reconnects = 0;
  // Batches (ReadSamples responses) received.
  int64_t batches = 0;
  // Seconds Next() blocked before returning a sample (the consumer's input
  // wait; also reported to the coordinator in heartbeats).
  double input_wait_seconds = 0;
};

class Reader {
 public:
  static absl::StatusOr<std::unique_ptr<Reader>> Create(ReaderOptions options);
  virtual ~Reader() = default;

  // The next event; blocks. An error is final: the job does not exist, the
  // coordinator stayed unreachable past reconnect_timeout, a DATA_LOSS under
  // on_corrupt=fail, or the reader was closed (CANCELLED).
  absl::StatusOr<ReaderEvent> Next() {
    return NextWithin(absl::InfiniteDuration());
  }
  // Next() waiting at most `timeout`: DEADLINE_EXCEEDED when no event came
  // in time (not final: call again).
  virtual absl::StatusOr<ReaderEvent> NextWithin(absl::Duration timeout) = 0;
  // Changes how many units this reader holds at once (the Want credits;
  // 0 = take no new work, the units held are still delivered). Kept across
  // reconnects. May be called from any thread.
  virtual void Want(int32_t units) = 0;
  virtual ReaderStats stats() const = 0;
  // The resume cursor after the last event Next() returned: this rank's
  // count of consumed samples in the current epoch, -1 for the other ranks
  // (merge every rank's cursor with MergeCursors, or all-gather them, before
  // saving). Blocks until everything this Reader delivered is durably
  // acknowledged at the coordinator, so the cursor never runs ahead of what
  // a resume can restore; UNAVAILABLE if that cannot be confirmed within
  // reconnect_timeout, FAILED_PRECONDITION before the first EpochBegin.
  // Call from the thread that calls Next().
  virtual absl::StatusOr<v1::Cursor> Cursor() = 0;
  // Reports what was consumed, gives unfinished units back (Release) so
  // others take them at once, and ends the session. Idempotent.
  virtual void Close() = 0;
};

// Combines the cursors of a job's ranks (same job, epoch and world size)
// into one with every rank's count: INVALID_ARGUMENT on a mismatch or two
// different counts for one rank. Ranks no cursor knows stay -1.
absl::StatusOr<v1::Cursor> MergeCursors(const std::vector<v1::Cursor>& cursors);

// Optional, once at the start of a program that reads through a Reader with
// glibc's malloc: keeps up to 64 MiB of freed memory per malloc arena
// instead of returning it to the kernel after every megabyte-sized message,
// whose pages the next message would fault in again (on this project's
// benchmark machine the Reader read 25-35 % more samples/s). Process-wide,
// so a library does not do it behind the program's back; the servers do it
// by default. Returns false where the C library is not glibc or the
// allocator in use refuses the settings (sanitizers, a preloaded malloc).
// See server/common/malloc_tuning.h.
bool TuneMallocForStreaming();

}  // namespace sluice

#endif  // SLUICE_CLIENT_INCLUDE_SLUICE_READER_H_
