#include "server/coordinator/mix_plan.h"

#include <algorithm>
#include <numeric>

#include "server/common/mix_order.h"
#include "server/common/shuffle_window.h"

namespace sluice {

using i128 = __int128;

uint64_t SourceSeed(uint64_t seed, int32_t source) {
  return SplitMix64::Mix(
      SplitMix64::Mix(seed) ^
      SplitMix64::Mix(static_cast<uint64_t>(source) + 0x632BE59BD9B4E019ULL));
}

MixPlan::MixPlan(std::vector<MixSourceShape> sources,
                 const PlanOptions& options, int64_t block_samples)
    : sources_(std::move(sources)),
      options_(options),
      block_(std::max<int64_t>(block_samples, 1)) {
  for (MixSourceShape& src : sources_) {
    src.total = 0;
    for (int64_t n : src.shard_samples) src.total += std::max<int64_t>(n, 0);
  }
}

namespace {

// MixCountsBefore(counts, end), given `before` = the counts at `begin`: a
// short stretch is stepped through, a long one computed afresh.
std::vector<int64_t> CountsThrough(const std::vector<int64_t>& counts,
                                   const std::vector<int64_t>& before,
                                   int64_t begin, int64_t end) {
  if (end - begin > 2 * static_cast<int64_t>(counts.size()) + 2)
    return MixCountsBefore(counts, end);
  std::vector<int64_t> out = before;
  for (int32_t s : MixSourcesFrom(counts, before, end - begin))
    ++out[static_cast<size_t>(s)];
  return out;
}

}  // namespace

std::vector<int64_t> MixPlan::CountsAt(int64_t epoch,
                                       const std::vector<int64_t>& counts,
                                       int64_t position) const {
  constexpr size_t kRecent = 8;
  const int64_t reach = 2 * static_cast<int64_t>(counts.size()) + 2;
  std::vector<int64_t> out;
  int64_t from = -1;
  {
    absl::MutexLock lock(&mu_);
    for (const Counted& c : recent_) {
      if (c.epoch == epoch && c.position <= position &&
          position - c.position <= reach && c.position > from) {
        from = c.position;
        out = c.counts;
      }
    }
  }
  if (from < 0) {
    out = MixCountsBefore(counts, position);
  } else if (from < position) {
    for (int32_t s : MixSourcesFrom(counts, out, position - from))
      ++out[static_cast<size_t>(s)];
  }
  absl::MutexLock lock(&mu_);
  if (recent_.size() < kRecent) recent_.resize(kRecent);
  recent_[recent_next_] = Counted{epoch, position, out};
  recent_next_ = (recent_next_ + 1) % kRecent;
  return out;
}

std::vector<int64_t> MixPlan::EpochCounts(int64_t epoch) const {
  std::vector<int64_t> counts(sources_.size());
  for (size_t s = 0; s < sources_.size(); ++s) {
    const MixSourceShape& src = sources_[s];
    counts[s] = src.per_epoch;
    if (src.stop) {
      const i128 left = static_cast<i128>(src.num_samples()) -
                        static_cast<i128>(epoch) * src.per_epoch;
      counts[s] = static_cast<int64_t>(
          std::clamp<i128>(left, 0, static_cast<i128>(src.per_epoch)));
    }
  }
  return counts;
}

std::pair<int64_t, int64_t> MixPlan::StreamPosition(int32_t source,
                                                    int64_t epoch,
                                                    int64_t k) const {
  const MixSourceShape& src = sources_[static_cast<size_t>(source)];
  const int64_t n = src.num_samples();
  const i128 g = static_cast<i128>(epoch) * src.per_epoch + k;
  if (n <= 0) return {0, 0};
  if (src.stop && g >= n) return {0, n};
  return {static_cast<int64_t>(g / n), static_cast<int64_t>(g % n)};
}

uint64_t MixPlan::AugmentSeed(int32_t source, int64_t pass) const {
  return SplitMix64::Mix(
      SourceSeed(options_.seed, source) ^
      SplitMix64::Mix(static_cast<uint64_t>(pass) + 0x2545F4914F6CDD1DULL));
}

std::vector<SampleRange> MixPlan::EpochSequence(int64_t epoch) const {
  const std::vector<int64_t> counts = EpochCounts(epoch);
  const int64_t total = std::accumulate(counts.begin(), counts.end(), 0L);
  std::vector<SampleRange> out;
  out.reserve(static_cast<size_t>(total / block_ + 1));
  for (int64_t b = 0; b * block_ < total; ++b) {
    out.push_back(SampleRange{static_cast<int32_t>(b), b * block_,
                              std::min(total, (b + 1) * block_)});
  }
  return out;
}

std::shared_ptr<const MixPlan::Pass> MixPlan::PassOf(int32_t source,
                                                     int64_t pass) const {
  const std::pair<int32_t, int64_t> key{source, pass};
  {
    absl::MutexLock lock(&mu_);
    for (auto it = passes_.begin(); it != passes_.end(); ++it) {
      if (it->first != key) continue;
      passes_.splice(passes_.begin(), passes_, it);
      return passes_.front().second;
    }
  }
  const MixSourceShape& src = sources_[static_cast<size_t>(source)];
  PlanOptions options = options_;
  options.seed = SourceSeed(options_.seed, source);
  auto out = std::make_shared<Pass>();
  if (UsesWindows(options)) {
    for (ShuffleWindow& w : PlanWindows(src.shard_samples, options, pass)) {
      auto window = std::make_shared<Window>();
      window->shards = std::move(w.shards);
      window->samples = w.samples;
      window->order_seed = w.order_seed;
      out->windows.push_back(std::move(window));
    }
  } else {
    for (int32_t shard :
         ShardOrder(static_cast<int32_t>(src.shard_samples.size()),
                    options.seed, pass, options.shuffle)) {
      auto window = std::make_shared<Window>();
      window->shards = {shard};
      window->samples = std::max<int64_t>(src.shard_samples[shard], 0);
      out->windows.push_back(std::move(window));
    }
  }
  int64_t at = 0;
  for (const auto& w : out->windows) {
    out->starts.push_back(at);
    at += w->samples;
  }
  out->starts.push_back(at);
  absl::MutexLock lock(&mu_);
  passes_.emplace_front(key, out);
  // Two passes per source: the one being read and the next.
  while (passes_.size() > 2 * sources_.size() + 2) passes_.pop_back();
  return out;
}

std::vector<int64_t> MixPlan::SourceCounts(int64_t epoch, int64_t begin,
                                           int64_t end) const {
  const std::vector<int64_t> counts = EpochCounts(epoch);
  const std::vector<int64_t> before = CountsAt(epoch, counts, begin);
  std::vector<int64_t> out = CountsThrough(counts, before, begin, end);
  for (size_t s = 0; s < counts.size(); ++s) out[s] -= before[s];
  return out;
}

std::vector<MixPlan::Segment> MixPlan::Segments(int64_t epoch, int64_t begin,
                                                int64_t end) const {
  const std::vector<int64_t> counts = EpochCounts(epoch);
  const std::vector<int64_t> first = CountsAt(epoch, counts, begin);
  const std::vector<int64_t> last = CountsThrough(counts, first, begin, end);
  std::vector<Segment> out;
  for (size_t s = 0; s < sources_.size(); ++s) {
    const auto source = static_cast<int32_t>(s);
    const int64_t n = sources_[s].num_samples();
    int64_t k = first[s];
    const int64_t k_end = last[s];
    while (k < k_end && n > 0) {
      const auto [pass, offset] = StreamPosition(source, epoch, k);
      const std::shared_ptr<const Pass> layout = PassOf(source, pass);
      // The window holding `offset`: the last start <= offset, skipping
      // empty windows.
      const size_t w = static_cast<size_t>(
          std::upper_bound(layout->starts.begin(), layout->starts.end() - 1,
                           offset) -
          layout->starts.begin() - 1);
      const int64_t in_window = offset - layout->starts[w];
      const int64_t take =
          std::min(k_end - k, layout->windows[w]->samples - in_window);
      out.push_back(Segment{source, pass, layout->windows[w], in_window,
                            in_window + take});
      k += take;
    }
  }
  return out;
}

std::vector<int64_t> SourceShares(const v1::JobSpec& spec) {
  std::vector<int64_t> shares(static_cast<size_t>(spec.sources_size()), 0);
  int64_t fixed = 0;
  std::vector<double> weights;
  std::vector<size_t> weighted;
  for (int i = 0; i < spec.sources_size(); ++i) {
    const v1::Source& src = spec.sources(i);
    if (src.samples_per_epoch() > 0) {
      shares[static_cast<size_t>(i)] = src.samples_per_epoch();
      fixed += src.samples_per_epoch();
    } else {
      weights.push_back(src.weight());
      weighted.push_back(static_cast<size_t>(i));
    }
  }
  const std::vector<int64_t> split = Apportion(
      std::max<int64_t>(spec.samples_per_epoch() - fixed, 0), weights);
  for (size_t k = 0; k < weighted.size(); ++k) shares[weighted[k]] = split[k];
  return shares;
}

int64_t MixBlockSamples(const v1::JobSpec& spec,
                        const std::vector<int64_t>& shares) {
  const int64_t total = std::accumulate(shares.begin(), shares.end(), 0L);
  const int64_t window =
      spec.shuffle() && spec.shuffle_window() > 1 ? spec.shuffle_window() : 1;
  i128 block = -1;
  for (int i = 0; i < spec.sources_size(); ++i) {
    const int64_t c = shares[static_cast<size_t>(i)];
    const auto& shards = spec.sources(i).manifest().shards();
    if (c <= 0 || shards.empty()) continue;
    int64_t n = 0;
    for (const v1::Shard& sh : shards)
      n += std::max<int64_t>(sh.num_samples(), 0);
    const i128 mean = std::max<int64_t>(n / shards.size(), 1);
    const i128 b = window * mean * total / c;
    if (block < 0 || b < block) block = b;
  }
  return static_cast<int64_t>(
      std::clamp<i128>(block, 1, total > 0 ? total : 1));
}

std::shared_ptr<const MixPlan> MixPlanFromSpec(const v1::JobSpec& spec,
                                               const PlanOptions& options) {
  if (spec.sources_size() == 0) return nullptr;
  const std::vector<int64_t> shares = SourceShares(spec);
  std::vector<MixSourceShape> shapes;
  for (int i = 0; i < spec.sources_size(); ++i) {
    const v1::Source& src = spec.sources(i);
    MixSourceShape shape;
    shape.name = src.name();
    for (const v1::Shard& sh : src.manifest().shards())
      shape.shard_samples.push_back(sh.num_samples());
    shape.per_epoch = shares[static_cast<size_t>(i)];
    shape.stop = src.on_exhausted() == v1::ON_EXHAUSTED_STOP;
    shapes.push_back(std::move(shape));
  }
  return std::make_shared<const MixPlan>(std::move(shapes), options,
                                         MixBlockSamples(spec, shares));
}

v1::WindowPiece* AddPiece(
    const v1::Shard& shard, int32_t index,
    google::protobuf::RepeatedPtrField<v1::WindowPiece>* pieces) {
  v1::WindowPiece* piece = pieces->Add();
  piece->set_shard_index(index);
  piece->set_url(shard.url());
  piece->set_num_samples(shard.num_samples());
  piece->set_size_bytes(shard.size_bytes());
  piece->set_checksum(shard.checksum());
  return piece;
}

void MixUnitToProto(const MixPlan& plan, const v1::JobSpec& spec, int64_t epoch,
                    int64_t begin, int64_t end, v1::MixedUnit* unit) {
  const std::vector<int64_t> counts = plan.EpochCounts(epoch);
  const std::vector<MixPlan::Segment> segments =
      plan.Segments(epoch, begin, end);
  unit->mutable_mix_samples()->Add(counts.begin(), counts.end());
  for (const MixPlan::Segment& seg : segments) {
    const auto& shards = spec.sources(seg.source).manifest().shards();
    v1::MixSegment* out = unit->add_segments();
    out->set_source(seg.source);
    out->set_first_piece(unit->pieces_size());
    out->set_num_pieces(static_cast<int32_t>(seg.window->shards.size()));
    out->set_window_order(seg.window->order_seed);
    out->set_begin(seg.begin);
    out->set_end(seg.end);
    out->set_augment_seed(plan.AugmentSeed(seg.source, seg.pass));
    out->set_source_name(plan.sources()[seg.source].name);
    for (int32_t index : seg.window->shards)
      AddPiece(shards[index], index, unit->mutable_pieces())
          ->set_source(seg.source);
  }
}

}  // namespace sluice
