#include "server/common/sha256.h"

#include <algorithm>
#include <string>

#include "gtest/gtest.h"

namespace sluice {
namespace {

// FIPS 180-2's examples.
TEST(Sha256Test, KnownDigests) {
  EXPECT_EQ(Sha256Hex(""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(Sha256Hex("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(
      Sha256Hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
      "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

// A million 'a's streamed in uneven pieces hash as the whole.
TEST(Sha256Test, StreamedInPiecesHashesAsTheWhole) {
  const std::string million(1000000, 'a');
  Sha256 sha;
  size_t at = 0;
  for (size_t piece = 1; at < million.size(); piece = piece * 3 + 1) {
    const size_t n = std::min(piece, million.size() - at);
    sha.Update(million.data() + at, n);
    at += n;
  }
  EXPECT_EQ(sha.HexDigest(),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  EXPECT_EQ(Sha256Hex(million), Sha256Hex(std::string(million)));
}

}  // namespace
}  // namespace sluice
