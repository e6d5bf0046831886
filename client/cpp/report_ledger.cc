#include "client/cpp/report_ledger.h"

#include <algorithm>

namespace sluice::client_internal {

void ReportLedger::Sent(const std::string& lease_id,
                        const v1::TrainerMessage& message, int64_t order) {
  reports_[lease_id] = Report{message, order, last_sync_id_};
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

}  // namespace sluice::client_internal
