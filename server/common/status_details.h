// Typed details on a status: a sluice.v1.RpcStatus (its details are Any-style
// messages named "type.googleapis.com/sluice.v1.<Message>") carried as the
// kGrpcDetailsPayloadUrl payload, which ToGrpcStatus / FromGrpcStatus turn
// into gRPC's status details and back (grpc_status.h).
#ifndef SLUICE_SERVER_COMMON_STATUS_DETAILS_H_
#define SLUICE_SERVER_COMMON_STATUS_DETAILS_H_

#include <google/protobuf/message.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace sluice {

// A status of `code` saying `message`, with `detail` attached.
absl::Status StatusWithDetail(absl::StatusCode code, absl::string_view message,
                              const google::protobuf::Message& detail);

// Whether `status` carries a detail of the message type `full_name` (e.g.
// "sluice.v1.HandedBack").
bool HasStatusDetail(const absl::Status& status, absl::string_view full_name);

}  // namespace sluice

#endif  // SLUICE_SERVER_COMMON_STATUS_DETAILS_H_
