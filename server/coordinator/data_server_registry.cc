#include "server/coordinator/data_server_registry.h"

#include <cmath>
#include <utility>

#include "absl/strings/string_view.h"

namespace sluice {
namespace {

uint64_t Fnv1a(absl::string_view s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

uint64_t Mix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace

int64_t DataServerRegistry::Add(const std::string& address, int32_t capacity,
                                std::shared_ptr<DataServerSink> sink,
                                const std::string& node,
                                const std::string& pool) {
  absl::MutexLock lock(&mu_);
  const int64_t id = next_id_++;
  Server& s = servers_[id];
  s.address = address;
  s.node = node;
  s.pool = pool;
  s.capacity = capacity > 0 ? capacity : 1;
  s.last_seen = clock_->Now();
  s.sink = std::move(sink);
  return id;
}

void DataServerRegistry::MarkAllSeen() {
  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_->Now();
  for (auto& [id, server] : servers_) server.last_seen = now;
}

bool DataServerRegistry::Heartbeat(int64_t id, bool* none_was_live,
                                   const Load* load) {
  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_->Now();
  auto it = servers_.find(id);
  if (it == servers_.end()) return false;
  if (none_was_live != nullptr)
    *none_was_live = !AnyLiveLocked(now, &it->second.pool);
  it->second.last_seen = now;
  if (load != nullptr) it->second.reported = *load;
  return true;
}

std::map<std::string, DataServerRegistry::Load>
DataServerRegistry::TakeLoadByPool() {
  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_->Now();
  struct Sum {
    Load load;
    int64_t cores = 0;
    int reporting = 0;
  };
  std::map<std::string, Sum> sums;
  for (auto& [id, s] : servers_) {
    if (!Live(s, now) || !s.reported.has_value()) continue;
    const Load& r = *s.reported;
    Sum& sum = sums[s.pool];
    sum.cores += r.cores;
    ++sum.reporting;
    // A count that went back is a server restarted under its address.
    if (s.taken.has_value() && r.samples_served >= s.taken->samples_served &&
        r.cpu_seconds >= s.taken->cpu_seconds) {
      sum.load.samples_served += r.samples_served - s.taken->samples_served;
      sum.load.cpu_seconds += r.cpu_seconds - s.taken->cpu_seconds;
    }
    s.taken = r;
  }
  std::map<std::string, Load> out;
  for (auto& [pool, sum] : sums) {
    sum.load.cores = static_cast<int32_t>(sum.cores / sum.reporting);
    out[pool] = sum.load;
  }
  return out;
}

void DataServerRegistry::Remove(int64_t id) {
  absl::MutexLock lock(&mu_);
  servers_.erase(id);
}

std::optional<std::string> DataServerRegistry::SetDraining(int64_t id) {
  absl::MutexLock lock(&mu_);
  auto it = servers_.find(id);
  if (it == servers_.end()) return std::nullopt;
  it->second.draining = true;
  return it->second.address;
}

int DataServerRegistry::DrainingCount() const {
  absl::MutexLock lock(&mu_);
  int draining = 0;
  for (const auto& [id, s] : servers_) draining += s.draining;
  return draining;
}

bool DataServerRegistry::AnyLiveLocked(absl::Time now,
                                       const std::string* pool) const {
  for (const auto& [id, s] : servers_) {
    if (Live(s, now) && (pool == nullptr || s.pool == *pool)) return true;
  }
  return false;
}

bool DataServerRegistry::AnyLive() const {
  absl::MutexLock lock(&mu_);
  return AnyLiveLocked(clock_->Now(), nullptr);
}

bool DataServerRegistry::AnyLiveIn(const std::string& pool) const {
  absl::MutexLock lock(&mu_);
  return AnyLiveLocked(clock_->Now(), &pool);
}

std::map<std::string, DataServerRegistry::PoolCounts>
DataServerRegistry::CountsByPool() const {
  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_->Now();
  std::map<std::string, PoolCounts> out;
  for (const auto& [id, s] : servers_) {
    PoolCounts& c = out[s.pool];
    c.live += Live(s, now);
    c.draining += s.draining;
  }
  return out;
}

int DataServerRegistry::LiveCount() const {
  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_->Now();
  int live = 0;
  for (const auto& [id, s] : servers_) live += Live(s, now);
  return live;
}

std::vector<std::string> DataServerRegistry::LiveAddresses() const {
  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_->Now();
  std::vector<std::string> out;
  for (const auto& [id, s] : servers_) {
    if (Live(s, now)) out.push_back(s.address);
  }
  return out;
}

std::vector<std::string> DataServerRegistry::LiveAddressesIn(
    const std::string& pool) const {
  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_->Now();
  std::vector<std::string> out;
  for (const auto& [id, s] : servers_) {
    if (s.pool == pool && Live(s, now)) out.push_back(s.address);
  }
  return out;
}

void DataServerRegistry::MarkSuspect(const std::string& address) {
  absl::MutexLock lock(&mu_);
  const absl::Time until = clock_->Now() + timeout_;
  for (auto& [id, s] : servers_) {
    if (s.address == address) s.suspect_until = until;
  }
}

std::string DataServerRegistry::Pick(const std::string& shard_url) const {
  return Pick(shard_url, [](const std::string&) { return false; });
}

// Each live server scores -capacity / ln(u), u in (0, 1) from a hash of
// (server address, shard URL); the top score wins, ties to the smaller
// address.
std::string DataServerRegistry::Pick(
    const std::string& shard_url,
    absl::FunctionRef<bool(const std::string&)> avoid, const std::string& node,
    bool* same_node, const std::string& pool) const {
  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_->Now();
  const uint64_t shard_hash = Mix64(Fnv1a(shard_url));
  const Server* best = nullptr;
  double best_score = -1;
  // Pass 0: on the reader's node, live, not suspect, not avoided; 1: live,
  // not suspect, not avoided; 2: live, not avoided; 3: live.
  for (int pass = node.empty() ? 1 : 0; pass < 4 && best == nullptr; ++pass) {
    for (const auto& [id, s] : servers_) {
      if (!Live(s, now) || s.pool != pool) continue;
      if (pass == 0 && s.node != node) continue;
      if (pass <= 1 && now < s.suspect_until) continue;
      if (pass <= 2 && avoid(s.address)) continue;
      const uint64_t h = Mix64(Fnv1a(s.address) ^ shard_hash);
      const double u = (static_cast<double>(h >> 11) + 0.5) * 0x1.0p-53;
      const double score = -static_cast<double>(s.capacity) / std::log(u);
      if (score > best_score ||
          (score == best_score && s.address < best->address)) {
        best_score = score;
        best = &s;
      }
    }
  }
  if (same_node != nullptr) {
    *same_node = best != nullptr && !node.empty() && best->node == node;
  }
  return best == nullptr ? std::string() : best->address;
}

std::optional<DataServerRegistry::HintTarget> DataServerRegistry::NoteHint(
    const std::string& address, const std::string& shard_url) {
  absl::MutexLock lock(&mu_);
  for (auto& [id, s] : servers_) {
    if (s.address != address || s.sink == nullptr) continue;
    if (!s.hinted_set.insert(shard_url).second) return std::nullopt;
    s.hinted.push_back(shard_url);
    if (s.hinted.size() > kRememberedHints) {
      s.hinted_set.erase(s.hinted.front());
      s.hinted.pop_front();
    }
    return HintTarget{id, s.sink};
  }
  return std::nullopt;
}

}  // namespace sluice
