// gMock matchers for absl::Status / StatusOr.
#ifndef SLUICE_TESTS_TESTING_STATUS_MATCHERS_H_
#define SLUICE_TESTS_TESTING_STATUS_MATCHERS_H_

#include <gmock/gmock.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace sluice::testing {

inline const absl::Status& GetStatus(const absl::Status& s) { return s; }
template <typename T>
const absl::Status& GetStatus(const absl::StatusOr<T>& s) {
  return s.status();
}

MATCHER(IsOk, "is OK") {
  const absl::Status& s = GetStatus(arg);
  *result_listener << "status: " << s;
  return s.ok();
}

// StatusIs(code) or StatusIs(code, message_matcher).
MATCHER_P(StatusIs, code, "") {
  const absl::Status& s = GetStatus(arg);
  *result_listener << "status: " << s;
  return s.code() == code;
}
MATCHER_P2(StatusIs, code, message_matcher, "") {
  const absl::Status& s = GetStatus(arg);
  *result_listener << "status: " << s;
  return s.code() == code &&
         ::testing::ExplainMatchResult(
             message_matcher, std::string(s.message()), result_listener);
}

#define ASSERT_OK(expr) ASSERT_THAT((expr), ::sluice::testing::IsOk())
#define EXPECT_OK(expr) EXPECT_THAT((expr), ::sluice::testing::IsOk())

}  // namespace sluice::testing

#endif  // SLUICE_TESTS_TESTING_STATUS_MATCHERS_H_
