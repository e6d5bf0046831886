#!/bin/sh
# Fails, listing the files, when a C++ file under server/, client/ or tests/
# differs from what clang-format makes of it with the repository's
# .clang-format. Fix with: clang-format -i FILE...
set -eu
root=${1:?usage: check_format.sh SOURCE_DIR}
cd "$root"
command -v clang-format > /dev/null || { echo "clang-format not found (make deps installs it)"; exit 1; }
bad=$(find server client tests \( -name '*.cc' -o -name '*.h' \) -print | sort | while read -r f; do
  clang-format --dry-run --Werror "$f" > /dev/null 2>&1 || echo "$f"
done)
if [ -n "$bad" ]; then
  echo "not formatted with .clang-format (clang-format -i these):"
  echo "$bad"
  exit 1
fi
echo "$(find server client tests \( -name '*.cc' -o -name '*.h' \) | wc -l) C++ files formatted"
