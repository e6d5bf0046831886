#include "tests/testing/etcd.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <regex>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/common/loopback_port.h"

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
  std::vector<int> client(members), peer(members);
  std::string initial;
  for (int i = 0; i < members; ++i) {
    client[i] = ReserveLoopbackPort();
    peer[i] = ReserveLoopbackPort();
    if (client[i] == 0 || peer[i] == 0) {
      return absl::InternalError("no free loopback port");
    }
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
                             absl::StrCat(dir, "/etcd-", i),
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
                            absl::StrCat(dir, "/etcd-", i, ".log"));
    if (!proc.ok()) return proc.status();
    auto etcd = std::unique_ptr<Etcd>(new Etcd());
    etcd->process_ = std::move(*proc);
    etcd->endpoint_ = absl::StrCat("127.0.0.1:", client[i]);
    cluster.push_back(std::move(etcd));
  }
  // Every member serves once the cluster has formed (polling their logs).
  const absl::Time deadline = absl::Now() + timeout;
  for (int i = 0; i < members; ++i) {
    const std::string log = absl::StrCat(dir, "/etcd-", i, ".log");
    while (true) {
      std::optional<std::string> text = ReadWholeFile(log);
      if (text &&
          text->find("ready to serve client requests") != std::string::npos) {
        break;
      }
      if (!cluster[i]->process_.running()) {
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
