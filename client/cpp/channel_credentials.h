// gRPC channel credentials for a client's optional ClientTls.
#ifndef SLUICE_CLIENT_CPP_CHANNEL_CREDENTIALS_H_
#define SLUICE_CLIENT_CPP_CHANNEL_CREDENTIALS_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "sluice/tls.h"

namespace sluice::client_internal {

// SSL credentials from the PEM text, or insecure ones without `tls`.
std::shared_ptr<grpc::ChannelCredentials> ChannelCredentials(
    const std::optional<ClientTls>& tls);

// INVALID_ARGUMENT naming `field` (e.g. "ReaderOptions.tls") when `tls` is
// set without a CA, or with a certificate but no key (or the reverse).
absl::Status CheckClientTls(const std::optional<ClientTls>& tls,
                            absl::string_view field);

}  // namespace sluice::client_internal

#endif  // SLUICE_CLIENT_CPP_CHANNEL_CREDENTIALS_H_
