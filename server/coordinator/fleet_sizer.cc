#include "server/coordinator/fleet_sizer.h"

#include <algorithm>
#include <cmath>

namespace sluice {

FleetSizer::FleetSizer(FleetSizerOptions options) : options_(options) {
  options_.min_servers = std::max(options_.min_servers, 0);
  options_.max_servers = std::max(options_.max_servers, options_.min_servers);
}

int32_t FleetSizer::Recommend(const FleetSample& now) {
  double wait = 0, reader_seconds = 0, cpu = 0;
  int64_t consumed = 0, served = 0;
  for (const FleetSample& s : window_) {
    wait += s.wait_seconds;
    reader_seconds += s.reader_seconds;
    consumed += s.consumed;
    served += s.served;
    cpu += s.server_cpu_seconds;
  }
  const double seconds =
      std::max(absl::ToDoubleSeconds(now.time - window_.front().time), 1e-3);
  Measures& m = measures_;
  m.wait_share = reader_seconds > 0 ? std::min(wait / reader_seconds, 1.0) : 0;
  // The first sample's increments happened before the window's start.
  m.consumed_per_second =
      static_cast<double>(consumed - window_.front().consumed) / seconds;
  // A lightly loaded fleet uses too little CPU to measure itself: the
  // capacity measured last holds until the next measure.
  if (cpu >= options_.min_cpu_seconds && served > 0) {
    capacity_ =
        static_cast<double>(served) / cpu * std::max(now.cores_per_server, 1.0);
  }
  m.server_capacity = capacity_;
  const int32_t live = now.live_servers;
  const auto servers_for = [&](double rate) {
    return static_cast<int32_t>(
        std::ceil(rate * options_.headroom / m.server_capacity));
  };
  int32_t rec = live;
  if (now.readers == 0) {
    rec = options_.min_servers;
  } else if (m.server_capacity <= 0) {
    rec = live;
  } else if (m.wait_share >= options_.scale_up_wait) {
    const double w = std::min(m.wait_share, options_.max_wait_share);
    rec = std::max(live, servers_for(m.consumed_per_second / (1 - w)));
  } else if (m.wait_share <= options_.scale_down_wait) {
    rec = std::min(live, servers_for(m.consumed_per_second));
  }
  rec = std::clamp(rec, options_.min_servers, options_.max_servers);
  m.recommended = rec;
  return rec;
}

int32_t FleetSizer::Update(const FleetSample& s) {
  window_.push_back(s);
  while (window_.size() > 1 &&
         window_.front().time < s.time - options_.window) {
    window_.pop_front();
  }
  const int32_t rec = Recommend(s);
  recommendations_.emplace_back(s.time, rec);
  while (recommendations_.front().first <
         s.time - options_.down_stabilization) {
    recommendations_.pop_front();
  }
  if (desired_ < 0) {
    desired_ =
        std::clamp(s.live_servers, options_.min_servers, options_.max_servers);
    last_change_ = s.time;
  }
  if (rec > desired_ && s.time - last_change_ >= options_.up_cooldown) {
    desired_ = rec;
    last_change_ = s.time;
  } else if (rec < desired_ &&
             s.time - last_change_ >= options_.down_stabilization) {
    // The highest recommendation of the stabilisation window.
    int32_t highest = rec;
    for (const auto& [time, r] : recommendations_)
      highest = std::max(highest, r);
    if (highest < desired_) {
      desired_ = highest;
      last_change_ = s.time;
    }
  }
  return desired_;
}

}  // namespace sluice
