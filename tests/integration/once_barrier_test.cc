// Once and Barrier through `sluicectl`, reproducing what users report:
// ranks racing on makedirs (P2), a runner dying mid-step, a failing step,
// a coordinator restart after the step, and rank 0 creating a checkpoint
// directory while the others time out in wait_for(exists) (P4).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>

#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "sluice/coordination.h"
#include "tests/testing/http.h"
#include "tests/testing/process.h"
#include "tests/testing/tar_writer.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/wait.h"

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
    auto c = testing::StartServer("sluice-coordinator", dir_.path(), args);
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
    auto code = p.Wait(absl::Seconds(60));
    return code.ok() ? *code : -1;
  }
  std::string Read(const std::string& name) {
    return testing::ReadWholeFile(dir_.File(name)).value_or("");
  }
  // Polls until `file` contains `text` (true) or 20 s pass.
  bool WaitFor(const std::string& file, const std::string& text) {
    return testing::WaitForFileText(dir_.File(file), text, absl::Seconds(20));
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

// OnceCancel ends a waiter's RunOnce from another thread (what Ctrl-C in
// the Python client does): it returns CANCELLED while the runner's step goes
// on, and the runner's outcome is unchanged. A cancel that comes before the
// call makes it return at once.
TEST_F(OnceBarrierTest, OnceCancelEndsAWaitAndTheStepGoesOn) {
  OnceOptions options;
  options.coordinator = coordinator_.grpc_address;
  options.name = "cancel";
  absl::Notification running, finish;
  absl::StatusOr<OnceOutcome> runner;
  std::thread runner_thread([&] {
    OnceOptions mine = options;
    mine.participant = "runner";
    runner = RunOnce(mine, [&]() -> absl::StatusOr<std::string> {
      running.Notify();
      finish.WaitForNotification();
      return std::string("done");
    });
  });
  running.WaitForNotification();
  OnceCancel cancel;
  absl::Notification waiting;
  OnceOptions waiter = options;
  waiter.participant = "waiter";
  waiter.cancel = &cancel;
  waiter.on_wait = [&](const std::string&, int64_t) { waiting.Notify(); };
  absl::StatusOr<OnceOutcome> waited;
  std::thread waiter_thread([&] {
    waited = RunOnce(waiter, []() -> absl::StatusOr<std::string> {
      return std::string("the waiter ran it");
    });
  });
  waiting.WaitForNotification();
  cancel.Cancel();
  waiter_thread.join();
  EXPECT_EQ(waited.status().code(), absl::StatusCode::kCancelled)
      << waited.status();
  finish.Notify();
  runner_thread.join();
  ASSERT_TRUE(runner.ok()) << runner.status();
  EXPECT_TRUE(runner->ran);
  EXPECT_EQ(runner->result, "done");
  // Cancelled before the call: no wait at all.
  OnceCancel early;
  early.Cancel();
  OnceOptions late = options;
  late.name = "cancel-early";
  late.participant = "late";
  late.cancel = &early;
  bool ran = false;
  absl::StatusOr<OnceOutcome> none =
      RunOnce(late, [&]() -> absl::StatusOr<std::string> {
        ran = true;
        return std::string();
      });
  EXPECT_EQ(none.status().code(), absl::StatusCode::kCancelled)
      << none.status();
  EXPECT_FALSE(ran);
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

// `once --list` shows what the coordinator remembers and what runs;
// `once --reset` forgets a finished step (refusing one that runs or never
// finished), durably: the step runs again after a coordinator restart.
TEST_F(OnceBarrierTest, AResetStepRunsAgainEvenAfterARestart) {
  const std::string step = absl::StrCat("echo ran >> ", dir_.File("ran.log"));
  ChildProcess first =
      Ctl({"once", "--id=x", "prep", "--", "sh", "-c", step}, "x.log");
  ASSERT_EQ(Exit(first), 0);
  ChildProcess list = Ctl({"once", "--list"}, "list1.log");
  ASSERT_EQ(Exit(list), 0);
  EXPECT_THAT(Read("list1.log"), HasSubstr("default/prep  run 1  done"));

  const std::string go = dir_.File("go");
  ChildProcess busy =
      Ctl({"once", "--id=r0", "busy", "--", "sh", "-c",
           absl::StrCat("while [ ! -f ", go, " ]; do sleep 0.02; done")},
          "busy.log");
  ASSERT_TRUE(WaitFor("busy.log", "running"));
  ChildProcess listed = Ctl({"once", "--list", "default"}, "list2.log");
  ASSERT_EQ(Exit(listed), 0);
  EXPECT_THAT(Read("list2.log"),
              HasSubstr("default/busy  run 1  running (r0, 0 waiting)"));
  ChildProcess refused = Ctl({"once", "--reset", "busy"}, "refused.log");
  EXPECT_EQ(Exit(refused), 1);
  EXPECT_THAT(Read("refused.log"),
              HasSubstr("FAILED_PRECONDITION: once --reset: once default/busy "
                        "is running (run 1 by r0, 0 waiting)"));
  testing::WriteFile(go, "");
  EXPECT_EQ(Exit(busy), 0);
  ChildProcess unknown = Ctl({"once", "--reset", "never"}, "unknown.log");
  EXPECT_EQ(Exit(unknown), 1);
  EXPECT_THAT(Read("unknown.log"),
              HasSubstr("NOT_FOUND: once --reset: once default/never has not "
                        "finished"));
  ChildProcess other_scope = Ctl({"once", "--list", "elsewhere"}, "list3.log");
  ASSERT_EQ(Exit(other_scope), 0);
  EXPECT_EQ(Read("list3.log"), "no once steps in scope elsewhere\n");

  ChildProcess reset = Ctl({"once", "--reset", "prep"}, "reset.log");
  ASSERT_EQ(Exit(reset), 0) << Read("reset.log");
  const std::string address = coordinator_.grpc_address;
  coordinator_.process.Kill();
  StartCoordinator(address);
  ChildProcess again =
      Ctl({"once", "--id=y", "prep", "--", "sh", "-c", step}, "y.log");
  EXPECT_EQ(Exit(again), 0);
  EXPECT_EQ(Read("ran.log"), "ran\nran\n");
  ChildProcess after = Ctl({"once", "--list", "--json"}, "list4.log");
  ASSERT_EQ(Exit(after), 0);
  EXPECT_THAT(Read("list4.log"),
              HasSubstr("\"name\": \"prep\",\n   \"state\": \"STATE_DONE\""));
}

// On a coordinator that checks operators, resetting a step is an operator's
// call, as deleting a job is.
TEST(OnceResetAccessTest, ResettingNeedsTheOperatorToken) {
  TempDir dir;
  testing::WriteFile(dir.File("secret"), "0123456789abcdef0123456789abcdef");
  testing::WriteFile(dir.File("token"), "operator-token-0123456789");
  chmod(dir.File("secret").c_str(), 0600);
  chmod(dir.File("token").c_str(), 0600);
  auto c = testing::StartServer("sluice-coordinator", dir.path(),
                                {"--journal_dir=" + dir.File("journal"),
                                 "--lease_secret_file=" + dir.File("secret"),
                                 "--admin_token_file=" + dir.File("token")});
  ASSERT_TRUE(c.ok()) << c.status();
  auto ctl = [&](std::vector<std::string> args, const std::string& log) {
    args.insert(args.begin(), testing::BinDir() + "/sluicectl");
    args.insert(args.begin() + 2, "--coordinator=" + c->grpc_address);
    auto p = ChildProcess::Start(args, dir.File(log));
    EXPECT_TRUE(p.ok());
    auto code = p->Wait(absl::Seconds(60));
    return code.ok() ? *code : -1;
  };
  ASSERT_EQ(ctl({"once", "step", "--", "true"}, "run.log"), 0);
  EXPECT_EQ(ctl({"once", "--reset", "step"}, "anonymous.log"), 1);
  EXPECT_THAT(testing::ReadWholeFile(dir.File("anonymous.log")).value_or(""),
              HasSubstr("UNAUTHENTICATED"));
  EXPECT_EQ(ctl({"once", "--list"}, "list.log"), 0);  // anyone may look
  EXPECT_EQ(ctl({"once", "--reset", "step",
                 "--admin_token_file=" + dir.File("token")},
                "operator.log"),
            0);
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

TEST_F(OnceBarrierTest,
       ARankKilledInsideABarrierDoesNotLetTheRestartedRunPass) {
  // Rank 1 of a run arrives at the step-10 checkpoint barrier and is
  // SIGKILLed there; the launcher restarts the run from an earlier
  // checkpoint, so both ranks come to the same barrier again.
  ChildProcess dead = Ctl({"barrier", "ckpt-10", "--participants=2",
                           "--id=rank-1", "--timeout=60s"},
                          "dead.log");
  ASSERT_TRUE(testing::WaitForMetric(coordinator_.metrics_address,
                                     "sluice_coordinator_barrier_waiting 1"));
  dead.Kill();
  ASSERT_TRUE(testing::WaitForMetric(coordinator_.metrics_address,
                                     "sluice_coordinator_barrier_waiting 0"));
  // The restarted rank 0 waits for the restarted rank 1 instead of passing
  // on the dead one's arrival (which would leave rank 1 alone in the next
  // generation until its timeout).
  ChildProcess rank0 = Ctl({"barrier", "ckpt-10", "--participants=2",
                            "--id=rank-0", "--timeout=60s"},
                           "r0.log");
  ASSERT_TRUE(testing::WaitForMetric(coordinator_.metrics_address,
                                     "sluice_coordinator_barrier_waiting 1"));
  ChildProcess rank1 = Ctl({"barrier", "ckpt-10", "--participants=2",
                            "--id=rank-1", "--timeout=60s"},
                           "r1.log");
  EXPECT_EQ(Exit(rank0), 0);
  EXPECT_EQ(Exit(rank1), 0);
  EXPECT_THAT(Read("r0.log"), HasSubstr("generation 0: 2 arrived"));
  EXPECT_THAT(Read("r1.log"), HasSubstr("generation 0: 2 arrived"));
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
