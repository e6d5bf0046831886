// gRPC channel credentials for a client's optional ClientTls.
#ifndef SLUICE_CLIENT_CPP_CHANNEL_CREDENTIALS_H_
#define SLUICE_CLIENT_CPP_CHANNEL_CREDENTIALS_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <optional>
#include <string>

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

// UNAVAILABLE from a coordinator that speaks TLS while the client does not
// (or the reverse) becomes the error that says so (CheckTransport); any
// other status is returned as it is.
absl::Status ExplainUnavailable(absl::Status status,
                                const std::string& coordinator,
                                const std::optional<ClientTls>& tls,
                                absl::string_view tls_field);

}  // namespace sluice::client_internal

#endif  // SLUICE_CLIENT_CPP_CHANNEL_CREDENTIALS_H_
