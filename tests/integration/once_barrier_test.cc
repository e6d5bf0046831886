// Once and Barrier through `sluicectl`, reproducing what users report:
// ranks racing on makedirs (P2), a runner dying mid-step, a failing step,
// a coordinator restart after the step, and rank 0 creating a checkpoint
// directory while the others time out in wait_for(exists) (P4).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "tests/testing/process.h"
#include "tests/testing/tar_writer.h"
#include "tests/testing/temp_dir.h"

namespace sluice {
namespace {

using ::sluice::testing::ChildProcess;
using ::sluice::testing::ServerProcess;
using ::sluice::testing::TempDir;
using ::testing::HasSubstr;
using ::testing::Not;

class OnceBarrierTest : public ::testing::Test {
 protected:
  void SetUp() override { StartCoordinator(""); }
  void StartCoordinator(const std::string& listen) {
    std::vector<std::string> args = {"--journal_dir=" + dir_.File("journal"),
                                     "--heartbeat_interval=200ms"};
    if (!listen.empty()) args.push_back("--listen=" + listen);
    auto c = ServerProcess::Start("sluice-coordinator", dir_.path(), args);
    ASSERT_TRUE(c.ok()) << c.status();
    coordinator_ = std::move(*c);
  }
  ChildProcess Ctl(std::vector<std::string> args, const std::string& log) {
    args.insert(args.begin(), testing::BinDir() + "/sluicectl");
    args.insert(args.begin() + 2, "--coordinator=" + coordinator_.grpc_address);
    auto p = ChildProcess::Start(args, dir_.File(log));
    EXPECT_TRUE(p.ok());
    return std::move(*p);
  }
  int Exit(ChildProcess& p) {
    auto code = p.WaitForExit(absl::Seconds(60));
    return code.ok() ? *code : -1;
  }
  std::string Read(const std::string& name) {
    return testing::ReadWholeFile(dir_.File(name)).value_or("");
  }
  // Polls until `file` contains `text` (true) or 20 s pass.
  bool WaitFor(const std::string& file, const std::string& text) {
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    while (absl::Now() < deadline) {
      if (Read(file).find(text) != std::string::npos) return true;
      absl::SleepFor(absl::Milliseconds(20));  // poll
    }
    return false;
  }
  TempDir dir_;
  ServerProcess coordinator_;
};

TEST_F(OnceBarrierTest, EightRanksRacingOnMakedirsRunItExactlyOnce) {
  // The step builds a directory tree and writes a dataset file slowly
  // (`mkdir` without -p fails if it ever runs twice: the race users hit on
  // NFS). Each rank, right after `once` returns, records the file's size:
  // no rank may see a partial file.
  const std::string tree = dir_.File("data");
  const std::string step = absl::StrCat(
      "mkdir ", tree, " && mkdir ", tree, "/train && echo ran >> ",
      dir_.File("ran.log"), " && for i in 1 2 3 4 5; do printf 0123456789 >> ",
      tree, "/train/part.bin; sleep 0.05; done");
  std::vector<ChildProcess> ranks;
  for (int r = 0; r < 8; ++r) {
    const std::string once = absl::StrCat(
        testing::BinDir(),
        "/sluicectl once --coordinator=", coordinator_.grpc_address,
        " --id=rank-", r, " prepare -- sh -c '", step, "' && wc -c < ", tree,
        "/train/part.bin > ", dir_.File(absl::StrCat("seen-", r)));
    auto p = ChildProcess::Start({"/bin/sh", "-c", once},
                                 dir_.File(absl::StrCat("rank", r, ".log")));
    ASSERT_TRUE(p.ok());
    ranks.push_back(std::move(*p));
  }
  for (int r = 0; r < 8; ++r) {
    EXPECT_EQ(Exit(ranks[r]), 0) << Read(absl::StrCat("rank", r, ".log"));
    EXPECT_EQ(Read(absl::StrCat("seen-", r)), "50\n")
        << "rank " << r << " saw a partial file";
  }
  EXPECT_EQ(Read("ran.log"), "ran\n");
}

TEST_F(OnceBarrierTest, ARunnerThatDiesIsReplacedByAWaiter) {
  const std::string a_step =
      absl::StrCat("echo A >> ", dir_.File("ran.log"), "; exec sleep 120");
  ChildProcess a =
      Ctl({"once", "--id=a", "--ttl=1s", "step", "--", "sh", "-c", a_step},
          "a.log");
  ASSERT_TRUE(WaitFor("ran.log", "A"));
  ChildProcess b = Ctl({"once", "--id=b", "step", "--", "sh", "-c",
                        absl::StrCat("echo B >> ", dir_.File("ran.log"))},
                       "b.log");
  ASSERT_TRUE(WaitFor("b.log", "waiting for a (run 1)"));
  a.Kill();  // SIGKILL mid-step; its command dies with it
  EXPECT_EQ(Exit(b), 0) << Read("b.log");
  EXPECT_EQ(Read("ran.log"), "A\nB\n");
  EXPECT_THAT(Read("b.log"), HasSubstr("running"));
}

TEST_F(OnceBarrierTest, AFailingStepFailsEveryWaiterWithItsStatus) {
  // The runner waits for the test's go-ahead, so the waiters are waiting.
  const std::string go = dir_.File("go");
  ChildProcess runner = Ctl(
      {"once", "--id=r0", "flaky", "--", "sh", "-c",
       absl::StrCat("while [ ! -f ", go, " ]; do sleep 0.02; done; exit 3")},
      "r0.log");
  ASSERT_TRUE(WaitFor("r0.log", "running"));
  ChildProcess w1 = Ctl({"once", "--id=r1", "flaky", "--", "true"}, "r1.log");
  ChildProcess w2 = Ctl({"once", "--id=r2", "flaky", "--", "true"}, "r2.log");
  ASSERT_TRUE(WaitFor("r1.log", "waiting"));
  ASSERT_TRUE(WaitFor("r2.log", "waiting"));
  testing::WriteFile(go, "");
  EXPECT_EQ(Exit(runner), 3);
  EXPECT_EQ(Exit(w1), 3);
  EXPECT_EQ(Exit(w2), 3);
  EXPECT_THAT(Read("r1.log"), HasSubstr("the run failed: exit 3"));
  // RETRY (the default): the next caller runs it again.
  ChildProcess again =
      Ctl({"once", "--id=r3", "flaky", "--", "true"}, "r3.log");
  EXPECT_EQ(Exit(again), 0);
  EXPECT_THAT(Read("r3.log"), HasSubstr("running"));
}

TEST_F(OnceBarrierTest, AFinishedStepIsNotRerunAfterACoordinatorRestart) {
  ChildProcess first = Ctl({"once", "--id=x", "download", "--", "sh", "-c",
                            absl::StrCat("echo ran >> ", dir_.File("ran.log"))},
                           "x.log");
  ASSERT_EQ(Exit(first), 0);
  const std::string address = coordinator_.grpc_address;
  coordinator_.process.Kill();
  StartCoordinator(address);
  ChildProcess later = Ctl({"once", "--id=y", "download", "--", "sh", "-c",
                            absl::StrCat("echo ran >> ", dir_.File("ran.log"))},
                           "y.log");
  EXPECT_EQ(Exit(later), 0);
  EXPECT_EQ(Read("ran.log"), "ran\n");
  EXPECT_THAT(Read("y.log"), HasSubstr("done by another participant"));
}

TEST_F(OnceBarrierTest, BarrierTimeoutNamesTheMissingRank) {
  // Rank 5 never comes (it is still creating the checkpoint directory on a
  // slow filesystem): the other 7 learn exactly that.
  std::vector<ChildProcess> ranks;
  for (int r = 0; r < 8; ++r) {
    if (r == 5) continue;
    ranks.push_back(Ctl({"barrier", "ckpt-dir", "--participants=8",
                         absl::StrCat("--id=rank-", r), "--timeout=3s"},
                        absl::StrCat("b", r, ".log")));
  }
  for (int r = 0, i = 0; r < 8; ++r) {
    if (r == 5) continue;
    EXPECT_EQ(Exit(ranks[i++]), 5);
    std::string log = Read(absl::StrCat("b", r, ".log"));
    EXPECT_THAT(log, HasSubstr("DEADLINE_EXCEEDED"));
    EXPECT_THAT(log, HasSubstr("7 of 8 arrived"));
    EXPECT_THAT(log, HasSubstr("1 missing: rank-5"));
    EXPECT_THAT(log, Not(HasSubstr("type.googleapis.com")));  // no payload dump
  }
}

TEST_F(OnceBarrierTest, BarrierReleasesEveryoneAndIsReusableByGeneration) {
  for (int generation = 0; generation < 2; ++generation) {
    std::vector<ChildProcess> ranks;
    for (int r = 0; r < 8; ++r) {
      ranks.push_back(Ctl({"barrier", "step", "--participants=8",
                           absl::StrCat("--id=rank-", r), "--timeout=30s"},
                          absl::StrCat("g", generation, "r", r, ".log")));
    }
    for (int r = 0; r < 8; ++r) {
      EXPECT_EQ(Exit(ranks[r]), 0);
      EXPECT_THAT(
          Read(absl::StrCat("g", generation, "r", r, ".log")),
          HasSubstr(absl::StrCat("generation ", generation, ": 8 arrived")));
    }
  }
}

}  // namespace
}  // namespace sluice
