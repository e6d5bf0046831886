#include "server/coordinator/unreachable_servers.h"

#include <gtest/gtest.h>

namespace sluice {
namespace {

const absl::Time kT0 = absl::FromUnixSeconds(1000);

TEST(UnreachableServersTest, AReportedServerIsPassedOverForTheInitialWait) {
  UnreachableServers u(absl::Seconds(10), absl::Seconds(60));
  EXPECT_TRUE(u.empty());
  EXPECT_FALSE(u.Avoids("a:1", kT0));
  EXPECT_EQ(u.Failed("a:1", kT0), kT0 + absl::Seconds(10));
  EXPECT_TRUE(u.Avoids("a:1", kT0 + absl::Seconds(9)));
  EXPECT_FALSE(u.Avoids("b:1", kT0 + absl::Seconds(9)));
  EXPECT_FALSE(u.Avoids("a:1", kT0 + absl::Seconds(10)));
}

TEST(UnreachableServersTest, FailingAgainAfterTheWaitDoublesItUpToTheMax) {
  UnreachableServers u(absl::Seconds(10), absl::Seconds(30));
  absl::Time now = kT0;
  EXPECT_EQ(u.Failed("a:1", now), now + absl::Seconds(10));
  now += absl::Seconds(10);
  EXPECT_EQ(u.Failed("a:1", now), now + absl::Seconds(20));
  now += absl::Seconds(20);
  EXPECT_EQ(u.Failed("a:1", now), now + absl::Seconds(30));
  now += absl::Seconds(30);
  EXPECT_EQ(u.Failed("a:1", now), now + absl::Seconds(30));
}

TEST(UnreachableServersTest, FailuresWhilePassedOverDoNotLengthenTheWait) {
  // Units granted there before the first report fail after it.
  UnreachableServers u(absl::Seconds(10), absl::Seconds(60));
  EXPECT_EQ(u.Failed("a:1", kT0), kT0 + absl::Seconds(10));
  EXPECT_EQ(u.Failed("a:1", kT0 + absl::Seconds(1)), kT0 + absl::Seconds(11));
  EXPECT_EQ(u.Failed("a:1", kT0 + absl::Seconds(2)), kT0 + absl::Seconds(12));
}

TEST(UnreachableServersTest, SamplesReadFromAServerForgetIt) {
  UnreachableServers u(absl::Seconds(10), absl::Seconds(60));
  u.Failed("a:1", kT0);
  u.Failed("a:1", kT0 + absl::Seconds(10));  // a wait of 20 s now
  u.Reached("a:1");
  EXPECT_TRUE(u.empty());
  EXPECT_FALSE(u.Avoids("a:1", kT0 + absl::Seconds(11)));
  // A new failure starts from the initial wait again.
  EXPECT_EQ(u.Failed("a:1", kT0 + absl::Seconds(40)), kT0 + absl::Seconds(50));
}

}  // namespace
}  // namespace sluice
