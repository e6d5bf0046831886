// What the coordinator accepts from a data server before it enters the
// registry: a registration's credential and fields, and any fence it reports
// having seen. Pure functions of the message (and the lease secret), so the
// gRPC adapter answers a bad registration before it touches the service.
#ifndef SLUICE_SERVER_COORDINATOR_DATA_SERVER_ADMISSION_H_
#define SLUICE_SERVER_COORDINATOR_DATA_SERVER_ADMISSION_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "sluice/v1/coordinator.pb.h"

namespace sluice {

// OK when `r` may register: its credential proves `lease_secret` (when there
// is one; UNAUTHENTICATED otherwise), its address is host:port of at most 256
// bytes, its node at most 256 bytes, its capacity in [0, 1024], its pool a
// valid pool name and its max_fence_seen within the fence space
// (INVALID_ARGUMENT naming the field).
absl::Status CheckDataServerRegistration(const v1::RegisterDataServer& r,
                                         absl::string_view lease_secret);

// INVALID_ARGUMENT naming `field` if a data server claims a fence beyond the
// fence space (registration and heartbeat).
absl::Status CheckFenceSeen(absl::string_view field, uint64_t max_fence_seen);

}  // namespace sluice

#endif  // SLUICE_SERVER_COORDINATOR_DATA_SERVER_ADMISSION_H_
