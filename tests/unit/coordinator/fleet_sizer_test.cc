#include "server/coordinator/fleet_sizer.h"

#include <gtest/gtest.h>

namespace sluice {
namespace {

const absl::Time kT0 = absl::FromUnixSeconds(1000);
constexpr absl::Duration kTick = absl::Seconds(5);

// Five seconds of a fleet: `live` servers each using one of its 2 cores to
// serve 1,000 samples/s between them (c = 2,000 samples/s per server), 8
// readers consuming `rate` samples/s and waiting `wait` of their time.
FleetSample Tick(absl::Time at, int32_t live, double rate, double wait,
                 int32_t readers = 8) {
  FleetSample s;
  s.time = at;
  s.consumed = static_cast<int64_t>(rate * 5);
  s.reader_seconds = readers * 5.0;
  s.wait_seconds = wait * s.reader_seconds;
  s.served = s.consumed;
  s.server_cpu_seconds = s.served / 1000.0;
  s.cores_per_server = 2;
  s.live_servers = live;
  s.readers = readers;
  return s;
}

// Feeds `n` ticks from *at on, returning the last answer.
int32_t Feed(FleetSizer& f, absl::Time* at, int n, int32_t live, double rate,
             double wait, int32_t readers = 8) {
  int32_t desired = 0;
  for (int i = 0; i < n; ++i) {
    desired = f.Update(Tick(*at, live, rate, wait, readers));
    *at += kTick;
  }
  return desired;
}

TEST(FleetSizerTest, InputBoundTrainersGetTheServersTheirUnboundRateNeeds) {
  FleetSizer f;
  absl::Time at = kT0;
  // 1,000/s consumed at a 0.6 wait share: 2,500/s wanted, x 1.25 headroom
  // over 2,000/s per server: 2 servers, after the 30 s cool-down.
  EXPECT_EQ(Feed(f, &at, 6, 1, 1000, 0.6), 1);
  EXPECT_EQ(f.measures().recommended, 2);
  EXPECT_NEAR(f.measures().wait_share, 0.6, 1e-9);
  EXPECT_NEAR(f.measures().consumed_per_second, 1000, 1e-6);
  EXPECT_NEAR(f.measures().server_capacity, 2000, 1e-6);
  EXPECT_EQ(Feed(f, &at, 1, 1, 1000, 0.6), 2);
}

TEST(FleetSizerTest, NoMoreServersWhileTrainersAreNotWaiting) {
  FleetSizer f;
  absl::Time at = kT0;
  // Fast consumption, but a wait share under the scale-up threshold.
  EXPECT_EQ(Feed(f, &at, 40, 1, 50000, 0.1), 1);
  EXPECT_EQ(f.measures().recommended, 1);
}

TEST(FleetSizerTest, ServersLeaveOnlyAfterTheStabilisationWindow) {
  FleetSizer f;
  absl::Time at = kT0;
  // 4 live, 1,000/s needs 1 (x 1.25 / 2,000), no waiting: down to 1, but
  // only once the recommendation held for 2 minutes.
  EXPECT_EQ(Feed(f, &at, 24, 4, 1000, 0.01), 4);  // 115 s
  EXPECT_EQ(f.measures().recommended, 1);
  EXPECT_EQ(Feed(f, &at, 1, 4, 1000, 0.01), 1);
}

TEST(FleetSizerTest, AlternatingBurstsAndLullsDoNotFlap) {
  FleetSizer f;
  absl::Time at = kT0;
  int changes = 0;
  int32_t last = Feed(f, &at, 1, 2, 1000, 0.01);
  for (int i = 0; i < 120; ++i) {  // 10 minutes, bursts every 5 s
    const bool burst = i % 2 == 0;
    const int32_t now =
        Feed(f, &at, 1, last, burst ? 3000 : 1000, burst ? 0.7 : 0.01);
    changes += now != last;
    last = now;
  }
  // Up once (the bursts' need), never down: every 2-minute window holds a
  // burst's recommendation.
  EXPECT_EQ(changes, 1);
  EXPECT_GT(last, 2);
}

TEST(FleetSizerTest, BetweenTheThresholdsOrUnmeasuredTheLiveCountStays) {
  FleetSizer f;
  absl::Time at = kT0;
  EXPECT_EQ(Feed(f, &at, 40, 3, 1000, 0.1), 3);
  FleetSizer g;
  at = kT0;
  // No server CPU reported: no capacity, no change.
  for (int i = 0; i < 40; ++i) {
    FleetSample s = Tick(at, 1, 1000, 0.8);
    s.server_cpu_seconds = 0;
    g.Update(s);
    at += kTick;
  }
  EXPECT_EQ(g.desired(), 1);
  EXPECT_EQ(g.measures().server_capacity, 0);
}

TEST(FleetSizerTest, ALightlyLoadedFleetShrinksOnTheCapacityMeasuredLast) {
  FleetSizer f;
  absl::Time at = kT0;
  // Measured busy: 4 servers of 2,000 samples/s each.
  EXPECT_EQ(Feed(f, &at, 10, 4, 6000, 0.1), 4);
  EXPECT_NEAR(f.measures().server_capacity, 2000, 1e-6);
  // Then 100 samples/s with too little server CPU (0.1 s a tick, 0.6 s in
  // the window) to measure anything: the last capacity holds, and step by
  // step (one change per stabilisation window) 100 x 1.25 / 2,000 rounds
  // up to one server.
  for (int i = 0; i < 80; ++i) {
    FleetSample s = Tick(at, 4, 100, 0);
    s.server_cpu_seconds = 0.1;
    f.Update(s);
    at += kTick;
  }
  // (The last measure came from a window of busy and light ticks.)
  EXPECT_GE(f.measures().server_capacity, 2000);
  EXPECT_LT(f.measures().server_capacity, 2500);
  EXPECT_EQ(f.desired(), 1);
}

TEST(FleetSizerTest, IdleFleetsShrinkToTheMinimumAndAllStaysInBounds) {
  FleetSizerOptions o;
  o.min_servers = 2;
  o.max_servers = 3;
  FleetSizer f(o);
  absl::Time at = kT0;
  EXPECT_EQ(Feed(f, &at, 30, 5, 0, 0, /*readers=*/0), 2);
  // Input-bound far beyond the maximum: the maximum.
  EXPECT_EQ(Feed(f, &at, 10, 2, 100000, 0.9), 3);
}

}  // namespace
}  // namespace sluice
