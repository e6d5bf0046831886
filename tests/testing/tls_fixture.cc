#include "tests/testing/tls_fixture.h"

#include <cstdlib>
#include <fstream>

#include "absl/strings/str_cat.h"

namespace sluice::testing {
namespace {

absl::Status Run(const std::string& command) {
  const int rc = std::system((command + " >/dev/null 2>&1").c_str());
  if (rc != 0)
    return absl::InternalError(absl::StrCat("failed (", rc, "): ", command));
  return absl::OkStatus();
}

absl::Status Issue(const std::string& dir, const std::string& name,
                   const std::string& ext) {
  const std::string d = dir + "/";
  std::ofstream(d + name + ".ext") << ext << "\n";
  if (auto s = Run(absl::StrCat("openssl req -new -newkey ec -pkeyopt "
                                "ec_paramgen_curve:prime256v1 -nodes",
                                " -keyout ", d, name, ".key -out ", d, name,
                                ".csr -subj /CN=", name));
      !s.ok()) {
    return s;
  }
  return Run(absl::StrCat("openssl x509 -req -in ", d, name, ".csr -CA ", d,
                          "ca.crt -CAkey ", d,
                          "ca.key -CAcreateserial -days 2 -out ", d, name,
                          ".crt -extfile ", d, name, ".ext"));
}

}  // namespace

absl::StatusOr<TestPki> MakeTestPki(const std::string& dir) {
  const std::string d = dir + "/";
  if (auto s = Run(absl::StrCat("openssl req -x509 -newkey ec -pkeyopt "
                                "ec_paramgen_curve:prime256v1 -nodes",
                                " -keyout ", d, "ca.key -out ", d,
                                "ca.crt -days 2 -subj /CN=sluice-test-ca"));
      !s.ok()) {
    return s;
  }
  if (auto s =
          Issue(dir, "server", "subjectAltName=IP:127.0.0.1,DNS:localhost");
      !s.ok()) {
    return s;
  }
  if (auto s = Issue(dir, "client", "extendedKeyUsage=clientAuth"); !s.ok())
    return s;
  return TestPki{d + "ca.crt", d + "server.crt", d + "server.key",
                 d + "client.crt", d + "client.key"};
}

}  // namespace sluice::testing
