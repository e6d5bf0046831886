// How many data servers the jobs need: the coordinator's answer to "is
// input the bottleneck, and how much serving would end it?".
//
// Fed every few seconds with what happened since the last call: samples
// the trainers acknowledged, the seconds their consumers waited for input
// (heartbeat InputWait) against the seconds they read, and the samples and
// CPU seconds the live data servers reported. Over the last `window`:
//
//   w = wait seconds / reader seconds            (the trainers' wait share)
//   r = samples acknowledged / second            (what they consume now)
//   c = samples served / server CPU second x cores per server
//                                                (one server's capacity)
//
// While w >= scale_up_wait, input is the bottleneck: the trainers would
// consume r / (1 - w) with input free (w capped at max_wait_share), and
// the recommendation is ceil(that x headroom / c), never fewer servers than
// are live. While w <= scale_down_wait, the recommendation is
// ceil(r x headroom / c), never more than are live. A window with under
// min_cpu_seconds of server CPU (a lightly loaded fleet) does not measure c:
// the last measure holds. In between, or before any measure of c, it is the
// live count. Idle (no reader) it is min_servers. Always within
// [min_servers, max_servers].
//
// The answer follows the recommendation up at most once per up_cooldown,
// and down only to the highest recommendation of the last
// down_stabilization, at most once per down_stabilization (as Kubernetes'
// HPA stabilises scale-down), so a burst or a lull does not make it flap.
//
// Not thread-safe; pure over its inputs (times come with the samples).
#ifndef SLUICE_SERVER_COORDINATOR_FLEET_SIZER_H_
#define SLUICE_SERVER_COORDINATOR_FLEET_SIZER_H_

#include <cstdint>
#include <deque>

#include "absl/time/time.h"

namespace sluice {

struct FleetSizerOptions {
  int32_t min_servers = 1;
  int32_t max_servers = 64;
  absl::Duration window = absl::Seconds(30);
  double scale_up_wait = 0.2;
  double scale_down_wait = 0.05;
  double max_wait_share = 0.9;
  double headroom = 1.25;
  double min_cpu_seconds = 1.0;
  absl::Duration up_cooldown = absl::Seconds(30);
  absl::Duration down_stabilization = absl::Minutes(2);
};

// What happened since the previous sample, at `time`.
struct FleetSample {
  absl::Time time;
  int64_t consumed = 0;           // samples acknowledged, all jobs
  double wait_seconds = 0;        // trainers' reported input wait
  double reader_seconds = 0;      // open readers x elapsed seconds
  int64_t served = 0;             // samples the live data servers served
  double server_cpu_seconds = 0;  // the CPU time they used for it
  double cores_per_server = 1;    // mean over the live servers
  int32_t live_servers = 0;
  int32_t readers = 0;  // open now
};

class FleetSizer {
 public:
  explicit FleetSizer(FleetSizerOptions options = {});

  // Records `s` (times must not go back) and returns the data servers
  // wanted now.
  int32_t Update(const FleetSample& s);

  // The window's measures as of the last Update (for status and logs).
  struct Measures {
    double wait_share = 0;
    double consumed_per_second = 0;
    double server_capacity = 0;  // c above; 0 = not measured
    int32_t recommended = 0;
  };
  const Measures& measures() const { return measures_; }
  int32_t desired() const { return desired_; }

 private:
  int32_t Recommend(const FleetSample& now);

  FleetSizerOptions options_;
  std::deque<FleetSample> window_;
  std::deque<std::pair<absl::Time, int32_t>> recommendations_;
  Measures measures_;
  double capacity_ = 0;   // c, as last measured (0 = never)
  int32_t desired_ = -1;  // none yet
  absl::Time last_change_ = absl::InfinitePast();
};

}  // namespace sluice

#endif  // SLUICE_SERVER_COORDINATOR_FLEET_SIZER_H_
