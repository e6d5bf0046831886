// A real nginx (Debian's /usr/sbin/nginx) on 127.0.0.1 for tests of remote
// shards: serves `docroot` at /, the same files rate-limited under /slow/,
// and under /flaky/ answers 500 until the test calls MakeFlakyHealthy().
// Every request is logged (tab-separated) to an access log the test reads.
// Stopped by its own PID in the destructor.
#ifndef SLUICE_TESTS_TESTING_NGINX_H_
#define SLUICE_TESTS_TESTING_NGINX_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tests/testing/process.h"

namespace sluice::testing {

struct NginxLogLine {
  std::string method;
  std::string uri;  // path without the query
  int status = 0;
  int64_t body_bytes = 0;
  std::string host;
  std::string authorization;
  std::string amz_date;
  std::string amz_content_sha256;
  std::string amz_security_token;
  int64_t connection = 0;  // nginx's connection serial number
};

struct NginxTls {
  std::string cert, key;  // PEM paths; empty = plain http
};

class Nginx {
 public:
  // `dir` holds the config, logs and pid file; /slow/ sends at most
  // `slow_bytes_per_second`.
  static absl::StatusOr<std::unique_ptr<Nginx>> Start(
      const std::string& dir, const std::string& docroot,
      int64_t slow_bytes_per_second = 2 << 20, const NginxTls& tls = {});
  ~Nginx();

  // "http://127.0.0.1:PORT" ("https://..." with TLS)
  std::string base_url() const;
  int port() const { return port_; }
  // Every request nginx has answered so far (it is asked for one more,
  // on a port of its own, and its line awaited first).
  std::vector<NginxLogLine> AccessLog() const;
  // Requests logged for `uri` with `method`.
  int Count(const std::string& method, const std::string& uri) const;
  void MakeFlakyHealthy();

 private:
  Nginx() = default;
  std::vector<NginxLogLine> ReadAccessLog() const;
  std::string dir_;
  int port_ = 0;
  int sync_port_ = 0;  // plain HTTP, for AccessLog's sync request
  mutable int syncs_ = 0;
  bool tls_ = false;
  ChildProcess process_;
};

}  // namespace sluice::testing

#endif  // SLUICE_TESTS_TESTING_NGINX_H_
