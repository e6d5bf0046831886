// SHA-256 over OpenSSL's EVP interface: whole strings at once or streamed
// (a download hashed as it is written), digests as lowercase hex.
#ifndef SLUICE_SERVER_COMMON_SHA256_H_
#define SLUICE_SERVER_COMMON_SHA256_H_

#include <openssl/types.h>

#include <string>

#include "absl/strings/string_view.h"

namespace sluice {

// The SHA-256 of `data`, as 64 lowercase hex digits.
std::string Sha256Hex(absl::string_view data);

// A streamed SHA-256: Update with the bytes in order, then HexDigest once.
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;

  void Update(const void* data, size_t size);
  // The digest of everything updated so far, as 64 lowercase hex digits.
  // Ends the hash: call it once.
  std::string HexDigest();

 private:
  EVP_MD_CTX* ctx_;
};

}  // namespace sluice

#endif  // SLUICE_SERVER_COMMON_SHA256_H_
