#include "server/common/path_roots.h"

#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace sluice {

std::string NormalizeAbsolutePath(absl::string_view path) {
  std::vector<absl::string_view> parts;
  for (absl::string_view part : absl::StrSplit(path, '/')) {
    if (part.empty() || part == ".") continue;
    if (part == "..") {
      if (!parts.empty()) parts.pop_back();
      continue;
    }
    parts.push_back(part);
  }
  std::string out;
  for (absl::string_view part : parts) absl::StrAppend(&out, "/", part);
  return out.empty() ? "/" : out;
}

absl::StatusOr<PathRoots> PathRoots::Create(
    const std::vector<std::string>& roots, absl::string_view flag) {
  std::vector<std::string> resolved;
  for (const std::string& root : roots) {
    if (root.empty()) continue;
    char buf[PATH_MAX];
    if (realpath(root.c_str(), buf) == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, ": \"", root, "\": ", std::strerror(errno)));
    }
    struct stat st;
    if (stat(buf, &st) != 0 || !S_ISDIR(st.st_mode)) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, ": \"", root, "\" is not a directory"));
    }
    resolved.emplace_back(buf);
  }
  return PathRoots(std::move(resolved), std::string(flag));
}

bool PathRoots::Contains(absl::string_view path) const {
  for (const std::string& root : roots_) {
    if (root == "/") return true;
    if (path == root) return true;
    if (absl::StartsWith(path, root) && path.size() > root.size() &&
        path[root.size()] == '/') {
      return true;
    }
  }
  return false;
}

absl::StatusOr<std::string> PathRoots::Resolve(absl::string_view path,
                                               absl::string_view what) const {
  if (path.empty() || path[0] != '/') {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " is not an absolute path"));
  }
  if (absl::StrContains(path, absl::string_view("\0", 1))) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " contains a NUL byte"));
  }
  const std::string lexical = NormalizeAbsolutePath(path);
  if (!Contains(lexical)) {
    return absl::PermissionDeniedError(
        absl::StrCat(what, " is outside ", flag_));
  }
  char buf[PATH_MAX];
  if (realpath(lexical.c_str(), buf) == nullptr) {
    const int err = errno;
    const std::string message = absl::StrCat(what, ": ", std::strerror(err));
    if (err == ENOENT || err == ENOTDIR) return absl::NotFoundError(message);
    if (err == EACCES || err == EPERM || err == ELOOP) {
      return absl::PermissionDeniedError(message);
    }
    return absl::InternalError(message);
  }
  if (!Contains(buf)) {
    return absl::PermissionDeniedError(
        absl::StrCat(what, " resolves (through a symlink) outside ", flag_));
  }
  return std::string(buf);
}

}  // namespace sluice
