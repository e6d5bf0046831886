#include "server/common/work_unit.h"

#include <gtest/gtest.h>

#include "server/common/lease_token.h"

namespace sluice {
namespace {

v1::WindowPiece Piece(int32_t shard_index, const char* url) {
  v1::WindowPiece p;
  p.set_shard_index(shard_index);
  p.set_url(url);
  p.set_num_samples(4);
  return p;
}

TEST(WorkUnitTest, EachKindAnswersForItself) {
  v1::WorkUnit shard;
  shard.mutable_shard()->set_shard_index(3);
  shard.mutable_shard()->set_url("/d/3.tar");
  EXPECT_EQ(UnitIndex(shard), 3);
  EXPECT_EQ(UnitFirstUrl(shard), "/d/3.tar");
  EXPECT_TRUE(UnitPieces(shard).empty());
  EXPECT_STREQ(UnitKindName(shard), "shard");

  v1::WorkUnit window;
  window.mutable_window()->set_window_index(5);
  *window.mutable_window()->add_pieces() = Piece(7, "/d/7.tar");
  *window.mutable_window()->add_pieces() = Piece(1, "/d/1.tar");
  EXPECT_EQ(UnitIndex(window), 5);
  EXPECT_EQ(UnitFirstUrl(window), "/d/7.tar");
  ASSERT_EQ(UnitPieces(window).size(), 2);
  EXPECT_EQ(UnitPieces(window).Get(1).shard_index(), 1);
  EXPECT_STREQ(UnitKindName(window), "window");

  v1::WorkUnit mixed;
  mixed.mutable_mixed()->set_block_index(9);
  *mixed.mutable_mixed()->add_pieces() = Piece(0, "/web/0.tar");
  EXPECT_EQ(UnitIndex(mixed), 9);
  EXPECT_EQ(UnitFirstUrl(mixed), "/web/0.tar");
  EXPECT_EQ(UnitPieces(mixed).size(), 1);
  EXPECT_STREQ(UnitKindName(mixed), "mixed");

  const v1::WorkUnit none;
  EXPECT_EQ(UnitIndex(none), -1);
  EXPECT_EQ(UnitFirstUrl(none), "");
  EXPECT_TRUE(UnitPieces(none).empty());
  EXPECT_STREQ(UnitKindName(none), "unset");
}

// The token covers the unit's kind (the same shard and range as a one-piece
// window is another lease) and the job's weight.
TEST(WorkUnitTest, ALeaseTokenCoversTheUnitsKind) {
  v1::Lease lease;
  lease.set_lease_id("j/e0/u0/f1");
  lease.set_job("j");
  lease.set_fence(1);
  lease.mutable_unit()->set_begin(0);
  lease.mutable_unit()->set_end(4);
  lease.mutable_unit()->mutable_shard()->set_url("/d/0.tar");
  lease.set_token(SignLease(lease, "secret"));
  ASSERT_TRUE(VerifyLeaseToken(lease, "secret").ok());

  v1::Lease as_window = lease;
  *as_window.mutable_unit()->mutable_window()->add_pieces() =
      Piece(0, "/d/0.tar");
  EXPECT_EQ(VerifyLeaseToken(as_window, "secret").code(),
            absl::StatusCode::kPermissionDenied);
  v1::Lease heavier = lease;
  heavier.set_weight(1000);
  EXPECT_EQ(VerifyLeaseToken(heavier, "secret").code(),
            absl::StatusCode::kPermissionDenied);
  v1::Lease other_index = lease;
  other_index.mutable_unit()->mutable_shard()->set_shard_index(1);
  EXPECT_EQ(VerifyLeaseToken(other_index, "secret").code(),
            absl::StatusCode::kPermissionDenied);
}

}  // namespace
}  // namespace sluice
