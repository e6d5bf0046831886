#include "server/common/mixed_unit.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "server/common/mix_order.h"
#include "server/common/quote.h"

namespace sluice {
namespace {

absl::Status Bad(const v1::Lease& lease, absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("lease ", QuotePrefix(lease.lease_id()), ": ", what));
}

}  // namespace

absl::StatusOr<MixedOrder> OrderMixedUnit(const v1::Lease& lease,
                                          const WindowLabelsFn& window_labels) {
  const v1::WorkUnit& unit = lease.unit();
  const v1::MixedUnit& mixed = unit.mixed();
  if (mixed.mix_samples_size() > kMaxMixSources) {
    return Bad(lease,
               absl::StrCat("lease.unit.mixed.mix_samples has ",
                            mixed.mix_samples_size(),
                            " sources, above the limit of ", kMaxMixSources));
  }
  if (mixed.pieces_size() > 65535) {
    return Bad(lease,
               absl::StrCat("lease.unit.mixed.pieces has ", mixed.pieces_size(),
                            " shards, above the limit of 65535"));
  }
  std::vector<int64_t> counts;
  int64_t total = 0;
  for (int s = 0; s < mixed.mix_samples_size(); ++s) {
    const int64_t c = mixed.mix_samples(s);
    if (c < 0 || c > (int64_t{1} << 50)) {
      return Bad(lease, absl::StrCat("lease.unit.mixed.mix_samples[", s,
                                     "]=", c, " is out of range"));
    }
    counts.push_back(c);
    total += c;
  }
  if (unit.begin() < 0 || unit.end() <= unit.begin() || unit.end() > total) {
    return absl::OutOfRangeError(absl::StrCat(
        "lease ", QuotePrefix(lease.lease_id()), ": lease.unit range [",
        unit.begin(), ", ", unit.end(), ") is not inside the mixed epoch's ",
        total, " positions"));
  }
  if (unit.end() - unit.begin() > kMaxUnitLabels) {
    return Bad(lease,
               absl::StrCat("lease.unit has ", unit.end() - unit.begin(),
                            " positions, above the limit of ", kMaxUnitLabels));
  }
  if ((unit.end() - unit.begin()) * std::max(mixed.mix_samples_size(), 1) >
      kMaxUnitLabels * 4) {
    return Bad(lease,
               absl::StrCat("lease.unit mixes ", mixed.mix_samples_size(),
                            " sources over ", unit.end() - unit.begin(),
                            " positions, above the limit of ",
                            kMaxUnitLabels * 4, " for their product"));
  }
  MixedOrder out;
  out.first.assign(static_cast<size_t>(mixed.pieces_size()), 0);
  int64_t window_labels_total = 0;  // labels computed for all segments
  // Per source: its segments' labels (global piece numbers), in order.
  std::vector<std::vector<uint16_t>> stream(counts.size());
  for (int g = 0; g < mixed.segments_size(); ++g) {
    const v1::MixSegment& seg = mixed.segments(g);
    const std::string field =
        absl::StrCat("lease.unit.mixed.segments[", g, "]");
    if (seg.source() < 0 || seg.source() >= mixed.mix_samples_size()) {
      return Bad(
          lease,
          absl::StrCat(field, ".source=", seg.source(),
                       " names no source of lease.unit.mixed.mix_samples"));
    }
    if (seg.first_piece() < 0 || seg.num_pieces() < 1 ||
        seg.num_pieces() > mixed.pieces_size() - seg.first_piece()) {
      return Bad(lease, absl::StrCat(field, " names pieces [",
                                     seg.first_piece(), ", +", seg.num_pieces(),
                                     ") of ", mixed.pieces_size()));
    }
    std::vector<int64_t> sizes;
    int64_t samples = 0;
    for (int k = 0; k < seg.num_pieces(); ++k) {
      const v1::WindowPiece& p = mixed.pieces(seg.first_piece() + k);
      if (p.source() != seg.source() || p.num_samples() < 0 ||
          p.num_samples() > kMaxUnitLabels - samples) {
        return Bad(lease, absl::StrCat("lease.unit.mixed.pieces[",
                                       seg.first_piece() + k,
                                       "] has another source than ", field,
                                       " or a sample count out of range"));
      }
      sizes.push_back(p.num_samples());
      samples += p.num_samples();
    }
    window_labels_total += samples;
    if (window_labels_total > 2 * kMaxUnitLabels) {
      return Bad(lease,
                 absl::StrCat("the windows of lease.unit.mixed.segments hold "
                              "more than ",
                              2 * kMaxUnitLabels, " samples"));
    }
    if (seg.begin() < 0 || seg.end() <= seg.begin() || seg.end() > samples) {
      return Bad(lease,
                 absl::StrCat(field, " range [", seg.begin(), ", ", seg.end(),
                              ") is not inside its ", samples, " samples"));
    }
    const std::shared_ptr<const std::vector<uint16_t>> labels =
        window_labels(sizes, seg.window_order());
    std::vector<uint16_t>& to = stream[static_cast<size_t>(seg.source())];
    if (static_cast<int64_t>(to.size()) + (seg.end() - seg.begin()) >
        unit.end() - unit.begin()) {
      return Bad(lease, absl::StrCat(field, " is more than the unit holds"));
    }
    for (int64_t p = 0; p < seg.begin(); ++p)
      ++out.first[static_cast<size_t>(seg.first_piece() + (*labels)[p])];
    for (int64_t p = seg.begin(); p < seg.end(); ++p) {
      to.push_back(static_cast<uint16_t>(seg.first_piece() + (*labels)[p]));
    }
  }
  const std::vector<int64_t> before = MixCountsBefore(counts, unit.begin());
  const std::vector<int64_t> through = MixCountsBefore(counts, unit.end());
  for (size_t s = 0; s < counts.size(); ++s) {
    const auto source = static_cast<int32_t>(s);
    const int64_t want = through[s] - before[s];
    if (static_cast<int64_t>(stream[s].size()) != want) {
      return Bad(lease,
                 absl::StrCat("the segments of source ", source, " hold ",
                              stream[s].size(), " samples, but positions [",
                              unit.begin(), ", ", unit.end(),
                              ") of the mix give it ", want));
    }
  }
  const std::vector<int32_t> sources =
      MixSources(counts, unit.begin(), unit.end());
  std::vector<size_t> at(counts.size(), 0);
  out.labels.reserve(sources.size());
  for (int32_t s : sources)
    out.labels.push_back(stream[static_cast<size_t>(s)][at[s]++]);
  return out;
}

}  // namespace sluice
