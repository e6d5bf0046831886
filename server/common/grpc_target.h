// Channels to the coordinator from an address flag or option: one
// "HOST:PORT", or several comma-separated IPv4 "HOST:PORT"s (gRPC's "ipv4:"
// target).
//
// With several addresses, or a host name (which may resolve to several, as a
// headless Kubernetes Service does), the channel balances over the addresses
// whose gRPC health service reports "readiness" SERVING. With the
// coordinator's journal in etcd only the leader is ready (standbys answer
// UNAVAILABLE naming it), so the list of every coordinator reaches whichever
// leads, and the channel moves to a new leader as soon as it is ready.
#ifndef SLUICE_SERVER_COMMON_GRPC_TARGET_H_
#define SLUICE_SERVER_COMMON_GRPC_TARGET_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

namespace sluice {

// The service config of a channel that follows the ready coordinator.
inline constexpr char kFollowReadyServiceConfig[] =
    R"({"loadBalancingConfig":[{"round_robin":{}}],)"
    R"("healthCheckConfig":{"serviceName":"readiness"}})";

// The gRPC target for `address` (several comma-separated ones: "ipv4:...").
inline std::string GrpcTarget(const std::string& address) {
  if (address.find(',') == std::string::npos) return address;
  return "ipv4:" + address;
}

// True when `address` may name several coordinators: a comma-separated list
// or a host name (not an IP literal, not a target with a scheme).
inline bool MayNameSeveralCoordinators(const std::string& address) {
  if (address.find(',') != std::string::npos) return true;
  if (address.find(":/") != std::string::npos || address.empty() ||
      address[0] == '[') {
    return false;
  }
  const std::string host = address.substr(0, address.rfind(':'));
  if (host.empty()) return false;
  return host.find_first_not_of("0123456789.") != std::string::npos;
}

// Keepalive for a channel that carries long streams: an HTTP/2 PING every
// 2 s, the transport failed when one is not answered within 2 s. A peer that
// is stopped (SIGSTOP, a frozen VM) or cut off silently keeps its TCP
// connection up, and its streams would wait for ever: the stream fails
// within about 4 s instead, and the client moves on (another coordinator,
// another data server). The servers accept pings this often (server_host.cc).
inline void SetStreamKeepalive(grpc::ChannelArguments& args) {
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 2000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 2000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
}

// A channel to the coordinator(s) at `address`, with `args` and, when the
// address may name several, the service config that follows the ready one.
inline std::shared_ptr<grpc::Channel> CoordinatorChannel(
    const std::string& address,
    const std::shared_ptr<grpc::ChannelCredentials>& credentials,
    grpc::ChannelArguments args = grpc::ChannelArguments()) {
  if (MayNameSeveralCoordinators(address)) {
    args.SetServiceConfigJSON(kFollowReadyServiceConfig);
  }
  return grpc::CreateCustomChannel(GrpcTarget(address), credentials, args);
}

}  // namespace sluice

#endif  // SLUICE_SERVER_COMMON_GRPC_TARGET_H_
