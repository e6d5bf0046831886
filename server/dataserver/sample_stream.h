// SampleStream: one ReadSamples stream of a data server, a pull-based
// producer of encoded SampleBatch messages.
//
// Pipeline of one stream. Samples pass through a window in shard order; each
// is decoded on its own and framed as soon as every sample before it is, so
// one slow image holds back only the framing, never the decoding of the
// samples behind it (no per-step barrier):
//
//   produce on the pool: read samples from the tar (index seek, no copy)
//     --> window: one pool task per sample to decode (raw mode and cheap
//         fields: inline)
//     --> in order, frame into messages of <= max_batch_bytes --> ready
//   Next() --> ready message? --yes--> deliver, top up the window
//                 | no: frame what is done now (the client is waiting;
//                   decoding, once none of the stream's decodes is in
//                   flight, so those join the message)
//
// Bounds (nothing is unbounded): raw, `prefetch_messages` messages ready;
// decoding, four samples per pool thread in the window, about
// `prefetch_messages` messages' bytes framed and waiting, and across all
// streams the decode memory budget (decode_budget.h) before a decode starts.
// A client that goes away calls Cancel(): decodes in flight finish and are
// dropped, and nothing more is read. Thread-safe.
#ifndef SLUICE_SERVER_DATASERVER_SAMPLE_STREAM_H_
#define SLUICE_SERVER_DATASERVER_SAMPLE_STREAM_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "server/dataserver/dataserver_metrics.h"
#include "server/dataserver/decode_budget.h"
#include "server/dataserver/decoded_image_cache.h"
#include "server/dataserver/decoders.h"
#include "server/dataserver/fair_pool.h"
#include "server/dataserver/image_transforms.h"
#include "server/dataserver/sample_encoder.h"
#include "server/format/sample_index.h"
#include "server/format/shard_store.h"
#include "server/format/tar_shard_reader.h"
#include "sluice/v1/dataserver.pb.h"

namespace sluice::dataserver {

// What a stream uses of the server it belongs to, and nothing more: shared
// by the server's streams, and outliving them.
struct StreamContext {
  FairPool* pool = nullptr;                     // reading and decoding
  DecodeMemoryBudget* decode_budget = nullptr;  // across all streams
  ShardStore* store = nullptr;                  // opens pieces given by ref
  DataServerMetrics* metrics = nullptr;         // may be null
  size_t prefetch_messages = 2;
  // A compressed member larger than this is a corrupt sample.
  int64_t max_sample_bytes = kDefaultMaxSampleBytes;
  // A shard's index (the server keeps a cache of them).
  std::function<std::shared_ptr<const ShardIndex>(
      const std::shared_ptr<const ShardData>&)>
      index;
  // Tests: called on the decoding thread before a sample's fields are
  // decoded (with the sample's index in its shard). May be empty.
  std::function<void(int64_t index)> before_decode_for_testing;
  // Decoded images shared between jobs reading the same shard; null = none.
  DecodedImageCache* decoded_images = nullptr;
  // Called once by each stream as it is destroyed, with its lease. May be
  // empty.
  std::function<void(const v1::Lease& lease)> stream_ended;
};

class SampleStream : public std::enable_shared_from_this<SampleStream> {
 public:
  // Receives the next message, nullopt at the end of the range, or the error
  // that ends the stream. Runs on a pool thread or inline in Next().
  using NextCallback =
      std::function<void(absl::StatusOr<std::optional<EncodedMessage>>)>;

  // At most one call outstanding.
  void Next(NextCallback done);
  // Stops production; an outstanding Next gets CANCELLED.
  void Cancel();

  // One shard the unit reads: the unit's shard, or one piece of its
  // shuffle window.
  struct Piece {
    // Opened; null = open `ref` through the store (asynchronously: a
    // remote shard may have to be downloaded first).
    std::shared_ptr<const ShardData> shard;
    ShardRef ref;
    int32_t shard_index = 0;  // in the job's manifest
    // Window pieces: the manifest's sample count. -1 for a plain unit.
    int64_t num_samples = -1;
    // Mixed units: the sample the piece's first label stands for, and the
    // augmentation key of its segment (else Lease.augment_seed).
    int64_t first = 0;
    std::optional<uint64_t> augment_seed;
  };
  // What a stream serves (DataServerService::ReadSamples checks a request
  // and fills them in).
  struct Params {
    // One piece for a plain unit (positions are its sample indexes); a
    // window unit's pieces, in the unit's pieces order.
    std::vector<Piece> pieces;
    // Window and mixed units: which piece serves each position p, at
    // labels[p - label_base] (WindowLabels; a mixed unit's MixedOrder with
    // label_base = unit.begin). Null for a plain unit.
    std::shared_ptr<const std::vector<uint16_t>> labels;
    int64_t label_base = 0;
    v1::Lease lease;
    // Positions [start, end) to serve.
    int64_t start = 0;
    int64_t end = 0;
    bool decode = false;
    ImageOptions image;
    // DecodeSpec's image transforms (never null when decoding).
    std::shared_ptr<const ImageTransforms> transforms;
    absl::flat_hash_set<std::string> fields;  // empty = all
    int64_t batch_bytes = 0;
    v1::CorruptPolicy policy = v1::CORRUPT_POLICY_SKIP;
    // Whether the reader is on this server's node, for the bytes-served
    // count.
    Locality locality = Locality::kUnknown;
  };
  // `context` outlives the stream.
  SampleStream(const StreamContext* context, Params params);
  ~SampleStream();

 private:
  struct Slot;
  using NextResult = absl::StatusOr<std::optional<EncodedMessage>>;
  void MaybeProduceLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Queues `task` on the server's threads as work of the lease's job, at the
  // job's weight, counting its CPU time to the job.
  void Schedule(std::function<void()> task);
  // How much the next produce step may read: raw, samples; decoding,
  // samples for the pool (samples decoded inline do not count). 0 = none.
  size_t RoomLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Decoding: samples the window holds at most (read, not yet framed).
  size_t WindowSamples() const;
  void Produce();
  void OnShard(size_t piece,
               absl::StatusOr<std::shared_ptr<const ShardData>> shard);
  absl::Status OpenLocked();
  void DecodeSample(Slot& slot);
  // Appends `slots` (read in order) to the window; marks reading done.
  // False (and nothing appended) once the stream is cancelled.
  bool Append(std::vector<std::shared_ptr<Slot>> slots, bool at_end);
  bool IsCancelled();
  // Marks a decoded slot done and frames what became framable.
  void Done(const std::shared_ptr<Slot>& slot);
  // Ends reading with `status`, after the samples already in the window.
  void Fail(absl::Status status);
  // Frames the window's done prefix; ends the stream when all is framed.
  void DrainLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves the encoder's pending samples into a ready message.
  void FlushLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PushReadyLocked(std::vector<EncodedMessage>& messages)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // If a Next() waits and can be answered, takes its callback and answer.
  NextCallback TakeWaiterLocked(NextResult* result)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  NextResult PopReadyLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Fails the stream (DATA_LOSS) if its shard's file was truncated or
  // rewritten since it was opened (ShardData::CheckIntact).
  void CheckShardLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs a callback taken by TakeWaiterLocked (outside mu_), counting what
  // it delivers.
  void Deliver(NextCallback callback, NextResult result);
  // A corrupt sample under the stream's policy: a skipped sample, or the
  // DATA_LOSS error that ends the stream.
  absl::StatusOr<OutSample> Corrupt(int64_t index, const std::string& key,
                                    const std::string& reason,
                                    CorruptReason kind);

  const StreamContext* const context_;
  const Params params_;
  // The job's series (null without metrics).
  prometheus::Counter* job_samples_ = nullptr;
  prometheus::Counter* job_cpu_seconds_ = nullptr;

  // One per piece. `shard` is set once (in the constructor, or by OnShard
  // under mu_) before the producing task reads it; CheckShardLocked reads
  // it under mu_. The rest is touched only by the producing task (one at a
  // time).
  struct PieceState {
    std::shared_ptr<const ShardData> shard;
    std::shared_ptr<const ShardIndex> index;
    std::unique_ptr<TarSampleReader> reader;
    int64_t next = 0;  // the piece's next sample
  };
  std::vector<PieceState> pieces_;
  size_t pieces_missing_ = 0;  // not opened yet (under mu_ while opening)
  int64_t next_ = 0;           // the next position
  bool opened_ = false;

  absl::Mutex mu_;
  // Samples read and not yet framed, in shard order.
  std::deque<std::shared_ptr<Slot>> window_ ABSL_GUARDED_BY(mu_);
  BatchEncoder encoder_ ABSL_GUARDED_BY(mu_);
  std::deque<EncodedMessage> ready_ ABSL_GUARDED_BY(mu_);
  size_t ready_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  NextCallback waiter_ ABSL_GUARDED_BY(mu_);
  bool producing_ ABSL_GUARDED_BY(mu_) = false;
  bool read_all_ ABSL_GUARDED_BY(mu_) = false;  // nothing more to read
  bool finished_ ABSL_GUARDED_BY(mu_) = false;  // everything is in ready_
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  bool shard_changed_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace sluice::dataserver

#endif  // SLUICE_SERVER_DATASERVER_SAMPLE_STREAM_H_
