#!/bin/sh
# Builds Debian's own Abseil source package (the version installed, with
# Debian's patches and its ABI options: inline namespace, hardening) as
# shared libraries instrumented with -fsanitize=thread, and installs them
# under PREFIX. The ThreadSanitizer build links against these and carries
# them in its RPATH, so every absl::Mutex in the process -- Sluice's and
# the ones inside gRPC -- is seen by TSan. Debian's binary packages are
# built without instrumentation; TSan then sees neither side of a lock.
#
# Usage: tests/tsan/build_abseil.sh PREFIX    (about a minute on 2 cores)
# The source comes through apt (signed Debian archive) with a private
# sources list and state directory; the system's apt setup is untouched.
set -eu

prefix=${1:?usage: build_abseil.sh PREFIX}
version=$(dpkg-query -W -f='${Version}' libabsl-dev 2>/dev/null) || {
  echo "build_abseil.sh: libabsl-dev is not installed (run make deps)" >&2
  exit 1
}
stamp="$prefix/.sluice-abseil-$version"
if [ -f "$stamp" ]; then
  exit 0
fi

work="$prefix.work"
rm -rf "$work" "$prefix"
mkdir -p "$work/parts" "$work/lists/partial" "$work/cache/archives/partial"
cat > "$work/parts/debian-src.sources" <<EOF
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb-src
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF

apt_opts="-o Dir::Etc::SourceList=/dev/null -o Dir::Etc::SourceParts=$work/parts
  -o Dir::State::Lists=$work/lists -o Dir::Cache=$work/cache
  -o APT::Sandbox::User=root -q"
echo "build_abseil.sh: fetching Debian's abseil $version source"
# shellcheck disable=SC2086
apt-get $apt_opts update > "$work/apt.log" 2>&1 || {
  cat "$work/apt.log" >&2
  exit 1
}
# shellcheck disable=SC2086
(cd "$work" && apt-get $apt_opts source "abseil=$version") >> "$work/apt.log" 2>&1 || {
  cat "$work/apt.log" >&2
  exit 1
}
src=$(find "$work" -maxdepth 1 -type d -name 'abseil-*' | head -n 1)

echo "build_abseil.sh: building it with -fsanitize=thread into $prefix"
# -O1 with line tables only (-g1): TSan's reports still name files and
# lines, and the build is shorter than at -O2 -g.
cmake -S "$src" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" \
  -DCMAKE_CXX_STANDARD=17 -DBUILD_SHARED_LIBS=ON \
  -DCMAKE_CXX_FLAGS="-fsanitize=thread -fno-omit-frame-pointer" \
  -DCMAKE_SHARED_LINKER_FLAGS=-fsanitize=thread \
  -DCMAKE_INSTALL_PREFIX="$prefix" -DCMAKE_INSTALL_LIBDIR=lib > "$work/build.log" 2>&1 &&
  cmake --build "$work/build" -j "${JOBS:-2}" >> "$work/build.log" 2>&1 &&
  cmake --install "$work/build" >> "$work/build.log" 2>&1 || {
  tail -n 40 "$work/build.log" >&2
  exit 1
}
# The installed headers must be the ones Sluice compiles against elsewhere.
if ! cmp -s "$prefix/include/absl/base/options.h" /usr/include/absl/base/options.h; then
  echo "build_abseil.sh: $prefix/include/absl/base/options.h differs from Debian's" >&2
  exit 1
fi
rm -rf "$work"
touch "$stamp"
