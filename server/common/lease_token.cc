#include "server/common/lease_token.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <cstdint>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "server/common/quote.h"
#include "server/common/work_unit.h"

namespace sluice {
namespace {

void PutInt(std::string* out, int64_t v) {
  auto u = static_cast<uint64_t>(v);
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>(u >> (8 * i)));
}

void PutString(std::string* out, absl::string_view s) {
  auto n = static_cast<uint32_t>(s.size());
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>(n >> (8 * i)));
  out->append(s.data(), s.size());
}

}  // namespace

std::string CanonicalLeaseBytes(const v1::Lease& lease) {
  const v1::WorkUnit& unit = lease.unit();
  std::string out = "sluice-lease-v3";
  PutString(&out, lease.lease_id());
  PutInt(&out, static_cast<int64_t>(lease.fence()));
  PutString(&out, lease.job());
  PutInt(&out, lease.epoch());
  PutInt(&out, lease.rank());
  PutInt(&out, unit.begin());
  PutInt(&out, unit.end());
  PutInt(&out, unit.sequence());
  PutString(&out, lease.data_server());
  PutInt(&out, lease.on_corrupt());
  PutInt(&out, lease.expires_at_unix_ms());
  PutInt(&out, lease.weight());
  PutString(&out, lease.tenant());
  PutString(&out, UnitKindName(unit));
  const auto put_pieces = [&out](const auto& pieces) {
    PutInt(&out, pieces.size());
    for (const v1::WindowPiece& p : pieces) {
      PutInt(&out, p.shard_index());
      PutString(&out, p.url());
      PutInt(&out, p.num_samples());
      PutInt(&out, p.size_bytes());
      PutString(&out, p.checksum());
      PutInt(&out, p.source());
    }
  };
  switch (unit.kind_case()) {
    case v1::WorkUnit::kShard:
      PutInt(&out, unit.shard().shard_index());
      PutString(&out, unit.shard().url());
      PutInt(&out, unit.shard().size_bytes());
      PutString(&out, unit.shard().checksum());
      break;
    case v1::WorkUnit::kWindow:
      PutInt(&out, unit.window().window_index());
      PutInt(&out, static_cast<int64_t>(unit.window().window_order()));
      put_pieces(unit.window().pieces());
      break;
    case v1::WorkUnit::kMixed: {
      const v1::MixedUnit& mixed = unit.mixed();
      PutInt(&out, mixed.block_index());
      PutInt(&out, mixed.mix_samples_size());
      for (int64_t n : mixed.mix_samples()) PutInt(&out, n);
      PutInt(&out, mixed.segments_size());
      for (const v1::MixSegment& g : mixed.segments()) {
        PutInt(&out, g.source());
        PutInt(&out, g.first_piece());
        PutInt(&out, g.num_pieces());
        PutInt(&out, static_cast<int64_t>(g.window_order()));
        PutInt(&out, g.begin());
        PutInt(&out, g.end());
        PutInt(&out, static_cast<int64_t>(g.augment_seed()));
        PutString(&out, g.source_name());
      }
      put_pieces(mixed.pieces());
      break;
    }
    case v1::WorkUnit::KIND_NOT_SET:
      break;
  }
  return out;
}

std::string SignLease(const v1::Lease& lease, absl::string_view secret) {
  std::string data = CanonicalLeaseBytes(lease);
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int mac_len = 0;
  HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
       reinterpret_cast<const unsigned char*>(data.data()), data.size(), mac,
       &mac_len);
  return std::string(reinterpret_cast<const char*>(mac), mac_len);
}

absl::Status VerifyLeaseToken(const v1::Lease& lease,
                              absl::string_view secret) {
  if (lease.token().empty()) {
    return absl::PermissionDeniedError(
        absl::StrCat("lease ", QuotePrefix(lease.lease_id()),
                     " has no token; this server requires "
                     "leases signed by the coordinator"));
  }
  std::string expected = SignLease(lease, secret);
  if (lease.token().size() != expected.size() ||
      CRYPTO_memcmp(lease.token().data(), expected.data(), expected.size()) !=
          0) {
    return absl::PermissionDeniedError(
        absl::StrCat("lease ", QuotePrefix(lease.lease_id()), " (job ",
                     QuotePrefix(lease.job()), ", shard ",
                     QuotePrefix(UnitFirstUrl(lease.unit())),
                     "): token does not match its fields"));
  }
  return absl::OkStatus();
}

std::string SignRegistration(absl::string_view address,
                             absl::string_view secret) {
  const std::string data = absl::StrCat("sluice-register-v1", address);
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int mac_len = 0;
  HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
       reinterpret_cast<const unsigned char*>(data.data()), data.size(), mac,
       &mac_len);
  return std::string(reinterpret_cast<const char*>(mac), mac_len);
}

absl::Status VerifyRegistration(absl::string_view address,
                                absl::string_view credential,
                                absl::string_view secret) {
  const std::string expected = SignRegistration(address, secret);
  if (credential.size() != expected.size() ||
      CRYPTO_memcmp(credential.data(), expected.data(), expected.size()) != 0) {
    return absl::UnauthenticatedError(
        absl::StrCat("data server ", address.substr(0, 256), ": registration ",
                     credential.empty() ? "carries no credential"
                                        : "credential does not match",
                     "; this coordinator accepts data servers holding its "
                     "--lease_secret_file"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadSecretFile(const std::string& path,
                                           absl::string_view flag) {
  if (path.empty()) return std::string();
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, ": cannot read \"", path, "\""));
  }
  std::stringstream buffer;
  buffer << in.rdbuf();
  std::string secret(absl::StripAsciiWhitespace(buffer.str()));
  if (secret.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, ": \"", path, "\" is empty"));
  }
  return secret;
}

}  // namespace sluice
