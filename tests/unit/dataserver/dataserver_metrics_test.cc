#include "server/dataserver/dataserver_metrics.h"

#include <prometheus/registry.h>

#include <set>
#include <string>

#include "gtest/gtest.h"
#include "tests/testing/fake_clock.h"

namespace sluice::dataserver {
namespace {

// The sluice_job values of `family`'s series in the registry now.
std::set<std::string> JobsIn(prometheus::Registry& registry,
                             const std::string& family) {
  std::set<std::string> jobs;
  for (const prometheus::MetricFamily& f : registry.Collect()) {
    if (f.name != family) continue;
    for (const prometheus::ClientMetric& m : f.metric) {
      for (const prometheus::ClientMetric::Label& l : m.label) {
        if (l.name == "sluice_job") jobs.insert(l.value);
      }
    }
  }
  return jobs;
}

// A job's series stay while a stream holds them and for the retention
// after its last stream ended; then the next hold or release removes them
// (skips included). A job back within the retention keeps its counts.
TEST(DataServerMetricsTest, AJobsSeriesGoAfterItsLastStreamAndTheRetention) {
  prometheus::Registry registry;
  testing::FakeClock clock;
  DataServerMetrics metrics(registry, absl::Minutes(15), &clock);
  DataServerMetrics::JobSeries a = metrics.HoldJob("a");
  DataServerMetrics::JobSeries a2 = metrics.HoldJob("a");  // two streams
  EXPECT_EQ(a.samples, a2.samples);
  a.samples->Increment(5);
  metrics.Skipped(CorruptReason::kUndecodable, "a").Increment();
  metrics.HoldJob("b").samples->Increment(2);
  metrics.ReleaseJob("b");
  metrics.ReleaseJob("a");
  clock.Advance(absl::Hours(1));
  metrics.ReleaseJob("a");  // b expired; a's last stream ends only now
  EXPECT_EQ(JobsIn(registry, "sluice_dataserver_job_samples_total"),
            (std::set<std::string>{"a"}));
  EXPECT_EQ(metrics.jobs_exported(), 1u);

  clock.Advance(absl::Minutes(14));
  EXPECT_EQ(metrics.HoldJob("a").samples->Value(), 5);  // back in time
  metrics.ReleaseJob("a");
  clock.Advance(absl::Minutes(15));
  metrics.HoldJob("c");
  EXPECT_EQ(JobsIn(registry, "sluice_dataserver_job_samples_total"),
            (std::set<std::string>{"c"}));
  EXPECT_EQ(JobsIn(registry, "sluice_dataserver_job_cpu_seconds_total"),
            (std::set<std::string>{"c"}));
  EXPECT_TRUE(
      JobsIn(registry, "sluice_dataserver_samples_skipped_total").empty());
  EXPECT_EQ(metrics.jobs_exported(), 1u);
  // A job that comes back later starts from zero.
  EXPECT_EQ(metrics.HoldJob("a").samples->Value(), 0);
}

}  // namespace
}  // namespace sluice::dataserver
