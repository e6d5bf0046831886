#include "client/cpp/input_wait.h"

#include <gtest/gtest.h>

namespace sluice::client_internal {
namespace {

TEST(InputWaitHistogramTest, NothingObservedTakesNothing) {
  InputWaitHistogram h;
  v1::InputWait out;
  out.set_sum_seconds(3);
  EXPECT_FALSE(h.Take(&out));
  EXPECT_EQ(out.ByteSizeLong(), 0u);
}

TEST(InputWaitHistogramTest, BucketsAreUpperBoundsWithALastOpenOne) {
  InputWaitHistogram h;
  for (double s : {0.0, 0.001, 0.0011, 0.5, 10.0, 10.5, 99.0}) h.Observe(s);
  v1::InputWait out;
  ASSERT_TRUE(h.Take(&out));
  ASSERT_EQ(out.bucket_counts_size(), 10);
  const std::vector<uint64_t> counts(out.bucket_counts().begin(),
                                     out.bucket_counts().end());
  EXPECT_EQ(counts, (std::vector<uint64_t>{2, 1, 0, 0, 0, 1, 0, 0, 1, 2}));
  EXPECT_DOUBLE_EQ(out.sum_seconds(), 0.0011 + 0.001 + 0.5 + 10 + 10.5 + 99);
}

TEST(InputWaitHistogramTest, TakeStartsAFreshInterval) {
  InputWaitHistogram h;
  h.Observe(0.2);
  v1::InputWait out;
  ASSERT_TRUE(h.Take(&out));
  EXPECT_FALSE(h.Take(&out));
  h.Observe(0.02);
  ASSERT_TRUE(h.Take(&out));
  EXPECT_EQ(out.bucket_counts(3), 1u);
  EXPECT_DOUBLE_EQ(out.sum_seconds(), 0.02);
}

}  // namespace
}  // namespace sluice::client_internal
