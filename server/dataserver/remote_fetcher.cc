#include "server/dataserver/remote_fetcher.h"

#include <curl/curl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "server/common/backoff.h"
#include "server/common/logging.h"
#include "server/common/sha256.h"

namespace sluice::dataserver {
namespace {

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? std::string() : std::string(v);
}

std::string FirstNonEmpty(std::initializer_list<std::string> values) {
  for (const std::string& v : values) {
    if (!v.empty()) return v;
  }
  return "";
}

// curl_global_init is not thread-safe; run it once before any handle.
void GlobalInit() {
  static const bool initialized = [] {
    curl_global_init(CURL_GLOBAL_DEFAULT);
    return true;
  }();
  (void)initialized;
}

// Keeps a short printable excerpt of an error body for messages.
std::string Excerpt(const std::string& body) {
  std::string out;
  for (char c : body.substr(0, 200)) {
    out.push_back(absl::ascii_isprint(static_cast<unsigned char>(c)) ? c : ' ');
  }
  return std::string(absl::StripAsciiWhitespace(out));
}

bool IsRetryableCurlError(CURLcode code) {
  switch (code) {
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_CONNECT:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_PARTIAL_FILE:
    case CURLE_RECV_ERROR:
    case CURLE_SEND_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
      return true;
    default:
      return false;
  }
}

}  // namespace

const char* FetchFailureLabel(FetchFailure failure) {
  switch (failure) {
    case FetchFailure::kNone:
      return "none";
    case FetchFailure::kNotFound:
      return "not_found";
    case FetchFailure::kForbidden:
      return "forbidden";
    case FetchFailure::kHttpClient:
      return "http_4xx";
    case FetchFailure::kHttpServer:
      return "http_5xx";
    case FetchFailure::kNetwork:
      return "network";
    case FetchFailure::kTls:
      return "tls";
    case FetchFailure::kTruncated:
      return "truncated";
    case FetchFailure::kSizeMismatch:
      return "size_mismatch";
    case FetchFailure::kChecksumMismatch:
      return "checksum_mismatch";
    case FetchFailure::kDisk:
      return "disk";
    case FetchFailure::kCancelled:
      return "cancelled";
  }
  return "unknown";
}

std::vector<FetchFailure> AllFetchFailures() {
  return {FetchFailure::kNotFound,         FetchFailure::kForbidden,
          FetchFailure::kHttpClient,       FetchFailure::kHttpServer,
          FetchFailure::kNetwork,          FetchFailure::kTls,
          FetchFailure::kTruncated,        FetchFailure::kSizeMismatch,
          FetchFailure::kChecksumMismatch, FetchFailure::kDisk,
          FetchFailure::kCancelled};
}

// State of one transfer attempt, shared with curl's callbacks.
struct RemoteFetcher::Attempt {
  CURL* curl = nullptr;
  int fd = -1;
  const std::atomic<bool>* cancelled = nullptr;
  std::unique_ptr<Sha256> sha;  // when the caller wants the digest
  int64_t written = 0;
  int write_errno = 0;
  std::string error_body;  // the start of a non-2xx body

  static size_t Write(char* data, size_t size, size_t n, void* arg) {
    auto* a = static_cast<Attempt*>(arg);
    const size_t total = size * n;
    long status = 0;
    curl_easy_getinfo(a->curl, CURLINFO_RESPONSE_CODE, &status);
    if (status < 200 || status >= 300) {
      if (a->error_body.size() < 512)
        a->error_body.append(data, std::min<size_t>(total, 512));
      return total;
    }
    if (a->sha != nullptr) a->sha->Update(data, total);
    size_t done = 0;
    while (done < total) {
      ssize_t w = write(a->fd, data + done, total - done);
      if (w < 0) {
        if (errno == EINTR) continue;
        a->write_errno = errno;
        return 0;  // makes curl fail with CURLE_WRITE_ERROR
      }
      done += static_cast<size_t>(w);
    }
    a->written += static_cast<int64_t>(total);
    return total;
  }

  static int Progress(void* arg, curl_off_t, curl_off_t, curl_off_t,
                      curl_off_t) {
    return static_cast<Attempt*>(arg)->cancelled->load() ? 1 : 0;
  }
};

RemoteFetcher::RemoteFetcher(RemoteFetcherOptions options)
    : options_(std::move(options)) {
  GlobalInit();
  if (options_.max_attempts < 1) options_.max_attempts = 1;
  s3_region_ = FirstNonEmpty({options_.s3_region, Env("AWS_REGION"),
                              Env("AWS_DEFAULT_REGION"), "us-east-1"});
  s3_endpoint_ = FirstNonEmpty(
      {options_.s3_endpoint, Env("AWS_ENDPOINT_URL_S3"),
       Env("AWS_ENDPOINT_URL"),
       absl::StrCat("https://s3.", s3_region_, ".amazonaws.com")});
  while (absl::EndsWith(s3_endpoint_, "/")) s3_endpoint_.pop_back();
  const std::string key = Env("AWS_ACCESS_KEY_ID");
  const std::string secret = Env("AWS_SECRET_ACCESS_KEY");
  if (!key.empty() && !secret.empty()) {
    aws_userpwd_ = absl::StrCat(key, ":", secret);
    aws_session_token_ = Env("AWS_SESSION_TOKEN");
  }
}

RemoteFetcher::~RemoteFetcher() {
  absl::MutexLock lock(&mu_);
  for (void* h : idle_handles_) curl_easy_cleanup(static_cast<CURL*>(h));
}

bool RemoteFetcher::IsRemoteUrl(absl::string_view url) {
  return absl::StartsWith(url, "http://") ||
         absl::StartsWith(url, "https://") || absl::StartsWith(url, "s3://");
}

absl::StatusOr<std::string> RemoteFetcher::HttpUrl(
    absl::string_view url) const {
  for (char c : url) {
    if (static_cast<unsigned char>(c) <= ' ' || c == 0x7f) {
      return absl::InvalidArgumentError(absl::StrCat(
          "shard url \"", url, "\" contains whitespace or control characters"));
    }
  }
  absl::string_view rest = url;
  if (absl::ConsumePrefix(&rest, "s3://")) {
    size_t slash = rest.find('/');
    if (slash == 0 || slash == absl::string_view::npos ||
        slash + 1 == rest.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("shard url \"", url, "\": expected s3://BUCKET/KEY"));
    }
    return absl::StrCat(s3_endpoint_, "/", rest);
  }
  if (absl::StartsWith(url, "http://") || absl::StartsWith(url, "https://")) {
    return std::string(url);
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "shard url \"", url, "\" is not http://, https:// or s3://"));
}

void* RemoteFetcher::AcquireHandle() {
  {
    absl::MutexLock lock(&mu_);
    if (!idle_handles_.empty()) {
      void* h = idle_handles_.back();
      idle_handles_.pop_back();
      return h;
    }
  }
  return curl_easy_init();
}

void RemoteFetcher::ReleaseHandle(void* handle) {
  absl::MutexLock lock(&mu_);
  // A handle keeps its connection cache: the next download to the same host
  // reuses the connection. Keep a few; more are closed.
  if (idle_handles_.size() < 16) {
    idle_handles_.push_back(handle);
  } else {
    curl_easy_cleanup(static_cast<CURL*>(handle));
  }
}

absl::StatusOr<FetchResult> RemoteFetcher::Fetch(const std::string& url, int fd,
                                                 bool sha256,
                                                 FetchFailure* failure) {
  *failure = FetchFailure::kNone;
  auto fail = [&](FetchFailure why, absl::Status status) {
    *failure = why;
    return status;
  };
  absl::StatusOr<std::string> http_url = HttpUrl(url);
  if (!http_url.ok()) return fail(FetchFailure::kHttpClient, http_url.status());
  const bool s3 = absl::StartsWith(url, "s3://");
  Backoff backoff(options_.initial_backoff, options_.max_backoff);
  std::string last_error;
  FetchFailure last_failure = FetchFailure::kNetwork;
  int attempts_made = 0;

  for (int attempt = 1; attempt <= options_.max_attempts; ++attempt) {
    if (cancelled_.load()) {
      return fail(FetchFailure::kCancelled,
                  absl::CancelledError(absl::StrCat(
                      "download of \"", url, "\" cancelled: shutting down")));
    }
    if (ftruncate(fd, 0) != 0 || lseek(fd, 0, SEEK_SET) != 0) {
      return fail(FetchFailure::kDisk,
                  absl::InternalError(absl::StrCat(
                      "cache file for \"", url, "\": ", std::strerror(errno))));
    }
    CURL* curl = static_cast<CURL*>(AcquireHandle());
    if (curl == nullptr) {
      return fail(FetchFailure::kNetwork,
                  absl::ResourceExhaustedError("curl_easy_init failed"));
    }
    curl_easy_reset(curl);
    attempts_made = attempt;
    Attempt a;
    a.curl = curl;
    a.fd = fd;
    a.cancelled = &cancelled_;
    if (sha256) a.sha = std::make_unique<Sha256>();
    char curl_error[CURL_ERROR_SIZE] = {0};
    curl_slist* headers = nullptr;
    curl_easy_setopt(curl, CURLOPT_URL, http_url->c_str());
    curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(curl, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(curl, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(curl, CURLOPT_MAXREDIRS, 5L);
    curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(curl, CURLOPT_USERAGENT, "sluice-dataserver");
    curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, curl_error);
    curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, &Attempt::Write);
    curl_easy_setopt(curl, CURLOPT_WRITEDATA, &a);
    curl_easy_setopt(curl, CURLOPT_BUFFERSIZE,
                     512L * 1024);  // fewer, larger writes
    curl_easy_setopt(curl, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(curl, CURLOPT_XFERINFOFUNCTION, &Attempt::Progress);
    curl_easy_setopt(curl, CURLOPT_XFERINFODATA, &a);
    curl_easy_setopt(
        curl, CURLOPT_CONNECTTIMEOUT_MS,
        static_cast<long>(absl::ToInt64Milliseconds(options_.connect_timeout)));
    curl_easy_setopt(curl, CURLOPT_LOW_SPEED_LIMIT, 1024L);
    curl_easy_setopt(curl, CURLOPT_LOW_SPEED_TIME,
                     static_cast<long>(std::max<int64_t>(
                         1, absl::ToInt64Seconds(options_.stall_timeout))));
    curl_easy_setopt(curl, CURLOPT_SSL_VERIFYPEER, 1L);
    curl_easy_setopt(curl, CURLOPT_SSL_VERIFYHOST, 2L);
    if (!options_.ca_bundle.empty()) {
      curl_easy_setopt(curl, CURLOPT_CAINFO, options_.ca_bundle.c_str());
    }
    if (s3 && !aws_userpwd_.empty()) {
      const std::string sigv4 = absl::StrCat("aws:amz:", s3_region_, ":s3");
      curl_easy_setopt(curl, CURLOPT_AWS_SIGV4, sigv4.c_str());
      curl_easy_setopt(curl, CURLOPT_USERPWD, aws_userpwd_.c_str());
      if (!aws_session_token_.empty()) {
        headers = curl_slist_append(
            headers,
            absl::StrCat("x-amz-security-token: ", aws_session_token_).c_str());
      }
    }
    if (headers != nullptr) curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);

    const CURLcode code = curl_easy_perform(curl);
    long status = 0;
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
    curl_off_t content_length = -1;
    curl_easy_getinfo(curl, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T,
                      &content_length);
    curl_slist_free_all(headers);
    curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, nullptr);
    ReleaseHandle(curl);

    bool retryable = false;
    if (code == CURLE_OK && status >= 200 && status < 300) {
      if (content_length >= 0 && content_length != a.written) {
        last_failure = FetchFailure::kTruncated;
        last_error =
            absl::StrCat("body has ", a.written,
                         " bytes but Content-Length says ", content_length);
        retryable = true;
      } else {
        FetchResult result;
        result.bytes = a.written;
        result.attempts = attempt;
        if (a.sha != nullptr) result.sha256 = a.sha->HexDigest();
        return result;
      }
    } else if (a.write_errno != 0) {
      std::string message = absl::StrCat("writing the cache file for \"", url,
                                         "\": ", std::strerror(a.write_errno));
      if (a.write_errno == ENOSPC || a.write_errno == EDQUOT) {
        return fail(
            FetchFailure::kDisk,
            absl::ResourceExhaustedError(absl::StrCat(
                message,
                " (the cache's filesystem is full: lower --cache_bytes or "
                "raise --cache_min_free_bytes)")));
      }
      return fail(FetchFailure::kDisk, absl::InternalError(message));
    } else if (code == CURLE_ABORTED_BY_CALLBACK) {
      return fail(FetchFailure::kCancelled,
                  absl::CancelledError(absl::StrCat(
                      "download of \"", url, "\" cancelled: shutting down")));
    } else if (code != CURLE_OK) {
      last_failure = code == CURLE_PARTIAL_FILE ? FetchFailure::kTruncated
                                                : FetchFailure::kNetwork;
      last_error = absl::StrCat(
          curl_easy_strerror(code),
          curl_error[0] != 0 ? absl::StrCat(": ", curl_error) : "",
          code == CURLE_PARTIAL_FILE
              ? absl::StrCat(" (body ended after ", a.written,
                             " bytes; Content-Length ", content_length, ")")
              : "");
      retryable = IsRetryableCurlError(code);
      if (code == CURLE_PEER_FAILED_VERIFICATION ||
          code == CURLE_SSL_CACERT_BADFILE) {
        return fail(FetchFailure::kTls,
                    absl::FailedPreconditionError(absl::StrCat(
                        "shard \"", url, "\": TLS verification failed: ",
                        last_error, " (set --ca_bundle for a private CA)")));
      }
    } else {
      const std::string body = Excerpt(a.error_body);
      last_error = absl::StrCat("HTTP ", status,
                                body.empty() ? "" : absl::StrCat(": ", body));
      if (status == 404 || status == 410) {
        return fail(FetchFailure::kNotFound,
                    absl::NotFoundError(
                        absl::StrCat("shard \"", url, "\": ", last_error)));
      }
      if (status == 401 || status == 403) {
        return fail(FetchFailure::kForbidden,
                    absl::PermissionDeniedError(
                        absl::StrCat("shard \"", url, "\": ", last_error)));
      }
      if (status >= 500 || status == 408 || status == 429) {
        last_failure = FetchFailure::kHttpServer;
        retryable = true;
      } else {
        return fail(FetchFailure::kHttpClient,
                    absl::FailedPreconditionError(
                        absl::StrCat("shard \"", url, "\": ", last_error)));
      }
    }
    if (!retryable) break;
    if (attempt < options_.max_attempts) {
      const absl::Duration wait = backoff.NextWait();
      LogWarning("download of \"%s\" attempt %d/%d failed (%s); retrying in %s",
                 url, attempt, options_.max_attempts, last_error,
                 absl::FormatDuration(wait));
      for (absl::Time until = absl::Now() + wait;
           absl::Now() < until && !cancelled_.load();) {
        absl::SleepFor(std::min(absl::Milliseconds(50), until - absl::Now()));
      }
    }
  }
  return fail(
      last_failure,
      absl::UnavailableError(absl::StrCat(
          "shard \"", url, "\": download failed after ", attempts_made,
          attempts_made == 1 ? " attempt: " : " attempts: ", last_error)));
}

}  // namespace sluice::dataserver
