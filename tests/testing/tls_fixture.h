// Test PKI made with the openssl CLI: a CA, a server certificate for
// 127.0.0.1/localhost, and a client certificate, all signed by the CA.
#ifndef SLUICE_TESTS_TESTING_TLS_FIXTURE_H_
#define SLUICE_TESTS_TESTING_TLS_FIXTURE_H_

#include <string>

#include "absl/status/statusor.h"

namespace sluice::testing {

struct TestPki {
  std::string ca_cert, server_cert, server_key, client_cert,
      client_key;  // paths
};

// Writes the PKI into `dir`.
absl::StatusOr<TestPki> MakeTestPki(const std::string& dir);

}  // namespace sluice::testing

#endif  // SLUICE_TESTS_TESTING_TLS_FIXTURE_H_
