#include "server/dataserver/dataserver_service.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "server/common/lease_token.h"
#include "server/common/logging.h"
#include "server/common/mixed_unit.h"
#include "server/common/quote.h"
#include "server/common/shuffle_window.h"
#include "server/common/status_details.h"
#include "server/common/status_macros.h"
#include "server/common/work_unit.h"

namespace sluice::dataserver {
absl::StatusOr<std::unique_ptr<DataServerService>> DataServerService::Create(
    DataServerOptions options) {
  if (options.store == nullptr) {
    return absl::InvalidArgumentError("a shard store is required");
  }
  if (options.default_batch_bytes <= 0 || options.max_batch_bytes <= 0) {
    return absl::InvalidArgumentError("--max_batch_bytes must be positive");
  }
  if (options.prefetch_messages == 0) options.prefetch_messages = 1;
  return std::unique_ptr<DataServerService>(
      new DataServerService(std::move(options)));
}

DataServerService::DataServerService(DataServerOptions options)
    : options_(std::move(options)),
      index_cache_(options_.index_cache_entries),
      decode_budget_(options_.max_decode_memory),
      pool_(options_.decode_threads) {
  stream_context_.pool = &pool_;
  stream_context_.decode_budget = &decode_budget_;
  if (options_.shared_decode_bytes > 0) {
    decoded_images_ =
        std::make_unique<DecodedImageCache>(options_.shared_decode_bytes);
    stream_context_.decoded_images = decoded_images_.get();
  }
  stream_context_.store = options_.store.get();
  stream_context_.metrics = options_.metrics;
  stream_context_.prefetch_messages = options_.prefetch_messages;
  stream_context_.max_sample_bytes = options_.max_sample_bytes;
  stream_context_.index = [this](const std::shared_ptr<const ShardData>& s) {
    return GetIndex(s);
  };
  stream_context_.before_decode_for_testing =
      options_.before_decode_for_testing;
  stream_context_.stream_ended = [this](const v1::Lease& lease) {
    {
      absl::MutexLock lock(&mu_);
      --active_streams_;
      auto it = tenant_streams_.find(lease.tenant());
      if (it != tenant_streams_.end() && --it->second == 0)
        tenant_streams_.erase(it);
    }
    if (options_.metrics != nullptr)
      options_.metrics->active_streams.Decrement();
  };
}

std::shared_ptr<const ShardIndex> DataServerService::GetIndex(
    const std::shared_ptr<const ShardData>& shard) {
  std::string key = absl::StrCat(shard->path(), "@", shard->version());
  if (auto index = index_cache_.Find(key)) {
    if (options_.metrics != nullptr)
      options_.metrics->index_cache_hits.Increment();
    return index;
  }
  if (options_.metrics != nullptr)
    options_.metrics->index_cache_misses.Increment();
  // Two streams may scan the same new shard at once; both get the same
  // result and the second insert wins. Cheaper than a lock around a scan.
  auto index = std::make_shared<const ShardIndex>(BuildShardIndex(shard));
  index_cache_.Insert(key, index);
  return index;
}

absl::Status DataServerService::CheckExpiry(const v1::Lease& lease) const {
  if (lease.expires_at_unix_ms() <= 0)
    return absl::OkStatus();  // signed without one
  const int64_t late =
      absl::ToUnixMillis(absl::Now()) - lease.expires_at_unix_ms();
  if (late <= absl::ToInt64Milliseconds(options_.lease_clock_skew))
    return absl::OkStatus();
  return absl::AbortedError(absl::StrCat(
      "lease ", QuotePrefix(lease.lease_id()), " (job ",
      QuotePrefix(lease.job()), ") expired ", late,
      " ms ago, beyond the allowed clock skew of ",
      absl::FormatDuration(options_.lease_clock_skew),
      " (--lease_clock_skew); its holder gets a fresh token while it holds the "
      "lease"));
}

absl::Status DataServerService::CheckFence(const v1::Lease& lease) {
  absl::MutexLock lock(&mu_);
  return fences_.Check(lease);
}

size_t DataServerService::fence_units() const {
  absl::MutexLock lock(&mu_);
  return fences_.ranges();
}

uint64_t DataServerService::max_fence_seen() const {
  absl::MutexLock lock(&mu_);
  return fences_.max_fence_seen();
}

absl::StatusOr<std::shared_ptr<SampleStream>> DataServerService::ReadSamples(
    const v1::ReadRequest& request) {
  return OpenStream(request, /*check_fence=*/true);
}

namespace {

// INVALID_ARGUMENT naming the lease unless it is a replay lease: one
// sample of one shard.
absl::Status CheckReplayLease(const v1::Lease& lease, int64_t start) {
  const v1::WorkUnit& unit = lease.unit();
  if (unit.has_shard() && unit.end() - unit.begin() == 1 &&
      (start == 0 || start == unit.begin())) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "lease ", QuotePrefix(lease.lease_id()),
      ": a replay lease covers exactly one sample of one shard; this one "
      "is a ",
      UnitKindName(unit), " unit [", unit.begin(), ", ", unit.end(),
      ") (replay leases come from Coordinator.Audit with replay_leases)"));
}

// The draws of `raw` (the lease's sample, fields undecoded) under
// `transforms`, planned for its first image field; empty without one or
// when its header does not parse.
v1::SampleDraws PlanDraws(const v1::Lease& lease,
                          const ImageTransforms& transforms,
                          const v1::Sample& raw) {
  v1::SampleDraws draws;
  for (const v1::Field& f : raw.fields()) {
    const Codec codec = CodecForField(f.name());
    if (codec != Codec::kJpeg && codec != Codec::kPng) continue;
    absl::StatusOr<ImageSize> size =
        ReadImageSize(codec, Payload{f.raw(), nullptr});
    if (!size.ok()) break;  // the decode says why
    const SampleRandom random(lease.augment_seed(), lease.epoch(),
                              lease.unit().shard().shard_index(),
                              lease.unit().begin());
    const Geometry g = transforms.Plan(size->width, size->height, random);
    draws.set_source_width(size->width);
    draws.set_source_height(size->height);
    for (const GeometryStep& step : g.steps) {
      v1::GeometryStep* out = draws.add_steps();
      out->set_kind(step.kind == GeometryStep::Kind::kCrop ? "crop" : "resize");
      out->set_left(step.left);
      out->set_top(step.top);
      out->set_width(step.width);
      out->set_height(step.height);
    }
    draws.set_flip_horizontal(g.flip_horizontal);
    draws.set_flip_vertical(g.flip_vertical);
    break;
  }
  return draws;
}

// The most leases one ReplayDraws call plans.
constexpr int kMaxReplayDraws = 10000;

}  // namespace

void DataServerService::ReplaySample(
    const v1::ReadRequest& request,
    std::function<void(absl::StatusOr<v1::ReplayedSample>)> done) {
  absl::Status shape = CheckReplayLease(request.lease(), request.start());
  if (!shape.ok()) return done(shape);
  absl::StatusOr<ImageTransforms> transforms =
      ImageTransforms::FromSpec(request.decode());
  if (!transforms.ok()) return done(transforms.status());
  // First the sample's raw fields, for the size its transforms were
  // planned for; then the sample as the trainer got it.
  RawSample(request.lease(), request.fields(),
            [this, request, transforms = *std::move(transforms),
             done = std::move(done)](absl::StatusOr<v1::Sample> raw) mutable {
              if (!raw.ok()) return done(raw.status());
              v1::ReplayedSample replayed;
              if (request.decode().decode()) {
                *replayed.mutable_draws() =
                    PlanDraws(request.lease(), transforms, *raw);
              }
              absl::StatusOr<std::shared_ptr<SampleStream>> stream =
                  OpenStream(request, /*check_fence=*/false);
              if (!stream.ok()) return done(stream.status());
              CollectBatch(
                  *std::move(stream),
                  [replayed = std::move(replayed), done = std::move(done)](
                      absl::StatusOr<v1::SampleBatch> batch) mutable {
                    if (!batch.ok()) return done(batch.status());
                    if (batch->samples_size() != 1) {
                      return done(absl::InternalError(absl::StrCat(
                          "a replay served ", batch->samples_size(),
                          " samples, not one")));
                    }
                    *replayed.mutable_sample() =
                        std::move(*batch->mutable_samples(0));
                    done(std::move(replayed));
                  });
            });
}

void DataServerService::ReplayDraws(
    const v1::ReplayDrawsRequest& request,
    std::function<void(absl::StatusOr<v1::ReplayDrawsResponse>)> done) {
  if (request.leases_size() > kMaxReplayDraws) {
    return done(absl::InvalidArgumentError(
        absl::StrCat("replay_draws.leases has ", request.leases_size(),
                     " leases; at most ", kMaxReplayDraws, " per call")));
  }
  for (const v1::Lease& lease : request.leases()) {
    absl::Status shape = CheckReplayLease(lease, 0);
    if (!shape.ok()) return done(shape);
  }
  absl::StatusOr<ImageTransforms> transforms =
      ImageTransforms::FromSpec(request.decode());
  if (!transforms.ok()) return done(transforms.status());
  auto plan = std::make_shared<DrawsPlan>();
  plan->request = request;
  plan->transforms.emplace(*std::move(transforms));
  plan->done = std::move(done);
  NextDraws(plan);
}

void DataServerService::NextDraws(const std::shared_ptr<DrawsPlan>& plan) {
  const int next = plan->response.draws_size();
  if (next == plan->request.leases_size() || !plan->request.decode().decode()) {
    plan->response.mutable_draws()->Reserve(plan->request.leases_size());
    while (plan->response.draws_size() < plan->request.leases_size()) {
      plan->response.add_draws();
    }
    return plan->done(std::move(plan->response));
  }
  const v1::Lease& lease = plan->request.leases(next);
  RawSample(lease, plan->request.fields(),
            [this, plan, &lease](absl::StatusOr<v1::Sample> raw) {
              if (!raw.ok()) return plan->done(raw.status());
              *plan->response.add_draws() =
                  PlanDraws(lease, *plan->transforms, *raw);
              // On a pool thread: a sample read inline must not nest the next
              // call.
              pool_.Schedule([this, plan] { NextDraws(plan); });
            });
}

void DataServerService::RawSample(
    const v1::Lease& lease,
    const google::protobuf::RepeatedPtrField<std::string>& fields,
    std::function<void(absl::StatusOr<v1::Sample>)> done) {
  v1::ReadRequest raw;
  *raw.mutable_lease() = lease;
  *raw.mutable_fields() = fields;
  absl::StatusOr<std::shared_ptr<SampleStream>> stream =
      OpenStream(raw, /*check_fence=*/false);
  if (!stream.ok()) return done(stream.status());
  CollectBatch(*std::move(stream), [done = std::move(done)](
                                       absl::StatusOr<v1::SampleBatch> batch) {
    if (!batch.ok()) return done(batch.status());
    if (batch->samples_size() != 1) {
      return done(absl::InternalError(absl::StrCat(
          "a replay read ", batch->samples_size(), " samples, not one")));
    }
    done(std::move(*batch->mutable_samples(0)));
  });
}

void DataServerService::CollectBatch(
    std::shared_ptr<SampleStream> stream,
    std::function<void(absl::StatusOr<v1::SampleBatch>)> done) {
  auto pump = std::make_shared<ReplayPump>();
  pump->stream = std::move(stream);
  pump->done = std::move(done);
  ReplayPump::Pull(pump);
}

void DataServerService::ReplayPump::Pull(
    const std::shared_ptr<ReplayPump>& pump) {
  pump->stream->Next([pump](absl::StatusOr<std::optional<EncodedMessage>> m) {
    if (!m.ok()) return pump->done(m.status());
    if (!m->has_value()) return pump->done(std::move(pump->batch));
    v1::SampleBatch part;
    if (!part.ParseFromString((*m)->Flatten())) {
      return pump->done(absl::InternalError("a replayed batch does not parse"));
    }
    pump->batch.MergeFrom(part);
    Pull(pump);
  });
}

absl::StatusOr<std::shared_ptr<SampleStream>> DataServerService::OpenStream(
    const v1::ReadRequest& request, bool check_fence) {
  {
    absl::MutexLock lock(&mu_);
    if (draining_) {
      return HandedBackStatus(absl::StrCat(
          "data server draining (shutting down): lease ",
          QuotePrefix(request.lease().lease_id()), " of job ",
          QuotePrefix(request.lease().job()), " handed back unread"));
    }
  }
  const v1::Lease& lease = request.lease();
  if (!options_.lease_secret.empty()) {
    RETURN_IF_ERROR(VerifyLeaseToken(lease, options_.lease_secret));
    RETURN_IF_ERROR(CheckExpiry(lease));
    if (check_fence) RETURN_IF_ERROR(CheckFence(lease));
  }
  const v1::WorkUnit& unit = lease.unit();
  if (unit.kind_case() == v1::WorkUnit::KIND_NOT_SET) {
    return absl::InvalidArgumentError(absl::StrCat(
        "lease ", QuotePrefix(lease.lease_id()),
        ": lease.unit names no kind (shard, window or mixed); a client or "
        "coordinator of another protocol version sent it"));
  }
  std::optional<MixedOrder> mixed_order;
  if (unit.has_mixed()) {
    ASSIGN_OR_RETURN(
        mixed_order,
        OrderMixedUnit(lease, [this](const std::vector<int64_t>& sizes,
                                     uint64_t order_seed) {
          return LabelsFor(sizes, order_seed);
        }));
  }
  if (unit.has_shard() && unit.shard().url().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("lease ", QuotePrefix(lease.lease_id()),
                     ": lease.unit.shard.url is empty"));
  }
  int64_t window_samples = 0;
  if (unit.has_window()) {
    const auto& pieces = unit.window().pieces();
    if (pieces.empty() || pieces.size() > 2 * kMaxShuffleWindowShards) {
      return absl::InvalidArgumentError(absl::StrCat(
          "lease ", QuotePrefix(lease.lease_id()),
          ": lease.unit.window.pieces has ", pieces.size(),
          " shards, not within [1, ", 2 * kMaxShuffleWindowShards, "]"));
    }
    for (int i = 0; i < pieces.size(); ++i) {
      const v1::WindowPiece& p = pieces.Get(i);
      if (p.url().empty() || p.num_samples() < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("lease ", QuotePrefix(lease.lease_id()),
                         ": lease.unit.window.pieces[", i,
                         "] has an empty url or a negative num_samples"));
      }
      window_samples += p.num_samples();
      if (window_samples > kMaxUnitLabels) {
        return absl::InvalidArgumentError(absl::StrCat(
            "lease ", QuotePrefix(lease.lease_id()),
            ": lease.unit.window.pieces hold more than ", kMaxUnitLabels,
            " samples, above the limit of one shuffle window"));
      }
    }
  }
  if (!unit.has_mixed() && (unit.begin() < 0 || unit.end() <= unit.begin())) {
    return absl::OutOfRangeError(absl::StrCat(
        "lease ", QuotePrefix(lease.lease_id()), ": lease.unit range [",
        unit.begin(), ", ", unit.end(), ") of shard \"", UnitFirstUrl(unit),
        "\" is empty or negative"));
  }
  if (unit.has_window() && unit.end() > window_samples) {
    return absl::OutOfRangeError(absl::StrCat(
        "lease ", QuotePrefix(lease.lease_id()), ": lease.unit range [",
        unit.begin(), ", ", unit.end(), ") is beyond the ", window_samples,
        " samples of its shuffle window (", unit.window().pieces_size(),
        " shards from \"", UnitFirstUrl(unit), "\")"));
  }
  int64_t start = request.start() == 0 ? unit.begin() : request.start();
  if (start < unit.begin() || start > unit.end()) {
    return absl::OutOfRangeError(absl::StrCat(
        "lease ", QuotePrefix(lease.lease_id()), ": start ", request.start(),
        " is outside the unit [", unit.begin(), ", ", unit.end(), ")"));
  }
  if (request.max_batch_bytes() < 0) {
    return absl::InvalidArgumentError("max_batch_bytes is negative");
  }
  const v1::DecodeSpec& d = request.decode();
  ASSIGN_OR_RETURN(ImageTransforms transforms, ImageTransforms::FromSpec(d));
  SampleStream::Params params;
  auto add_piece = [&](const std::string& url, int64_t size_bytes,
                       const std::string& checksum, int32_t shard_index,
                       int64_t num_samples, int64_t first) -> absl::Status {
    SampleStream::Piece piece;
    piece.first = first;
    piece.ref.url = url;
    piece.ref.size_bytes = size_bytes;
    piece.ref.checksum = checksum;
    piece.shard_index = shard_index;
    piece.num_samples = num_samples;
    if (!options_.store->IsRemote(url)) {
      // Local: open now, so a bad path fails the call before a stream
      // exists.
      ASSIGN_OR_RETURN(piece.shard, options_.store->Open(piece.ref));
    }
    params.pieces.push_back(std::move(piece));
    return absl::OkStatus();
  };
  switch (unit.kind_case()) {
    case v1::WorkUnit::kMixed: {
      const v1::MixedUnit& mixed = unit.mixed();
      for (int i = 0; i < mixed.pieces_size(); ++i) {
        const v1::WindowPiece& p = mixed.pieces(i);
        RETURN_IF_ERROR(add_piece(p.url(), p.size_bytes(), p.checksum(),
                                  p.shard_index(), p.num_samples(),
                                  mixed_order->first[static_cast<size_t>(i)]));
      }
      for (const v1::MixSegment& seg : mixed.segments()) {
        for (int k = 0; k < seg.num_pieces(); ++k) {
          params.pieces[static_cast<size_t>(seg.first_piece() + k)]
              .augment_seed = seg.augment_seed();
        }
      }
      params.labels = std::make_shared<const std::vector<uint16_t>>(
          std::move(mixed_order->labels));
      params.label_base = unit.begin();
      break;
    }
    case v1::WorkUnit::kWindow: {
      std::vector<int64_t> sizes;
      for (const v1::WindowPiece& p : unit.window().pieces()) {
        RETURN_IF_ERROR(add_piece(p.url(), p.size_bytes(), p.checksum(),
                                  p.shard_index(), p.num_samples(), 0));
        sizes.push_back(p.num_samples());
      }
      params.labels = LabelsFor(sizes, unit.window().window_order());
      break;
    }
    case v1::WorkUnit::kShard:
    case v1::WorkUnit::KIND_NOT_SET: {
      const v1::ShardRange& shard = unit.shard();
      RETURN_IF_ERROR(add_piece(shard.url(), shard.size_bytes(),
                                shard.checksum(), shard.shard_index(), -1, 0));
      break;
    }
  }
  params.lease = lease;
  params.start = start;
  params.end = unit.end();
  params.decode = d.decode();
  params.transforms =
      std::make_shared<const ImageTransforms>(std::move(transforms));
  params.image.max_pixels = options_.max_image_pixels;
  for (const std::string& f : request.fields()) params.fields.insert(f);
  params.batch_bytes =
      request.max_batch_bytes() == 0
          ? options_.default_batch_bytes
          : std::min(request.max_batch_bytes(), options_.max_batch_bytes);
  params.locality = LocalityOf(options_.node, request.node());
  params.policy = lease.on_corrupt() == v1::CORRUPT_POLICY_FAIL
                      ? v1::CORRUPT_POLICY_FAIL
                      : v1::CORRUPT_POLICY_SKIP;
  {
    absl::MutexLock lock(&mu_);
    if (const int32_t limit = options_.max_streams_per_tenant; limit > 0) {
      int& open = tenant_streams_[lease.tenant()];
      if (open >= limit) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "lease ", QuotePrefix(lease.lease_id()), ": ",
            lease.tenant().empty()
                ? std::string("the default tenant")
                : absl::StrCat("tenant ", QuotePrefix(lease.tenant())),
            " has ", open, " streams open on this data server; the limit is ",
            limit, " (--max_streams_per_tenant)"));
      }
      ++open;
    }
    ++active_streams_;
  }
  if (options_.metrics != nullptr) options_.metrics->active_streams.Increment();
  return std::make_shared<SampleStream>(&stream_context_, std::move(params));
}

std::shared_ptr<const std::vector<uint16_t>> DataServerService::LabelsFor(
    const std::vector<int64_t>& sizes, uint64_t order_seed) {
  constexpr size_t kMaxWindows = 16;
  std::string key = absl::StrCat(order_seed);
  for (int64_t n : sizes) absl::StrAppend(&key, ",", n);
  {
    absl::MutexLock lock(&mu_);
    for (auto it = labels_.begin(); it != labels_.end(); ++it) {
      if (it->first != key) continue;
      labels_.splice(labels_.begin(), labels_, it);
      return labels_.front().second;
    }
  }
  auto labels = std::make_shared<const std::vector<uint16_t>>(
      WindowLabels(sizes, order_seed));
  absl::MutexLock lock(&mu_);
  // Another stream may have computed the same window meanwhile.
  for (const auto& [k, v] : labels_) {
    if (k == key) return v;
  }
  labels_.emplace_front(std::move(key), labels);
  if (labels_.size() > kMaxWindows) labels_.pop_back();
  return labels;
}

absl::StatusOr<v1::ShardIndex> DataServerService::IndexShard(
    const v1::IndexShardRequest& request) {
  absl::Notification done;
  absl::StatusOr<v1::ShardIndex> result;
  IndexShardAsync(request, [&](absl::StatusOr<v1::ShardIndex> index) {
    result = std::move(index);
    done.Notify();
  });
  done.WaitForNotification();
  return result;
}

void DataServerService::IndexShardAsync(
    const v1::IndexShardRequest& request,
    std::function<void(absl::StatusOr<v1::ShardIndex>)> done) {
  if (request.url().empty()) {
    done(absl::InvalidArgumentError("url is empty"));
    return;
  }
  options_.store->OpenAsync(
      ShardRef{request.url(), 0, ""},
      [this, request = v1::IndexShardRequest(request), done = std::move(done)](
          absl::StatusOr<std::shared_ptr<const ShardData>> shard) mutable {
        if (!shard.ok()) {
          done(shard.status());
          return;
        }
        pool_.Schedule(
            [this, request = std::move(request), done = std::move(done),
             shard = *std::move(shard)] { done(IndexOf(request, shard)); });
      });
}

absl::StatusOr<v1::ShardIndex> DataServerService::IndexOf(
    const v1::IndexShardRequest& request,
    const std::shared_ptr<const ShardData>& shard) {
  std::shared_ptr<const ShardIndex> index = GetIndex(shard);
  // An index scanned while the file was being rewritten is not the file's.
  RETURN_IF_ERROR(shard->CheckIntact());
  if (!index->damage.empty()) {
    return absl::DataLossError(index->damage);
  }
  v1::ShardIndex out;
  out.set_url(request.url());
  out.set_num_samples(index->num_samples());
  out.set_size_bytes(index->size_bytes);
  if (request.include_samples()) {
    for (const IndexedSample& s : index->samples) {
      out.add_keys(ValidUtf8(s.key));
      out.add_sample_bytes(s.bytes);
    }
  }
  return out;
}

void DataServerService::Drain() {
  absl::MutexLock lock(&mu_);
  draining_ = true;
}

void DataServerService::HandBack() { handing_back_.store(true); }

bool DataServerService::IsHandedBack(const absl::Status& status) {
  return HasStatusDetail(status, v1::HandedBack::descriptor()->full_name());
}

absl::Status DataServerService::HandedBackStatus(absl::string_view what) {
  return StatusWithDetail(absl::StatusCode::kUnavailable, what,
                          v1::HandedBack());
}

int DataServerService::active_streams() const {
  absl::MutexLock lock(&mu_);
  return active_streams_;
}

}  // namespace sluice::dataserver
