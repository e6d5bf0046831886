#!/bin/bash
# Builds the Sluice image with podman from k8s/image/Dockerfile, the same
# file `docker build` uses. Without a Docker engine, podman runs as root with
# the settings in k8s/image/containers.conf (runc, cgroupfs, no default
# ulimits, host network). The Dockerfile's base images (debian:bookworm,
# debian:bookworm-slim) are made from Debian's packages with mmdebstrap and
# imported when podman does not have them yet; later builds reuse them.
# With --prebuilt the binaries are the host's release build ($BUILD_DIR/bin,
# default build/bin, from `make build` on bookworm) instead of a build inside
# the image: only the runtime-base and prebuilt stages and their base image
# are made.
#   usage: [BUILD_DIR=DIR] k8s/image/build.sh [--prebuilt] [TAG]
#   (default tag sluice:dev; BUILD_DIR relative to the repository or
#   absolute; run from anywhere)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
prebuilt=false
if [ "${1:-}" = --prebuilt ]; then
  prebuilt=true
  shift
fi
tag=${1:-sluice:dev}
export CONTAINERS_CONF="$here/containers.conf"

for tool in podman mmdebstrap; do
  command -v "$tool" > /dev/null || { echo "build.sh: $tool not found (make image-deps installs it)"; exit 1; }
done

# A Debian base image from packages: "apt" variant for the build stage (as
# debian:bookworm), "minbase" without documentation for the runtime.
base_image() {
  local name=$1 variant=$2
  if podman image exists "$name"; then
    echo "base image $name: present"
    return
  fi
  echo "base image $name: creating with mmdebstrap ($variant)"
  mmdebstrap --variant="$variant" --quiet \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin' \
    bookworm - http://deb.debian.org/debian | podman import - "$name" > /dev/null
}
context=$root
if $prebuilt; then
  build_dir=${BUILD_DIR:-build}
  case $build_dir in
    /*) ;;
    *) build_dir=$root/$build_dir ;;
  esac
  for binary in sluice-coordinator sluice-dataserver sluicectl; do
    [ -x "$build_dir/bin/$binary" ] || { echo "build.sh --prebuilt: $build_dir/bin/$binary not found (make build)"; exit 1; }
  done
  # The Dockerfile copies build/bin/*: a context holding only the three
  # binaries at that path, in the build directory (hard links when the
  # file system allows).
  context=$build_dir/image-context
  rm -rf "$context"
  mkdir -p "$context/build/bin"
  for binary in sluice-coordinator sluice-dataserver sluicectl; do
    cp -l "$build_dir/bin/$binary" "$context/build/bin/" 2> /dev/null ||
      cp "$build_dir/bin/$binary" "$context/build/bin/"
  done
  trap 'rm -rf "$context"' EXIT
  target=(--target prebuilt)
  ignore=Dockerfile.prebuilt.dockerignore
  echo "building $tag from k8s/image/Dockerfile with $build_dir/bin's binaries"
else
  base_image localhost/debian:bookworm apt
  target=()
  ignore=Dockerfile.dockerignore
  echo "building $tag from k8s/image/Dockerfile"
fi
base_image localhost/debian:bookworm-slim minbase
previous=$(podman image inspect --format '{{.Id}}' "$tag" 2> /dev/null || true)
podman build --pull=never --network=host "${target[@]}" \
  --ignorefile "$here/$ignore" -f "$here/Dockerfile" -t "$tag" "$context"
size=$(podman image inspect --format '{{.Size}}' "$tag")
echo "image $tag: $((size / 1000000)) MB"
# The image this tag named before: removed once no tag names it (not when
# another tag still does; podman refuses while a container uses it).
current=$(podman image inspect --format '{{.Id}}' "$tag")
if [ -n "$previous" ] && [ "$previous" != "$current" ] &&
  [ -z "$(podman image inspect --format '{{join .RepoTags " "}}' "$previous" 2> /dev/null)" ] &&
  podman rmi "$previous" > /dev/null 2>&1; then
  echo "removed the image $tag named before (${previous:0:12})"
fi
