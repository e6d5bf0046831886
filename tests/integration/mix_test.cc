// Jobs with several sources (JobSpec.sources) against the real coordinator
// and data servers: exact per-source shares per epoch, the interleave bound
// in every rank's sequence, passes of a repeating source, a stopping
// source, resume from merged cursors (same and another world size), and bad
// specs.
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <set>
#include <thread>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "sluice/reader.h"
#include "sluice/v1/coordinator.grpc.pb.h"
#include "tests/testing/coordinator_client.h"
#include "tests/testing/http.h"
#include "tests/testing/process.h"
#include "tests/testing/tar_writer.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/test_cluster.h"

namespace sluice {
namespace {

using ::sluice::testing::ServerProcess;
using ::sluice::testing::TempDir;
using ::sluice::testing::WaitForMetric;

// (source, shard url, index in the shard)
using Id = std::tuple<std::string, std::string, int64_t>;
using Sequence = std::vector<Id>;

struct SourceData {
  std::string name;
  int shards = 0;
  int per_shard = 0;
  std::vector<std::string> urls;
};

class MixTest : public ::testing::Test {
 protected:
  void TearDown() override {
    if (HasFailure())
      std::cerr << "--- coordinator log\n"
                << cluster_.CoordinatorLog() << "---\n";
  }

  // Sources a (1,000 samples), b (200) and c (5,000); a coordinator and two
  // data servers.
  void SetUp() override {
    sources_ = {{"a", 10, 100, {}}, {"b", 4, 50, {}}, {"c", 20, 250, {}}};
    for (SourceData& src : sources_) {
      for (int s = 0; s < src.shards; ++s) {
        src.urls.push_back(cluster_.WriteShard(
            absl::StrCat(src.name, s), src.per_shard,
            [&](testing::TarWriter& tar, int i) {
              tar.File(absl::StrCat(src.name, s, "_", i, ".cls"),
                       std::to_string(i));
            }));
      }
    }
    ASSERT_TRUE(cluster_.StartCoordinator().ok());
    const absl::Status started = cluster_.StartDataServers(2);
    ASSERT_TRUE(started.ok()) << started;
  }

  v1::Source* AddSource(v1::JobSpec& spec, int index) {
    const SourceData& src = sources_[index];
    v1::Source* out = spec.add_sources();
    out->set_name(src.name);
    for (const std::string& url : src.urls) {
      v1::Shard* shard = out->mutable_manifest()->add_shards();
      shard->set_url(url);
      shard->set_num_samples(src.per_shard);
    }
    return out;
  }

  // Weights 0.5/0.3/0.2 of 2,000 samples per epoch.
  v1::JobSpec WeightedSpec(const std::string& name, int world, int epochs) {
    v1::JobSpec spec;
    spec.set_name(name);
    AddSource(spec, 0)->set_weight(0.5);
    AddSource(spec, 1)->set_weight(0.3);
    AddSource(spec, 2)->set_weight(0.2);
    spec.set_samples_per_epoch(2000);
    spec.set_world_size(world);
    spec.set_num_epochs(epochs);
    spec.set_seed(5);
    spec.set_shuffle(true);
    spec.set_lease_ttl_ms(2000);
    return spec;
  }

  void Create(const v1::JobSpec& spec) {
    absl::Status created = testing::CreateJob(coordinator_.grpc_address, spec);
    ASSERT_TRUE(created.ok()) << created;
  }

  std::unique_ptr<Reader> MakeReader(const std::string& job, int rank,
                                     const v1::Cursor* resume = nullptr) {
    ReaderOptions o;
    if (resume != nullptr) {
      o.resume_from = *resume;
      o.resume_attempt = "restart-1";
    }
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
  std::vector<SourceData> sources_;
};

// Per epoch, the samples a reader delivered in order; stops after `limit`
// samples (-1 = until done).
std::map<int64_t, Sequence> ReadSequence(Reader& reader, int64_t limit = -1) {
  std::map<int64_t, Sequence> out;
  int64_t n = 0;
  while (limit < 0 || n < limit) {
    auto e = reader.Next();
    EXPECT_TRUE(e.ok()) << e.status();
    if (!e.ok() || e->kind == ReaderEvent::Kind::kDone) break;
    if (e->kind != ReaderEvent::Kind::kSample) continue;
    const Sample& s = e->sample;
    EXPECT_THAT(s.key, ::testing::StartsWith(s.source));
    out[e->epoch].emplace_back(s.source, s.shard_url, s.index);
    ++n;
  }
  return out;
}

std::vector<std::map<int64_t, Sequence>> ReadRanks(
    const std::vector<std::unique_ptr<Reader>>& readers, int64_t limit = -1) {
  std::vector<std::map<int64_t, Sequence>> out(readers.size());
  std::vector<std::thread> threads;
  for (size_t r = 0; r < readers.size(); ++r)
    threads.emplace_back([&, r] { out[r] = ReadSequence(*readers[r], limit); });
  for (auto& t : threads) t.join();
  return out;
}

std::map<std::string, int64_t> CountBySource(const Sequence& seq) {
  std::map<std::string, int64_t> n;
  for (const Id& id : seq) ++n[std::get<0>(id)];
  return n;
}

TEST_F(MixTest, ThreeSourcesGiveExactSharesBoundedStretchesAndFreshPasses) {
  Create(WeightedSpec("mix", 4, 3));
  std::vector<std::unique_ptr<Reader>> readers;
  for (int r = 0; r < 4; ++r) readers.push_back(MakeReader("mix", r));
  const auto seen = ReadRanks(readers);
  const std::map<std::string, double> share = {
      {"a", 0.5}, {"b", 0.3}, {"c", 0.2}};
  Sequence stream;  // every epoch's positions in order: ranks' blocks joined
  for (int64_t e = 0; e < 3; ++e) {
    Sequence epoch;
    for (int r = 0; r < 4; ++r) {
      const Sequence& seq = seen[r].at(e);
      ASSERT_EQ(seq.size(), 500u) << "rank " << r << " epoch " << e;
      epoch.insert(epoch.end(), seq.begin(), seq.end());
      // Every stretch of up to 64 consecutive samples of a rank holds each
      // source within 1 of its share (mix_order.h; 0.5/0.3/0.2).
      for (size_t a = 0; a < seq.size(); ++a) {
        std::map<std::string, int64_t> n;
        for (size_t b = a; b < std::min(seq.size(), a + 64); ++b) {
          ++n[std::get<0>(seq[b])];
          for (const auto& [name, w] : share) {
            const double dev = std::abs(static_cast<double>(n[name]) -
                                        w * static_cast<double>(b - a + 1));
            ASSERT_LE(dev, 1.0 + 1e-9) << "rank " << r << " epoch " << e
                                       << " source " << name << " at " << a;
          }
        }
      }
    }
    EXPECT_THAT(CountBySource(epoch),
                ::testing::ElementsAre(::testing::Pair("a", 1000),
                                       ::testing::Pair("b", 600),
                                       ::testing::Pair("c", 400)))
        << "epoch " << e;
    stream.insert(stream.end(), epoch.begin(), epoch.end());
  }
  // Each source's stream, cut into passes: every pass holds each of the
  // source's samples once, and each pass has an order of its own.
  for (const SourceData& src : sources_) {
    Sequence mine;
    for (const Id& id : stream)
      if (std::get<0>(id) == src.name) mine.push_back(id);
    const size_t pass = static_cast<size_t>(src.shards * src.per_shard);
    std::set<Sequence> orders;
    for (size_t at = 0; at < mine.size(); at += pass) {
      const Sequence one(mine.begin() + at,
                         mine.begin() + std::min(mine.size(), at + pass));
      const std::set<Id> distinct(one.begin(), one.end());
      EXPECT_EQ(distinct.size(), one.size())
          << src.name << ": a sample twice in the pass at " << at;
      if (one.size() == pass) orders.insert(one);
    }
    if (src.name == "b") {
      EXPECT_EQ(mine.size(), 1800u);
      EXPECT_EQ(orders.size(), 9u);  // nine passes, nine orders
    }
  }
  // The coordinator's view per source.
  auto job = testing::GetJob(coordinator_.grpc_address, "mix");
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(job->status().sources_size(), 3);
  EXPECT_EQ(job->status().sources(1).name(), "b");
  EXPECT_EQ(job->status().sources(1).samples_in_epoch(), 600);
  EXPECT_EQ(job->status().sources(1).consumed_in_epoch(), 600);
}

// 2,000 samples over 3 ranks: 666 each, 2 dropped from the end of the
// sequence. The status counts what each source served and what it lost to
// the remainder, during the epoch and after the job is done.
TEST_F(MixTest, ADroppedRemainderIsCountedPerSourceAsDropped) {
  Create(WeightedSpec("odd", 3, 1));
  std::vector<std::unique_ptr<Reader>> readers;
  for (int r = 0; r < 3; ++r) readers.push_back(MakeReader("odd", r));
  auto during = testing::GetJob(coordinator_.grpc_address, "odd");
  ASSERT_TRUE(during.ok()) << during.status();
  int64_t dropped = 0;
  for (const v1::SourceStatus& src : during->status().sources())
    dropped += src.dropped_in_epoch();
  EXPECT_EQ(dropped, 2);
  const auto seen = ReadRanks(readers);
  Sequence epoch;
  for (int r = 0; r < 3; ++r) {
    const Sequence& seq = seen[r].at(0);
    ASSERT_EQ(seq.size(), 666u) << "rank " << r;
    epoch.insert(epoch.end(), seq.begin(), seq.end());
  }
  const std::map<std::string, int64_t> served = CountBySource(epoch);
  auto job = testing::GetJob(coordinator_.grpc_address, "odd");
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(job->status().sources_size(), 3);
  int64_t total = 0;
  for (const v1::SourceStatus& src : job->status().sources()) {
    EXPECT_EQ(src.consumed_in_epoch(), served.at(src.name())) << src.name();
    EXPECT_EQ(src.consumed_in_epoch() + src.dropped_in_epoch(),
              src.samples_in_epoch())
        << src.name();
    total += src.consumed_in_epoch();
  }
  EXPECT_EQ(total, 1998);
}

TEST_F(MixTest, AStoppingSourceEndsAtItsEndAndTheEpochsShorten) {
  v1::JobSpec spec;
  spec.set_name("stop");
  AddSource(spec, 0)->set_samples_per_epoch(300);
  v1::Source* b = AddSource(spec, 1);
  b->set_samples_per_epoch(120);
  b->set_on_exhausted(v1::ON_EXHAUSTED_STOP);
  spec.set_world_size(2);
  spec.set_num_epochs(3);
  spec.set_seed(9);
  spec.set_shuffle(true);
  Create(spec);
  std::vector<std::unique_ptr<Reader>> readers;
  for (int r = 0; r < 2; ++r) readers.push_back(MakeReader("stop", r));
  const auto seen = ReadRanks(readers);
  std::set<Id> b_samples;
  const int64_t b_per_epoch[3] = {120, 80, 0};  // 200 samples, then none
  for (int64_t e = 0; e < 3; ++e) {
    Sequence epoch;
    for (int r = 0; r < 2; ++r) {
      ASSERT_EQ(seen[r].count(e), 1u) << "rank " << r << " epoch " << e;
      const Sequence& seq = seen[r].at(e);
      ASSERT_EQ(seq.size(), static_cast<size_t>((300 + b_per_epoch[e]) / 2));
      epoch.insert(epoch.end(), seq.begin(), seq.end());
    }
    auto counts = CountBySource(epoch);
    EXPECT_EQ(counts["a"], 300) << "epoch " << e;
    EXPECT_EQ(counts["b"], b_per_epoch[e]) << "epoch " << e;
    for (const Id& id : epoch) {
      if (std::get<0>(id) == "b") {
        EXPECT_TRUE(b_samples.insert(id).second);
      }
    }
  }
  EXPECT_EQ(b_samples.size(), 200u);  // all of b, once
}

// Four readers stopped at a point, their cursors merged, and a new job
// resumed from it: with four ranks every rank continues its uninterrupted
// sequence exactly; with three, the rest of the epoch is served once.
TEST_F(MixTest, ResumeFromAMergedCursorContinuesExactly) {
  Create(WeightedSpec("whole", 4, 2));
  std::vector<std::unique_ptr<Reader>> readers;
  for (int r = 0; r < 4; ++r) readers.push_back(MakeReader("whole", r));
  const auto whole = ReadRanks(readers);
  readers.clear();
  // Stop points, per rank (500 samples each per epoch): mid-epoch; where
  // source b's first pass ends (its 200th sample sits at position ~667 of
  // the epoch: rank 1's 167th); right after epoch 0.
  int case_number = 0;
  for (const int64_t stop : {int64_t{250}, int64_t{167}, int64_t{501}}) {
    for (const int world : {4, 3}) {
      const std::string first = absl::StrCat("first", ++case_number);
      Create(WeightedSpec(first, 4, 2));
      for (int r = 0; r < 4; ++r) readers.push_back(MakeReader(first, r));
      const auto head = ReadRanks(readers, stop);
      std::vector<v1::Cursor> cursors;
      for (auto& reader : readers) {
        auto c = reader->Cursor();
        ASSERT_TRUE(c.ok()) << c.status();
        cursors.push_back(*c);
        reader->Close();
      }
      readers.clear();
      auto merged = MergeCursors(cursors);
      ASSERT_TRUE(merged.ok()) << merged.status();
      EXPECT_THAT(merged->sources(), ::testing::ElementsAre("a", "b", "c"));
      const std::string rest = absl::StrCat("rest", case_number);
      Create(WeightedSpec(rest, world, 2));
      for (int r = 0; r < world; ++r)
        readers.push_back(MakeReader(rest, r, &*merged));
      const auto tail = ReadRanks(readers);
      readers.clear();
      if (world == 4) {
        for (int r = 0; r < 4; ++r) {
          Sequence joined, expected;
          for (const auto& [e, seq] : head[r])
            joined.insert(joined.end(), seq.begin(), seq.end());
          for (const auto& [e, seq] : tail[r])
            joined.insert(joined.end(), seq.begin(), seq.end());
          for (const auto& [e, seq] : whole[r])
            expected.insert(expected.end(), seq.begin(), seq.end());
          EXPECT_EQ(joined, expected) << "stop " << stop << " rank " << r;
        }
      } else {
        // The interrupted epoch's rest is re-balanced over three ranks
        // (REMAINDER_DROP leaves out the rest's last (rest mod 3) samples):
        // every position of the epoch is served once, all but those (a
        // multiset: source b repeats within the epoch).
        const int64_t epoch = stop > 500 ? 1 : 0;
        std::multiset<Id> got;
        std::multiset<Id> want;
        size_t head_count = 0;
        size_t served = 0;
        for (int r = 0; r < 4; ++r) {
          if (head[r].count(epoch)) {
            got.insert(head[r].at(epoch).begin(), head[r].at(epoch).end());
            head_count += head[r].at(epoch).size();
          }
          want.insert(whole[r].at(epoch).begin(), whole[r].at(epoch).end());
        }
        served = head_count;
        for (int r = 0; r < world; ++r) {
          if (!tail[r].count(epoch)) continue;
          got.insert(tail[r].at(epoch).begin(), tail[r].at(epoch).end());
          served += tail[r].at(epoch).size();
        }
        ASSERT_EQ(want.size(), 2000u);
        EXPECT_EQ(served, 2000 - (2000 - head_count) % 3) << "stop " << stop;
        EXPECT_TRUE(
            std::includes(want.begin(), want.end(), got.begin(), got.end()));
      }
    }
  }
}

// The coordinator SIGKILLed mid-epoch and restarted on its journal: the mixed
// plan follows from the journaled spec, so both ranks finish with every
// position once and every source's exact share.
TEST_F(MixTest, CoordinatorKilledMidEpochKeepsEveryPositionOnce) {
  Create(WeightedSpec("killed", 2, 1));
  std::vector<std::unique_ptr<Reader>> readers;
  for (int r = 0; r < 2; ++r) readers.push_back(MakeReader("killed", r));
  std::vector<std::map<int64_t, Sequence>> seen(2);
  std::thread other([&] { seen[1] = ReadSequence(*readers[1]); });
  seen[0] = ReadSequence(*readers[0], 300);
  ASSERT_TRUE(cluster_.RestartCoordinator().ok());
  const auto rest = ReadSequence(*readers[0]);
  other.join();
  for (const auto& [e, seq] : rest)
    seen[0][e].insert(seen[0][e].end(), seq.begin(), seq.end());
  Sequence epoch;
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(seen[r][0].size(), 1000u) << "rank " << r;
    epoch.insert(epoch.end(), seen[r][0].begin(), seen[r][0].end());
  }
  EXPECT_THAT(CountBySource(epoch),
              ::testing::ElementsAre(::testing::Pair("a", 1000),
                                     ::testing::Pair("b", 600),
                                     ::testing::Pair("c", 400)));
  // a's and c's shares lie within one pass: each sample once.
  std::map<Id, int> count;
  for (const Id& id : epoch) ++count[id];
  for (const auto& [id, n] : count) {
    if (std::get<0>(id) != "b") {
      EXPECT_EQ(n, 1) << std::get<1>(id) << "/" << std::get<2>(id);
    }
  }
  EXPECT_GE(readers[0]->stats().reconnects, 1);
}

TEST_F(MixTest, BadSpecsAreRefusedNamingTheField) {
  struct Case {
    std::string field;
    std::function<void(v1::JobSpec&)> damage;
  };
  const std::vector<Case> cases = {
      {"spec.sources[1].weight",
       [](v1::JobSpec& s) { s.mutable_sources(1)->set_weight(-0.3); }},
      {"spec.sources[2].name",
       [](v1::JobSpec& s) { s.mutable_sources(2)->set_name("a"); }},
      {"spec.sources[0].manifest",
       [](v1::JobSpec& s) {
         s.mutable_sources(0)->mutable_manifest()->clear_shards();
       }},
      {"spec.samples_per_epoch",
       [](v1::JobSpec& s) { s.set_samples_per_epoch(0); }},
      {"spec.sources",
       [](v1::JobSpec& s) {
         s.mutable_manifest()->add_shards()->set_url("/x.tar");
       }},
  };
  for (const Case& c : cases) {
    v1::JobSpec spec = WeightedSpec("bad", 2, 1);
    c.damage(spec);
    absl::Status s = testing::CreateJob(coordinator_.grpc_address, spec);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.field;
    EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr(c.field)) << s;
  }
  // A cursor naming a source the job does not have.
  Create(WeightedSpec("good", 1, 1));
  v1::Cursor cursor;
  cursor.set_job("good");
  cursor.set_world_size(1);
  cursor.add_consumed_per_rank(0);
  cursor.add_sources("a");
  cursor.add_sources("web");
  cursor.add_sources("c");
  auto reader = MakeReader("good", 0, &cursor);
  auto e = reader->Next();
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(e.status().message()),
              ::testing::HasSubstr("hello.cursor.sources[1]"));
}

}  // namespace
}  // namespace sluice
