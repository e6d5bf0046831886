// Audit from C++: which samples one reader of a job took in an epoch, in
// the order its loop took them (the coordinator's Audit RPC), each named by
// shard, index, key and source.
//
//   sluice::AuditOptions o;
//   o.coordinator = "head:7070"; o.job = "cifar"; o.epoch = 3; o.rank = 5;
//   auto audit = sluice::Audit(o);                   // absl::StatusOr
//   for (const sluice::AuditedSample& s : audit->samples)
//     std::cout << s.position << " " << s.key << " " << s.shard_url << "\n";
//
// The coordinator keeps what audits need for a job's current epoch and the
// one before it. Keys come from a live data server of the job (IndexShard,
// once per shard); without one, keys are empty and `keys_missing` says why.
#ifndef SLUICE_CLIENT_INCLUDE_SLUICE_AUDIT_H_
#define SLUICE_CLIENT_INCLUDE_SLUICE_AUDIT_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "sluice/tls.h"
#include "sluice/v1/dataserver.pb.h"

namespace sluice {

struct AuditOptions {
  std::string coordinator;
  std::string job;
  int64_t epoch = 0;
  int32_t rank = 0;
  int32_t worker = 0;  // the reader within the rank (DataLoader worker)
  int64_t from = 0;    // first position listed, 0-based
  int64_t count = -1;  // most samples listed; -1 = all from `from` on
  // Or a training step's batch: with `batch_size` samples per step and
  // `num_workers` DataLoader workers (torch's DataLoader takes whole
  // batches from them in turn), step s is batch s / K of worker s % K
  // (K = max(num_workers, 1)); sets worker, from and count. -1 = not used.
  int64_t step = -1;
  int64_t batch_size = 0;
  int32_t num_workers = 0;
  bool keys = true;  // look keys up on a live data server
  // The DecodeSpec the reader read with (ReaderOptions.decode): with it,
  // each sample's augmentation draws (AuditedSample.draws), planned by a
  // live data server from the image's header. With the fields it asked for
  // (ReaderOptions.fields; empty = all): the draws are planned for the
  // first image field among them, as the stream planned them.
  std::optional<v1::DecodeSpec> decode;
  std::vector<std::string> fields;
  // List what resumes cut off this reader's record instead (samples it
  // acknowledged after the cursor a resume restored).
  bool rolled_back = false;
  // TLS (sluice/tls.h), or none for plaintext.
  std::optional<ClientTls> tls;
  absl::Duration timeout = absl::Seconds(10);  // of each call
};

struct AuditedSample {
  int64_t position = 0;  // in the reader's order of the epoch
  std::string key;       // empty when keys were not looked up
  // The shard, in the job's manifest or (a job with sources) in `source`'s.
  int32_t shard_index = 0;
  std::string shard_url;
  int64_t index = 0;   // within the shard
  std::string source;  // JobSpec.sources' name; empty for one manifest
  int64_t unit = 0;    // the planned unit (WorkUnit.sequence) it was served in
  std::string unit_kind;  // "shard", "window" or "mixed"
  // A run a resume rolled back had taken it in this epoch: read again.
  bool reread = false;
  // With AuditOptions.decode: the image's size and what its transforms
  // drew (crop boxes, resizes, flips); source_width 0 when nothing was
  // drawn (no transforms, no image field, a header that does not parse).
  v1::SampleDraws draws;
};

struct AuditResult {
  int64_t total = 0;  // samples the reader acknowledged in the epoch so far
  int32_t workers_per_rank = 1;
  std::vector<int64_t> epochs_kept;    // auditable epochs, oldest first
  std::vector<AuditedSample> samples;  // empty when given to `each`
  std::string keys_missing;            // why keys are empty, if they are
};

// The samples, in order. The coordinator's errors as it gave them:
// NOT_FOUND naming the job, FAILED_PRECONDITION naming the epochs kept,
// INVALID_ARGUMENT naming the field; with AuditOptions.decode, the data
// server's when none of the job's live ones plans the draws.
absl::StatusOr<AuditResult> Audit(const AuditOptions& options);
// The same, each sample handed to `each` as its page arrives instead of
// kept (an epoch of millions of samples in constant memory).
absl::StatusOr<AuditResult> Audit(
    const AuditOptions& options,
    const std::function<void(const AuditedSample&)>& each);

// Replay: one audited sample served again by a data server, with the
// augmentation draws it got in that epoch, so its tensors are the ones the
// trainer received, byte for byte, given the same DecodeSpec.
struct ReplayOptions {
  std::string coordinator;
  std::string job;
  int64_t epoch = 0;
  // The sample at `position` of reader (rank, worker) ...
  int32_t rank = 0;
  int32_t worker = 0;
  int64_t position = -1;
  // ... or the sample with this key, looked for over every reader of the
  // epoch (position < 0).
  std::string key;
  // What the trainer's reader asked for (ReaderOptions.decode and .fields;
  // empty fields = all): the sample comes back with those fields.
  v1::DecodeSpec decode;
  std::vector<std::string> fields;
  // The data server to ask; "" = the job's live ones, in turn.
  std::string data_server;
  std::optional<ClientTls> tls;
  absl::Duration timeout = absl::Seconds(10);  // of each call
};

struct ReplayResult {
  int32_t rank = 0;
  int32_t worker = 0;
  AuditedSample audited;
  std::string data_server;  // the one that served it
  // The sample's fields, and the geometry its image transforms drew
  // (replayed.draws).
  v1::ReplayedSample replayed;
};

// NOT_FOUND naming the key when no reader of the epoch took it; the
// coordinator's and data server's errors otherwise.
absl::StatusOr<ReplayResult> Replay(const ReplayOptions& options);

}  // namespace sluice

#endif  // SLUICE_CLIENT_INCLUDE_SLUICE_AUDIT_H_
