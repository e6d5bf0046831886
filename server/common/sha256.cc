#include "server/common/sha256.h"

#include <openssl/evp.h>

namespace sluice {
namespace {

std::string Hex(const unsigned char* data, unsigned int n) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out(2 * static_cast<size_t>(n), '0');
  for (unsigned int i = 0; i < n; ++i) {
    out[2 * i] = kDigits[data[i] >> 4];
    out[2 * i + 1] = kDigits[data[i] & 15];
  }
  return out;
}

}  // namespace

std::string Sha256Hex(absl::string_view data) {
  Sha256 sha;
  sha.Update(data.data(), data.size());
  return sha.HexDigest();
}

Sha256::Sha256() : ctx_(EVP_MD_CTX_new()) {
  EVP_DigestInit_ex(ctx_, EVP_sha256(), nullptr);
}

Sha256::~Sha256() { EVP_MD_CTX_free(ctx_); }

void Sha256::Update(const void* data, size_t size) {
  EVP_DigestUpdate(ctx_, data, size);
}

std::string Sha256::HexDigest() {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_DigestFinal_ex(ctx_, digest, &len);
  return Hex(digest, len);
}

}  // namespace sluice
