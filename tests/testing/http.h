// Tiny HTTP GET for tests (libcurl): scraping /metrics and the like.
#ifndef SLUICE_TESTS_TESTING_HTTP_H_
#define SLUICE_TESTS_TESTING_HTTP_H_

#include <string>

#include "absl/status/statusor.h"

namespace sluice::testing {

struct HttpResponse {
  long code = 0;
  std::string body;
};

absl::StatusOr<HttpResponse> HttpGet(const std::string& url);

}  // namespace sluice::testing

#endif  // SLUICE_TESTS_TESTING_HTTP_H_
