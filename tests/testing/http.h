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

// Polls http://metrics_address/metrics until a line containing `text`
// appears (true) or 20 s pass (false).
bool WaitForMetric(const std::string& metrics_address, const std::string& text);

}  // namespace sluice::testing

#endif  // SLUICE_TESTS_TESTING_HTTP_H_
