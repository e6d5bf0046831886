// JobSpec validation: every field checked (INVALID_ARGUMENT naming it),
// defaults filled in, and a manifest_path read into the spec, only from the
// directories the coordinator was told to read manifests from.
#ifndef SLUICE_SERVER_COORDINATOR_JOB_SPEC_H_
#define SLUICE_SERVER_COORDINATOR_JOB_SPEC_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "server/common/path_roots.h"
#include "sluice/v1/coordinator.pb.h"

namespace sluice {

// JobSpec.shuffle_window when a shuffled job leaves it 0.
inline constexpr int32_t kDefaultShuffleWindow = 32;

// What one JobSpec may make the coordinator plan (INVALID_ARGUMENT naming
// the field and the limit beyond it).
struct JobLimits {
  int32_t max_world_size = 65536;
  // Units of one epoch's plan (each held in the plan, the queues and the
  // journal).
  int64_t max_units_per_epoch = 4'000'000;
};

// Where and how much JobSpec.manifest_path may read (see CoordinatorOptions).
struct ManifestFiles {
  const PathRoots* roots = nullptr;  // null = manifest_path refused
  int64_t max_bytes = 256 << 20;
};

// Validates `spec` and returns it with defaults filled in and the manifest
// inline (manifest_path read and parsed, only inside `files.roots`; no file
// content is ever quoted in an error). INVALID_ARGUMENT names the field,
// PERMISSION_DENIED a path outside the roots.
absl::StatusOr<v1::JobSpec> NormalizeJobSpec(const v1::JobSpec& spec,
                                             const ManifestFiles& files = {},
                                             const JobLimits& limits = {});

}  // namespace sluice

#endif  // SLUICE_SERVER_COORDINATOR_JOB_SPEC_H_
