#include "tests/testing/nginx.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "tests/testing/http.h"
#include "tests/testing/tar_writer.h"

namespace sluice::testing {
namespace {

// A port that was free a moment ago (nginx cannot report a port-0 bind).
int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    close(fd);
    return 0;
  }
  close(fd);
  return ntohs(addr.sin_port);
}

bool Accepting(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  bool ok = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  close(fd);
  return ok;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Nginx>> Nginx::Start(
    const std::string& dir, const std::string& docroot,
    int64_t slow_bytes_per_second, const NginxTls& tls) {
  const std::string nginx = "/usr/sbin/nginx";
  if (access(nginx.c_str(), X_OK) != 0) {
    return absl::FailedPreconditionError(
        "nginx not installed (make deps installs nginx-light)");
  }
  absl::Status last = absl::UnavailableError("nginx did not start");
  for (int attempt = 0; attempt < 5; ++attempt) {
    auto server = std::unique_ptr<Nginx>(new Nginx());
    server->dir_ = dir;
    server->port_ = FreePort();
    server->sync_port_ = FreePort();
    server->tls_ = !tls.cert.empty();
    const std::string conf = absl::StrCat(
        "worker_processes 1;\n", geteuid() == 0 ? "user root root;\n" : "",
        "pid ", dir, "/nginx.pid;\n", "error_log ", dir, "/error.log info;\n",
        "events { worker_connections 512; }\n", "http {\n",
        "  log_format sluice "
        "'$request_method\\t$uri\\t$status\\t$body_bytes_sent\\t$http_host\\t"
        "$http_authorization\\t$http_x_amz_date\\t$http_x_amz_content_sha256\\t"
        "$http_x_amz_security_token\t$connection';\n",
        "  access_log ", dir, "/access.log sluice;\n",
        "  client_body_temp_path ", dir, "/body; proxy_temp_path ", dir,
        "/proxy;\n", "  fastcgi_temp_path ", dir, "/fcgi; uwsgi_temp_path ",
        dir, "/uwsgi; scgi_temp_path ", dir, "/scgi;\n",
        "  sendfile on; keepalive_timeout 60; keepalive_requests 10000;\n",
        "  server {\n", "    listen 127.0.0.1:", server->port_,
        server->tls_ ? " ssl" : "", ";\n",
        "    listen 127.0.0.1:", server->sync_port_, ";\n",
        "    location /__sync/ { return 204; }\n",
        server->tls_
            ? absl::StrCat("    ssl_certificate ", tls.cert,
                           ";\n    ssl_certificate_key ", tls.key, ";\n")
            : "",
        "    root ", docroot, ";\n", "    location /slow/ { alias ", docroot,
        "/; limit_rate ", slow_bytes_per_second, "; }\n",
        "    location /flaky/ { if (!-f ", dir,
        "/flaky-ok) { return 500; } alias ", docroot, "/; }\n", "  }\n", "}\n");
    WriteFile(dir + "/nginx.conf", conf);
    auto child =
        ChildProcess::Start({nginx, "-p", dir, "-c", dir + "/nginx.conf", "-e",
                             dir + "/error.log", "-g", "daemon off;"},
                            dir + "/nginx.out");
    if (!child.ok()) return child.status();
    server->process_ = std::move(*child);
    for (absl::Time deadline = absl::Now() + absl::Seconds(10);
         absl::Now() < deadline;) {
      if (Accepting(server->port_)) return server;
      if (!server->process_.running()) break;
      absl::SleepFor(absl::Milliseconds(10));
    }
    last = absl::UnavailableError(absl::StrCat("nginx did not start on port ",
                                               server->port_, "; see ", dir,
                                               "/error.log"));
  }
  return last;
}

Nginx::~Nginx() {
  if (process_.pid() > 0 && process_.running()) {
    process_.Signal(SIGTERM);  // fast shutdown of master and workers
    if (!process_.Wait(absl::Seconds(10)).ok()) process_.Kill();
  }
}

std::string Nginx::base_url() const {
  return absl::StrCat(tls_ ? "https" : "http", "://127.0.0.1:", port_);
}

std::vector<NginxLogLine> Nginx::AccessLog() const {
  // nginx logs a request after sending its response, so a client can have
  // the response before the line is written. One worker serves requests
  // one event at a time: once a request made now is logged, every request
  // answered before it is too.
  const std::string sync_uri = absl::StrCat("/__sync/", ++syncs_);
  (void)HttpGet(absl::StrCat("http://127.0.0.1:", sync_port_, sync_uri));
  std::vector<NginxLogLine> out;
  for (absl::Time deadline = absl::Now() + absl::Seconds(10);;) {
    out = ReadAccessLog();
    bool synced = false;
    for (const NginxLogLine& l : out) synced |= l.uri == sync_uri;
    if (synced || absl::Now() > deadline) break;
    absl::SleepFor(absl::Milliseconds(2));
  }
  out.erase(std::remove_if(out.begin(), out.end(),
                           [](const NginxLogLine& l) {
                             return absl::StartsWith(l.uri, "/__sync/");
                           }),
            out.end());
  return out;
}

std::vector<NginxLogLine> Nginx::ReadAccessLog() const {
  std::vector<NginxLogLine> out;
  std::ifstream in(dir_ + "/access.log");
  std::string line;
  while (std::getline(in, line)) {
    std::vector<std::string> f = absl::StrSplit(line, '\t');
    if (f.size() < 10) continue;
    NginxLogLine l;
    l.method = f[0];
    l.uri = f[1];
    (void)absl::SimpleAtoi(f[2], &l.status);
    (void)absl::SimpleAtoi(f[3], &l.body_bytes);
    l.host = f[4];
    l.authorization = f[5] == "-" ? "" : f[5];
    l.amz_date = f[6] == "-" ? "" : f[6];
    l.amz_content_sha256 = f[7] == "-" ? "" : f[7];
    l.amz_security_token = f[8] == "-" ? "" : f[8];
    (void)absl::SimpleAtoi(f[9], &l.connection);
    out.push_back(std::move(l));
  }
  return out;
}

int Nginx::Count(const std::string& method, const std::string& uri) const {
  int n = 0;
  for (const NginxLogLine& l : AccessLog())
    n += l.method == method && l.uri == uri;
  return n;
}

void Nginx::MakeFlakyHealthy() { WriteFile(dir_ + "/flaky-ok", "ok"); }

}  // namespace sluice::testing
