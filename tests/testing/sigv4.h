// An independent AWS Signature Version 4 signer for tests, written from the
// AWS specification and checked against AWS's published example. Tests use
// it to verify the signatures libcurl (CURLOPT_AWS_SIGV4) puts on the data
// server's S3 requests.
#ifndef SLUICE_TESTS_TESTING_SIGV4_H_
#define SLUICE_TESTS_TESTING_SIGV4_H_

#include <map>
#include <string>

#include "server/common/sha256.h"

namespace sluice::testing {

struct SigV4Request {
  std::string method = "GET";
  std::string canonical_uri;    // already URI-encoded, e.g. "/bucket/key"
  std::string canonical_query;  // "" for none
  // Signed headers: lowercase name -> value (trimmed when canonicalised).
  std::map<std::string, std::string> headers;
  std::string payload_sha256;  // hex, or "UNSIGNED-PAYLOAD"
  std::string amz_date;        // "20130524T000000Z"
  std::string region;
  std::string service = "s3";
  std::string secret_key;
};

std::string SigV4CanonicalRequest(const SigV4Request& request);
std::string SigV4StringToSign(const SigV4Request& request);
// Lowercase hex signature.
std::string SigV4Signature(const SigV4Request& request);
using ::sluice::Sha256Hex;

}  // namespace sluice::testing

#endif  // SLUICE_TESTS_TESTING_SIGV4_H_
