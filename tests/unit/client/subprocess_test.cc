#include "client/cli/subprocess.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

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

TEST(SubprocessTest, ACommandThatCannotBeRunExits127SayingSo) {
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
