#!/bin/bash
# systemd-analyze verify on k8s/systemd/*.service, with ExecStart pointed at
# the built binaries (verify checks the executables exist). Any message
# (an unknown key is only a warning) fails the test.
#   usage: systemd_test.sh SOURCE_DIR BIN_DIR
set -euo pipefail
src=$1
bin=$2
command -v systemd-analyze > /dev/null || { echo "systemd-analyze not found (package systemd)"; exit 1; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
units=()
for unit in "$src"/k8s/systemd/*.service; do
  sed "s|/usr/local/bin/|$bin/|g" "$unit" > "$out/$(basename "$unit")"
  units+=("$out/$(basename "$unit")")
done
[ "${#units[@]}" -eq 3 ] || { echo "expected the coordinator, data server and etcd units"; exit 1; }
if ! systemd-analyze verify --man=no "${units[@]}" > "$out/log" 2>&1 || [ -s "$out/log" ]; then
  cat "$out/log"
  exit 1
fi
# Hardening is on in each.
for u in "${units[@]}"; do
  for key in NoNewPrivileges=yes ProtectSystem=strict DynamicUser=yes CapabilityBoundingSet= \
             RestrictAddressFamilies= SystemCallFilter=@system-service PrivateTmp=yes; do
    grep -q "^$key" "$u" || { echo "$(basename "$u"): missing $key"; exit 1; }
  done
done
echo "systemd: ${#units[@]} units verify cleanly, hardened"
