#include "tests/testing/etcd.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <regex>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace sluice::testing {

absl::StatusOr<std::unique_ptr<Etcd>> Etcd::Start(const std::string& dir,
                                                  absl::Duration timeout,
                                                  const TestPki* pki) {
  const std::string log = dir + "/etcd.log";
  const std::string any = "http://127.0.0.1:0";
  const std::string client = pki ? "https://127.0.0.1:0" : any;
  std::vector<std::string> argv = {"/usr/bin/etcd",
                                   "--name",
                                   "test",
                                   "--data-dir",
                                   dir + "/etcd-data",
                                   "--listen-client-urls",
                                   client,
                                   "--advertise-client-urls",
                                   client,
                                   "--listen-peer-urls",
                                   any,
                                   "--initial-advertise-peer-urls",
                                   any,
                                   "--initial-cluster",
                                   "test=" + any,
                                   "--log-outputs",
                                   "stderr"};
  if (pki != nullptr) {
    for (const std::string& a :
         {"--cert-file=" + pki->server_cert, "--key-file=" + pki->server_key,
          "--trusted-ca-file=" + pki->ca_cert,
          std::string("--client-cert-auth")}) {
      argv.push_back(a);
    }
  }
  absl::StatusOr<ChildProcess> proc = ChildProcess::Start(argv, log);
  if (!proc.ok()) return proc.status();
  auto etcd = std::unique_ptr<Etcd>(new Etcd());
  etcd->process_ = std::move(*proc);
  static const std::regex kServing(
      "serving (?:insecure )?client requests on (127\\.0\\.0\\.1:[0-9]+)");
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (std::optional<std::string> text = ReadWholeFile(log)) {
      std::smatch m;
      if (std::regex_search(*text, m, kServing)) {
        etcd->endpoint_ = m[1];
        return etcd;
      }
    }
    if (!etcd->process_.running()) {
      return absl::InternalError(
          absl::StrCat("etcd exited before serving; see ", log));
    }
    absl::SleepFor(absl::Milliseconds(20));  // polling its log file
  }
  return absl::DeadlineExceededError(absl::StrCat("etcd did not serve within ",
                                                  absl::FormatDuration(timeout),
                                                  "; see ", log));
}

absl::StatusOr<std::vector<std::unique_ptr<Etcd>>> Etcd::StartCluster(
    const std::string& dir, int members, absl::Duration timeout) {
  // A reserved port is free only when reserved: another test's server may
  // bind it before the member does. Such a member exits at once saying so;
  // the cluster then starts again on other ports, in other directories.
  constexpr int kAttempts = 3;
  absl::StatusOr<std::vector<std::unique_ptr<Etcd>>> cluster;
  for (int attempt = 0; attempt < kAttempts; ++attempt) {
    std::string taken_log;
    cluster = StartClusterOnce(
        dir, attempt == 0 ? "" : absl::StrCat("-retry", attempt), members,
        timeout, &taken_log);
    if (cluster.ok() || taken_log.empty()) return cluster;
    std::fprintf(stderr, "etcd cluster: a port was taken (%s); again\n",
                 taken_log.c_str());
  }
  return cluster;
}

absl::StatusOr<std::vector<std::unique_ptr<Etcd>>> Etcd::StartClusterOnce(
    const std::string& dir, const std::string& suffix, int members,
    absl::Duration timeout, std::string* taken_log) {
  // Held open until all are read, so the 2 * members ports differ.
  std::vector<int> sockets;
  std::vector<int> ports;
  for (int i = 0; i < 2 * members; ++i) {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    if (fd < 0 ||
        bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      if (fd >= 0) close(fd);
      for (int s : sockets) close(s);
      return absl::InternalError("no free loopback port");
    }
    sockets.push_back(fd);
    ports.push_back(ntohs(addr.sin_port));
  }
  for (int s : sockets) close(s);
  std::vector<int> client(members), peer(members);
  std::string initial;
  for (int i = 0; i < members; ++i) {
    client[i] = ports[2 * i];
    peer[i] = ports[2 * i + 1];
    absl::StrAppend(&initial, i == 0 ? "" : ",", "m", i,
                    "=http://127.0.0.1:", peer[i]);
  }
  std::vector<std::unique_ptr<Etcd>> cluster;
  for (int i = 0; i < members; ++i) {
    const std::string c = absl::StrCat("http://127.0.0.1:", client[i]);
    const std::string p = absl::StrCat("http://127.0.0.1:", peer[i]);
    absl::StatusOr<ChildProcess> proc =
        ChildProcess::Start({"/usr/bin/etcd",
                             "--name",
                             absl::StrCat("m", i),
                             "--data-dir",
                             absl::StrCat(dir, "/etcd-", i, suffix),
                             "--listen-client-urls",
                             c,
                             "--advertise-client-urls",
                             c,
                             "--listen-peer-urls",
                             p,
                             "--initial-advertise-peer-urls",
                             p,
                             "--initial-cluster",
                             initial,
                             "--initial-cluster-state",
                             "new",
                             "--initial-cluster-token",
                             "sluice-test",
                             "--log-outputs",
                             "stderr"},
                            absl::StrCat(dir, "/etcd-", i, suffix, ".log"));
    if (!proc.ok()) return proc.status();
    auto etcd = std::unique_ptr<Etcd>(new Etcd());
    etcd->process_ = std::move(*proc);
    etcd->endpoint_ = absl::StrCat("127.0.0.1:", client[i]);
    cluster.push_back(std::move(etcd));
  }
  // Every member serves once the cluster has formed (polling their logs).
  const absl::Time deadline = absl::Now() + timeout;
  for (int i = 0; i < members; ++i) {
    const std::string log = absl::StrCat(dir, "/etcd-", i, suffix, ".log");
    while (true) {
      std::optional<std::string> text = ReadWholeFile(log);
      if (text &&
          text->find("ready to serve client requests") != std::string::npos) {
        break;
      }
      if (!cluster[i]->process_.running()) {
        text = ReadWholeFile(log);
        if (text && text->find("address already in use") != std::string::npos)
          *taken_log = log;
        return absl::InternalError(
            absl::StrCat("etcd member ", i, " exited; see ", log));
      }
      if (absl::Now() > deadline) {
        return absl::DeadlineExceededError(
            absl::StrCat("etcd member ", i, " did not serve; see ", log));
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
  }
  return cluster;
}

Etcd::~Etcd() { process_.Kill(); }

}  // namespace sluice::testing
