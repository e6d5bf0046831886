#include "client/cli/subprocess.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <pthread.h>

#include <atomic>
#include <string>

#include "tests/testing/process.h"
#include "tests/testing/temp_dir.h"

namespace sluice::cli {
namespace {

using ::testing::HasSubstr;

TEST(SubprocessTest, ACommandByNameIsFoundInPathAndItsExitCodeReturned) {
  absl::StatusOr<Subprocess> child =
      Subprocess::Spawn({"sh", "-c", "exit 3"}, "", "");
  ASSERT_TRUE(child.ok()) << child.status();
  absl::StatusOr<int> code = child->Wait(absl::InfiniteDuration());
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 3);
}

TEST(SubprocessTest, ACommandThatCannotBeRunIsAnErrorNamingIt) {
  absl::StatusOr<Subprocess> child =
      Subprocess::Spawn({"sluice-no-such-command", "x"}, "", "");
  EXPECT_EQ(child.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(child.status().message(),
              HasSubstr("cannot run sluice-no-such-command"));
}

std::atomic<int> forks_seen{0};

TEST(SubprocessTest, SpawningRunsNoForkHandlersOfTheParent) {
  // A parent's fork handlers (gRPC's stop and restart its threads) are for
  // forks that keep running the parent's code, not for a command started.
  static const int registered =
      pthread_atfork([] { forks_seen.fetch_add(1); }, nullptr, nullptr);
  ASSERT_EQ(registered, 0);
  testing::TempDir dir;
  const std::string out = dir.File("out");
  const int before = forks_seen.load();
  absl::StatusOr<Subprocess> child =
      Subprocess::Spawn({"sh", "-c", "echo spawned"}, out, "");
  ASSERT_TRUE(child.ok()) << child.status();
  absl::StatusOr<int> code = child->Wait(absl::InfiniteDuration());
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 0);
  EXPECT_EQ(testing::ReadWholeFile(out).value_or(""), "spawned\n");
  EXPECT_EQ(forks_seen.load(), before);
  // The foreground form forks (it sets PR_SET_PDEATHSIG before exec).
  absl::StatusOr<Subprocess> foreground = Subprocess::Spawn(
      {"sh", "-c", "exit 0"}, "", "", /*die_with_parent=*/true);
  ASSERT_TRUE(foreground.ok()) << foreground.status();
  ASSERT_TRUE(foreground->Wait(absl::InfiniteDuration()).ok());
  EXPECT_EQ(forks_seen.load(), before + 1);
}

TEST(SubprocessTest, AForegroundCommandThatCannotBeRunExits127SayingSo) {
  testing::TempDir dir;
  const std::string err = dir.File("err");
  absl::StatusOr<Subprocess> child =
      Subprocess::Spawn({"sluice-no-such-command", "x"}, "", err,
                        /*die_with_parent=*/true);
  ASSERT_TRUE(child.ok()) << child.status();
  absl::StatusOr<int> code = child->Wait(absl::InfiniteDuration());
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 127);
  EXPECT_THAT(testing::ReadWholeFile(err).value_or(""),
              HasSubstr("cannot run sluice-no-such-command"));
  EXPECT_EQ(Subprocess::Spawn({}, "", "").status().code(),
            absl::StatusCode::kInvalidArgument);
}

// A handle without a process answers at once: Wait says so, Stop and Kill
// do nothing (an infinite timeout would otherwise never return).
TEST(SubprocessTest, AHandleWithoutAProcessAnswersAtOnce) {
  Subprocess none;
  EXPECT_FALSE(none.running());
  EXPECT_EQ(none.Wait(absl::InfiniteDuration()).status().code(),
            absl::StatusCode::kFailedPrecondition);
  none.Stop(absl::InfiniteDuration());
  none.Kill();
  EXPECT_FALSE(none.running());
}

// Kill reaps a running child (128 + SIGKILL); Stop after that does nothing.
TEST(SubprocessTest, KillReapsARunningChild) {
  absl::StatusOr<Subprocess> child =
      Subprocess::Spawn({"sleep", "600"}, "", "", /*die_with_parent=*/true);
  ASSERT_TRUE(child.ok()) << child.status();
  EXPECT_TRUE(child->running());
  child->Kill();
  EXPECT_FALSE(child->running());
  absl::StatusOr<int> code = child->Wait(absl::InfiniteDuration());
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 128 + 9);
  child->Stop(absl::InfiniteDuration());
}

}  // namespace
}  // namespace sluice::cli
