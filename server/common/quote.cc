#include "server/common/quote.h"

#include "absl/strings/str_cat.h"

namespace sluice {

std::string QuotePrefix(absl::string_view text) {
  constexpr size_t kShown = 64;
  if (text.size() <= kShown) return absl::StrCat("\"", text, "\"");
  return absl::StrCat("\"", text.substr(0, kShown), "...\" (", text.size(),
                      " bytes)");
}

}  // namespace sluice
