// JobSpec validation: every field checked (INVALID_ARGUMENT naming it),
// defaults filled in, and a manifest_path read into the spec, only from the
// directories the coordinator was told to read manifests from.
#ifndef SLUICE_SERVER_COORDINATOR_JOB_SPEC_H_
#define SLUICE_SERVER_COORDINATOR_JOB_SPEC_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/common/path_roots.h"
#include "sluice/v1/coordinator.pb.h"

namespace sluice {

// JobSpec.shuffle_window when a shuffled job leaves it 0.
inline constexpr int32_t kDefaultShuffleWindow = 32;
// The largest JobSpec.weight.
inline constexpr int32_t kMaxJobWeight = 1000;

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

// The name of job `job`'s copy for `world_size` ranks
// (CreateJobRequest.copy_of): "<job>.w<world_size>".
std::string CopyJobName(absl::string_view job, int32_t world_size);

// Whether `name` is CopyJobName(`job`, N) for some N >= 1.
bool IsCopyJobName(absl::string_view name, absl::string_view job);

// A CreateJobRequest with copy_of: OK when its spec holds nothing but name
// and world_size (INVALID_ARGUMENT naming the first other field set, or an
// empty name).
absl::Status CheckCopyRequest(const v1::CreateJobRequest& request);

}  // namespace sluice

#endif  // SLUICE_SERVER_COORDINATOR_JOB_SPEC_H_
