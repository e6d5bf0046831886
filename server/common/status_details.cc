#include "server/common/status_details.h"

#include <string>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "server/common/grpc_status.h"
#include "sluice/v1/common.pb.h"

namespace sluice {

absl::Status StatusWithDetail(absl::StatusCode code, absl::string_view message,
                              const google::protobuf::Message& detail) {
  v1::RpcStatus rpc;
  rpc.set_code(static_cast<int32_t>(code));
  rpc.set_message(std::string(message));
  v1::AnyDetail* any = rpc.add_details();
  any->set_type_url(absl::StrCat("type.googleapis.com/",
                                 detail.GetDescriptor()->full_name()));
  any->set_value(detail.SerializeAsString());
  absl::Status status(code, message);
  status.SetPayload(kGrpcDetailsPayloadUrl,
                    absl::Cord(rpc.SerializeAsString()));
  return status;
}

bool HasStatusDetail(const absl::Status& status, absl::string_view full_name) {
  absl::optional<absl::Cord> payload =
      status.GetPayload(kGrpcDetailsPayloadUrl);
  v1::RpcStatus rpc;
  if (!payload.has_value() || !rpc.ParseFromString(std::string(*payload))) {
    return false;
  }
  const std::string url = absl::StrCat("type.googleapis.com/", full_name);
  for (const v1::AnyDetail& any : rpc.details()) {
    if (any.type_url() == url) return true;
  }
  return false;
}

}  // namespace sluice
