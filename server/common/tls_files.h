// TLS material from PEM files, for servers' own listeners and for the
// client side of any Sluice process (a data server registering with the
// coordinator, sluicectl). Errors name the flag the path came from.
#ifndef SLUICE_SERVER_COMMON_TLS_FILES_H_
#define SLUICE_SERVER_COMMON_TLS_FILES_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace sluice {

// The whole file; INVALID_ARGUMENT "cannot read <flag>=<path>" otherwise.
absl::StatusOr<std::string> ReadPemFile(const std::string& path,
                                        absl::string_view flag);

// Client-side TLS: verify the server against `ca`, and present `cert`/`key`
// for mutual TLS when set. No `ca` and no certificate = insecure.
struct ClientTlsFiles {
  std::string ca, cert, key;  // PEM paths
  // The flags they came from, for messages.
  std::string ca_flag, cert_flag, key_flag;
};
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>>
ClientCredentialsFromFiles(const ClientTlsFiles& files);

}  // namespace sluice

#endif  // SLUICE_SERVER_COMMON_TLS_FILES_H_
