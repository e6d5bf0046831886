#include "client/cpp/channel_credentials.h"

#include "absl/strings/str_cat.h"
#include "server/common/tls_files.h"
#include "server/common/tls_probe.h"

namespace sluice {
namespace client_internal {

std::shared_ptr<grpc::ChannelCredentials> ChannelCredentials(
    const std::optional<ClientTls>& tls) {
  if (!tls.has_value()) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = tls->ca_cert_pem;
  ssl.pem_cert_chain = tls->client_cert_pem;
  ssl.pem_private_key = tls->client_key_pem;
  return grpc::SslCredentials(ssl);
}

absl::Status CheckClientTls(const std::optional<ClientTls>& tls,
                            absl::string_view field) {
  if (!tls.has_value()) return absl::OkStatus();
  if (tls->ca_cert_pem.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(field,
                     ".ca_cert_pem is empty: TLS needs the CA that "
                     "signed the servers' certificates"));
  }
  if (tls->client_cert_pem.empty() != tls->client_key_pem.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        field,
        ": give client_cert_pem and client_key_pem together (mutual "
        "TLS), or neither"));
  }
  return absl::OkStatus();
}

absl::Status ExplainUnavailable(absl::Status status,
                                const std::string& coordinator,
                                const std::optional<ClientTls>& tls,
                                absl::string_view tls_field) {
  if (!absl::IsUnavailable(status)) return status;
  absl::Status mismatch =
      CheckTransport("coordinator", coordinator, tls.has_value(), tls_field);
  return mismatch.ok() ? status : mismatch;
}

}  // namespace client_internal

absl::StatusOr<ClientTls> ReadClientTls(const std::string& ca_cert,
                                        const std::string& client_cert,
                                        const std::string& client_key) {
  if (client_cert.empty() != client_key.empty()) {
    return absl::InvalidArgumentError(
        "ReadClientTls: give client_cert and client_key together (mutual "
        "TLS), or neither");
  }
  ClientTls tls;
  auto ca = ReadPemFile(ca_cert, "ca_cert");
  if (!ca.ok()) return ca.status();
  tls.ca_cert_pem = *std::move(ca);
  if (!client_cert.empty()) {
    auto cert = ReadPemFile(client_cert, "client_cert");
    if (!cert.ok()) return cert.status();
    auto key = ReadPemFile(client_key, "client_key");
    if (!key.ok()) return key.status();
    tls.client_cert_pem = *std::move(cert);
    tls.client_key_pem = *std::move(key);
  }
  return tls;
}

}  // namespace sluice
