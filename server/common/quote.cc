#include "server/common/quote.h"

#include "absl/strings/str_cat.h"

namespace sluice {

std::string QuotePrefix(absl::string_view text) {
  constexpr size_t kShown = 64;
  if (text.size() <= kShown) return absl::StrCat("\"", text, "\"");
  return absl::StrCat("\"", text.substr(0, kShown), "...\" (", text.size(),
                      " bytes)");
}

namespace {

// The length of the well-formed UTF-8 sequence at the start of `s`
// (Unicode 15, table 3-7), or 0 when there is none.
size_t SequenceLength(absl::string_view s) {
  const auto b = [&](size_t i) { return static_cast<unsigned char>(s[i]); };
  const auto cont = [&](size_t i, unsigned lo, unsigned hi) {
    return i < s.size() && b(i) >= lo && b(i) <= hi;
  };
  const unsigned c = b(0);
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) return cont(1, 0x80, 0xBF) ? 2 : 0;
  if (c >= 0xE0 && c <= 0xEF) {
    const unsigned lo = c == 0xE0 ? 0xA0 : 0x80;
    const unsigned hi = c == 0xED ? 0x9F : 0xBF;
    return cont(1, lo, hi) && cont(2, 0x80, 0xBF) ? 3 : 0;
  }
  if (c >= 0xF0 && c <= 0xF4) {
    const unsigned lo = c == 0xF0 ? 0x90 : 0x80;
    const unsigned hi = c == 0xF4 ? 0x8F : 0xBF;
    return cont(1, lo, hi) && cont(2, 0x80, 0xBF) && cont(3, 0x80, 0xBF) ? 4
                                                                         : 0;
  }
  return 0;
}

}  // namespace

std::string ValidUtf8(absl::string_view bytes) {
  std::string out(bytes);
  MakeValidUtf8(&out);
  return out;
}

void MakeValidUtf8(std::string* text) {
  const absl::string_view bytes = *text;
  std::string out;
  size_t i = 0;
  while (i < bytes.size()) {
    const size_t n = SequenceLength(bytes.substr(i));
    if (n == 0) break;
    i += n;
  }
  if (i == bytes.size()) return;  // already valid
  out.reserve(bytes.size() + 8);
  out.append(bytes.data(), i);
  while (i < bytes.size()) {
    const size_t n = SequenceLength(bytes.substr(i));
    if (n == 0) {
      out.append("\xEF\xBF\xBD");  // U+FFFD
      ++i;
    } else {
      out.append(bytes.data() + i, n);
      i += n;
    }
  }
  *text = std::move(out);
}

}  // namespace sluice
