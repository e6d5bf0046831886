#include "server/common/quote.h"

#include <gtest/gtest.h>

#include <string>

namespace sluice {
namespace {

TEST(QuotePrefixTest, LongTextIsCutAndMeasured) {
  EXPECT_EQ(QuotePrefix("abc"), "\"abc\"");
  EXPECT_EQ(QuotePrefix(std::string(100, 'x')),
            "\"" + std::string(64, 'x') + "...\" (100 bytes)");
}

TEST(ValidUtf8Test, ValidTextIsUnchanged) {
  for (const std::string& s :
       {std::string(""), std::string("sample000042"),
        std::string("caf\xc3\xa9"), std::string("\xe2\x82\xac 5"),
        std::string("\xf0\x9f\x98\x80"), std::string("\xf4\x8f\xbf\xbf"),
        std::string("a\0b", 3)}) {
    EXPECT_EQ(ValidUtf8(s), s);
    std::string copy = s;
    MakeValidUtf8(&copy);
    EXPECT_EQ(copy, s);
  }
}

TEST(ValidUtf8Test, EachBadByteBecomesOneReplacementCharacter) {
  const std::string r = "\xef\xbf\xbd";                     // U+FFFD
  EXPECT_EQ(ValidUtf8("caf\xe9"), "caf" + r);               // Latin-1
  EXPECT_EQ(ValidUtf8("\x80x"), r + "x");                   // lone continuation
  EXPECT_EQ(ValidUtf8("\xc0\x80"), r + r);                  // overlong NUL
  EXPECT_EQ(ValidUtf8("\xed\xa0\x80"), r + r + r);          // a surrogate
  EXPECT_EQ(ValidUtf8("ab\xe2\x82"), "ab" + r + r);         // cut short
  EXPECT_EQ(ValidUtf8("\xf5\x80\x80\x80"), r + r + r + r);  // above U+10FFFF
  EXPECT_EQ(ValidUtf8("\xff\xc3\xa9"), r + "\xc3\xa9");     // valid after bad
}

}  // namespace
}  // namespace sluice
