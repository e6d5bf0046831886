#include "server/coordinator/data_server_registry.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "tests/testing/fake_clock.h"

namespace sluice {
namespace {

using ::sluice::testing::FakeClock;
using ::testing::ElementsAre;
using ::testing::IsEmpty;

constexpr absl::Duration kTimeout = absl::Seconds(3);

class NullSink : public DataServerSink {
 public:
  void Send(const v1::CoordinatorToDataServer&) override {}
};

std::string Shard(int i) {
  return absl::StrCat("s3://bucket/shard-", i, ".tar");
}

// Which server each of n shards is routed to.
std::map<std::string, std::string> Routes(const DataServerRegistry& r, int n) {
  std::map<std::string, std::string> out;
  for (int i = 0; i < n; ++i) out[Shard(i)] = r.Pick(Shard(i));
  return out;
}

TEST(DataServerRegistryTest,
     AServerIsLiveUntilTheTimeoutAfterItsLastHeartbeat) {
  FakeClock clock;
  DataServerRegistry r(&clock, kTimeout);
  EXPECT_FALSE(r.AnyLive());
  const int64_t id = r.Add("a:1", 1, nullptr);
  EXPECT_NE(id, 0);
  clock.Advance(kTimeout);
  EXPECT_THAT(r.LiveAddresses(), ElementsAre("a:1"));
  clock.Advance(absl::Nanoseconds(1));
  EXPECT_FALSE(r.AnyLive());
  EXPECT_EQ(r.LiveCount(), 0);
  EXPECT_EQ(r.Pick(Shard(0)), "");
  EXPECT_TRUE(r.Heartbeat(id));
  EXPECT_EQ(r.LiveCount(), 1);
  EXPECT_EQ(r.Pick(Shard(0)), "a:1");
  EXPECT_FALSE(r.Heartbeat(id + 1));
  r.Remove(id);
  EXPECT_TRUE(r.empty());
  EXPECT_THAT(r.LiveAddresses(), IsEmpty());
}

// Servers serve one pool each: a pick is among its pool's servers only,
// liveness and load are told per pool, and a heartbeat reports "none was
// live" for its own pool.
TEST(DataServerRegistryTest, APickIsAmongThePoolsServersOnly) {
  FakeClock clock;
  DataServerRegistry r(&clock, kTimeout);
  const int64_t a = r.Add("a:1", 1, nullptr);
  const int64_t g = r.Add("g:1", 1, nullptr, "", "gpu");
  const auto none = [](const std::string&) { return false; };
  for (int i = 0; i < 20; ++i) {
    EXPECT_EQ(r.Pick(Shard(i)), "a:1");
    EXPECT_EQ(r.Pick(Shard(i), none, "", nullptr, "gpu"), "g:1");
    EXPECT_EQ(r.Pick(Shard(i), none, "", nullptr, "cpu"), "");
  }
  EXPECT_TRUE(r.AnyLiveIn("gpu"));
  EXPECT_FALSE(r.AnyLiveIn("cpu"));
  EXPECT_THAT(r.LiveAddressesIn("gpu"), ElementsAre("g:1"));
  EXPECT_THAT(r.LiveAddressesIn(""), ElementsAre("a:1"));
  r.SetDraining(g);
  EXPECT_FALSE(r.AnyLiveIn("gpu"));
  EXPECT_TRUE(r.AnyLiveIn(""));
  const auto counts = r.CountsByPool();
  ASSERT_EQ(counts.size(), 2u);
  EXPECT_EQ(counts.at("").live, 1);
  EXPECT_EQ(counts.at("gpu").live, 0);
  EXPECT_EQ(counts.at("gpu").draining, 1);
  const int64_t g2 = r.Add("g:2", 1, nullptr, "", "gpu");
  clock.Advance(kTimeout + absl::Nanoseconds(1));
  bool none_was_live = false;
  EXPECT_TRUE(r.Heartbeat(a, &none_was_live));
  EXPECT_TRUE(none_was_live);
  EXPECT_TRUE(r.Heartbeat(g2, &none_was_live));
  EXPECT_TRUE(none_was_live);  // "a:1" is live, but of another pool
  DataServerRegistry::Load load;
  load.cores = 4;
  r.Heartbeat(g2, nullptr, &load);
  load.samples_served = 100;
  load.cpu_seconds = 2;
  r.TakeLoadByPool();  // the baseline
  r.Heartbeat(g2, nullptr, &load);
  const auto loads = r.TakeLoadByPool();
  ASSERT_EQ(loads.size(), 1u);
  EXPECT_EQ(loads.at("gpu").samples_served, 100);
  EXPECT_EQ(loads.at("gpu").cpu_seconds, 2);
  EXPECT_EQ(loads.at("gpu").cores, 4);
}

TEST(DataServerRegistryTest, RemovingAServerMovesOnlyTheShardsItHad) {
  FakeClock clock;
  DataServerRegistry r(&clock, kTimeout);
  r.Add("a:1", 1, nullptr);
  const int64_t b = r.Add("b:1", 1, nullptr);
  r.Add("c:1", 1, nullptr);
  const auto before = Routes(r, 3000);
  EXPECT_EQ(Routes(r, 3000), before);  // stable
  std::map<std::string, int> count;
  for (const auto& [shard, server] : before) ++count[server];
  for (const char* s : {"a:1", "b:1", "c:1"}) {
    EXPECT_GT(count[s], 800) << s;
    EXPECT_LT(count[s], 1200) << s;
  }
  r.Remove(b);
  int moved = 0;
  for (const auto& [shard, server] : Routes(r, 3000)) {
    if (before.at(shard) == "b:1") {
      EXPECT_NE(server, "b:1");
      ++moved;
    } else {
      EXPECT_EQ(server, before.at(shard)) << shard;
    }
  }
  EXPECT_EQ(moved, count["b:1"]);
}

TEST(DataServerRegistryTest, ADrainingServerIsRoutedNothingAndNotCountedLive) {
  FakeClock clock;
  DataServerRegistry r(&clock, kTimeout);
  const int64_t a = r.Add("a:1", 1, nullptr, "node-a");
  r.Add("b:1", 1, nullptr, "node-b");
  EXPECT_EQ(r.SetDraining(a), "a:1");
  EXPECT_EQ(r.SetDraining(a + 100), std::nullopt);
  EXPECT_EQ(r.LiveCount(), 1);
  EXPECT_EQ(r.DrainingCount(), 1);
  EXPECT_THAT(r.LiveAddresses(), ElementsAre("b:1"));
  // Not even for a reader on its own node, nor as a last resort.
  bool same_node = true;
  for (int i = 0; i < 200; ++i) {
    EXPECT_EQ(r.Pick(
                  Shard(i), [](const std::string&) { return false; }, "node-a",
                  &same_node),
              "b:1");
    EXPECT_FALSE(same_node);
  }
  EXPECT_TRUE(r.Heartbeat(a));  // heartbeats go on; still draining
  EXPECT_EQ(r.LiveCount(), 1);
  r.Remove(a);
  EXPECT_EQ(r.DrainingCount(), 0);
}

TEST(DataServerRegistryTest, CapacityWeighsTheShareOfShards) {
  FakeClock clock;
  DataServerRegistry r(&clock, kTimeout);
  r.Add("small:1", 1, nullptr);
  r.Add("big:1", 3, nullptr);
  r.Add("zero:1", 0, nullptr);  // counts as 1
  std::map<std::string, int> count;
  for (const auto& [shard, server] : Routes(r, 5000)) ++count[server];
  // Expected shares 1/5, 3/5, 1/5.
  EXPECT_NEAR(count["big:1"] / 5000.0, 0.6, 0.04);
  EXPECT_NEAR(count["small:1"] / 5000.0, 0.2, 0.04);
  EXPECT_NEAR(count["zero:1"] / 5000.0, 0.2, 0.04);
}

TEST(DataServerRegistryTest,
     ASuspectServerIsPassedOverUntilTheTimeoutUnlessAlone) {
  FakeClock clock;
  DataServerRegistry r(&clock, kTimeout);
  const int64_t a = r.Add("a:1", 1, nullptr);
  const int64_t b = r.Add("b:1", 1, nullptr);
  int on_a = -1;
  for (int i = 0; i < 100 && on_a < 0; ++i) {
    if (r.Pick(Shard(i)) == "a:1") on_a = i;
  }
  ASSERT_GE(on_a, 0);
  r.MarkSuspect("a:1");
  EXPECT_EQ(r.Pick(Shard(on_a)), "b:1");
  // Alone, a suspect server is still better than none.
  clock.Advance(kTimeout / 2);
  r.Heartbeat(a);
  clock.Advance(kTimeout / 2 + absl::Nanoseconds(1));
  r.Heartbeat(a);
  EXPECT_THAT(r.LiveAddresses(), ElementsAre("a:1"));  // b missed its heartbeat
  r.Heartbeat(b);
  EXPECT_EQ(r.Pick(Shard(on_a)), "a:1");  // the suspicion ended
  r.MarkSuspect("a:1");
  r.Remove(b);
  EXPECT_EQ(r.Pick(Shard(on_a)), "a:1");
}

TEST(DataServerRegistryTest,
     AServerOneReaderAvoidsIsPassedOverForItAloneUnlessNoOtherIsLive) {
  FakeClock clock;
  DataServerRegistry r(&clock, kTimeout);
  r.Add("a:1", 1, nullptr);
  const int64_t b = r.Add("b:1", 1, nullptr);
  int on_a = -1;
  for (int i = 0; i < 100 && on_a < 0; ++i) {
    if (r.Pick(Shard(i)) == "a:1") on_a = i;
  }
  ASSERT_GE(on_a, 0);
  const auto avoid_a = [](const std::string& address) {
    return address == "a:1";
  };
  EXPECT_EQ(r.Pick(Shard(on_a), avoid_a), "b:1");
  EXPECT_EQ(r.Pick(Shard(on_a)), "a:1");  // everyone else's route
  // A suspect server the reader can reach beats one it cannot.
  r.MarkSuspect("b:1");
  EXPECT_EQ(r.Pick(Shard(on_a), avoid_a), "b:1");
  // Alone, an avoided server is still better than none.
  r.Remove(b);
  EXPECT_EQ(r.Pick(Shard(on_a), avoid_a), "a:1");
}

TEST(DataServerRegistryTest, AReaderOnANodeGetsAServerOnTheSameNodeFirst) {
  FakeClock clock;
  DataServerRegistry r(&clock, kTimeout);
  r.Add("a:1", 1, nullptr, "node-a");
  r.Add("a:2", 1, nullptr, "node-a");
  r.Add("b:1", 1, nullptr, "node-b");
  r.Add("none:1", 1, nullptr);
  const auto none = [](const std::string&) { return false; };
  std::map<std::string, int> on_a;
  for (int i = 0; i < 200; ++i) {
    bool same = false;
    const std::string picked = r.Pick(Shard(i), none, "node-a", &same);
    EXPECT_TRUE(same);
    ++on_a[picked];
  }
  // Both of node-a's servers, by rendezvous between them.
  EXPECT_EQ(on_a.size(), 2u);
  EXPECT_GT(on_a["a:1"], 60);
  EXPECT_GT(on_a["a:2"], 60);
  // A node with no server of its own (or a reader naming none): by hash
  // over all of them, and not on the reader's node.
  std::map<std::string, int> elsewhere;
  for (int i = 0; i < 200; ++i) {
    bool same = true;
    ++elsewhere[r.Pick(Shard(i), none, "node-c", &same)];
    EXPECT_FALSE(same);
    EXPECT_EQ(r.Pick(Shard(i), none, "node-c"), r.Pick(Shard(i)));
  }
  EXPECT_EQ(elsewhere.size(), 4u);
  // The node's servers suspect or unreachable: another node's.
  r.MarkSuspect("a:1");
  const auto not_a2 = [](const std::string& address) {
    return address == "a:2";
  };
  for (int i = 0; i < 50; ++i) {
    bool same = true;
    const std::string picked = r.Pick(Shard(i), not_a2, "node-a", &same);
    EXPECT_TRUE(picked == "b:1" || picked == "none:1") << picked;
    EXPECT_FALSE(same);
  }
}

TEST(DataServerRegistryTest, EachShardIsHintedOnceToAServerWithASink) {
  FakeClock clock;
  DataServerRegistry r(&clock, kTimeout);
  auto sink = std::make_shared<NullSink>();
  const int64_t a = r.Add("a:1", 1, sink);
  r.Add("nosink:1", 1, nullptr);
  auto first = r.NoteHint("a:1", Shard(0));
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->id, a);
  EXPECT_EQ(first->sink, sink);
  EXPECT_FALSE(r.NoteHint("a:1", Shard(0)).has_value());
  EXPECT_FALSE(r.NoteHint("nosink:1", Shard(0)).has_value());
  EXPECT_FALSE(r.NoteHint("unknown:1", Shard(0)).has_value());
  // The oldest hint is forgotten once kRememberedHints newer ones were made.
  for (size_t i = 1; i < DataServerRegistry::kRememberedHints; ++i) {
    ASSERT_TRUE(r.NoteHint("a:1", Shard(static_cast<int>(i))).has_value());
  }
  EXPECT_FALSE(r.NoteHint("a:1", Shard(0)).has_value());
  ASSERT_TRUE(r.NoteHint("a:1", Shard(100000)).has_value());
  EXPECT_TRUE(r.NoteHint("a:1", Shard(0)).has_value());
}

}  // namespace
}  // namespace sluice
