#include "server/coordinator/audit.h"

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/common/mixed_unit.h"
#include "server/common/quote.h"
#include "server/common/shuffle_window.h"
#include "server/common/work_unit.h"
#include "server/coordinator/job_report.h"

namespace sluice {
namespace {

absl::Status BadField(const v1::AuditRequest& r, absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("audit of job ", QuotePrefix(r.job()), ": ", what));
}

// The labels of the windows a page meets, by order seed: the parts of one
// window (a unit split, or acknowledged in pieces) order it once.
using LabelsByWindow = std::map<uint64_t, std::vector<uint16_t>>;

// Appends positions [unit.begin, unit.end) of a window unit: the window's
// labels say which piece serves each position, and a piece's samples are
// served in file order.
void NameWindow(const v1::WorkUnit& unit, int64_t position,
                v1::AuditResponse* out,
                std::vector<const v1::WindowPiece*>* pieces_of,
                LabelsByWindow* cache) {
  const auto& pieces = unit.window().pieces();
  std::vector<int64_t> sizes;
  sizes.reserve(pieces.size());
  for (const v1::WindowPiece& p : pieces) sizes.push_back(p.num_samples());
  auto cached = cache->find(unit.window().window_order());
  if (cached == cache->end()) {
    cached = cache
                 ->emplace(unit.window().window_order(),
                           WindowLabels(sizes, unit.window().window_order()))
                 .first;
  }
  const std::vector<uint16_t>& labels = cached->second;
  std::vector<int64_t> next(sizes.size(), 0);
  for (int64_t p = 0; p < unit.begin(); ++p) ++next[labels[p]];
  for (int64_t p = unit.begin(); p < unit.end(); ++p) {
    const v1::WindowPiece& piece = pieces.Get(labels[p]);
    v1::AuditedSample* s = out->add_samples();
    s->set_position(position++);
    s->set_shard_index(piece.shard_index());
    s->set_shard_url(piece.url());
    s->set_index(next[labels[p]]++);
    pieces_of->push_back(&piece);
  }
}

absl::Status NameMixed(const v1::WorkUnit& unit, int64_t position,
                       const std::string& job, v1::AuditResponse* out,
                       std::vector<const v1::WindowPiece*>* pieces_of) {
  v1::Lease lease;
  lease.set_lease_id(absl::StrCat("audit/", job, "/u", unit.sequence()));
  *lease.mutable_unit() = unit;
  absl::StatusOr<MixedOrder> order = OrderMixedUnit(
      lease, [](const std::vector<int64_t>& sizes, uint64_t order_seed) {
        return std::make_shared<const std::vector<uint16_t>>(
            WindowLabels(sizes, order_seed));
      });
  if (!order.ok()) return order.status();
  const v1::MixedUnit& mixed = unit.mixed();
  // Each piece's segment: its source's name and augmentation key.
  std::vector<const v1::MixSegment*> segment_of(mixed.pieces_size(), nullptr);
  for (const v1::MixSegment& seg : mixed.segments()) {
    for (int32_t i = seg.first_piece();
         i < seg.first_piece() + seg.num_pieces() && i < mixed.pieces_size();
         ++i) {
      if (i >= 0) segment_of[i] = &seg;
    }
  }
  std::vector<int64_t> next = order->first;
  for (uint16_t label : order->labels) {
    const v1::WindowPiece& piece = mixed.pieces(label);
    v1::AuditedSample* s = out->add_samples();
    s->set_position(position++);
    s->set_shard_index(piece.shard_index());
    s->set_shard_url(piece.url());
    s->set_index(next[label]++);
    if (const v1::MixSegment* seg = segment_of[label]; seg != nullptr) {
      s->set_source(seg->source_name());
      s->set_augment_seed(seg->augment_seed());
    }
    pieces_of->push_back(&piece);
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<int64_t> AuditableEpochs(const JobData& job) {
  std::vector<int64_t> epochs;
  if (!job.history.empty()) epochs.push_back(job.epoch - 1);
  if (!job.done) epochs.push_back(job.epoch);
  return epochs;
}

absl::StatusOr<AuditSlice> SliceAudit(
    const JobData& job, const v1::AuditRequest& request,
    const std::vector<ShuffleWindow>& current_windows) {
  const std::vector<int64_t> kept = AuditableEpochs(job);
  if (std::find(kept.begin(), kept.end(), request.epoch()) == kept.end()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "audit of job ", QuotePrefix(request.job()),
        ": audit.epoch=", request.epoch(), " is not kept; the job keeps ",
        kept.empty() ? std::string("no epoch")
                     : absl::StrCat("epoch(s) ", absl::StrJoin(kept, ", ")),
        " (its current epoch and the one before it)"));
  }
  const bool current = request.epoch() == job.epoch;
  const EpochPlan& plan = current ? job.plan : job.history.front().plan;
  const AckLog& rolled_back =
      current ? job.rolled_back : job.history.front().rolled_back;
  const AckLog& log =
      request.rolled_back()
          ? rolled_back
          : (current ? job.ack_log : job.history.front().ack_log);
  if (request.rank() < 0 || request.rank() >= plan.num_ranks) {
    return BadField(request,
                    absl::StrCat("audit.rank=", request.rank(),
                                 " is not within [0, ", plan.num_ranks,
                                 ") (the job's world size, or 1 without one)"));
  }
  if (request.worker() < 0 || request.worker() >= plan.workers_per_rank) {
    return BadField(
        request, absl::StrCat("audit.worker=", request.worker(),
                              " is not within [0, ", plan.workers_per_rank,
                              "): epoch ", request.epoch(), " was read with ",
                              plan.workers_per_rank, " reader(s) per rank"));
  }
  if (request.start() < 0) {
    return BadField(request,
                    absl::StrCat("audit.start=", request.start(), " < 0"));
  }
  if (request.count() < 0 || request.count() > kAuditMaxCount) {
    return BadField(request,
                    absl::StrCat("audit.count=", request.count(),
                                 " is not within [0, ", kAuditMaxCount, "]"));
  }
  const int64_t count =
      request.count() == 0 ? kAuditDefaultCount : request.count();
  const int32_t slot = plan.SlotOf(request.rank(), request.worker());
  const std::vector<AckedRange> empty;
  const std::vector<AckedRange>& ranges =
      static_cast<size_t>(slot) < log.size() ? log[slot] : empty;

  AuditSlice slice;
  v1::AuditResponse& h = slice.header;
  h.set_job(request.job());
  h.set_epoch(request.epoch());
  h.set_rank(request.rank());
  h.set_worker(request.worker());
  h.set_workers_per_rank(plan.workers_per_rank);
  for (int64_t e : kept) h.add_epochs_kept(e);
  if (request.replay_leases()) {
    slice.replay = true;
    v1::Lease& l = slice.lease_template;
    l.set_job(request.job());
    l.set_epoch(request.epoch());
    l.set_rank(job.spec.world_size() > 0 ? request.rank() : -1);
    l.set_on_corrupt(job.spec.on_corrupt());
    l.set_augment_seed(job.spec.seed());
    l.set_weight(std::max(job.spec.weight(), 1));
    l.set_tenant(job.spec.tenant());
  }
  std::vector<ShuffleWindow> planned;
  const std::vector<ShuffleWindow>* windows = &current_windows;
  if (!current && job.mix == nullptr && UsesWindows(job.options)) {
    planned = PlanWindows(*job.shard_samples, job.options, request.epoch());
    windows = &planned;
  }
  // What resumes rolled back, per unit.
  std::map<int64_t, IntervalSet> rolled;
  if (!request.rolled_back()) {
    for (const std::vector<AckedRange>& slot_log : rolled_back) {
      for (const AckedRange& a : slot_log)
        rolled[a.sequence].Add(a.begin, a.end);
    }
  }
  const int64_t first = request.start();
  const int64_t last = first + count;
  int64_t position = 0;
  for (const AckedRange& a : ranges) {
    const int64_t size = a.end - a.begin;
    const int64_t lo = std::max(position, first);
    const int64_t hi = std::min(position + size, last);
    if (lo < hi) {
      AuditSlice::Part part;
      part.position = lo;
      UnitToProto(job, request.epoch(), a.shard_index,
                  a.begin + (lo - position), a.begin + (hi - position),
                  a.sequence, *windows, &part.unit);
      if (auto r = rolled.find(a.sequence); r != rolled.end()) {
        const int64_t b = part.unit.begin(), e = part.unit.end();
        for (const auto& [rb, re] : r->second.ranges()) {
          if (rb < e && re > b)
            part.reread.emplace_back(std::max(rb, b), std::min(re, e));
        }
      }
      slice.parts.push_back(std::move(part));
    }
    position += size;
  }
  h.set_total(position);
  return slice;
}

absl::StatusOr<v1::AuditResponse> NameAuditedSamples(
    AuditSlice slice, const SignReplayLease& sign) {
  v1::AuditResponse out = std::move(slice.header);
  LabelsByWindow labels;
  for (const AuditSlice::Part& part : slice.parts) {
    const v1::WorkUnit& unit = part.unit;
    const int first = out.samples_size();
    // The shard each sample was read from (window and mixed units).
    std::vector<const v1::WindowPiece*> pieces;
    if (unit.has_window()) {
      NameWindow(unit, part.position, &out, &pieces, &labels);
    } else if (unit.has_mixed()) {
      if (absl::Status named =
              NameMixed(unit, part.position, out.job(), &out, &pieces);
          !named.ok()) {
        return named;
      }
    } else {
      int64_t position = part.position;
      for (int64_t i = unit.begin(); i < unit.end(); ++i) {
        v1::AuditedSample* s = out.add_samples();
        s->set_position(position++);
        s->set_shard_index(unit.shard().shard_index());
        s->set_shard_url(unit.shard().url());
        s->set_index(i);
      }
    }
    for (int i = first; i < out.samples_size(); ++i) {
      v1::AuditedSample* s = out.mutable_samples(i);
      s->set_sequence(unit.sequence());
      s->set_unit_kind(UnitKindName(unit));
      // Every kind names the unit's positions in order from its begin.
      const int64_t at = unit.begin() + (i - first);
      for (const auto& [rb, re] : part.reread) {
        if (at >= rb && at < re) s->set_reread(true);
      }
      if (!unit.has_mixed()) {
        s->set_augment_seed(slice.lease_template.augment_seed());
      }
      if (!slice.replay) continue;
      v1::Lease* lease = s->mutable_replay_lease();
      *lease = slice.lease_template;
      lease->set_lease_id(absl::StrCat("replay/", out.job(), "/e", out.epoch(),
                                       "/r", out.rank(), "w", out.worker(),
                                       "/p", s->position()));
      lease->set_augment_seed(s->augment_seed());
      v1::WorkUnit* one = lease->mutable_unit();
      one->set_begin(s->index());
      one->set_end(s->index() + 1);
      one->set_sequence(unit.sequence());
      v1::ShardRange* range = one->mutable_shard();
      range->set_shard_index(s->shard_index());
      range->set_url(s->shard_url());
      if (unit.has_shard()) {
        range->set_size_bytes(unit.shard().size_bytes());
        range->set_checksum(unit.shard().checksum());
      } else {
        const v1::WindowPiece* piece = pieces[static_cast<size_t>(i - first)];
        range->set_size_bytes(piece->size_bytes());
        range->set_checksum(piece->checksum());
      }
      if (sign) sign(lease);
    }
  }
  return out;
}

}  // namespace sluice
