// Lease tokens: an HMAC-SHA256 over a lease's fields, keyed by a secret the
// coordinator and the data servers share, so a data server checks a lease
// without calling the coordinator.
//
// Canonical encoding (version 3), everything little-endian:
//   "sluice-lease-v3"
//   then, in this order, strings as u32 length + bytes and integers as
//   8-byte two's complement:
//   lease_id, fence, job, epoch, rank, unit.begin, unit.end, unit.sequence,
//   data_server, on_corrupt, expires_at_unix_ms, weight, tenant, the unit's
//   kind as a string ("shard", "window", "mixed", "unset");
//   then for a ShardRange: shard_index, url, size_bytes, checksum;
//   for a WindowUnit: window_index, window_order, the pieces;
//   for a MixedUnit: block_index, the number of mix_samples and each, the
//   number of segments and per segment source, first_piece, num_pieces,
//   window_order, begin, end, augment_seed, source_name; then the pieces;
//   where the pieces are their number and per piece shard_index, url,
//   num_samples, size_bytes, checksum, source.
// The expiry is signed, so a token cannot be replayed after its lease
// expired: the coordinator sends a held lease again with a fresh expiry and
// token before half its TTL is left (the holder's heartbeats keep it alive),
// and a data server refuses a token past its expiry (plus a clock skew).
#ifndef SLUICE_SERVER_COMMON_LEASE_TOKEN_H_
#define SLUICE_SERVER_COMMON_LEASE_TOKEN_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "sluice/v1/common.pb.h"

namespace sluice {

// The bytes the token signs.
std::string CanonicalLeaseBytes(const v1::Lease& lease);

// HMAC-SHA256 of the canonical bytes (32 bytes).
std::string SignLease(const v1::Lease& lease, absl::string_view secret);

// OK when lease.token is the HMAC of lease under `secret`;
// PERMISSION_DENIED naming the lease otherwise (missing or wrong token).
absl::Status VerifyLeaseToken(const v1::Lease& lease, absl::string_view secret);

// A data server's registration credential for `address` (HMAC-SHA256 of
// "sluice-register-v1" + address under the lease secret, 32 bytes).
std::string SignRegistration(absl::string_view address,
                             absl::string_view secret);
// OK when `credential` is SignRegistration(address, secret);
// UNAUTHENTICATED naming the address otherwise.
absl::Status VerifyRegistration(absl::string_view address,
                                absl::string_view credential,
                                absl::string_view secret);

// Reads a secret from a file (surrounding whitespace trimmed). Empty path =
// no secret. An empty or unreadable file is an error naming `flag`.
absl::StatusOr<std::string> ReadSecretFile(const std::string& path,
                                           absl::string_view flag);

}  // namespace sluice

#endif  // SLUICE_SERVER_COMMON_LEASE_TOKEN_H_
