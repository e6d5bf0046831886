#!/bin/sh
# clang-tidy with the repository's .clang-tidy over every server/ and
# client/ source in BUILD_DIR's compilation database; fails on any finding.
#   usage: check_tidy.sh SOURCE_DIR BUILD_DIR [JOBS]   (JOBS: default nproc)
set -eu
root=${1:?usage: check_tidy.sh SOURCE_DIR BUILD_DIR}
build=${2:?usage: check_tidy.sh SOURCE_DIR BUILD_DIR}
jobs=${3:-$(nproc)}
command -v run-clang-tidy > /dev/null || {
  echo "run-clang-tidy not found (Debian package clang-tidy)"; exit 1; }
[ -f "$build/compile_commands.json" ] || {
  echo "no $build/compile_commands.json (configure with CMake first)"; exit 1; }
out=$(mktemp)
trap 'rm -f "$out"' EXIT
# -quiet: only findings; files: the regex is matched against each entry's
# absolute path (generated protos under the build tree are left out).
if ! run-clang-tidy -quiet -p "$build" -j "$jobs" \
    "^$(cd "$root" && pwd)/(server|client)/" > "$out" 2>&1; then
  grep -E "(warning|error):" "$out" | sort -u
  echo "clang-tidy found the above (checks and why: .clang-tidy)"
  exit 1
fi
echo "clang-tidy: $(grep -c '"file"' "$build/compile_commands.json") files in the database, server/ and client/ clean"
