// A real single-member etcd (Debian's etcd-server) on 127.0.0.1 with ports
// chosen by the kernel, its data in a directory of the test's. The client
// port is read back from etcd's own log line.
#ifndef SLUICE_TESTS_TESTING_ETCD_H_
#define SLUICE_TESTS_TESTING_ETCD_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "tests/testing/process.h"
#include "tests/testing/tls_fixture.h"

namespace sluice::testing {

class Etcd {
 public:
  // Starts etcd with its data in `dir`/etcd-data and its log in
  // `dir`/etcd.log; returns once it serves clients.
  // With `pki`, the client port is TLS with the PKI's server certificate
  // and demands a client certificate signed by its CA.
  static absl::StatusOr<std::unique_ptr<Etcd>> Start(
      const std::string& dir, absl::Duration timeout = absl::Seconds(30),
      const TestPki* pki = nullptr);
  // A cluster of `members` members in `dir`/etcd-<i>; its ports are
  // reserved first (bound, read back, released: a member's peer URL must be
  // known to the others before it starts), and the cluster is started again
  // on other ports when one was taken meanwhile. Returns once every member
  // serves.
  static absl::StatusOr<std::vector<std::unique_ptr<Etcd>>> StartCluster(
      const std::string& dir, int members,
      absl::Duration timeout = absl::Seconds(60));
  ~Etcd();  // SIGKILL

  const std::string& endpoint() const { return endpoint_; }  // 127.0.0.1:P
  ChildProcess& process() { return process_; }

 private:
  // One try of StartCluster, in `dir`/etcd-<i><suffix>; `taken_log` names
  // the log of a member that found its port taken.
  static absl::StatusOr<std::vector<std::unique_ptr<Etcd>>> StartClusterOnce(
      const std::string& dir, const std::string& suffix, int members,
      absl::Duration timeout, std::string* taken_log);

  ChildProcess process_;
  std::string endpoint_;
};

}  // namespace sluice::testing

#endif  // SLUICE_TESTS_TESTING_ETCD_H_
