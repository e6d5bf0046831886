#include "server/common/dir_lock.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <optional>

#include "absl/strings/str_cat.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace sluice {
namespace {

using ::sluice::testing::StatusIs;
using ::sluice::testing::TempDir;
using ::testing::HasSubstr;

TEST(DirLockTest, OneHolderAtATimeAndTheSecondIsToldWhoHoldsIt) {
  TempDir dir;
  std::optional<DirLock> first;
  {
    absl::StatusOr<DirLock> lock = DirLock::Acquire(dir.path(), "journal");
    ASSERT_OK(lock);
    first.emplace(*std::move(lock));
  }
  EXPECT_THAT(DirLock::Acquire(dir.path(), "journal directory").status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr(absl::StrCat("journal directory ", dir.path(),
                                              " is in use by another process "
                                              "(PID ",
                                              getpid(), ")"))));
  first.reset();  // released: the next one gets it
  EXPECT_OK(DirLock::Acquire(dir.path(), "journal directory").status());
}

TEST(DirLockTest, AMissingDirectoryIsNotFound) {
  TempDir dir;
  EXPECT_THAT(DirLock::Acquire(dir.File("absent"), "journal").status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("absent/LOCK")));
}

}  // namespace
}  // namespace sluice
