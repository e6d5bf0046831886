#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "server/coordinator/file_journal.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/tar_writer.h"
#include "tests/testing/temp_dir.h"

namespace sluice {
namespace {

using ::sluice::testing::StatusIs;
using ::sluice::testing::TempDir;
using ::testing::HasSubstr;

JournalRecord Deleted(const std::string& job, int64_t t) {
  JournalRecord r;
  r.set_time_unix_ms(t);
  r.mutable_job_deleted()->set_job(job);
  return r;
}

// Opens `dir` and collects the replayed job names.
absl::StatusOr<std::unique_ptr<FileJournal>> OpenCollect(
    const std::string& dir, std::vector<std::string>* seen) {
  return FileJournal::Open(dir, true, [seen](const JournalRecord& r) {
    seen->push_back(r.job_deleted().job());
    return absl::OkStatus();
  });
}

int64_t FileSize(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  return static_cast<int64_t>(in.tellg());
}

TEST(FileJournalTest, RoundTripAndAppendAfterReopen) {
  TempDir dir;
  {
    std::vector<std::string> seen;
    auto j = OpenCollect(dir.path(), &seen);
    ASSERT_OK(j);
    EXPECT_TRUE(seen.empty());
    ASSERT_OK((*j)->Append({Deleted("a", 1), Deleted("b", 2)}));
    ASSERT_OK((*j)->Append({Deleted("c", 3)}));
  }
  {
    std::vector<std::string> seen;
    auto j = OpenCollect(dir.path(), &seen);
    ASSERT_OK(j);
    EXPECT_EQ(seen, (std::vector<std::string>{"a", "b", "c"}));
    EXPECT_EQ((*j)->replayed_records(), 3);
    ASSERT_OK((*j)->Append({Deleted("d", 4)}));
  }
  std::vector<std::string> seen;
  ASSERT_OK(OpenCollect(dir.path(), &seen));
  EXPECT_EQ(seen, (std::vector<std::string>{"a", "b", "c", "d"}));
}

TEST(FileJournalTest, MissingDirectoryIsNotFoundUnlessCreating) {
  TempDir dir;
  auto j =
      FileJournal::Open(dir.File("absent"), false,
                        [](const JournalRecord&) { return absl::OkStatus(); });
  EXPECT_THAT(j, StatusIs(absl::StatusCode::kNotFound, HasSubstr("absent")));
  EXPECT_OK(
      FileJournal::Open(dir.File("absent"), true,
                        [](const JournalRecord&) { return absl::OkStatus(); }));
}

// Every proper prefix of the last frame is a torn tail: truncated, the
// earlier records kept, and appending continues cleanly.
TEST(FileJournalTest, TornTailAtEveryCutIsTruncated) {
  TempDir dir;
  const std::string log = dir.File("journal.log");
  int64_t whole_two = 0, whole_three = 0;
  {
    std::vector<std::string> seen;
    auto j = OpenCollect(dir.path(), &seen);
    ASSERT_OK((*j)->Append({Deleted("a", 1), Deleted("b", 2)}));
    whole_two = FileSize(log);
    ASSERT_OK((*j)->Append({Deleted("c", 3)}));
    whole_three = FileSize(log);
  }
  std::ifstream in(log, std::ios::binary);
  const std::string full((std::istreambuf_iterator<char>(in)), {});
  for (int64_t cut = whole_two + 1; cut < whole_three; ++cut) {
    std::ofstream(log, std::ios::binary | std::ios::trunc)
        << full.substr(0, cut);
    std::vector<std::string> seen;
    auto j = OpenCollect(dir.path(), &seen);
    ASSERT_OK(j) << "cut at " << cut;
    EXPECT_EQ(seen, (std::vector<std::string>{"a", "b"})) << "cut at " << cut;
    EXPECT_EQ((*j)->truncated_bytes(), cut - whole_two);
    EXPECT_EQ(FileSize(log), whole_two);
  }
  // A garbled (not short) last frame is a torn tail too.
  std::string garbled = full;
  garbled[whole_three - 1] ^= 0x5a;
  std::ofstream(log, std::ios::binary | std::ios::trunc) << garbled;
  std::vector<std::string> seen;
  auto j = OpenCollect(dir.path(), &seen);
  ASSERT_OK(j);
  EXPECT_EQ(seen, (std::vector<std::string>{"a", "b"}));
  ASSERT_OK((*j)->Append({Deleted("z", 9)}));
  j->reset();
  seen.clear();
  ASSERT_OK(OpenCollect(dir.path(), &seen));
  EXPECT_EQ(seen, (std::vector<std::string>{"a", "b", "z"}));
}

TEST(FileJournalTest, CorruptMiddleIsDataLossNamingTheOffset) {
  TempDir dir;
  const std::string log = dir.File("journal.log");
  {
    std::vector<std::string> seen;
    auto j = OpenCollect(dir.path(), &seen);
    ASSERT_OK(
        (*j)->Append({Deleted("a", 1), Deleted("b", 2), Deleted("c", 3)}));
  }
  std::fstream f(log, std::ios::binary | std::ios::in | std::ios::out);
  f.seekp(10);  // inside the first record's payload
  f.put('\x7f');
  f.close();
  std::vector<std::string> seen;
  EXPECT_THAT(OpenCollect(dir.path(), &seen),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("offset 0")));
  EXPECT_GT(FileSize(log), 0);  // nothing was truncated
}

// Every single-bit flip in the header (length and CRC) of a record in the
// middle is corruption, never a torn tail: a length made to reach past the
// end of the file used to truncate every acknowledged record after it. A
// zero-filled tail after the last record is still a torn tail.
TEST(FileJournalTest, EveryBitFlipInAMiddleRecordHeaderIsDataLoss) {
  TempDir dir;
  const std::string log = dir.File("journal.log");
  int64_t second = 0;
  {
    std::vector<std::string> seen;
    auto j = OpenCollect(dir.path(), &seen);
    ASSERT_OK((*j)->Append({Deleted("a", 1)}));
    second = FileSize(log);
    ASSERT_OK((*j)->Append({Deleted("b", 2)}));
    for (int i = 0; i < 20; ++i)
      ASSERT_OK((*j)->Append({Deleted(absl::StrCat("c", i), 3 + i)}));
  }
  std::ifstream in(log, std::ios::binary);
  const std::string full((std::istreambuf_iterator<char>(in)), {});
  for (int bit = 0; bit < 64; ++bit) {
    std::string damaged = full;
    damaged[second + bit / 8] ^= static_cast<char>(1 << (bit % 8));
    std::ofstream(log, std::ios::binary | std::ios::trunc) << damaged;
    std::vector<std::string> seen;
    EXPECT_THAT(OpenCollect(dir.path(), &seen),
                StatusIs(absl::StatusCode::kDataLoss,
                         HasSubstr(absl::StrCat("offset ", second))))
        << "bit " << bit;
    EXPECT_EQ(FileSize(log), static_cast<int64_t>(full.size()))
        << "bit " << bit;
  }
  // The length set to 0xFFFFFFFF, as the probe did.
  std::string damaged = full;
  for (int i = 0; i < 4; ++i) damaged[second + i] = '\xff';
  std::ofstream(log, std::ios::binary | std::ios::trunc) << damaged;
  std::vector<std::string> seen;
  EXPECT_THAT(OpenCollect(dir.path(), &seen),
              StatusIs(absl::StatusCode::kDataLoss));
  // Zeros after the last whole record: a torn tail, truncated.
  std::ofstream(log, std::ios::binary | std::ios::trunc)
      << full << std::string(4096, '\0');
  seen.clear();
  auto j = OpenCollect(dir.path(), &seen);
  ASSERT_OK(j);
  EXPECT_EQ(seen.size(), 22u);
  EXPECT_EQ((*j)->truncated_bytes(), 4096);
}

TEST(FileJournalTest, ConcurrentAppendsAreAllDurableAndWhole) {
  TempDir dir;
  {
    std::vector<std::string> seen;
    auto j = OpenCollect(dir.path(), &seen);
    ASSERT_OK(j);
    std::vector<std::thread> threads;
    for (int t = 0; t < 8; ++t) {
      threads.emplace_back([&, t] {
        for (int i = 0; i < 50; ++i) {
          ASSERT_OK((*j)->Append(
              {Deleted("t" + std::to_string(t) + "-" + std::to_string(i), i)}));
        }
      });
    }
    for (auto& th : threads) th.join();
  }
  std::vector<std::string> seen;
  ASSERT_OK(OpenCollect(dir.path(), &seen));
  EXPECT_EQ(seen.size(), 400u);
  // Each thread's records stay in its own order.
  for (int t = 0; t < 8; ++t) {
    int next = 0;
    for (const std::string& s : seen) {
      if (s.rfind("t" + std::to_string(t) + "-", 0) == 0) {
        EXPECT_EQ(s, "t" + std::to_string(t) + "-" + std::to_string(next));
        ++next;
      }
    }
    EXPECT_EQ(next, 50);
  }
}

TEST(FileJournalTest, ReplayErrorStopsStartup) {
  TempDir dir;
  {
    std::vector<std::string> seen;
    auto j = OpenCollect(dir.path(), &seen);
    ASSERT_OK((*j)->Append({Deleted("a", 1)}));
  }
  auto j = FileJournal::Open(dir.path(), true, [](const JournalRecord&) {
    return absl::FailedPreconditionError("job a unknown");
  });
  EXPECT_THAT(
      j, StatusIs(absl::StatusCode::kDataLoss, HasSubstr("job a unknown")));
}

// Compact replaces everything enqueued so far (written or not) with the
// snapshot; later appends follow it; a leftover temp file of an
// interrupted compaction is removed at open.
TEST(FileJournalTest, CompactReplacesTheJournalWithTheSnapshot) {
  TempDir dir;
  {
    std::vector<std::string> seen;
    auto j = OpenCollect(dir.path(), &seen);
    ASSERT_OK(j);
    ASSERT_OK((*j)->Append({Deleted("a", 1), Deleted("b", 2)}));
    const uint64_t queued = (*j)->Enqueue({Deleted("c", 3)});
    ASSERT_OK((*j)->Compact(Deleted("snapshot", 4)));
    ASSERT_OK((*j)->WaitDurable(queued));  // contained in the snapshot
    ASSERT_OK((*j)->Append({Deleted("d", 5)}));
    EXPECT_EQ((*j)->bytes_written(), FileSize(dir.path() + "/journal.log"));
  }
  testing::WriteFile(dir.path() + "/journal.log.compact", "half a snapshot");
  std::vector<std::string> seen;
  auto j = OpenCollect(dir.path(), &seen);
  ASSERT_OK(j);
  EXPECT_EQ(seen, (std::vector<std::string>{"snapshot", "d"}));
  EXPECT_NE(access((dir.path() + "/journal.log.compact").c_str(), F_OK), 0);
}

// Records enqueued after BeginCompaction, written to the old file or not
// yet, and appended by another thread while FinishCompaction writes, all
// follow the snapshot in the compacted journal, in order, each once.
TEST(FileJournalTest, AppendsDuringACompactionFollowTheSnapshot) {
  TempDir dir;
  constexpr int kConcurrent = 200;
  {
    std::vector<std::string> seen;
    auto j = OpenCollect(dir.path(), &seen);
    ASSERT_OK(j);
    FileJournal& journal = **j;
    ASSERT_OK(journal.Append({Deleted("a", 1), Deleted("b", 2)}));
    journal.BeginCompaction();
    ASSERT_OK(journal.Append({Deleted("c", 3)}));         // in the old file
    const uint64_t d = journal.Enqueue(Deleted("d", 4));  // not written yet
    std::thread appender([&journal] {
      for (int i = 0; i < kConcurrent; ++i) {
        ASSERT_OK(journal.Append({Deleted(absl::StrCat("e", i), 5)}));
      }
    });
    ASSERT_OK(journal.FinishCompaction(Deleted("snapshot", 6)));
    appender.join();
    ASSERT_OK(journal.WaitDurable(d));
    ASSERT_OK(journal.Append({Deleted("f", 7)}));
    EXPECT_EQ(journal.bytes_written(), FileSize(dir.path() + "/journal.log"));
  }
  std::vector<std::string> want = {"snapshot", "c", "d"};
  for (int i = 0; i < kConcurrent; ++i) want.push_back(absl::StrCat("e", i));
  want.push_back("f");
  std::vector<std::string> seen;
  ASSERT_OK(OpenCollect(dir.path(), &seen));
  EXPECT_EQ(seen, want);
}

// A compaction that cannot stage its file leaves the journal as it was:
// the records enqueued meanwhile are written to it, and it keeps taking
// appends.
TEST(FileJournalTest, AFailedCompactionLeavesTheJournalAsItWas) {
  TempDir dir;
  {
    std::vector<std::string> seen;
    auto j = OpenCollect(dir.path(), &seen);
    ASSERT_OK(j);
    ASSERT_OK((*j)->Append({Deleted("a", 1)}));
    ASSERT_EQ(mkdir((dir.path() + "/journal.log.compact").c_str(), 0755), 0);
    (*j)->BeginCompaction();
    const uint64_t b = (*j)->Enqueue(Deleted("b", 2));
    EXPECT_THAT((*j)->FinishCompaction(Deleted("snapshot", 3)),
                StatusIs(absl::StatusCode::kInternal,
                         HasSubstr("journal.log.compact")));
    ASSERT_OK((*j)->WaitDurable(b));
    ASSERT_OK((*j)->Append({Deleted("c", 4)}));
    EXPECT_EQ((*j)->bytes_written(), FileSize(dir.path() + "/journal.log"));
  }
  ASSERT_EQ(rmdir((dir.path() + "/journal.log.compact").c_str()), 0);
  std::vector<std::string> seen;
  ASSERT_OK(OpenCollect(dir.path(), &seen));
  EXPECT_EQ(seen, (std::vector<std::string>{"a", "b", "c"}));
}

}  // namespace
}  // namespace sluice
