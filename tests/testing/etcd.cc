#include "tests/testing/etcd.h"

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

Etcd::~Etcd() { process_.Kill(); }

}  // namespace sluice::testing
