#include "server/coordinator/session_table.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

namespace sluice {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

// The session `id` of `table`, past a Hello as reader (rank, slot) of `job`
// for trainer `trainer`, joined.
Session* Joined(SessionTable& table, const std::string& job, int32_t rank,
                int32_t slot, const std::string& trainer,
                Session** replaced = nullptr) {
  Session& s = table.Add(nullptr);
  s.hello = true;
  s.job = job;
  s.rank = rank;
  s.slot = slot;
  s.trainer_id = job + "/" + trainer;
  Session* previous = table.Join(s);
  if (replaced != nullptr) *replaced = previous;
  return &s;
}

TEST(SessionTableTest, OpenSessionsAreCountedPerJobSlotAndRank) {
  SessionTable table;
  Session& waiting = table.Add(nullptr);  // no Hello yet: in no job
  Session* a = Joined(table, "j", 0, 0, "a");
  Session* b = Joined(table, "j", 0, 1, "b");
  Session* c = Joined(table, "k", 0, 0, "c");
  EXPECT_EQ(table.OpenCount("j"), 2);
  EXPECT_EQ(table.OpenCount("k"), 1);
  EXPECT_EQ(table.OpenCount("none"), 0);
  EXPECT_EQ(table.OpenOf("j")->per_rank.at(0), 2);
  EXPECT_TRUE(table.SlotHasOpenSession("j", 1));
  EXPECT_FALSE(table.SlotHasOpenSession("j", 2));
  EXPECT_THAT(table.OpenIds("j", false), ElementsAre(a->id, b->id));
  EXPECT_EQ(table.OpenCounts(),
            (std::map<std::string, int64_t>{{"j", 2}, {"k", 1}}));
  EXPECT_THAT(table.Ids(), ElementsAre(waiting.id, a->id, b->id, c->id));
  // b finishes: its slot is left without a session, rank 0 keeps a.
  b->finished = true;
  EXPECT_TRUE(table.Leave(*b));
  EXPECT_FALSE(table.Leave(*b));  // once
  EXPECT_FALSE(table.SlotHasOpenSession("j", 1));
  EXPECT_EQ(table.OpenOf("j")->per_rank.at(0), 1);
  // Closing the last one of k forgets the job's entry.
  EXPECT_TRUE(table.Remove(c->id));
  EXPECT_EQ(table.OpenOf("k"), nullptr);
  EXPECT_EQ(table.Find(c->id), nullptr);
  EXPECT_FALSE(table.Remove(waiting.id));  // was in no job
}

TEST(SessionTableTest, ATrainersNewSessionReplacesItsOldOne) {
  SessionTable table;
  Session* replaced = nullptr;
  Session* first = Joined(table, "j", 0, 0, "t", &replaced);
  EXPECT_EQ(replaced, nullptr);
  EXPECT_EQ(table.SessionOf("j/t"), first);
  Session* second = Joined(table, "j", 0, 0, "t", &replaced);
  EXPECT_EQ(replaced, first);
  EXPECT_EQ(table.SessionOf("j/t"), second);
  // The old session closing does not take the trainer from the new one.
  EXPECT_FALSE(table.Remove(first->id));  // slot 0 keeps `second`
  EXPECT_EQ(table.SessionOf("j/t"), second);
  // A finished session holds nothing for its trainer.
  second->finished = true;
  EXPECT_EQ(table.SessionOf("j/t"), nullptr);
  EXPECT_EQ(table.SessionOf("j/nobody"), nullptr);
}

TEST(SessionTableTest, OnlyOpenSessionsAreMarkedWanting) {
  SessionTable table;
  Session* a = Joined(table, "j", 0, 0, "a");
  Session* b = Joined(table, "j", 1, 1, "b");
  Session& outside = table.Add(nullptr);
  table.SetWanting(*a, true);
  table.SetWanting(*b, true);
  table.SetWanting(outside, true);  // in no job: left alone
  EXPECT_THAT(table.OpenIds("j", true), ElementsAre(a->id, b->id));
  table.SetWanting(*a, false);
  EXPECT_THAT(table.OpenIds("j", true), ElementsAre(b->id));
  b->finished = true;
  table.Leave(*b);
  table.SetWanting(*b, true);  // no longer open
  EXPECT_THAT(table.OpenIds("j", true), IsEmpty());
}

}  // namespace
}  // namespace sluice
