#!/bin/sh
# The layers, as includes: fails listing each offending line when
#   - client/ includes anything from server/coordinator/ or server/dataserver/
#     (a client builds on the protocol, server/common and server/format only);
#   - server/format/ includes from server/coordinator/ or server/dataserver/
#     (the tar layer knows no service);
#   - server/coordinator/ and server/dataserver/ include each other;
#   - a public client header (client/include/sluice) includes from server/,
#     or gRPC (its options take TLS as PEM text, sluice/tls.h).
set -eu
root=${1:?usage: check_includes.sh SOURCE_DIR}
cd "$root"
bad=""
check() {  # DIR PATTERN WHY
  hits=$(grep -rnE "^#include \"($2)" "$1" --include='*.h' --include='*.cc' || true)
  if [ -n "$hits" ]; then
    bad="$bad
$3:
$hits"
  fi
}
check client 'server/(coordinator|dataserver)/' "client/ includes server internals"
check server/format 'server/(coordinator|dataserver)/' "server/format includes a service"
check server/coordinator 'server/dataserver/' "the coordinator includes the data server"
check server/dataserver 'server/coordinator/' "the data server includes the coordinator"
check client/include 'server/' "a public client header includes server/"
grpc=$(grep -rnE '^#include <grpc' client/include || true)
if [ -n "$grpc" ]; then
  bad="$bad
a public client header includes gRPC:
$grpc"
fi
if [ -n "$bad" ]; then
  echo "include boundaries crossed (see tests/README.md, \"Layers\"):$bad"
  exit 1
fi
echo "include boundaries kept"
