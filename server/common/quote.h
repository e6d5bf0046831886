// Quoting untrusted input into error messages.
#ifndef SLUICE_SERVER_COMMON_QUOTE_H_
#define SLUICE_SERVER_COMMON_QUOTE_H_

#include <string>

#include "absl/strings/string_view.h"

namespace sluice {

// `text` quoted for a message: at most its first 64 bytes, then its length
// (input can be megabytes; the reply must stay small).
std::string QuotePrefix(absl::string_view text);

// `bytes` as valid UTF-8, for protobuf string fields (a parser refuses a
// message whose string holds anything else): each byte that does not start
// a well-formed sequence becomes U+FFFD. Valid text is returned unchanged.
// Tar member names are bytes; a Latin-1 name must not make a sample
// unreadable.
std::string ValidUtf8(absl::string_view bytes);
// The same in place; no copy when `text` is valid already.
void MakeValidUtf8(std::string* text);

}  // namespace sluice

#endif  // SLUICE_SERVER_COMMON_QUOTE_H_
