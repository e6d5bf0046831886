#include "tests/testing/http.h"

#include <curl/curl.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "tests/testing/wait.h"

namespace sluice::testing {
namespace {

size_t Append(char* data, size_t size, size_t n, void* out) {
  static_cast<std::string*>(out)->append(data, size * n);
  return size * n;
}

}  // namespace

absl::StatusOr<HttpResponse> HttpGet(const std::string& url) {
  CURL* curl = curl_easy_init();
  if (curl == nullptr) return absl::InternalError("curl_easy_init failed");
  HttpResponse response;
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, &Append);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &response.body);
  curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, 10000L);
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  const CURLcode rc = curl_easy_perform(curl);
  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &response.code);
  curl_easy_cleanup(curl);
  if (rc != CURLE_OK) {
    return absl::UnavailableError(
        absl::StrCat("GET ", url, ": ", curl_easy_strerror(rc)));
  }
  return response;
}

bool WaitForMetric(const std::string& metrics_address,
                   const std::string& text) {
  return WaitUntil(
      [&] {
        auto page = HttpGet("http://" + metrics_address + "/metrics");
        return page.ok() && page->body.find(text) != std::string::npos;
      },
      absl::Seconds(20), absl::Milliseconds(50));
}

}  // namespace sluice::testing
