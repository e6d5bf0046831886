// Quoting untrusted input into error messages.
#ifndef SLUICE_SERVER_COMMON_QUOTE_H_
#define SLUICE_SERVER_COMMON_QUOTE_H_

#include <string>

#include "absl/strings/string_view.h"

namespace sluice {

// `text` quoted for a message: at most its first 64 bytes, then its length
// (input can be megabytes; the reply must stay small).
std::string QuotePrefix(absl::string_view text);

}  // namespace sluice

#endif  // SLUICE_SERVER_COMMON_QUOTE_H_
