#include "server/common/mixed_unit.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "server/common/mix_order.h"
#include "server/common/shuffle_window.h"

namespace sluice {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::shared_ptr<const std::vector<uint16_t>> Labels(
    const std::vector<int64_t>& sizes, uint64_t seed) {
  return std::make_shared<const std::vector<uint16_t>>(
      WindowLabels(sizes, seed));
}

// Two sources of 6 and 3 samples per epoch; the unit is positions [2, 8).
// Source 0 reads a one-shard window from its sample 1; source 1 a window of
// two shards (2 and 1 samples) from position 0.
v1::Lease TwoSourceLease() {
  v1::Lease lease;
  lease.set_lease_id("j/e0/u1/f1");
  v1::WorkUnit* unit = lease.mutable_unit();
  unit->set_begin(2);
  unit->set_end(8);
  v1::MixedUnit* mixed = unit->mutable_mixed();
  mixed->add_mix_samples(6);  // web
  mixed->add_mix_samples(3);  // books
  const std::vector<int64_t> counts = {6, 3};
  auto piece = [&](const char* url, int64_t n, int source) {
    v1::WindowPiece* p = mixed->add_pieces();
    p->set_url(url);
    p->set_num_samples(n);
    p->set_source(source);
  };
  piece("/w0.tar", 6, 0);
  piece("/b0.tar", 2, 1);
  piece("/b1.tar", 1, 1);
  const int64_t web_before = MixCountBefore(counts, 0, 2);
  const int64_t web_end = MixCountBefore(counts, 0, 8);
  const int64_t books_before = MixCountBefore(counts, 1, 2);
  const int64_t books_end = MixCountBefore(counts, 1, 8);
  v1::MixSegment* s0 = mixed->add_segments();
  s0->set_source(0);
  s0->set_first_piece(0);
  s0->set_num_pieces(1);
  s0->set_begin(web_before);
  s0->set_end(web_end);
  v1::MixSegment* s1 = mixed->add_segments();
  s1->set_source(1);
  s1->set_first_piece(1);
  s1->set_num_pieces(2);
  s1->set_window_order(77);
  s1->set_begin(books_before);
  s1->set_end(books_end);
  return lease;
}

TEST(MixedUnitTest, OrderFollowsTheMixAndEachSourcesWindow) {
  const v1::Lease lease = TwoSourceLease();
  auto order = OrderMixedUnit(lease, Labels);
  ASSERT_TRUE(order.ok()) << order.status();
  const std::vector<int32_t> sources = MixSources({6, 3}, 2, 8);
  const std::vector<uint16_t> books = WindowLabels({2, 1}, 77);
  ASSERT_EQ(order->labels.size(), 6u);
  size_t b = static_cast<size_t>(lease.unit().mixed().segments(1).begin());
  for (size_t p = 0; p < sources.size(); ++p) {
    if (sources[p] == 0) {
      EXPECT_EQ(order->labels[p], 0) << p;
    } else {
      EXPECT_EQ(order->labels[p], 1 + books[b++]) << p;
    }
  }
  // web's one shard starts after the samples served before position 2.
  EXPECT_EQ(order->first[0], lease.unit().mixed().segments(0).begin());
}

TEST(MixedUnitTest, InconsistentLeasesAreInvalidArgumentNamingTheField) {
  struct Case {
    const char* what;
    std::function<void(v1::MixedUnit&)> damage;
  };
  const std::vector<Case> cases = {
      {"segments[1].source=5",
       [](v1::MixedUnit& u) { u.mutable_segments(1)->set_source(5); }},
      {"names pieces [1, +9)",
       [](v1::MixedUnit& u) { u.mutable_segments(1)->set_num_pieces(9); }},
      {"another source than",
       [](v1::MixedUnit& u) { u.mutable_pieces(2)->set_source(0); }},
      {"segments of source 0 hold",
       [](v1::MixedUnit& u) {
         u.mutable_segments(0)->set_end(u.segments(0).end() - 1);
       }},
      {"mix_samples[0]=-1", [](v1::MixedUnit& u) { u.set_mix_samples(0, -1); }},
      {"is not inside its",
       [](v1::MixedUnit& u) { u.mutable_segments(1)->set_end(99); }},
  };
  for (const Case& c : cases) {
    v1::Lease lease = TwoSourceLease();
    c.damage(*lease.mutable_unit()->mutable_mixed());
    auto order = OrderMixedUnit(lease, Labels);
    ASSERT_FALSE(order.ok()) << c.what;
    EXPECT_EQ(order.status().code(), absl::StatusCode::kInvalidArgument)
        << c.what;
    EXPECT_THAT(std::string(order.status().message()), HasSubstr(c.what));
    EXPECT_THAT(std::string(order.status().message()),
                HasSubstr("lease \"j/e0/u1/f1\""));
  }
  // A range outside the epoch is OUT_OF_RANGE; a huge one is refused before
  // anything is allocated.
  v1::Lease outside = TwoSourceLease();
  outside.mutable_unit()->set_end(10);
  EXPECT_EQ(OrderMixedUnit(outside, Labels).status().code(),
            absl::StatusCode::kOutOfRange);
  v1::Lease huge = TwoSourceLease();
  huge.mutable_unit()->mutable_mixed()->set_mix_samples(0, int64_t{1} << 40);
  huge.mutable_unit()->set_end(int64_t{1} << 39);
  EXPECT_THAT(std::string(OrderMixedUnit(huge, Labels).status().message()),
              HasSubstr("above the limit"));
}

}  // namespace
}  // namespace sluice
