#include "server/common/status_macros.h"

#include <gtest/gtest.h>

#include "tests/testing/status_matchers.h"

namespace sluice {
namespace {

using ::sluice::testing::StatusIs;

int evaluations = 0;

absl::Status CountedStatus(absl::Status s) {
  ++evaluations;
  return s;
}

absl::Status UsesReturnIfError(absl::Status inner, bool* reached_end) {
  RETURN_IF_ERROR(CountedStatus(inner));
  *reached_end = true;
  return absl::OkStatus();
}

absl::StatusOr<int> Half(int x) {
  if (x % 2 != 0) return absl::InvalidArgumentError("odd");
  return x / 2;
}

absl::StatusOr<int> Quarter(int x) {
  ASSIGN_OR_RETURN(int half, Half(x));
  ASSIGN_OR_RETURN(auto quarter, Half(half));
  return quarter;
}

TEST(StatusMacrosTest, ReturnIfErrorPassesOkThrough) {
  evaluations = 0;
  bool reached = false;
  EXPECT_TRUE(UsesReturnIfError(absl::OkStatus(), &reached).ok());
  EXPECT_TRUE(reached);
  EXPECT_EQ(evaluations, 1);
}

TEST(StatusMacrosTest, ReturnIfErrorReturnsTheErrorAndEvaluatesOnce) {
  evaluations = 0;
  bool reached = false;
  EXPECT_THAT(UsesReturnIfError(absl::NotFoundError("job x"), &reached),
              StatusIs(absl::StatusCode::kNotFound, "job x"));
  EXPECT_FALSE(reached);
  EXPECT_EQ(evaluations, 1);
}

TEST(StatusMacrosTest, AssignOrReturnAssignsValues) {
  absl::StatusOr<int> q = Quarter(12);
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(*q, 3);
}

TEST(StatusMacrosTest, AssignOrReturnPropagatesErrorsFromAnyStep) {
  EXPECT_THAT(Quarter(3), StatusIs(absl::StatusCode::kInvalidArgument, "odd"));
  EXPECT_THAT(Quarter(6), StatusIs(absl::StatusCode::kInvalidArgument, "odd"));
}

TEST(StatusMacrosTest, AssignOrReturnWorksWithMoveOnlyTypes) {
  auto make = []() -> absl::StatusOr<std::unique_ptr<int>> {
    return std::make_unique<int>(7);
  };
  auto use = [&]() -> absl::StatusOr<int> {
    ASSIGN_OR_RETURN(std::unique_ptr<int> p, make());
    return *p;
  };
  EXPECT_EQ(*use(), 7);
}

}  // namespace
}  // namespace sluice
