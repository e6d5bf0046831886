#!/bin/bash
# How long a newcomer and a contributor wait, measured on a fresh Debian
# bookworm machine: a new container made from Debian's packages (the base
# image k8s/image/build.sh makes with mmdebstrap), given only what a user
# installs before cloning (git, make). In it:
#   1. git clone + `make run`, until the demo prints VERIFIED (packages,
#      configure, the build of the servers, sluicectl and the Python package,
#      the demo);
#   2. `make run` again (the second start);
#   3. `make build` (the test packages and every test target; not timed);
#   4. `make check` from that warm tree.
# Prints each step's seconds and ends with one JSON line.
#
#   usage: sudo tests/deploy/fresh_machine.sh [REPO]   (default: this checkout's HEAD)
#
# Needs podman and mmdebstrap (`make image-deps`) and network access to the
# Debian mirror; takes about as long as what it measures.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
repo=${1:-$root}
export CONTAINERS_CONF="$root/k8s/image/containers.conf"

for tool in podman mmdebstrap; do
  command -v "$tool" > /dev/null || { echo "fresh_machine.sh: $tool not found (make image-deps installs it)"; exit 1; }
done
if ! podman image exists localhost/debian:bookworm; then
  echo "base image localhost/debian:bookworm: creating with mmdebstrap"
  mmdebstrap --variant=apt --quiet bookworm - http://deb.debian.org/debian |
    podman import - localhost/debian:bookworm > /dev/null
fi

echo "fresh_machine.sh: $(nproc) cores; repository $repo at $(git -C "$repo" rev-parse --short HEAD)"
podman run --rm --network=host -v "$repo:/src:ro" localhost/debian:bookworm bash -c '
  set -euo pipefail
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q > /dev/null && apt-get install -y -q --no-install-recommends git make ca-certificates > /dev/null
  git config --global --add safe.directory "*"
  cd /root
  step() {  # step NAME COMMAND...: runs it, logs to /root/NAME.log, prints seconds
    local name=$1; shift
    local t0=$(date +%s%N)
    if ! "$@" > /root/$name.log 2>&1; then
      echo "step $name failed; its log ends:"; tail -n 40 /root/$name.log; exit 1
    fi
    local ms=$(( ($(date +%s%N) - t0) / 1000000 ))
    printf "%-20s %5d.%d s\n" "$name" $((ms / 1000)) $((ms % 1000 / 100))
    echo "$name=$((ms / 1000)).$((ms % 1000 / 100))" >> /root/times
  }
  step clone_to_verified bash -c "git clone -q /src sluice && cd sluice && make run | tee /dev/stderr | grep -q ^VERIFIED"
  step second_run bash -c "cd sluice && make run | grep -q ^VERIFIED"
  step build_for_tests bash -c "cd sluice && make build"
  step check bash -c "cd sluice && make check"
  . /root/times
  echo "{\"bench\":\"fresh_machine\",\"cores\":$(nproc),\"clone_to_verified_s\":$clone_to_verified,\"second_run_s\":$second_run,\"build_for_tests_s\":$build_for_tests,\"check_s\":$check}"
'
