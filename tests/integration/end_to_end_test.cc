// The whole system under faults (issue: C++ client): 4 ranks x 2 workers
// (`sluicectl read` processes), 3 epochs, a trainer SIGKILLed and restarted,
// a data server SIGKILLed, the coordinator SIGKILLed and restarted on the
// same port and journal. Per epoch, the distinct (shard, index) delivered
// equal the dataset minus the dropped remainder, the ranks are equal, and
// the only samples delivered twice are ones the killed trainer had not
// acknowledged, fewer than its progress interval allows (G1-G5).
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "sluice/v1/coordinator.grpc.pb.h"
#include "tests/testing/http.h"
#include "tests/testing/process.h"
#include "tests/testing/tar_writer.h"
#include "tests/testing/temp_dir.h"

namespace sluice {
namespace {

using ::sluice::testing::ChildProcess;
using ::sluice::testing::ServerProcess;
using ::sluice::testing::TempDir;

struct Line {
  int64_t epoch, index;
  int rank, shard;
};

std::vector<Line> Ledger(const std::string& path) {
  std::vector<Line> out;
  std::ifstream in(path);
  std::string s;
  while (std::getline(in, s)) {
    Line l;
    long long e, i;
    if (std::sscanf(s.c_str(),
                    "{\"epoch\":%lld,\"rank\":%d,\"shard\":%d,\"index\":%lld",
                    &e, &l.rank, &l.shard, &i) == 4) {
      l.epoch = e;
      l.index = i;
      out.push_back(l);
    }
  }
  return out;
}

TEST(EndToEndTest, FourRanksTwoWorkersThreeEpochsWithKills) {
  TempDir dir;
  mkdir(dir.File("shards").c_str(), 0755);
  constexpr int kShards = 20, kWorld = 4, kEpochs = 3;
  constexpr int kRate = 250;  // samples/s per worker
  const std::vector<std::string> progress = {"--progress_interval=200ms"};
  std::vector<int> sizes;
  std::string manifest = "{\"shards\":[";
  for (int s = 0, total = 0; s < kShards; ++s) {
    int n = 100 + (s == 0 ? 2 : 0);  // 2002 samples: 2 do not divide by 4
    testing::TarWriter tar;
    for (int i = 0; i < n; ++i)
      tar.File(absl::StrCat("x", s, "_", i, ".cls"), "1");
    std::string path = dir.File(absl::StrCat("shards/", s, ".tar"));
    testing::WriteFile(path, tar.Finish());
    absl::StrAppend(&manifest, s ? "," : "", "{\"url\":\"", path,
                    "\",\"num_samples\":", n, "}");
    sizes.push_back(n);
    total += n;
  }
  manifest += "]}";
  testing::WriteFile(dir.File("manifest.json"), manifest);
  const int64_t per_rank = 2002 / kWorld, per_epoch = per_rank * kWorld;

  const std::string journal = "--journal_dir=" + dir.File("journal");
  auto coordinator =
      testing::StartServer("sluice-coordinator", dir.path(),
                           {journal, "--heartbeat_interval=200ms"});
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  const std::string address = coordinator->grpc_address;
  std::vector<ServerProcess> data;
  for (int i = 0; i < 2; ++i) {
    auto d = testing::StartServer(
        "sluice-dataserver", dir.path(),
        {"--roots=" + dir.File("shards"), "--coordinator=" + address});
    ASSERT_TRUE(d.ok()) << d.status();
    data.push_back(std::move(*d));
  }
  const std::string ctl = testing::BinDir() + "/sluicectl";
  {
    auto create =
        ChildProcess::Start({ctl, "job", "create", "--name=e2e",
                             "--manifest=" + dir.File("manifest.json"),
                             "--world_size=4", "--epochs=3", "--lease_ttl=2s",
                             "--seed=11", "--coordinator=" + address},
                            dir.File("create.log"));
    ASSERT_TRUE(create.ok());
    ASSERT_EQ(*create->Wait(absl::Seconds(30)), 0);
  }

  struct Trainer {
    int rank, worker;
    std::string ledger;
    ChildProcess process;
    bool killed = false;
  };
  std::vector<Trainer> trainers;
  auto start = [&](int rank, int worker, const std::string& tag) {
    Trainer t{rank,
              worker,
              dir.File(absl::StrCat("r", rank, "w", worker, tag, ".jsonl")),
              {}};
    std::vector<std::string> argv = {ctl,
                                     "read",
                                     "--job=e2e",
                                     absl::StrCat("--rank=", rank),
                                     absl::StrCat("--worker=", worker),
                                     "--workers=2",
                                     absl::StrCat("--rate=", kRate),
                                     "--coordinator=" + address};
    argv.insert(argv.end(), progress.begin(), progress.end());
    auto p = ChildProcess::Start(argv, t.ledger);
    ASSERT_TRUE(p.ok());
    t.process = std::move(*p);
    trainers.push_back(std::move(t));
  };
  for (int r = 0; r < kWorld; ++r) {
    for (int w = 0; w < 2; ++w) start(r, w, "");
  }

  bool trainer_killed = false, server_killed = false,
       coordinator_killed = false;
  std::string killed_ledger;
  const absl::Time deadline = absl::Now() + absl::Seconds(120);
  while (true) {
    std::map<int64_t, int64_t> by_epoch;
    for (const Trainer& t : trainers) {
      for (const Line& l : Ledger(t.ledger)) ++by_epoch[l.epoch];
    }
    if (!trainer_killed && by_epoch[0] >= per_epoch * 3 / 10) {
      Trainer& victim = trainers[5];  // rank 2, worker 1
      victim.process.Kill();
      victim.killed = true;
      killed_ledger = victim.ledger;
      trainer_killed = true;
      start(2, 1, "-restarted");
    }
    if (trainer_killed && !server_killed && by_epoch[1] >= per_epoch * 3 / 10) {
      data[1].process.Kill();
      server_killed = true;
    }
    if (server_killed && !coordinator_killed &&
        by_epoch[1] >= per_epoch * 6 / 10) {
      coordinator->process.Kill();
      auto again = testing::StartServer(
          "sluice-coordinator", dir.path(),
          {journal, "--heartbeat_interval=200ms", "--listen=" + address});
      ASSERT_TRUE(again.ok()) << again.status();
      *coordinator = std::move(*again);
      coordinator_killed = true;
    }
    bool running = false;
    for (Trainer& t : trainers) running |= !t.killed && t.process.running();
    if (!running) break;
    ASSERT_LT(absl::Now(), deadline) << "trainers still running";
    absl::SleepFor(absl::Milliseconds(20));  // monitoring interval
  }
  ASSERT_TRUE(trainer_killed && server_killed && coordinator_killed);
  for (Trainer& t : trainers) {
    if (t.killed) continue;
    auto code = t.process.Wait(absl::Seconds(5));
    ASSERT_TRUE(code.ok());
    EXPECT_EQ(*code, 0) << t.ledger;
  }

  std::map<std::tuple<int64_t, int, int64_t>, std::vector<std::string>> seen;
  std::map<std::pair<int64_t, int>, std::set<std::pair<int, int64_t>>>
      per_rank_unique;
  for (const Trainer& t : trainers) {
    for (const Line& l : Ledger(t.ledger)) {
      ASSERT_LT(l.shard, kShards);
      ASSERT_LT(l.index, sizes[l.shard]);
      seen[{l.epoch, l.shard, l.index}].push_back(t.ledger);
      per_rank_unique[{l.epoch, l.rank}].insert({l.shard, l.index});
    }
  }
  for (int e = 0; e < kEpochs; ++e) {
    int64_t distinct = 0, twice = 0;
    for (const auto& [key, who] : seen) {
      if (std::get<0>(key) != e) continue;
      ++distinct;
      if (who.size() > 1) {
        twice += static_cast<int64_t>(who.size()) - 1;
        // Only the killed trainer's unacknowledged tail comes twice.
        EXPECT_EQ(who.size(), 2u);
        EXPECT_TRUE(who[0] == killed_ledger || who[1] == killed_ledger)
            << "epoch " << e << " shard " << std::get<1>(key) << " index "
            << std::get<2>(key);
      }
    }
    EXPECT_EQ(distinct, per_epoch) << "epoch " << e;
    EXPECT_LE(twice, kRate * 2 / 5)
        << "epoch " << e;  // rate x 2 progress intervals
    for (int r = 0; r < kWorld; ++r) {
      EXPECT_EQ(static_cast<int64_t>(per_rank_unique[{e, r}].size()), per_rank)
          << "epoch " << e << " rank " << r;
    }
  }
}

}  // namespace
}  // namespace sluice
