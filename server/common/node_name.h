// The node (host) a process runs on, as readers and data servers tell the
// coordinator for locality (Hello.node, RegisterDataServer.node):
// $SLUICE_NODE when set (Kubernetes passes spec.nodeName through the
// downward API), else SLURM's $SLURMD_NODENAME, else the host name.
#ifndef SLUICE_SERVER_COMMON_NODE_NAME_H_
#define SLUICE_SERVER_COMMON_NODE_NAME_H_

#include <unistd.h>

#include <cstdlib>
#include <string>

namespace sluice {

inline std::string NodeName() {
  for (const char* variable : {"SLUICE_NODE", "SLURMD_NODENAME"}) {
    const char* value = std::getenv(variable);
    if (value != nullptr && value[0] != '\0') return value;
  }
  char host[256] = {0};
  if (gethostname(host, sizeof(host) - 1) != 0) return "";
  return host;
}

}  // namespace sluice

#endif  // SLUICE_SERVER_COMMON_NODE_NAME_H_
