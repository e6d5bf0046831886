// The gRPC target for an address flag or option: one "HOST:PORT" as it is,
// or several comma-separated IPv4 "HOST:PORT"s as one "ipv4:" target, which
// gRPC's default pick_first policy connects in order, moving on when one
// refuses. With the coordinator's journal in etcd only the leader listens,
// so the list of every coordinator reaches whichever leads.
#ifndef SLUICE_SERVER_COMMON_GRPC_TARGET_H_
#define SLUICE_SERVER_COMMON_GRPC_TARGET_H_

#include <string>

namespace sluice {

inline std::string GrpcTarget(const std::string& address) {
  if (address.find(',') == std::string::npos) return address;
  return "ipv4:" + address;
}

}  // namespace sluice

#endif  // SLUICE_SERVER_COMMON_GRPC_TARGET_H_
