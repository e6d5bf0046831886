#include "server/coordinator/access_policy.h"

#include <openssl/crypto.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "server/common/quote.h"
#include "server/common/sha256.h"
#include "server/coordinator/job_spec.h"

namespace sluice {
namespace {

bool Listed(const std::vector<std::string>& names,
            const std::vector<std::string>& allowed) {
  return std::any_of(names.begin(), names.end(), [&](const std::string& name) {
    return std::find(allowed.begin(), allowed.end(), name) != allowed.end();
  });
}

// Equal strings, compared as SHA-256 digests with CRYPTO_memcmp: the time
// depends on neither where they differ nor the expected string's length.
bool SecretEquals(absl::string_view got, absl::string_view want) {
  const std::string a = Sha256Hex(got), b = Sha256Hex(want);
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace

absl::Status AccessPolicy::AuthorizeAdmin(const Peer& peer,
                                          absl::string_view what) const {
  if (!enforce) return absl::OkStatus();
  if (Listed(peer.identities, identities)) return absl::OkStatus();
  if (peer.authorization.has_value() && !token.empty() &&
      SecretEquals(*peer.authorization, absl::StrCat("Bearer ", token))) {
    return absl::OkStatus();
  }
  if (token.empty() && identities.empty()) {
    return absl::PermissionDeniedError(absl::StrCat(
        what,
        " is refused: this coordinator has TLS or a lease secret but accepts "
        "no operator credential (start it with --admin_token_file or "
        "--admin_identities, or --allow_unauthenticated_admin)"));
  }
  if (peer.authorization.has_value()) {
    return absl::PermissionDeniedError(absl::StrCat(
        what, ": the authorization metadata is not the operator token"));
  }
  if (!peer.identities.empty()) {
    return absl::PermissionDeniedError(absl::StrCat(
        what, ": client certificate ", QuotePrefix(peer.identities.front()),
        " is not an operator identity (--admin_identities)",
        token.empty() ? "" : ", and no operator token was sent"));
  }
  return absl::UnauthenticatedError(absl::StrCat(
      what, " needs an operator credential: ",
      token.empty() ? ""
                    : "the token (metadata \"authorization: Bearer <token>\"; "
                      "sluicectl --admin_token_file)",
      !token.empty() && !identities.empty() ? " or " : "",
      identities.empty() ? ""
                         : "a client certificate named in --admin_identities"));
}

absl::Status AccessPolicy::AuthorizeCreateJob(
    const Peer& peer, const v1::CreateJobRequest& request) const {
  if (!request.copy_of().empty() &&
      request.spec().name() ==
          CopyJobName(request.copy_of(), request.spec().world_size())) {
    return absl::OkStatus();
  }
  return AuthorizeAdmin(peer, "CreateJob");
}

absl::Status AccessPolicy::AuthorizeDataServer(const Peer& peer) const {
  if (data_server_identities.empty() ||
      Listed(peer.identities, data_server_identities)) {
    return absl::OkStatus();
  }
  return absl::PermissionDeniedError(
      absl::StrCat("RegisterDataServer: ",
                   peer.identities.empty()
                       ? std::string("the call carries no client certificate")
                       : absl::StrCat("client certificate ",
                                      QuotePrefix(peer.identities.front()),
                                      " is not a data server identity"),
                   " (--data_server_identities)"));
}

}  // namespace sluice
