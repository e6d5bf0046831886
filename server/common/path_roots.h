// PathRoots: the directories a server may read files from, and the check
// that a client-named path lies inside them.
//
// A path is normalised lexically ("." and ".." resolved), checked against
// the roots, then resolved with realpath (symlinks) and checked again, so
// neither "../" nor a symlink leads outside. The data server reads shards
// this way (--roots), the coordinator manifest files (--manifest_roots).
// Immutable after Create: safe to share between threads.
#ifndef SLUICE_SERVER_COMMON_PATH_ROOTS_H_
#define SLUICE_SERVER_COMMON_PATH_ROOTS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace sluice {

class PathRoots {
 public:
  // `roots` must be existing directories (empty entries are skipped); `flag`
  // names them in messages ("--roots"). INVALID_ARGUMENT otherwise.
  static absl::StatusOr<PathRoots> Create(const std::vector<std::string>& roots,
                                          absl::string_view flag);

  // The real path of absolute `path` if it lies inside a root.
  // PERMISSION_DENIED (naming `what` and the flag) if it does not, before or
  // after resolving symlinks; INVALID_ARGUMENT if it is not absolute or holds
  // a NUL byte; NOT_FOUND and the like from realpath.
  absl::StatusOr<std::string> Resolve(absl::string_view path,
                                      absl::string_view what) const;
  bool Contains(absl::string_view real_path) const;
  const std::vector<std::string>& roots() const { return roots_; }

 private:
  PathRoots(std::vector<std::string> roots, std::string flag)
      : roots_(std::move(roots)), flag_(std::move(flag)) {}
  std::vector<std::string> roots_;  // real paths
  std::string flag_;
};

// "/a/./b/../c//d" -> "/a/c/d" (lexical; ".." above "/" stays at "/").
std::string NormalizeAbsolutePath(absl::string_view path);

}  // namespace sluice

#endif  // SLUICE_SERVER_COMMON_PATH_ROOTS_H_
