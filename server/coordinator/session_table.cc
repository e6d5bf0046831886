#include "server/coordinator/session_table.h"

#include <utility>

namespace sluice {

Session& SessionTable::Add(std::shared_ptr<SessionSink> sink) {
  const int64_t id = next_id_++;
  Session& s = sessions_[id];
  s.id = id;
  s.sink = std::move(sink);
  return s;
}

Session* SessionTable::Find(int64_t id) {
  auto it = sessions_.find(id);
  return it == sessions_.end() ? nullptr : &it->second;
}

Session* SessionTable::SessionOf(const std::string& trainer_id) {
  auto owner = session_of_trainer_.find(trainer_id);
  if (owner == session_of_trainer_.end()) return nullptr;
  Session* s = Find(owner->second);
  return s == nullptr || s->finished ? nullptr : s;
}

Session* SessionTable::Join(Session& s) {
  Open& open = open_[s.job];
  open.all.insert(s.id);
  ++open.per_slot[s.slot];
  ++open.per_rank[s.rank];
  auto [owner, inserted] = session_of_trainer_.emplace(s.trainer_id, s.id);
  if (inserted || owner->second == s.id) return nullptr;
  Session* previous = Find(owner->second);
  owner->second = s.id;
  return previous;
}

bool SessionTable::Leave(const Session& s) {
  if (!s.hello) return false;
  auto open = open_.find(s.job);
  if (open == open_.end() || open->second.all.erase(s.id) == 0) return false;
  open->second.wanting.erase(s.id);
  bool slot_left = false;
  if (auto n = open->second.per_slot.find(s.slot);
      n != open->second.per_slot.end() && --n->second <= 0) {
    open->second.per_slot.erase(n);
    slot_left = true;
  }
  if (auto n = open->second.per_rank.find(s.rank);
      n != open->second.per_rank.end() && --n->second <= 0) {
    open->second.per_rank.erase(n);
  }
  if (open->second.all.empty()) open_.erase(open);
  return slot_left;
}

bool SessionTable::Remove(int64_t id) {
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return false;
  auto owner = session_of_trainer_.find(it->second.trainer_id);
  if (owner != session_of_trainer_.end() && owner->second == id) {
    session_of_trainer_.erase(owner);
  }
  const bool slot_left = Leave(it->second);
  sessions_.erase(it);
  return slot_left;
}

const SessionTable::Open* SessionTable::OpenOf(const std::string& job) const {
  auto open = open_.find(job);
  return open == open_.end() ? nullptr : &open->second;
}

int64_t SessionTable::OpenCount(const std::string& job) const {
  const Open* open = OpenOf(job);
  return open == nullptr ? 0 : static_cast<int64_t>(open->all.size());
}

bool SessionTable::SlotHasOpenSession(const std::string& job,
                                      int32_t slot) const {
  const Open* open = OpenOf(job);
  if (open == nullptr) return false;
  auto n = open->per_slot.find(slot);
  return n != open->per_slot.end() && n->second > 0;
}

std::vector<int64_t> SessionTable::OpenIds(const std::string& job,
                                           bool wanting) const {
  const Open* open = OpenOf(job);
  if (open == nullptr) return {};
  const std::set<int64_t>& ids = wanting ? open->wanting : open->all;
  return {ids.begin(), ids.end()};
}

void SessionTable::SetWanting(const Session& s, bool wanting) {
  auto open = open_.find(s.job);
  if (open == open_.end() || open->second.all.count(s.id) == 0) return;
  if (wanting) {
    open->second.wanting.insert(s.id);
  } else {
    open->second.wanting.erase(s.id);
  }
}

std::map<std::string, int64_t> SessionTable::OpenCounts() const {
  std::map<std::string, int64_t> counts;
  for (const auto& [job, open] : open_)
    counts[job] = static_cast<int64_t>(open.all.size());
  return counts;
}

bool SessionTable::AnyOtherJobOpen(
    const std::string& job,
    absl::FunctionRef<bool(const std::string& other)> matches) const {
  for (const auto& [other, open] : open_) {
    if (other != job && !open.all.empty() && matches(other)) return true;
  }
  return false;
}

std::vector<int64_t> SessionTable::Ids() const {
  std::vector<int64_t> ids;
  ids.reserve(sessions_.size());
  for (const auto& [id, s] : sessions_) ids.push_back(id);
  return ids;
}

}  // namespace sluice
