// Downloads remote shards (http://, https://, s3://) with libcurl.
//
// One RemoteFetcher per data server. It keeps a small pool of curl handles so
// connections (and TLS sessions) to the same host are reused across
// downloads. A download is retried with jittered exponential backoff on
// 5xx / 408 / 429, connection failures, timeouts and truncated bodies (the
// server closed before Content-Length bytes arrived); 404 and 403 are final.
//
// s3://bucket/key is fetched path-style from the S3 endpoint
// (<endpoint>/<bucket>/<key>) and signed with libcurl's built-in AWS
// Signature Version 4 (CURLOPT_AWS_SIGV4) when credentials are present in
// the standard environment variables (AWS_ACCESS_KEY_ID,
// AWS_SECRET_ACCESS_KEY, optional AWS_SESSION_TOKEN); without them the
// request is unsigned (public buckets).
//
// Thread-safe: several downloads may run at once.
#ifndef SLUICE_SERVER_DATASERVER_REMOTE_FETCHER_H_
#define SLUICE_SERVER_DATASERVER_REMOTE_FETCHER_H_

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace sluice::dataserver {

// Why a download failed: the label of
// sluice_dataserver_cache_download_failures_total. A fixed set.
enum class FetchFailure {
  kNone,
  kNotFound,      // HTTP 404 (or 410)
  kForbidden,     // HTTP 401 / 403
  kHttpClient,    // another 4xx
  kHttpServer,    // 5xx / 408 / 429 after every retry
  kNetwork,       // connect / DNS / timeout after every retry
  kTls,           // the server's certificate did not verify
  kTruncated,     // body shorter than its Content-Length after every retry
  kSizeMismatch,  // body size differs from the manifest's size_bytes
  kChecksumMismatch,
  kDisk,       // writing the temp file failed
  kCancelled,  // the data server is shutting down
};
const char* FetchFailureLabel(FetchFailure failure);
// The failures FetchFailureLabel can name, for pre-registering metrics.
std::vector<FetchFailure> AllFetchFailures();

struct RemoteFetcherOptions {
  // PEM bundle of CA certificates for https; empty = the system's.
  std::string ca_bundle;
  // Attempts per download, the first included.
  int max_attempts = 5;
  absl::Duration initial_backoff = absl::Milliseconds(100);
  absl::Duration max_backoff = absl::Seconds(5);
  absl::Duration connect_timeout = absl::Seconds(10);
  // A transfer slower than 1 KiB/s for this long is abandoned (and retried).
  absl::Duration stall_timeout = absl::Seconds(30);
  // S3: endpoint URL ("https://s3.us-east-1.amazonaws.com",
  // "http://127.0.0.1:9000"); empty = $AWS_ENDPOINT_URL_S3, then
  // $AWS_ENDPOINT_URL, then https://s3.<region>.amazonaws.com.
  std::string s3_endpoint;
  // Empty = $AWS_REGION, then $AWS_DEFAULT_REGION, then us-east-1.
  std::string s3_region;
};

struct FetchResult {
  int64_t bytes = 0;
  int attempts = 0;
  // Lowercase hex SHA-256 of the body, when asked for.
  std::string sha256;
};

class RemoteFetcher {
 public:
  explicit RemoteFetcher(RemoteFetcherOptions options);
  ~RemoteFetcher();
  RemoteFetcher(const RemoteFetcher&) = delete;
  RemoteFetcher& operator=(const RemoteFetcher&) = delete;

  // True for the schemes this fetcher serves (http, https, s3).
  static bool IsRemoteUrl(absl::string_view url);

  // Writes the body of `url` to `fd` (from offset 0; truncated again before
  // each retry). On failure `*failure` says why (the metric label) and the
  // file's contents are meaningless. Errors name the URL: NOT_FOUND (404),
  // PERMISSION_DENIED (401/403), FAILED_PRECONDITION (other 4xx),
  // UNAVAILABLE (5xx, network, truncated body, after every attempt),
  // INTERNAL (disk), CANCELLED (shutdown).
  // `sha256`: also hash the body (FetchResult::sha256; empty otherwise).
  absl::StatusOr<FetchResult> Fetch(const std::string& url, int fd, bool sha256,
                                    FetchFailure* failure);

  // The http(s) URL a shard URL is fetched from (s3:// mapped onto the
  // endpoint); INVALID_ARGUMENT naming the URL when it cannot be fetched.
  absl::StatusOr<std::string> HttpUrl(absl::string_view url) const;

  // Aborts transfers in progress and makes later ones fail fast (shutdown).
  void Cancel() { cancelled_.store(true); }

 private:
  struct Attempt;
  void* AcquireHandle();
  void ReleaseHandle(void* handle);

  RemoteFetcherOptions options_;
  std::string s3_region_;
  std::string s3_endpoint_;
  std::string aws_userpwd_;        // "access:secret", empty = unsigned
  std::string aws_session_token_;  // empty = none
  std::atomic<bool> cancelled_{false};
  absl::Mutex mu_;
  std::vector<void*> idle_handles_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sluice::dataserver

#endif  // SLUICE_SERVER_DATASERVER_REMOTE_FETCHER_H_
