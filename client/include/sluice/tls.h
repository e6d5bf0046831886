// TLS for a client's connections to the coordinator and the data servers,
// given as PEM text: the public headers carry no gRPC types.
//
//   sluice::ReaderOptions o;
//   ASSIGN_OR_RETURN(o.tls, sluice::ReadClientTls("/etc/sluice/ca.crt"));
//
// One CA verifies both kinds of server (k8s/README.md, "TLS"); with a
// certificate and key the client also authenticates itself (mutual TLS).
#ifndef SLUICE_CLIENT_INCLUDE_SLUICE_TLS_H_
#define SLUICE_CLIENT_INCLUDE_SLUICE_TLS_H_

#include <string>

#include "absl/status/statusor.h"

namespace sluice {

struct ClientTls {
  std::string ca_cert_pem;  // verifies the servers; required
  // Mutual TLS: this client's certificate chain and private key, both or
  // neither.
  std::string client_cert_pem;
  std::string client_key_pem;
};

// Reads the PEM files; `client_cert` and `client_key` may be empty (no
// mutual TLS). INVALID_ARGUMENT naming the file that cannot be read, or a
// certificate given without its key (or the reverse).
absl::StatusOr<ClientTls> ReadClientTls(const std::string& ca_cert,
                                        const std::string& client_cert = "",
                                        const std::string& client_key = "");

}  // namespace sluice

#endif  // SLUICE_CLIENT_INCLUDE_SLUICE_TLS_H_
