#include "server/dataserver/fair_pool.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace sluice::dataserver {
namespace {

// Holds a one-thread pool's thread until Release(), so that what is
// scheduled meanwhile queues up and the pool's choices can be read off the
// order it runs them in.
class Gate {
 public:
  explicit Gate(FairPool& pool) {
    pool.Schedule([this] {
      entered_.Notify();
      release_.WaitForNotification();
    });
    entered_.WaitForNotification();
  }
  void Release() { release_.Notify(); }

 private:
  absl::Notification entered_;
  absl::Notification release_;
};

// Records the flows of the tasks in the order they ran.
class Ledger {
 public:
  explicit Ledger(int expected) : done_(expected) {}
  std::function<void()> Task(std::string flow) {
    return [this, flow = std::move(flow)] {
      {
        absl::MutexLock lock(&mu_);
        ran_.push_back(flow);
      }
      done_.DecrementCount();
    };
  }
  std::vector<std::string> Wait() {
    done_.Wait();
    absl::MutexLock lock(&mu_);
    return ran_;
  }

 private:
  absl::BlockingCounter done_;
  absl::Mutex mu_;
  std::vector<std::string> ran_;
};

int CountIn(const std::vector<std::string>& ran, size_t first,
            const std::string& flow) {
  int n = 0;
  for (size_t i = 0; i < first && i < ran.size(); ++i) n += ran[i] == flow;
  return n;
}

TEST(FairPoolTest, BackloggedFlowsStartInProportionToTheirWeights) {
  FairPool pool(1);
  Ledger ledger(800);
  Gate gate(pool);
  for (int i = 0; i < 400; ++i) {
    pool.Schedule("heavy", 3, ledger.Task("heavy"));
    pool.Schedule("light", 1, ledger.Task("light"));
  }
  gate.Release();
  const std::vector<std::string> ran = ledger.Wait();
  ASSERT_EQ(ran.size(), 800u);
  // While both have work waiting, 3 of every 4 turns go to the heavy flow.
  const int heavy = CountIn(ran, 400, "heavy");
  EXPECT_GE(heavy, 299);
  EXPECT_LE(heavy, 301);
  // Then the light flow, alone, gets every turn.
  EXPECT_EQ(CountIn(ran, 800, "heavy"), 400);
}

TEST(FairPoolTest, EqualWeightsAlternate) {
  FairPool pool(1);
  Ledger ledger(200);
  Gate gate(pool);
  for (int i = 0; i < 100; ++i) pool.Schedule("a", 1, ledger.Task("a"));
  for (int i = 0; i < 100; ++i) pool.Schedule("b", 1, ledger.Task("b"));
  gate.Release();
  const std::vector<std::string> ran = ledger.Wait();
  ASSERT_EQ(ran.size(), 200u);
  for (size_t i = 0; i < ran.size(); i += 2) {
    EXPECT_NE(ran[i], ran[i + 1]) << "turns " << i << " and " << i + 1;
  }
}

TEST(FairPoolTest, AFlowThatWasIdleBanksNoCredit) {
  FairPool pool(1);
  {
    // "busy" runs alone for 100 turns; "idle" has nothing to do.
    Ledger ledger(100);
    for (int i = 0; i < 100; ++i) pool.Schedule("busy", 1, ledger.Task("busy"));
    EXPECT_EQ(CountIn(ledger.Wait(), 100, "busy"), 100);
  }
  // When "idle" returns, it shares from now on instead of claiming the 100
  // turns it left unused.
  Ledger ledger(100);
  Gate gate(pool);
  for (int i = 0; i < 50; ++i) pool.Schedule("idle", 1, ledger.Task("idle"));
  for (int i = 0; i < 50; ++i) pool.Schedule("busy", 1, ledger.Task("busy"));
  gate.Release();
  const std::vector<std::string> ran = ledger.Wait();
  const int busy = CountIn(ran, 20, "busy");
  EXPECT_GE(busy, 9);
  EXPECT_LE(busy, 11);
}

TEST(FairPoolTest, AFlowsTasksRunInTheOrderScheduled) {
  FairPool pool(1);
  Ledger ledger(100);
  Gate gate(pool);
  for (int i = 0; i < 50; ++i) {
    pool.Schedule("a", 2, ledger.Task(absl::StrCat("a", i)));
    pool.Schedule("b", 1, ledger.Task(absl::StrCat("b", i)));
  }
  gate.Release();
  const std::vector<std::string> ran = ledger.Wait();
  int next_a = 0;
  int next_b = 0;
  for (const std::string& task : ran) {
    if (task[0] == 'a') {
      EXPECT_EQ(task, absl::StrCat("a", next_a++));
    } else {
      EXPECT_EQ(task, absl::StrCat("b", next_b++));
    }
  }
  EXPECT_EQ(next_a, 50);
  EXPECT_EQ(next_b, 50);
}

TEST(FairPoolTest, RunsWhatIsQueuedBeforeJoining) {
  int ran = 0;
  {
    FairPool pool(1);
    Gate gate(pool);
    for (int i = 0; i < 10; ++i) pool.Schedule("job", 1, [&ran] { ++ran; });
    gate.Release();
  }
  EXPECT_EQ(ran, 10);
}

}  // namespace
}  // namespace sluice::dataserver
