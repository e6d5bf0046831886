// A loopback TCP port nothing listens on at the moment of the call: bound to
// port 0, read back, released. For a server whose address others must know
// before it can bind (a standby coordinator binds only once it leads; an
// etcd member's peer URL is given to the others first). Another process may
// take the port in between; 0 when none could be bound.
#ifndef SLUICE_SERVER_COMMON_LOOPBACK_PORT_H_
#define SLUICE_SERVER_COMMON_LOOPBACK_PORT_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

namespace sluice {

inline int ReserveLoopbackPort() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

}  // namespace sluice

#endif  // SLUICE_SERVER_COMMON_LOOPBACK_PORT_H_
