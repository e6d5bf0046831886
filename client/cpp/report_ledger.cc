#include "client/cpp/report_ledger.h"

#include <algorithm>

#include "server/common/work_unit.h"

namespace sluice::client_internal {

void ReportLedger::Sent(const v1::Lease& lease, int64_t delivered,
                        const v1::TrainerMessage& message, int64_t order) {
  reports_[lease.lease_id()] =
      Report{lease, delivered, message, order, last_sync_id_};
}

void ReportLedger::Synced(uint64_t id) {
  synced_ = std::max(synced_, id);
  for (auto it = reports_.begin(); it != reports_.end();) {
    it = it->second.after_sync < synced_ ? reports_.erase(it) : std::next(it);
  }
}

std::vector<v1::TrainerMessage> ReportLedger::Unconfirmed() const {
  std::vector<const Report*> by_order;
  by_order.reserve(reports_.size());
  for (const auto& [id, r] : reports_) by_order.push_back(&r);
  std::sort(
      by_order.begin(), by_order.end(),
      [](const Report* a, const Report* b) { return a->order < b->order; });
  std::vector<v1::TrainerMessage> out;
  out.reserve(by_order.size());
  for (const Report* r : by_order) out.push_back(r->message);
  return out;
}

const v1::TrainerMessage* ReportLedger::Find(
    const std::string& lease_id) const {
  auto it = reports_.find(lease_id);
  return it == reports_.end() ? nullptr : &it->second.message;
}

std::optional<ReportLedger::Dropped> ReportLedger::Drop(
    const std::string& lease_id) {
  auto it = reports_.find(lease_id);
  if (it == reports_.end()) return std::nullopt;
  Dropped dropped{std::move(it->second.lease), it->second.delivered};
  reports_.erase(it);
  return dropped;
}

std::vector<ReportLedger::Dropped> ReportLedger::DropSameUnit(
    const v1::Lease& lease) {
  std::vector<Dropped> out;
  for (auto it = reports_.begin(); it != reports_.end();) {
    const v1::Lease& old = it->second.lease;
    if (it->first != lease.lease_id() && old.epoch() == lease.epoch() &&
        old.unit().sequence() == lease.unit().sequence() &&
        UnitIndex(old.unit()) == UnitIndex(lease.unit())) {
      out.push_back(Dropped{std::move(it->second.lease), it->second.delivered});
      it = reports_.erase(it);
    } else {
      ++it;
    }
  }
  return out;
}

}  // namespace sluice::client_internal
