#include "tests/testing/sigv4.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace sluice::testing {
namespace {

std::string Hmac(const std::string& key, const std::string& data) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(data.data()), data.size(), out,
       &len);
  return std::string(reinterpret_cast<char*>(out), len);
}

}  // namespace

std::string SigV4CanonicalRequest(const SigV4Request& r) {
  std::string headers;
  std::vector<std::string> names;
  for (const auto& [name, value] : r.headers) {  // std::map: sorted by name
    absl::StrAppend(&headers, name, ":", absl::StripAsciiWhitespace(value),
                    "\n");
    names.push_back(name);
  }
  return absl::StrCat(r.method, "\n", r.canonical_uri, "\n", r.canonical_query,
                      "\n", headers, "\n", absl::StrJoin(names, ";"), "\n",
                      r.payload_sha256);
}

std::string SigV4StringToSign(const SigV4Request& r) {
  const std::string date = r.amz_date.substr(0, 8);
  return absl::StrCat("AWS4-HMAC-SHA256\n", r.amz_date, "\n", date, "/",
                      r.region, "/", r.service, "/aws4_request\n",
                      Sha256Hex(SigV4CanonicalRequest(r)));
}

std::string SigV4Signature(const SigV4Request& r) {
  const std::string date = r.amz_date.substr(0, 8);
  std::string key = Hmac("AWS4" + r.secret_key, date);
  key = Hmac(key, r.region);
  key = Hmac(key, r.service);
  key = Hmac(key, "aws4_request");
  const std::string sig = Hmac(key, SigV4StringToSign(r));
  return absl::BytesToHexString(sig);
}

}  // namespace sluice::testing
