#include "server/common/tls_files.h"

#include <fstream>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "server/common/status_macros.h"

namespace sluice {

absl::StatusOr<std::string> ReadPemFile(const std::string& path,
                                        absl::string_view flag) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return absl::InvalidArgumentError(
        absl::StrCat("cannot read ", flag, "=", path));
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>>
ClientCredentialsFromFiles(const ClientTlsFiles& f) {
  if (f.cert.empty() != f.key.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        f.cert_flag, " and ", f.key_flag, " must be given together"));
  }
  if (f.ca.empty()) {
    if (!f.cert.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(f.cert_flag, " (mutual TLS) needs ", f.ca_flag,
                       " to verify the server"));
    }
    return grpc::InsecureChannelCredentials();
  }
  grpc::SslCredentialsOptions options;
  ASSIGN_OR_RETURN(options.pem_root_certs, ReadPemFile(f.ca, f.ca_flag));
  if (!f.cert.empty()) {
    ASSIGN_OR_RETURN(options.pem_cert_chain, ReadPemFile(f.cert, f.cert_flag));
    ASSIGN_OR_RETURN(options.pem_private_key, ReadPemFile(f.key, f.key_flag));
  }
  return grpc::SslCredentials(options);
}

}  // namespace sluice
