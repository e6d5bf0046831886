// sluice::Reader against the real coordinator and data servers: exact
// coverage, epoch events, a data server killed mid-read (re-route), and the
// coordinator SIGKILLed and restarted mid-read (reconnect).
#include "sluice/reader.h"

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>

#include <atomic>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "sluice/v1/coordinator.grpc.pb.h"
#include "tests/testing/coordinator_client.h"
#include "tests/testing/http.h"
#include "tests/testing/process.h"
#include "tests/testing/tar_writer.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/test_cluster.h"
#include "tests/testing/wait.h"

namespace sluice {
namespace {

using ::sluice::testing::ServerProcess;
using ::sluice::testing::TempDir;
using ::sluice::testing::WaitForMetric;

class ReaderTest : public ::testing::Test {
 protected:
  void TearDown() override {
    if (HasFailure())
      std::cerr << "--- coordinator log\n"
                << cluster_.CoordinatorLog() << "---\n";
  }

  // `shards` shards of `per_shard` samples; a coordinator and `servers` data
  // servers registered with it.
  void StartCluster(int shards, int per_shard, int servers,
                    size_t sample_bytes = 200,
                    std::vector<std::string> data_server_flags = {}) {
    for (int s = 0; s < shards; ++s) {
      urls_.push_back(cluster_.WriteShard(
          std::to_string(s), per_shard, [&](testing::TarWriter& tar, int i) {
            tar.File(absl::StrCat("s", s, "_", i, ".cls"), std::to_string(i))
                .File(absl::StrCat("s", s, "_", i, ".bin"),
                      std::string(sample_bytes, 'a' + (i % 26)));
          }));
    }
    per_shard_ = per_shard;
    ASSERT_TRUE(cluster_.StartCoordinator().ok());
    const absl::Status started =
        cluster_.StartDataServers(servers, std::move(data_server_flags));
    ASSERT_TRUE(started.ok()) << started;
  }

  // `shuffle_window` 1 (units of one shard, whose failures the tests
  // stage); 0 = the coordinator's default.
  void CreateJob(const std::string& name, int world, int epochs,
                 int32_t shuffle_window = 1) {
    v1::JobSpec spec;
    spec.set_name(name);
    for (const std::string& url : urls_) {
      auto* s = spec.mutable_manifest()->add_shards();
      s->set_url(url);
      s->set_num_samples(per_shard_);
    }
    spec.set_world_size(world);
    spec.set_num_epochs(epochs);
    spec.set_seed(3);
    spec.set_shuffle(true);
    spec.set_shuffle_window(shuffle_window);
    spec.set_lease_ttl_ms(2000);
    absl::Status created = testing::CreateJob(coordinator_.grpc_address, spec);
    ASSERT_TRUE(created.ok()) << created;
  }

  std::unique_ptr<Reader> MakeReader(
      const std::string& job, int rank, int buffer = 256,
      const v1::Cursor* resume = nullptr,
      absl::Duration stall_timeout = absl::Milliseconds(300)) {
    ReaderOptions o;
    if (resume != nullptr) {
      o.resume_from = *resume;
      o.resume_attempt = "restart-1";
    }
    o.buffer_samples = buffer;
    o.stall_timeout = stall_timeout;
    o.coordinator = coordinator_.grpc_address;
    o.job = job;
    o.rank = rank;
    o.progress_interval = absl::Milliseconds(100);
    o.reconnect_timeout = absl::Seconds(30);
    auto r = Reader::Create(o);
    EXPECT_TRUE(r.ok()) << r.status();
    return std::move(*r);
  }

  TempDir dir_;
  testing::TestCluster cluster_{dir_.path()};
  ServerProcess& coordinator_ = cluster_.coordinator();
  std::vector<ServerProcess>& data_ = cluster_.data_servers();
  std::vector<std::string> urls_;
  int per_shard_ = 0;
};

// What a rank's reader saw: per epoch, (shard, index) -> count; events.
struct Seen {
  std::map<int64_t, std::map<std::pair<int, int64_t>, int>> samples;
  std::vector<std::string> events;
  absl::Status status;
  int64_t announced = -1;
};

// Reads until Done; `on_sample(n, sample)` runs after the n-th sample.
Seen ReadAll(
    Reader& reader,
    const std::function<void(int64_t, const Sample&)>& on_sample = nullptr) {
  Seen seen;
  int64_t n = 0;
  while (true) {
    auto e = reader.Next();
    if (!e.ok()) {
      seen.status = e.status();
      return seen;
    }
    switch (e->kind) {
      case ReaderEvent::Kind::kDone:
        seen.events.push_back("done");
        return seen;
      case ReaderEvent::Kind::kEpochBegin:
        seen.events.push_back(absl::StrCat("begin", e->epoch));
        seen.announced = e->samples_for_rank;
        break;
      case ReaderEvent::Kind::kEpochEnd:
        seen.events.push_back(absl::StrCat("end", e->epoch));
        break;
      case ReaderEvent::Kind::kSample:
        ++seen.samples[e->epoch][{e->sample.shard_index, e->sample.index}];
        EXPECT_EQ(e->sample.key, absl::StrCat("s", e->sample.shard_index, "_",
                                              e->sample.index));
        EXPECT_EQ(e->sample.fields.size(), 2u);
        if (on_sample) on_sample(++n, e->sample);
        break;
    }
  }
}

TEST_F(ReaderTest, TwoRanksTwoEpochsCoverEverySampleOnceWithEpochEvents) {
  StartCluster(6, 25, 1);  // 150 samples; 75 per rank
  CreateJob("cover", 2, 2);
  Seen seen[2];
  std::thread t0([&] { seen[0] = ReadAll(*MakeReader("cover", 0)); });
  std::thread t1([&] { seen[1] = ReadAll(*MakeReader("cover", 1)); });
  t0.join();
  t1.join();
  for (int e = 0; e < 2; ++e) {
    std::map<std::pair<int, int64_t>, int> all;
    for (int r = 0; r < 2; ++r) {
      ASSERT_TRUE(seen[r].status.ok()) << seen[r].status;
      int64_t n = 0;
      for (auto& [k, c] : seen[r].samples[e]) {
        all[k] += c;
        n += c;
      }
      EXPECT_EQ(n, 75) << "rank " << r << " epoch " << e;
    }
    EXPECT_EQ(all.size(), 150u);
    for (auto& [k, c] : all) EXPECT_EQ(c, 1);
  }
  EXPECT_THAT(seen[0].events, ::testing::ElementsAre("begin0", "end0", "begin1",
                                                     "end1", "done"));
  EXPECT_EQ(seen[0].announced, 75);
}

TEST_F(ReaderTest, HungAndDeadDataServersAreRoutedAround) {
  StartCluster(8, 50, 2);  // 400 samples
  CreateJob("reroute", 1, 1);
  auto reader = MakeReader("reroute", 0, /*buffer=*/4);
  // Mid-read, both data servers hang (SIGSTOP): every unit not yet received
  // stalls and is re-routed. Once the coordinator has timed both out, one
  // comes back; the other is SIGKILLed.
  // The reader keeps consuming meanwhile, so it needs units that cannot be
  // fetched while the servers hang.
  std::thread faults;
  bool timed_out = false;
  Seen seen = ReadAll(*reader, [&](int64_t n, const Sample&) {
    if (n != 110) return;
    kill(data_[0].process.pid(), SIGSTOP);
    kill(data_[1].process.pid(), SIGSTOP);
    faults = std::thread([&] {
      timed_out = WaitForMetric(coordinator_.metrics_address,
                                "sluice_coordinator_data_servers 0");
      data_[1].process.Kill();
      kill(data_[0].process.pid(), SIGCONT);
    });
  });
  faults.join();
  EXPECT_TRUE(timed_out);
  ASSERT_TRUE(seen.status.ok()) << seen.status;
  std::map<std::pair<int, int64_t>, int> all = seen.samples[0];
  EXPECT_EQ(all.size(), 400u);
  for (auto& [k, c] : all)
    EXPECT_EQ(c, 1) << k.first << "/" << k.second;  // nothing twice
  EXPECT_GE(reader->stats().reroutes, 1);
}

// A data server stopped with SIGTERM leaves without a failed stream: the
// coordinator routes it nothing new, its open stream ends handing the rest
// of its lease back (the reader Releases it), and the rest is read from the
// other server. Nothing is re-routed, nothing read twice or lost.
TEST_F(ReaderTest, ADrainingDataServerHandsItsUnitsBackWithoutAReroute) {
  // Units of 100 x 400 KB: a unit's stream stays open while the reader
  // consumes it. With 50-sample units the flow-control windows and socket
  // buffers sometimes held all of a unit's rest (about 19 MB), and nothing
  // was left to hand back.
  StartCluster(4, 100, 2, 400 << 10, {"--drain_timeout=2s"});
  CreateJob("drain", 1, 1);
  // A stall is not what this test is about: under ThreadSanitizer, with
  // 400 KB samples, 300 ms without a batch can happen on a loaded machine
  // and would re-route the unit before the drain.
  auto reader = MakeReader("drain", 0, /*buffer=*/4, /*resume=*/nullptr,
                           /*stall_timeout=*/absl::Seconds(5));
  // The server that leaves is the one the first sample came from: with four
  // shards, rendezvous hashing routes all of them to one server in one run
  // out of eight.
  ServerProcess* leaving = nullptr;
  bool stopped = false;
  std::map<int, int> read_there;  // samples of each unit read from it
  Seen seen = ReadAll(*reader, [&](int64_t, const Sample& sample) {
    if (leaving == nullptr) {
      for (ServerProcess& d : data_)
        if (d.grpc_address == sample.data_server) leaving = &d;
    }
    // At the second sample of a unit read from the server, with 98 x 400 KB
    // of it still to come (more than the transport buffers), the server is
    // stopped, and the trainer takes no sample until half the drain timeout
    // has passed: the stream is still open then, and is handed back.
    if (!stopped && leaving != nullptr &&
        sample.data_server == leaving->grpc_address &&
        ++read_there[sample.shard_index] == 2) {
      leaving->process.Signal(SIGTERM);
      stopped = true;
      EXPECT_TRUE(testing::WaitUntil(
          [&] {
            return testing::ReadWholeFile(leaving->log_path)
                       .value_or("")
                       .find("handing the rest of their leases back") !=
                   std::string::npos;
          },
          absl::Seconds(10)));
    }
    absl::SleepFor(absl::Milliseconds(8));  // a training step
  });
  ASSERT_TRUE(stopped) << "no unit had a second sample";
  ASSERT_TRUE(seen.status.ok()) << seen.status;
  std::map<std::pair<int, int64_t>, int> all = seen.samples[0];
  EXPECT_EQ(all.size(), 400u);
  for (auto& [k, c] : all) EXPECT_EQ(c, 1) << k.first << "/" << k.second;
  EXPECT_EQ(reader->stats().reroutes, 0);
  EXPECT_GE(reader->stats().handed_back, 1);
  absl::StatusOr<int> exit_code = leaving->process.Wait(absl::Seconds(10));
  ASSERT_TRUE(exit_code.ok()) << exit_code.status();
  EXPECT_EQ(*exit_code, 0);
  const std::string log =
      testing::ReadWholeFile(leaving->log_path).value_or("");
  EXPECT_THAT(log,
              ::testing::HasSubstr("handing the rest of their leases back"));
  EXPECT_THAT(log,
              ::testing::Not(::testing::HasSubstr("cancelled at the drain")));
  if (HasFailure()) std::cerr << "--- leaving data server's log\n" << log;
}

// A unit waiting to open its stream on a server at its tenant limit
// (RESOURCE_EXHAUSTED, retried there with a back-off growing to 1 s) is
// given back at once when that server drains, not retried there: the
// retry could come after the server has gone, and fail as a re-route.
TEST_F(ReaderTest, ADrainingServerGivesBackAUnitWaitingForAStream) {
  // 1 MB samples: a unit (40 MB) is far more than a 2-sample buffer, the
  // transport's windows and the socket buffers (together they have held
  // 20 MB), so a reader that stops keeps its stream open.
  StartCluster(4, 40, 1, 1 << 20,
               {"--max_streams_per_tenant=1", "--drain_timeout=4s"});
  CreateJob("waiting", 1, 1);
  auto options = [&](int worker, int buffer) {
    ReaderOptions o;
    o.coordinator = coordinator_.grpc_address;
    o.job = "waiting";
    o.worker = worker;
    o.num_workers = 2;
    o.units_in_flight = 1;
    o.buffer_samples = buffer;
    o.stall_timeout = absl::Seconds(30);
    o.progress_interval = absl::Milliseconds(100);
    return o;
  };
  auto holder = Reader::Create(options(0, 2));
  ASSERT_TRUE(holder.ok()) << holder.status();
  Seen held;
  auto first = (*holder)->Next();  // epoch begin, then a sample
  while (first.ok() && first->kind != ReaderEvent::Kind::kSample)
    first = (*holder)->Next();
  ASSERT_TRUE(first.ok()) << first.status();
  ++held.samples[0][{first->sample.shard_index, first->sample.index}];

  auto waiting = Reader::Create(options(1, 256));
  ASSERT_TRUE(waiting.ok()) << waiting.status();
  Seen other;
  std::thread t([&] { other = ReadAll(**waiting); });
  // Refused five times: its next tries are 0.8 s and then 1 s apart.
  const std::string refused =
      "sluice_dataserver_stream_errors_total{code=\"RESOURCE_EXHAUSTED\"} ";
  EXPECT_TRUE(testing::WaitUntil(
      [&] {
        auto page =
            testing::HttpGet("http://" + data_[0].metrics_address + "/metrics");
        if (!page.ok()) return false;
        const size_t at = page->body.find(refused);
        return at != std::string::npos &&
               std::atoi(page->body.c_str() + at + refused.size()) >= 5;
      },
      absl::Seconds(30)));
  const absl::Status joined = cluster_.StartDataServers(1);
  ASSERT_TRUE(joined.ok()) << joined;
  data_[0].process.Signal(SIGTERM);
  Seen rest = ReadAll(**holder);
  t.join();
  ASSERT_TRUE(rest.status.ok()) << rest.status;
  ASSERT_TRUE(other.status.ok()) << other.status;
  std::map<std::pair<int, int64_t>, int> all = held.samples[0];
  for (const Seen* s : {&rest, &other}) {
    for (const auto& [k, c] : s->samples.at(0)) all[k] += c;
  }
  EXPECT_EQ(all.size(), 160u);
  for (const auto& [k, c] : all) EXPECT_EQ(c, 1) << k.first << "/" << k.second;
  EXPECT_EQ((*holder)->stats().reroutes, 0);
  EXPECT_EQ((*waiting)->stats().reroutes, 0);
  EXPECT_GE((*waiting)->stats().handed_back, 1);
  absl::StatusOr<int> exit_code = data_[0].process.Wait(absl::Seconds(10));
  ASSERT_TRUE(exit_code.ok()) << exit_code.status();
  EXPECT_EQ(*exit_code, 0);
  if (HasFailure()) {
    std::cerr << "--- the drained data server's log\n"
              << testing::ReadWholeFile(data_[0].log_path).value_or("");
  }
}

// A unit waiting behind another for longer than the stall timeout is not
// stalled: its fetcher waits on the consumer, not on the data server.
TEST_F(ReaderTest, ASlowConsumerIsNotAStalledServer) {
  // 3 units held at once, 16 MB each: more than gRPC's flow-control windows,
  // so the waiting units' streams stay open on the data server.
  StartCluster(3, 40, 1, 400 << 10);
  CreateJob("slow", 1, 1);
  auto reader = MakeReader("slow", 0, /*buffer=*/4);  // stall timeout 300 ms
  Seen seen = ReadAll(*reader, [](int64_t, const Sample&) {
    absl::SleepFor(absl::Milliseconds(8));  // a training step; ~1 s in all
  });
  ASSERT_TRUE(seen.status.ok()) << seen.status;
  EXPECT_EQ(seen.samples[0].size(), 120u);
  EXPECT_EQ(reader->stats().reroutes, 0);
}

// Units held ahead are buffered, but per data server one stream carries
// data at a time: the next opens as the current one reaches its last batch.
// Were every held unit's stream opened at once, each would stay open on the
// data server, parked by gRPC flow control (a unit is 4 MB).
TEST_F(ReaderTest, OneStreamPerDataServerCarriesDataAtATime) {
  StartCluster(6, 40, 1, 100 << 10);
  CreateJob("streams", 1, 1);
  auto reader = MakeReader("streams", 0, /*buffer=*/4);  // 4 units in flight
  auto active_streams = [&]() -> int {
    auto page =
        testing::HttpGet("http://" + data_[0].metrics_address + "/metrics");
    if (!page.ok()) return -1;
    const std::string name = "\nsluice_dataserver_active_streams ";
    const size_t at = page->body.find(name);
    if (at == std::string::npos) return -1;
    return std::atoi(page->body.c_str() + at + name.size());
  };
  int most = 0;
  int64_t samples = 0;
  while (true) {
    auto e = reader->Next();
    ASSERT_TRUE(e.ok()) << e.status();
    if (e->kind == ReaderEvent::Kind::kDone) break;
    if (e->kind != ReaderEvent::Kind::kSample) continue;
    ++samples;
    const int now = active_streams();
    ASSERT_GE(now, 0) << "no sluice_dataserver_active_streams on "
                      << data_[0].metrics_address;
    most = std::max(most, now);
  }
  EXPECT_EQ(samples, 240);
  EXPECT_GE(most, 1);
  EXPECT_LE(most, 2);
}

// A manifest entry the data server cannot find: every re-route of the unit
// comes back NOT_FOUND from the same server, and the Reader keeps re-routing
// it (with the back-off RerouteBackoffTest pins down on its own) while the
// readable shard is delivered exactly once.
TEST_F(ReaderTest, AShardNoServerCanServeKeepsBeingRerouted) {
  StartCluster(2, 10, 1);
  urls_.push_back(cluster_.shards_dir() + "/gone.tar");
  CreateJob("gone", 1, 1);
  auto reader = MakeReader("gone", 0);
  std::atomic<int64_t> got{0};
  std::thread consumer([&] {
    while (true) {
      auto e = reader->Next();
      if (!e.ok() || e->kind == ReaderEvent::Kind::kDone) return;
      if (e->kind == ReaderEvent::Kind::kSample) ++got;
    }
  });
  testing::WaitUntil([&] { return got >= 20; }, absl::Seconds(60),
                     absl::Milliseconds(10));
  ASSERT_EQ(got, 20) << "every readable sample arrives";
  const int64_t before = reader->stats().reroutes;
  const bool retried =
      testing::WaitUntil([&] { return reader->stats().reroutes >= before + 3; },
                         absl::Seconds(60), absl::Milliseconds(10));
  reader->Close();
  consumer.join();
  EXPECT_TRUE(retried) << "re-routes: " << reader->stats().reroutes;
  EXPECT_EQ(got, 20);
}

TEST_F(ReaderTest, CoordinatorKilledAndRestartedMidRead) {
  StartCluster(8, 50, 1);
  CreateJob("restart", 1, 1);
  auto reader = MakeReader("restart", 0);
  Seen seen = ReadAll(*reader, [&](int64_t n, const Sample&) {
    if (n == 120) {
      ASSERT_TRUE(cluster_.RestartCoordinator().ok());
    }
  });
  ASSERT_TRUE(seen.status.ok()) << seen.status;
  std::map<std::pair<int, int64_t>, int> all = seen.samples[0];
  EXPECT_EQ(all.size(), 400u);
  for (auto& [k, c] : all) EXPECT_EQ(c, 1);
  EXPECT_GE(reader->stats().reconnects, 1);
}

// The coordinator stays down for longer than the lease TTL, so the reader's
// reconnect backoff outlasts the fresh TTL its leases got at recovery: they
// expire and their rest is granted again. The reader must not deliver the
// expired leases' samples meanwhile (it holds delivery once disconnected
// for half a TTL, and after reconnecting has each lease confirmed): every
// sample still arrives exactly once.
TEST_F(ReaderTest, CoordinatorDownLongerThanTheLeaseTtl) {
  StartCluster(8, 50, 1);
  CreateJob("down", 1, 1);  // lease TTL 2 s
  auto reader = MakeReader("down", 0, /*buffer=*/64);
  Seen seen = ReadAll(*reader, [&](int64_t n, const Sample&) {
    if (n == 120) {
      cluster_.KillCoordinator();
      absl::SleepFor(
          absl::Seconds(3));  // the outage itself, not a wait for an event
      ASSERT_TRUE(cluster_.RestartCoordinator().ok());
    }
  });
  ASSERT_TRUE(seen.status.ok()) << seen.status;
  std::map<std::pair<int, int64_t>, int> all = seen.samples[0];
  EXPECT_EQ(all.size(), 400u);
  for (auto& [k, c] : all) EXPECT_EQ(c, 1);
  EXPECT_GE(reader->stats().reconnects, 1);
}

// (d) of the coordinator issue: four ranks train, checkpoint a cursor
// mid-epoch, consume some more and stop; the run restarts with three ranks
// (a new job over the same data) from the checkpoint. The samples consumed
// after the checkpoint are served again, the epoch's rest is re-balanced
// over three ranks, and nothing is served twice (G7).
TEST_F(ReaderTest, ResumeFromACursorWithWorldSizeFourThenThree) {
  StartCluster(10, 30, 1);  // 300 samples: 75 per rank with 4 ranks
  CreateJob("ws4", 4, 2);
  const int64_t at_checkpoint[4] = {20, 35, 5, 50};
  std::vector<v1::Cursor> cursors(4);
  std::map<std::pair<int, int64_t>, int>
      before;  // consumed before the checkpoint
  absl::Mutex mu;
  std::vector<std::thread> ranks;
  for (int r = 0; r < 4; ++r) {
    ranks.emplace_back([&, r] {
      auto reader = MakeReader("ws4", r);
      int64_t n = 0;
      while (n < at_checkpoint[r] + 10) {
        auto e = reader->Next();
        ASSERT_TRUE(e.ok()) << e.status();
        if (e->kind != ReaderEvent::Kind::kSample) continue;
        ASSERT_EQ(e->epoch, 0);
        if (++n <= at_checkpoint[r]) {
          absl::MutexLock lock(&mu);
          ++before[{e->sample.shard_index, e->sample.index}];
        }
        if (n == at_checkpoint[r]) {
          auto cursor = reader->Cursor();
          ASSERT_TRUE(cursor.ok()) << cursor.status();
          cursors[r] = *cursor;
        }
      }
      reader->Close();  // the 10 samples after the checkpoint are lost with the
                        // run
    });
  }
  for (auto& t : ranks) t.join();
  ASSERT_EQ(cursors[1].consumed_per_rank(1), 35);
  ASSERT_EQ(cursors[1].consumed_per_rank(0), -1);
  auto merged = MergeCursors(cursors);
  ASSERT_TRUE(merged.ok()) << merged.status();
  EXPECT_EQ(
      merged->ShortDebugString(),
      "job: \"ws4\" world_size: 4 consumed_per_rank: 20 consumed_per_rank: 35 "
      "consumed_per_rank: 5 consumed_per_rank: 50");

  CreateJob("ws3", 3, 2);
  Seen seen[3];
  ranks.clear();
  for (int r = 0; r < 3; ++r) {
    ranks.emplace_back(
        [&, r] { seen[r] = ReadAll(*MakeReader("ws3", r, 256, &*merged)); });
  }
  for (auto& t : ranks) t.join();
  // Epoch 0: 110 consumed before the checkpoint, 190 left -> 63 per rank
  // (one dropped); epoch 1 is a normal epoch of 100 per rank.
  std::map<std::pair<int, int64_t>, int> epoch0 = before;
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(seen[r].status.ok()) << seen[r].status;
    EXPECT_THAT(
        seen[r].events,
        ::testing::ElementsAre("begin0", "end0", "begin1", "end1", "done"));
    int64_t n0 = 0, n1 = 0;
    for (auto& [k, c] : seen[r].samples[0]) epoch0[k] += c, n0 += c;
    for (auto& [k, c] : seen[r].samples[1]) n1 += c;
    EXPECT_EQ(n0, 63) << "rank " << r;

    EXPECT_EQ(n1, 100) << "rank " << r;
  }
  EXPECT_EQ(epoch0.size(), 299u);
  // The resume is counted, and every grant's latency observed.
  EXPECT_TRUE(
      WaitForMetric(coordinator_.metrics_address,
                    "sluice_coordinator_resumes_total{sluice_job=\"ws3\"} 1"));
  EXPECT_TRUE(
      WaitForMetric(coordinator_.metrics_address,
                    "sluice_coordinator_lease_grant_latency_seconds_count"));
  for (auto& [k, c] : epoch0) EXPECT_EQ(c, 1) << k.first << "/" << k.second;
}

// The samples a reader delivers, in order, per epoch: (shard, index).
using Order = std::map<int64_t, std::vector<std::pair<int, int64_t>>>;
Order ReadOrder(
    Reader& reader, int64_t stop_after = -1,
    const std::function<void(int64_t, const Sample&)>& on_sample = nullptr) {
  Order order;
  int64_t n = 0;
  while (stop_after < 0 || n < stop_after) {
    auto e = reader.Next();
    EXPECT_TRUE(e.ok()) << e.status();
    if (!e.ok() || e->kind == ReaderEvent::Kind::kDone) break;
    if (e->kind != ReaderEvent::Kind::kSample) continue;
    order[e->epoch].emplace_back(e->sample.shard_index, e->sample.index);
    EXPECT_EQ(e->sample.key,
              absl::StrCat("s", e->sample.shard_index, "_", e->sample.index));
    ++n;
    if (on_sample) on_sample(n, e->sample);
  }
  return order;
}

// Mean number of distinct shards per batch of 64 consecutive samples.
double ShardsPerBatch(const std::vector<std::pair<int, int64_t>>& samples) {
  double total = 0;
  const size_t batches = samples.size() / 64;
  for (size_t b = 0; b < batches; ++b) {
    std::set<int> shards;
    for (size_t i = b * 64; i < (b + 1) * 64; ++i)
      shards.insert(samples[i].first);
    total += static_cast<double>(shards.size());
  }
  return batches == 0 ? 0 : total / static_cast<double>(batches);
}

// Shards written in class order (shard s holds class s only): with the
// default shuffle window every batch mixes most of them, every sample comes
// once per epoch, and the order is a function of the seed and the epoch.
TEST_F(ReaderTest, ShuffleMixesTheShardsIntoEveryBatchInAFixedOrder) {
  StartCluster(20, 64, 2, /*sample_bytes=*/32);  // 1280 samples
  CreateJob("mix", 2, 2, /*shuffle_window=*/0);
  CreateJob("mix-again", 2, 2, /*shuffle_window=*/0);
  Order order[2][2];  // [job][rank]
  std::vector<std::thread> readers;
  for (int j = 0; j < 2; ++j) {
    for (int r = 0; r < 2; ++r) {
      readers.emplace_back([&, j, r] {
        order[j][r] = ReadOrder(*MakeReader(j == 0 ? "mix" : "mix-again", r));
      });
    }
  }
  for (auto& t : readers) t.join();
  for (int e = 0; e < 2; ++e) {
    std::map<std::pair<int, int64_t>, int> all;
    for (int r = 0; r < 2; ++r) {
      const auto& samples = order[0][r][e];
      ASSERT_EQ(samples.size(), 640u) << "rank " << r << " epoch " << e;
      for (const auto& k : samples) ++all[k];
      EXPECT_GE(ShardsPerBatch(samples), 16.0) << "rank " << r;
      // The same seed gives the same per-rank order (G6).
      EXPECT_EQ(samples, order[1][r][e]) << "rank " << r << " epoch " << e;
      // Within a shard, samples keep their file order.
      std::map<int, int64_t> last;
      for (const auto& [shard, index] : samples) {
        auto [it, first] = last.try_emplace(shard, index);
        if (!first) {
          EXPECT_GT(index, it->second) << "shard " << shard;
        }
        it->second = index;
      }
    }
    EXPECT_EQ(all.size(), 1280u);
    for (auto& [k, c] : all) EXPECT_EQ(c, 1) << k.first << "/" << k.second;
  }
  EXPECT_NE(order[0][0][0], order[0][0][1]);  // a new order every epoch
}

// Resuming in the middle of a window's unit, and re-routing it when its
// data server dies, both continue the shuffled order exactly.
TEST_F(ReaderTest, ResumeAndRerouteMidWindowKeepTheOrderExact) {
  // 80 MB per epoch: far more than a stream has in flight when the data
  // server dies.
  StartCluster(20, 64, 2, /*sample_bytes=*/64 << 10);
  CreateJob("whole", 1, 1, /*shuffle_window=*/0);
  const Order whole = ReadOrder(*MakeReader("whole", 0));
  ASSERT_EQ(whole.at(0).size(), 1280u);

  CreateJob("first", 1, 1, /*shuffle_window=*/0);
  v1::Cursor cursor;
  Order first;
  {
    auto reader = MakeReader("first", 0);
    first = ReadOrder(*reader, 300);
    auto c = reader->Cursor();
    ASSERT_TRUE(c.ok()) << c.status();
    cursor = *c;
    reader->Close();
  }
  ASSERT_EQ(cursor.consumed_per_rank(0), 300);
  CreateJob("rest", 1, 1, /*shuffle_window=*/0);
  const Order rest = ReadOrder(*MakeReader("rest", 0, 256, &cursor));
  std::vector<std::pair<int, int64_t>> joined = first[0];
  joined.insert(joined.end(), rest.at(0).begin(), rest.at(0).end());
  EXPECT_EQ(joined, whole.at(0));

  // Both data servers serve; the one reading the window is killed mid-unit.
  CreateJob("rerouted", 1, 1, /*shuffle_window=*/0);
  auto reader = MakeReader("rerouted", 0, /*buffer=*/4);
  int killed = 0;
  const Order rerouted =
      ReadOrder(*reader, -1, [&](int64_t n, const Sample& sample) {
        if (n != 500) return;
        for (ServerProcess& ds : data_) {
          if (ds.grpc_address == sample.data_server) {
            ds.process.Kill();
            ++killed;
          }
        }
      });
  EXPECT_EQ(killed, 1);
  EXPECT_EQ(rerouted.at(0), whole.at(0));
  EXPECT_GE(reader->stats().reroutes, 1);
}

// Closing a reader mid-epoch gives every lease back at once: a Release
// frees a credit the coordinator would refill, so the reader first asks for
// no more (Want 0, confirmed by a Sync) and then releases everything,
// including grants that were in flight. Nothing is left to wait for the TTL.
TEST_F(ReaderTest, CloseGivesEveryLeaseBack) {
  StartCluster(8, 50, 1);
  CreateJob("close", 1, 1);  // lease TTL 2 s
  auto reader = MakeReader("close", 0);
  for (int n = 0; n < 70;) {
    auto e = reader->Next();
    ASSERT_TRUE(e.ok()) << e.status();
    n += e->kind == ReaderEvent::Kind::kSample;
  }
  reader->Close();
  auto stub = v1::Coordinator::NewStub(grpc::CreateChannel(
      coordinator_.grpc_address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::GetJobRequest request;
  request.set_name("close");
  v1::Job job;
  ASSERT_TRUE(stub->GetJob(&ctx, request, &job).ok());
  // Well inside the 2 s TTL: leases still held would show here.
  EXPECT_EQ(job.status().ranks(0).live_leases(), 0);
  EXPECT_EQ(job.status().ranks(0).consumed(), 70);
}

// Want(0) takes no new work: the units already held are delivered, then
// NextWithin times out (DEADLINE_EXCEEDED, not final) and the coordinator
// counts every delivered sample and no live lease. Want(2) takes work again
// and the epoch completes, each sample once.
TEST_F(ReaderTest, WantZeroStopsNewWorkAndNextWithinTimesOut) {
  StartCluster(12, 10, 1);
  CreateJob("want", 1, 1);
  ReaderOptions o;
  o.coordinator = coordinator_.grpc_address;
  o.job = "want";
  o.units_in_flight = 1;
  o.progress_interval = absl::Milliseconds(100);
  auto created = Reader::Create(o);
  ASSERT_TRUE(created.ok()) << created.status();
  Reader& reader = **created;
  reader.Want(0);
  std::map<std::pair<int32_t, int64_t>, int> seen;
  absl::StatusOr<ReaderEvent> e;
  while ((e = reader.NextWithin(absl::Seconds(3))).ok()) {
    if (e->kind == ReaderEvent::Kind::kSample)
      ++seen[{e->sample.shard_index, e->sample.index}];
  }
  ASSERT_EQ(e.status().code(), absl::StatusCode::kDeadlineExceeded)
      << e.status();
  const size_t held = seen.size();
  EXPECT_LT(held, 120u);  // at most the units granted before Want(0)
  EXPECT_EQ(held % 10, 0u);
  // The cursor waits for the reports: the coordinator then counts them.
  auto cursor = reader.Cursor();
  ASSERT_TRUE(cursor.ok()) << cursor.status();
  EXPECT_EQ(cursor->consumed_per_rank(0), static_cast<int64_t>(held));
  reader.Want(2);
  bool ended = false;
  while (!ended) {
    e = reader.NextWithin(absl::Seconds(30));
    ASSERT_TRUE(e.ok()) << e.status();
    if (e->kind == ReaderEvent::Kind::kSample)
      ++seen[{e->sample.shard_index, e->sample.index}];
    ended = e->kind == ReaderEvent::Kind::kEpochEnd;
  }
  EXPECT_EQ(seen.size(), 120u);
  for (const auto& [sample, n] : seen) EXPECT_EQ(n, 1);
}

TEST_F(ReaderTest, UnknownJobIsAFinalError) {
  StartCluster(1, 5, 1);
  auto reader = MakeReader("nope", 0);
  auto e = reader->Next();
  EXPECT_EQ(e.status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace sluice
