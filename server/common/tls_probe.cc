#include "server/common/tls_probe.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace sluice {
namespace {

struct HostAndPort {
  std::string host;
  std::string port;
};

// "HOST:PORT" / "[V6]:PORT" entries of a gRPC target; empty when the target
// is of a kind this probe does not resolve (unix:, xds:, ...).
std::vector<HostAndPort> TargetEntries(absl::string_view target) {
  absl::ConsumePrefix(&target, "dns:///");
  absl::ConsumePrefix(&target, "dns:");
  if (!absl::ConsumePrefix(&target, "ipv4:")) {
    absl::ConsumePrefix(&target, "ipv6:");
  }
  std::vector<HostAndPort> entries;
  for (absl::string_view entry : absl::StrSplit(target, ',')) {
    if (absl::StrContains(entry, "/")) return {};  // another scheme
    HostAndPort hp;
    if (absl::StartsWith(entry, "[")) {
      const size_t close = entry.find("]:");
      if (close == absl::string_view::npos) continue;
      hp.host = std::string(entry.substr(1, close - 1));
      hp.port = std::string(entry.substr(close + 2));
    } else {
      const size_t colon = entry.rfind(':');
      if (colon == absl::string_view::npos) continue;
      hp.host = std::string(entry.substr(0, colon));
      hp.port = std::string(entry.substr(colon + 1));
    }
    if (hp.host.empty() || hp.port.empty()) continue;
    entries.push_back(std::move(hp));
  }
  return entries;
}

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

// A blocking TCP connection whose sends and receives time out; -1 when the
// connection is refused or not made within `timeout`.
int ConnectWithTimeout(const addrinfo& ai, absl::Duration timeout) {
  int fd = socket(ai.ai_family, ai.ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                  ai.ai_protocol);
  if (fd < 0) return -1;
  if (connect(fd, ai.ai_addr, ai.ai_addrlen) != 0) {
    if (errno != EINPROGRESS) {
      close(fd);
      return -1;
    }
    pollfd p{fd, POLLOUT, 0};
    int error = 0;
    socklen_t len = sizeof(error);
    if (poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(timeout))) !=
            1 ||
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &len) != 0 || error != 0) {
      close(fd);
      return -1;
    }
  }
  const int flags = fcntl(fd, F_GETFL);
  fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  const timeval tv = absl::ToTimeval(timeout);
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  return fd;
}

// True when a TLS handshake with `fd` gets as far as the server's
// certificate (no verification: only whether the server speaks TLS).
bool AnswersTls(int fd, const std::string& host) {
  std::unique_ptr<SSL_CTX, decltype(&SSL_CTX_free)> ctx(
      SSL_CTX_new(TLS_client_method()), SSL_CTX_free);
  if (ctx == nullptr) return false;
  SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_NONE, nullptr);
  static const unsigned char kAlpn[] = {2, 'h', '2'};
  SSL_CTX_set_alpn_protos(ctx.get(), kAlpn, sizeof(kAlpn));
  std::unique_ptr<SSL, decltype(&SSL_free)> ssl(SSL_new(ctx.get()), SSL_free);
  if (ssl == nullptr || SSL_set_fd(ssl.get(), fd) != 1) return false;
  in6_addr ignored;
  if (inet_pton(AF_INET, host.c_str(), &ignored) != 1 &&
      inet_pton(AF_INET6, host.c_str(), &ignored) != 1) {
    SSL_set_tlsext_host_name(ssl.get(), host.c_str());
  }
  SSL_connect(ssl.get());
  const bool tls = SSL_get0_peer_certificate(ssl.get()) != nullptr;
  SSL_shutdown(ssl.get());
  return tls;
}

// True when `fd` answers the HTTP/2 client preface with a SETTINGS frame.
bool AnswersHttp2(int fd) {
  static const char kPreface[] =
      "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
      "\x00\x00\x00\x04\x00\x00\x00\x00\x00";  // an empty SETTINGS frame
  const size_t preface_size = sizeof(kPreface) - 1;
  if (send(fd, kPreface, preface_size, MSG_NOSIGNAL) !=
      static_cast<ssize_t>(preface_size)) {
    return false;
  }
  unsigned char header[9];
  size_t got = 0;
  while (got < sizeof(header)) {
    const ssize_t n = recv(fd, header + got, sizeof(header) - got, 0);
    if (n <= 0) return false;
    got += static_cast<size_t>(n);
  }
  // 24-bit length, type 4 (SETTINGS), flags, stream 0.
  return header[3] == 0x04 && header[5] == 0 && header[6] == 0 &&
         header[7] == 0 && header[8] == 0;
}

// OpenSSL writes to the socket with write(2): a peer that closes mid-way
// would raise SIGPIPE. Blocks it in this thread while alive and discards one
// raised meanwhile.
class ScopedNoSigpipe {
 public:
  ScopedNoSigpipe() {
    sigset_t pipe;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe, &old_);
  }
  ~ScopedNoSigpipe() {
    sigset_t pipe;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    const timespec zero{0, 0};
    while (sigtimedwait(&pipe, nullptr, &zero) == SIGPIPE) {
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  ScopedNoSigpipe(const ScopedNoSigpipe&) = delete;
  ScopedNoSigpipe& operator=(const ScopedNoSigpipe&) = delete;

 private:
  sigset_t old_;
};

}  // namespace

Transport ProbeTransport(absl::string_view address, absl::Duration timeout) {
  ScopedNoSigpipe no_sigpipe;
  for (const HostAndPort& entry : TargetEntries(address)) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* resolved = nullptr;
    if (getaddrinfo(entry.host.c_str(), entry.port.c_str(), &hints,
                    &resolved) != 0) {
      continue;
    }
    std::unique_ptr<addrinfo, decltype(&freeaddrinfo)> free_resolved(
        resolved, freeaddrinfo);
    for (const addrinfo* ai = resolved; ai != nullptr; ai = ai->ai_next) {
      {
        Fd fd(ConnectWithTimeout(*ai, timeout));
        if (fd.get() < 0) continue;  // nothing there: try the next address
        if (AnswersTls(fd.get(), entry.host)) return Transport::kTls;
      }
      Fd fd(ConnectWithTimeout(*ai, timeout));
      if (fd.get() >= 0 && AnswersHttp2(fd.get())) return Transport::kPlaintext;
    }
  }
  return Transport::kUnknown;
}

absl::Status CheckTransport(absl::string_view what, absl::string_view address,
                            bool client_tls, absl::string_view tls_hint,
                            absl::Duration timeout) {
  const Transport transport = ProbeTransport(address, timeout);
  if (transport == Transport::kTls && !client_tls) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, " ", address,
        " speaks TLS, but this client connects in plaintext: give it the CA "
        "that signed the server's certificate (",
        tls_hint, ")"));
  }
  if (transport == Transport::kPlaintext && client_tls) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, " ", address,
        " speaks plaintext, but this client connects with TLS (", tls_hint,
        " is set): start the server with --tls_cert/--tls_key, or connect "
        "without a CA"));
  }
  return absl::OkStatus();
}

}  // namespace sluice
