#include "server/dataserver/sample_stream.h"

#include <algorithm>
#include <chrono>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "server/common/logging.h"
#include "server/common/quote.h"
#include "server/common/status_macros.h"
#include "server/common/thread_cpu.h"

namespace sluice::dataserver {
namespace {

// Samples read per produce step at most (bounds the work of one step when
// samples are tiny).
constexpr size_t kMaxSamplesPerStep = 1024;

// The metric's reason for the format layer's kind of damage.
CorruptReason ReasonOf(SampleDamage damage) {
  switch (damage) {
    case SampleDamage::kDuplicateField:
      return CorruptReason::kDuplicateField;
    case SampleDamage::kLost:
      return CorruptReason::kLost;
    case SampleDamage::kNone:
    case SampleDamage::kDamagedTar:
      break;
  }
  return CorruptReason::kDamagedTar;
}

}  // namespace

// One sample on its way through the window. `out` is written by the one
// task that produces it, before `done` is set under the stream's mu_.
struct SampleStream::Slot {
  RawSample raw;
  int32_t piece = 0;        // of the unit's pieces
  int32_t shard_index = 0;  // the sample's shard in the manifest
  // The piece's shard, once `raw` is read from it (the stream keeps it).
  const ShardData* shard = nullptr;
  absl::StatusOr<OutSample> out = absl::UnknownError("not decoded");
  bool done = false;
  // Decode memory granted for this sample; given back when the slot goes
  // (framed, or its stream cancelled).
  DecodeMemoryBudget* budget = nullptr;
  std::string job;  // the budget's flow
  int64_t reserved = 0;
  ~Slot() {
    if (budget != nullptr) budget->Release(job, reserved);
  }
};

namespace {

// What decoding `raw` may allocate at once: an image's full-size pixels
// and the buffers its transforms work in, an npy's array.
int64_t EstimateDecodeBytes(const RawSample& raw) {
  int64_t total = 0;
  for (const RawField& f : raw.fields) {
    const Codec codec = CodecForField(f.name);
    if (codec == Codec::kJpeg || codec == Codec::kPng) {
      absl::StatusOr<ImageSize> size = ReadImageSize(codec, f.data);
      if (size.ok()) {
        // RGB(A), up to 16 bits, twice (decoded + resampled planes).
        total += int64_t{size->width} * size->height *
                 (codec == Codec::kJpeg ? 3 : 8) * 2;
      }
    } else if (codec == Codec::kNpy) {
      total += static_cast<int64_t>(f.data.bytes.size()) * 2;
    }
  }
  return total;
}

}  // namespace

SampleStream::SampleStream(const StreamContext* context, Params params)
    : context_(context),
      params_(std::move(params)),
      encoder_(static_cast<size_t>(params_.batch_bytes)) {
  next_ = params_.start;
  pieces_.resize(params_.pieces.size());
  for (size_t k = 0; k < pieces_.size(); ++k) {
    pieces_[k].shard = params_.pieces[k].shard;
    if (pieces_[k].shard == nullptr) ++pieces_missing_;
  }
  if (context_->decoded_images != nullptr && params_.decode) {
    for (const Piece& piece : params_.pieces)
      context_->decoded_images->StreamOpened(piece.ref.url,
                                             params_.lease.job());
  }
  if (context_->metrics != nullptr) {
    const std::string job = params_.lease.job().substr(0, 128);
    const DataServerMetrics::JobSeries series = context_->metrics->HoldJob(job);
    job_samples_ = series.samples;
    job_cpu_seconds_ = series.cpu_seconds;
  }
}

void SampleStream::Schedule(std::function<void()> task) {
  if (job_cpu_seconds_ == nullptr) {
    context_->pool->Schedule(params_.lease.job(), params_.lease.weight(),
                             std::move(task));
    return;
  }
  context_->pool->Schedule(params_.lease.job(), params_.lease.weight(),
                           [cpu = job_cpu_seconds_, task = std::move(task)] {
                             const double start = ThreadCpuSeconds();
                             task();
                             cpu->Increment(ThreadCpuSeconds() - start);
                           });
}

SampleStream::~SampleStream() {
  if (context_->decoded_images != nullptr && params_.decode) {
    for (const Piece& piece : params_.pieces)
      context_->decoded_images->StreamClosed(piece.ref.url,
                                             params_.lease.job());
  }
  if (context_->metrics != nullptr)
    context_->metrics->ReleaseJob(params_.lease.job().substr(0, 128));
  if (context_->stream_ended) context_->stream_ended(params_.lease);
}

size_t SampleStream::WindowSamples() const {
  return 4 * static_cast<size_t>(context_->pool->size());
}

SampleStream::NextResult SampleStream::PopReadyLocked() {
  NextResult result = std::optional<EncodedMessage>(std::move(ready_.front()));
  ready_.pop_front();
  ready_bytes_ -= (*result)->size();
  return result;
}

void SampleStream::PushReadyLocked(std::vector<EncodedMessage>& messages) {
  for (EncodedMessage& m : messages) {
    ready_bytes_ += m.size();
    ready_.push_back(std::move(m));
  }
}

void SampleStream::FlushLocked() {
  std::vector<EncodedMessage> messages;
  encoder_.Flush(&messages);
  PushReadyLocked(messages);
}

void SampleStream::Next(NextCallback done) {
  NextCallback waiter;
  NextResult result;
  {
    absl::MutexLock lock(&mu_);
    // Answered now if it can be; otherwise by whoever frames the next
    // message.
    waiter_ = std::move(done);
    waiter = TakeWaiterLocked(&result);
    MaybeProduceLocked();
  }
  Deliver(std::move(waiter), std::move(result));
}

SampleStream::NextCallback SampleStream::TakeWaiterLocked(NextResult* result) {
  if (!waiter_) return nullptr;
  if (cancelled_) {
    *result = absl::CancelledError("stream cancelled");
  } else {
    // The client waits: framed samples go now rather than when a message
    // is full -- when decoding, once no decode of this stream is in flight
    // (the samples still being decoded join the message): a message per
    // sample would cost the client a wake-up per sample.
    if (ready_.empty() && error_.ok() && (!params_.decode || window_.empty()))
      FlushLocked();
    // Only when there is an answer to give (one fstat, not one per call).
    if (!ready_.empty() || !error_.ok() || finished_) CheckShardLocked();
    if (!ready_.empty()) {
      *result = PopReadyLocked();
    } else if (!error_.ok()) {
      *result = error_;
    } else if (finished_) {
      *result = std::optional<EncodedMessage>();
    } else {
      return nullptr;
    }
  }
  NextCallback waiter = std::move(waiter_);
  waiter_ = nullptr;
  return waiter;
}

void SampleStream::CheckShardLocked() {
  // Before anything read from the shard goes out (and before the stream's
  // end or error): a file truncated or rewritten in place since it was
  // opened fails the stream, replacing whatever error reading the changed
  // bytes produced, and nothing framed is sent.
  if (shard_changed_) return;
  absl::Status intact = absl::OkStatus();
  for (const PieceState& piece : pieces_) {
    if (piece.shard == nullptr) continue;
    intact = piece.shard->CheckIntact();
    if (!intact.ok()) break;
  }
  if (intact.ok()) return;
  shard_changed_ = true;
  error_ =
      absl::Status(intact.code(),
                   absl::StrCat("lease ", QuotePrefix(params_.lease.lease_id()),
                                ": ", intact.message()));
  ready_.clear();
  ready_bytes_ = 0;
  if (context_->metrics != nullptr)
    context_->metrics->shards_changed.Increment();
  LogWarning("%s", error_.message());
}

void SampleStream::Deliver(NextCallback callback, NextResult result) {
  if (callback == nullptr) return;
  if (result.ok() && result->has_value() && context_->metrics != nullptr) {
    context_->metrics->samples_served.Increment(
        static_cast<double>((*result)->num_samples()));
    context_->metrics->BytesServed(params_.locality)
        .Increment(static_cast<double>((*result)->size()));
    job_samples_->Increment(static_cast<double>((*result)->num_samples()));
  }
  callback(std::move(result));
}

void SampleStream::Cancel() {
  NextCallback waiter;
  {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    ready_.clear();
    ready_bytes_ = 0;
    waiter = std::move(waiter_);
    waiter_ = nullptr;
  }
  if (waiter) waiter(absl::CancelledError("stream cancelled"));
}

size_t SampleStream::RoomLocked() const {
  if (!params_.decode) {
    return ready_.size() >= context_->prefetch_messages ? 0
                                                        : kMaxSamplesPerStep;
  }
  // Framed and waiting: about as much as raw mode keeps ready.
  const size_t framed = ready_bytes_ + encoder_.pending_bytes();
  if (framed >=
      context_->prefetch_messages * static_cast<size_t>(params_.batch_bytes)) {
    return 0;
  }
  return window_.size() >= WindowSamples() ? 0
                                           : WindowSamples() - window_.size();
}

void SampleStream::MaybeProduceLocked() {
  if (producing_ || read_all_ || cancelled_ || !error_.ok()) return;
  if (RoomLocked() == 0) return;
  producing_ = true;
  Schedule([self = shared_from_this()] { self->Produce(); });
}

absl::Status SampleStream::OpenLocked() {
  // Where each piece starts: a plain unit's one piece at `start`; a window
  // piece after the samples it serves at positions before `start`.
  if (params_.labels != nullptr) {
    for (size_t k = 0; k < pieces_.size(); ++k)
      pieces_[k].next = params_.pieces[k].first;
    for (int64_t p = params_.label_base; p < params_.start; ++p) {
      ++pieces_[(*params_.labels)[static_cast<size_t>(p - params_.label_base)]]
            .next;
    }
  } else {
    pieces_[0].next = params_.start;
  }
  for (size_t k = 0; k < pieces_.size(); ++k) {
    PieceState& piece = pieces_[k];
    const Piece& spec = params_.pieces[k];
    piece.index = context_->index(piece.shard);
    const int64_t count = piece.index->num_samples();
    if (piece.index->damage.empty()) {
      if (spec.num_samples < 0 && params_.end > count) {
        return absl::OutOfRangeError(absl::StrCat(
            "lease ", QuotePrefix(params_.lease.lease_id()), ": samples [",
            params_.lease.unit().begin(), ", ", params_.end, ") of shard \"",
            spec.ref.url, "\" are beyond its ", count, " samples"));
      }
      if (spec.num_samples > count) {
        return absl::OutOfRangeError(absl::StrCat(
            "lease ", QuotePrefix(params_.lease.lease_id()), ": shard \"",
            spec.ref.url, "\" (shard_index ", spec.shard_index, ") has ", count,
            " samples, but the job's manifest says ", spec.num_samples));
      }
    }
    if (piece.next < count) {
      ASSIGN_OR_RETURN(piece.reader, TarSampleReader::Open(
                                         piece.shard, piece.index, piece.next,
                                         context_->max_sample_bytes));
    }
  }
  opened_ = true;
  return absl::OkStatus();
}

void SampleStream::OnShard(
    size_t piece, absl::StatusOr<std::shared_ptr<const ShardData>> shard) {
  const absl::Status opened = shard.status();
  {
    absl::MutexLock lock(&mu_);
    // Cancelled, or ended by another piece that could not be opened: the
    // pieces still arriving are dropped.
    if (cancelled_ || read_all_) {
      producing_ = false;
      return;
    }
    if (!opened.ok()) {
      // The first piece that fails ends the stream (Fail sets read_all_).
      read_all_ = true;
    } else {
      pieces_[piece].shard = *std::move(shard);
      // Production resumes once every piece is open.
      if (--pieces_missing_ > 0) return;
    }
  }
  if (!opened.ok()) {
    Fail(opened);
    return;
  }
  Schedule([self = shared_from_this()] { self->Produce(); });
}

absl::StatusOr<OutSample> SampleStream::Corrupt(int64_t index,
                                                const std::string& key,
                                                const std::string& reason,
                                                CorruptReason kind) {
  DataServerMetrics* metrics = context_->metrics;
  if (metrics != nullptr) metrics->Corrupt(kind).Increment();
  if (params_.policy == v1::CORRUPT_POLICY_FAIL) {
    return absl::DataLossError(
        absl::StrCat("sample ", index, " (\"", key, "\"): ", reason));
  }
  if (metrics != nullptr)
    metrics->Skipped(kind, params_.lease.job().substr(0, 128)).Increment();
  OutSample sample;
  sample.key = ValidUtf8(key);
  sample.index = index;
  sample.skipped = true;
  sample.skip_reason = ValidUtf8(reason);
  return sample;
}

void SampleStream::Produce() {
  size_t room;
  {
    absl::MutexLock lock(&mu_);
    if (cancelled_) {
      producing_ = false;
      return;
    }
    room = RoomLocked();
  }
  size_t missing;
  {
    absl::MutexLock lock(&mu_);
    missing = opened_ ? 0 : pieces_missing_;
  }
  if (missing > 0) {
    // Production pauses (producing_ stays set) until the store has every
    // piece's shard; the last OnShard resumes it.
    std::vector<size_t> to_open;
    for (size_t k = 0; k < pieces_.size(); ++k) {
      if (params_.pieces[k].shard == nullptr) to_open.push_back(k);
    }
    for (size_t k : to_open) {
      context_->store->OpenAsync(
          params_.pieces[k].ref,
          [self = shared_from_this(),
           k](absl::StatusOr<std::shared_ptr<const ShardData>> shard) {
            self->OnShard(k, std::move(shard));
          });
    }
    return;
  }
  if (!opened_) {
    absl::Status opened = OpenLocked();
    if (!opened.ok()) {
      Fail(opened);
      return;
    }
  }
  int64_t budget = params_.batch_bytes;
  std::vector<std::shared_ptr<Slot>> slots;
  std::vector<std::shared_ptr<Slot>> to_decode;
  bool failed = false;
  // About one message's worth of shard bytes per step; decoding, also no
  // more samples for the pool than the window has room for.
  const size_t max_heavy = std::max<size_t>(room, 1);
  size_t heavy_count = 0;
  while (next_ < params_.end && slots.size() < kMaxSamplesPerStep &&
         heavy_count < max_heavy) {
    auto slot = std::make_shared<Slot>();
    slot->piece =
        params_.labels == nullptr
            ? 0
            : (*params_
                    .labels)[static_cast<size_t>(next_ - params_.label_base)];
    PieceState& piece = pieces_[static_cast<size_t>(slot->piece)];
    slot->shard_index =
        params_.pieces[static_cast<size_t>(slot->piece)].shard_index;
    if (piece.next >= piece.index->num_samples()) {
      // Past the damage that ended the shard's index: these samples are lost.
      slot->out =
          Corrupt(piece.next, "", absl::StrCat("lost: ", piece.index->damage),
                  CorruptReason::kLost);
      if (slot->out.ok()) slot->out->piece = slot->piece;
      slot->done = true;
      slots.push_back(std::move(slot));
      ++piece.next;
      ++next_;
      continue;
    }
    int64_t size = piece.index->samples[piece.next].bytes;
    if (!slots.empty() && size > budget) break;
    budget -= size;
    auto sample = piece.reader->Next();
    if (!sample.ok()) {
      // Reading ends here, after the samples before it.
      slot->out = sample.status();
      slot->done = true;
      slots.push_back(std::move(slot));
      failed = true;
      break;
    }
    if (!sample->has_value()) break;  // cannot happen while next < count
    ++piece.next;
    ++next_;
    RawSample& raw = **sample;
    if (!raw.corrupt.empty()) {
      slot->out =
          Corrupt(raw.index, raw.key, raw.corrupt, ReasonOf(raw.damage));
      if (slot->out.ok()) slot->out->piece = slot->piece;
      slot->done = true;
      slots.push_back(std::move(slot));
      continue;
    }
    if (!params_.fields.empty()) {
      std::vector<RawField> kept;
      for (RawField& f : raw.fields) {
        if (params_.fields.contains(f.name)) kept.push_back(std::move(f));
      }
      raw.fields = std::move(kept);
    }
    slot->raw = std::move(raw);
    slot->shard = piece.shard.get();
    // Samples that need a real decoder go to the pool, one task each; the
    // rest are done here.
    bool heavy = false;
    if (params_.decode) {
      for (const RawField& f : slot->raw.fields) {
        Codec c = CodecForField(f.name);
        heavy |= c == Codec::kJpeg || c == Codec::kPng || c == Codec::kNpy;
      }
    }
    if (heavy) {
      to_decode.push_back(slot);
      ++heavy_count;
    } else {
      DecodeSample(*slot);
      slot->done = true;
    }
    slots.push_back(std::move(slot));
  }
  // Each decode waits for its memory, then goes to the pool. Reserved
  // before the window is appended to: until then no other produce step of
  // this stream can run (producing_ is set), so the stream's samples ask in
  // read order. Were a later step to reserve first, its samples could hold
  // the memory that an earlier sample -- which they wait behind in the
  // window -- needs. A decode that finishes before Append marks its slot
  // done; Append drains it.
  for (const std::shared_ptr<Slot>& s : to_decode) {
    const int64_t estimate = EstimateDecodeBytes(s->raw);
    s->budget = context_->decode_budget;
    s->job = params_.lease.job();
    s->reserved = estimate;
    context_->decode_budget->Reserve(s->job, params_.lease.weight(), estimate,
                                     [self = shared_from_this(), s] {
                                       self->Schedule([self, s] {
                                         // A decode still queued when the
                                         // client went away is not run.
                                         if (!self->IsCancelled())
                                           self->DecodeSample(*s);
                                         self->Done(s);
                                       });
                                     });
  }
  Append(std::move(slots), failed || next_ >= params_.end);
}

bool SampleStream::IsCancelled() {
  absl::MutexLock lock(&mu_);
  return cancelled_;
}

bool SampleStream::Append(std::vector<std::shared_ptr<Slot>> slots,
                          bool at_end) {
  NextCallback waiter;
  NextResult result;
  {
    absl::MutexLock lock(&mu_);
    producing_ = false;
    if (cancelled_) return false;
    for (auto& s : slots) window_.push_back(std::move(s));
    if (at_end) read_all_ = true;
    DrainLocked();
    // A raw step is about one message: send it as one.
    if (!params_.decode) FlushLocked();
    waiter = TakeWaiterLocked(&result);
    MaybeProduceLocked();
  }
  Deliver(std::move(waiter), std::move(result));
  return true;
}

void SampleStream::Done(const std::shared_ptr<Slot>& slot) {
  NextCallback waiter;
  NextResult result;
  if (context_->metrics != nullptr) {
    context_->metrics->decode_memory_bytes.Set(
        static_cast<double>(context_->decode_budget->in_use()));
  }
  {
    absl::MutexLock lock(&mu_);
    slot->done = true;
    if (cancelled_) return;
    DrainLocked();
    waiter = TakeWaiterLocked(&result);
    MaybeProduceLocked();
  }
  Deliver(std::move(waiter), std::move(result));
}

void SampleStream::Fail(absl::Status status) {
  auto slot = std::make_shared<Slot>();
  slot->out = std::move(status);
  slot->done = true;
  std::vector<std::shared_ptr<Slot>> slots;
  slots.push_back(std::move(slot));
  (void)Append(std::move(slots), true);
}

void SampleStream::DrainLocked() {
  std::vector<EncodedMessage> messages;
  while (!window_.empty() && window_.front()->done) {
    std::shared_ptr<Slot> slot = std::move(window_.front());
    window_.pop_front();
    if (!error_.ok()) continue;  // after an error nothing more is sent
    if (!slot->out.ok()) {
      // The samples before the error are still delivered, then the error.
      encoder_.Flush(&messages);
      error_ = slot->out.status();
      continue;
    }
    encoder_.Add(*std::move(slot->out), &messages);
  }
  PushReadyLocked(messages);
  if (window_.empty() && read_all_ && error_.ok()) {
    FlushLocked();
    finished_ = true;
  }
}

void SampleStream::DecodeSample(Slot& slot) {
  RawSample& raw = slot.raw;
  OutSample out;
  out.key = ValidUtf8(raw.key);
  out.index = raw.index;
  out.piece = slot.piece;
  out.fields.reserve(raw.fields.size());
  DataServerMetrics* metrics = context_->metrics;
  if (params_.decode && context_->before_decode_for_testing) {
    context_->before_decode_for_testing(raw.index);
  }
  // Every image field of the sample gets the geometry planned for the first
  // one (scaled to its own size), from the sample's stateless randomness.
  const ImageTransforms& transforms = *params_.transforms;
  std::optional<Geometry> geometry;
  ImageSize planned_for;
  const std::optional<uint64_t>& key =
      params_.pieces[static_cast<size_t>(slot.piece)].augment_seed;
  const SampleRandom random(key.value_or(params_.lease.augment_seed()),
                            params_.lease.epoch(), slot.shard_index, raw.index);
  for (RawField& f : raw.fields) {
    OutField field;
    field.name = std::move(f.name);
    MakeValidUtf8(&field.name);
    if (!params_.decode) {
      field.value.kind = DecodedField::Kind::kRaw;
      field.value.bytes = std::move(f.data);
      out.fields.push_back(std::move(field));
      continue;
    }
    Codec codec = CodecForField(field.name);
    auto started = std::chrono::steady_clock::now();
    ImageOptions image = params_.image;
    Geometry field_geometry;
    TransformTimes times;
    SharedDecode shared;
    absl::StatusOr<DecodedField> decoded = absl::UnknownError("not decoded");
    const bool is_image = codec == Codec::kJpeg || codec == Codec::kPng;
    if (is_image) {
      absl::StatusOr<ImageSize> size = ReadImageSize(codec, f.data);
      if (!size.ok()) {
        decoded = size.status();
      } else {
        if (!geometry.has_value()) {
          geometry = transforms.Plan(size->width, size->height, random);
          planned_for = *size;
        }
        field_geometry = ImageTransforms::ScaleTo(*geometry, planned_for.width,
                                                  planned_for.height,
                                                  size->width, size->height);
        image.transforms = &transforms;
        image.geometry = &field_geometry;
        image.interpolation = transforms.InterpolationFor(field.name);
        image.times = &times;
        // Another job reads the same shards (the coordinator says so) or
        // this shard now: the image is decoded once for both
        // (decoded_image_cache.h).
        const std::string& url =
            params_.pieces[static_cast<size_t>(slot.piece)].ref.url;
        if (context_->decoded_images != nullptr && slot.shard != nullptr &&
            (params_.lease.shared_shards() ||
             context_->decoded_images->SharedWithOtherJob(
                 url, params_.lease.job()))) {
          shared.cache = context_->decoded_images;
          shared.key = DecodedImageCache::ImageKey(url, *slot.shard, raw.index,
                                                   field.name, f.data.bytes);
          image.shared = &shared;
        }
        decoded = DecodeField(codec, f.data, image);
        if (image.shared != nullptr && metrics != nullptr) {
          metrics->SharedDecodes(shared.hit).Increment();
          // The bytes held change only when this call decoded (and kept)
          // an image.
          if (!shared.hit) {
            metrics->shared_decode_bytes.Set(
                static_cast<double>(shared.cache->stats().bytes));
          }
        }
      }
    } else {
      decoded = DecodeField(codec, f.data, image);
    }
    if (metrics != nullptr && codec != Codec::kRaw) {
      metrics->DecodeSeconds(CodecName(codec))
          .Observe(std::chrono::duration<double>(
                       std::chrono::steady_clock::now() - started)
                       .count());
      if (is_image) {
        metrics->DecoderCpuSeconds(CodecName(codec))
            .Increment(times.decoder_cpu);
      }
      if (is_image && !transforms.identity() && decoded.ok()) {
        metrics->images_transformed.Increment();
        metrics->TransformSeconds("resize").Observe(times.resize);
        metrics->TransformSeconds("crop").Observe(times.crop);
        metrics->TransformSeconds("output").Observe(times.output);
      }
    }
    if (!decoded.ok() &&
        absl::StartsWith(decoded.status().message(), "decode.")) {
      // The request's transforms do not fit this image (Normalize with 3
      // values for a 1-channel PNG): the request's error, not the data's.
      slot.out = absl::InvalidArgumentError(
          absl::StrCat(decoded.status().message(), " (shard \"",
                       params_.pieces[static_cast<size_t>(slot.piece)].ref.url,
                       "\", member \"", raw.key, ".", field.name, "\")"));
      slot.raw = RawSample();
      return;
    }
    if (!decoded.ok()) {
      slot.out = Corrupt(
          raw.index, raw.key,
          absl::StrCat("shard \"",
                       params_.pieces[static_cast<size_t>(slot.piece)].ref.url,
                       "\", member \"", raw.key, ".", field.name,
                       "\": ", decoded.status().message()),
          CorruptReason::kUndecodable);
      slot.raw = RawSample();
      return;
    }
    field.value = *std::move(decoded);
    out.fields.push_back(std::move(field));
  }
  slot.out = std::move(out);
  slot.raw = RawSample();
}

}  // namespace sluice::dataserver
