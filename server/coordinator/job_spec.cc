#include "server/coordinator/job_spec.h"

#include <fcntl.h>
#include <google/protobuf/util/json_util.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "server/common/quote.h"
#include "server/common/shuffle_window.h"
#include "server/common/status_macros.h"
#include "server/coordinator/lease_table.h"

namespace sluice {
namespace {

constexpr int64_t kDefaultLeaseTtlMs = 10000;

bool ValidName(const std::string& name) {
  if (name.empty() || name.size() > 128) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
           (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
  });
}

bool SupportedUrl(const std::string& url) {
  return absl::StartsWith(url, "/") || absl::StartsWith(url, "file:///") ||
         absl::StartsWith(url, "http://") ||
         absl::StartsWith(url, "https://") || absl::StartsWith(url, "s3://");
}

// Limits on what one CreateJob can make the coordinator plan and hold.
// Samples per dataset: far beyond any real one, and far from int64's end
// (quotas and counts are summed).
constexpr int64_t kMaxTotalSamples = int64_t{1} << 50;
constexpr size_t kMaxUrlBytes = 4096;

absl::Status Invalid(absl::string_view field, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", why));
}

// The manifest at `path`, read only inside `files.roots`: a regular file
// (a FIFO or device is refused without blocking) of at most
// files.max_bytes. Errors name the path, never the file's content.
absl::StatusOr<v1::Manifest> ReadManifestFile(const std::string& path,
                                              const ManifestFiles& files) {
  const std::string field = "spec.manifest_path";
  const std::string shown = QuotePrefix(path);
  if (files.roots == nullptr || files.roots->roots().empty()) {
    return Invalid(field,
                   "this coordinator reads no manifest files (start it with "
                   "--manifest_roots=DIR, or send the manifest inline)");
  }
  absl::StatusOr<std::string> resolved =
      files.roots->Resolve(path, absl::StrCat(field, " ", shown));
  if (!resolved.ok() &&
      resolved.status().code() != absl::StatusCode::kPermissionDenied) {
    // A missing file is a bad field, like any other.
    return absl::InvalidArgumentError(resolved.status().message());
  }
  RETURN_IF_ERROR(resolved.status());
  const std::string& real = *resolved;
  const int fd =
      open(real.c_str(), O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0)
    return Invalid(field, absl::StrCat(shown, ": ", std::strerror(errno)));
  struct Closer {
    int fd;
    ~Closer() { close(fd); }
  } closer{fd};
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    return Invalid(field, absl::StrCat(shown, " is not a regular file"));
  }
  if (st.st_size > files.max_bytes) {
    return Invalid(
        field, absl::StrCat(shown, " is ", st.st_size, " bytes; the limit is ",
                            files.max_bytes, " (--max_manifest_bytes)"));
  }
  std::string text(static_cast<size_t>(st.st_size), '\0');
  size_t got = 0;
  while (got < text.size()) {
    const ssize_t n = read(fd, text.data() + got, text.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return Invalid(field, absl::StrCat(shown, ": read failed"));
    got += static_cast<size_t>(n);
  }
  v1::Manifest manifest;
  if (!google::protobuf::util::JsonStringToMessage(text, &manifest).ok()) {
    return Invalid(
        field,
        absl::StrCat(shown, " is not a JSON manifest ({\"shards\": [...]})"));
  }
  return manifest;
}

}  // namespace

absl::StatusOr<v1::JobSpec> NormalizeJobSpec(const v1::JobSpec& in,
                                             const ManifestFiles& files,
                                             const JobLimits& limits) {
  v1::JobSpec spec = in;
  if (!ValidName(spec.name())) {
    return Invalid("spec.name",
                   absl::StrCat(QuotePrefix(spec.name()),
                                " must be 1-128 characters of [A-Za-z0-9._-]"));
  }
  if (spec.dataset_case() == v1::JobSpec::kManifestPath) {
    ASSIGN_OR_RETURN(v1::Manifest manifest,
                     ReadManifestFile(spec.manifest_path(), files));
    *spec.mutable_manifest() = std::move(manifest);
  } else if (spec.dataset_case() != v1::JobSpec::kManifest) {
    return Invalid("spec.dataset", "set manifest or manifest_path");
  }
  const auto& shards = spec.manifest().shards();
  if (shards.empty())
    return Invalid("spec.manifest", "empty dataset (no shards)");
  // Views into the spec's own strings: a million-shard manifest must not be
  // copied again just to find duplicates.
  absl::flat_hash_map<absl::string_view, int> seen;
  seen.reserve(static_cast<size_t>(shards.size()));
  int64_t total = 0;
  for (int i = 0; i < shards.size(); ++i) {
    const v1::Shard& s = shards[i];
    const std::string field = absl::StrCat("spec.manifest.shards[", i, "]");
    if (s.url().size() > kMaxUrlBytes) {
      return Invalid(field + ".url",
                     absl::StrCat(QuotePrefix(s.url()), " is longer than ",
                                  kMaxUrlBytes, " bytes"));
    }
    if (!SupportedUrl(s.url())) {
      return Invalid(field + ".url",
                     absl::StrCat(QuotePrefix(s.url()),
                                  ": use an absolute path, file://, "
                                  "http(s):// or s3://"));
    }
    auto [it, inserted] = seen.emplace(s.url(), i);
    if (!inserted) {
      return Invalid(field + ".url",
                     absl::StrCat(QuotePrefix(s.url()), " duplicates shards[",
                                  it->second, "]"));
    }
    if (s.num_samples() < 0)
      return Invalid(field + ".num_samples", "must be >= 0");
    if (s.num_samples() > kMaxTotalSamples - total) {
      return Invalid(field + ".num_samples",
                     absl::StrCat(s.num_samples(), " brings the dataset past ",
                                  kMaxTotalSamples, " samples"));
    }
    if (s.size_bytes() < 0)
      return Invalid(field + ".size_bytes", "must be >= 0");
    if (!s.checksum().empty()) {
      absl::string_view hex = s.checksum();
      if (!absl::ConsumePrefix(&hex, "sha256:") || hex.size() != 64 ||
          !std::all_of(hex.begin(), hex.end(), [](char c) {
            return absl::ascii_isxdigit(static_cast<unsigned char>(c));
          })) {
        return Invalid(field + ".checksum",
                       absl::StrCat(QuotePrefix(s.checksum()),
                                    " is not \"sha256:<64 hex digits>\""));
      }
    }
    total += s.num_samples();
  }
  if (total == 0) return Invalid("spec.manifest", "empty dataset (0 samples)");
  if (spec.world_size() < 0)
    return Invalid("spec.world_size", "must be >= 0 (0 = no quotas)");
  if (spec.world_size() > limits.max_world_size) {
    return Invalid("spec.world_size",
                   absl::StrCat(spec.world_size(), " is above the limit of ",
                                limits.max_world_size, " (--max_world_size)"));
  }
  if (spec.num_epochs() < 0)
    return Invalid("spec.num_epochs", "must be >= 0 (0 = endless)");
  if (spec.lease_ttl_ms() < 0 ||
      (spec.lease_ttl_ms() > 0 &&
       spec.lease_ttl_ms() < absl::ToInt64Milliseconds(LeaseTable::kMinTtl))) {
    return Invalid(
        "spec.lease_ttl_ms",
        absl::StrCat(spec.lease_ttl_ms(), " is below the minimum of ",
                     absl::ToInt64Milliseconds(LeaseTable::kMinTtl)));
  }
  if (spec.max_samples_per_lease() < 0)
    return Invalid("spec.max_samples_per_lease", "must be >= 0");
  // Units an epoch plan holds (each costs memory in the plan, the queues and
  // the journal): one per max_samples_per_lease samples of each shard, plus
  // a cut per rank.
  int64_t units = spec.world_size();
  for (const v1::Shard& s : shards) {
    const int64_t per = spec.max_samples_per_lease() > 0
                            ? spec.max_samples_per_lease()
                            : std::max<int64_t>(s.num_samples(), 1);
    units += s.num_samples() / per + 1;
    if (units > limits.max_units_per_epoch) {
      return Invalid(
          "spec.max_samples_per_lease",
          absl::StrCat(spec.max_samples_per_lease(),
                       " cuts an epoch into more than ",
                       limits.max_units_per_epoch,
                       " units (--max_units_per_epoch); use larger units"));
    }
  }
  if (spec.shuffle_window() < 0 ||
      spec.shuffle_window() > kMaxShuffleWindowShards) {
    return Invalid("spec.shuffle_window",
                   absl::StrCat(spec.shuffle_window(), " is outside [0, ",
                                kMaxShuffleWindowShards,
                                "] (0 = default, 1 = shard order only)"));
  }
  if (!v1::Mode_IsValid(spec.mode()))
    return Invalid("spec.mode", "unknown value");
  if (!v1::Remainder_IsValid(spec.remainder()))
    return Invalid("spec.remainder", "unknown value");
  if (!v1::CorruptPolicy_IsValid(spec.on_corrupt()))
    return Invalid("spec.on_corrupt", "unknown value");
  if (spec.mode() == v1::MODE_UNSPECIFIED) spec.set_mode(v1::MODE_STATIC);
  if (spec.remainder() == v1::REMAINDER_UNSPECIFIED)
    spec.set_remainder(v1::REMAINDER_DROP);
  if (spec.on_corrupt() == v1::CORRUPT_POLICY_UNSPECIFIED)
    spec.set_on_corrupt(v1::CORRUPT_POLICY_SKIP);
  if (spec.lease_ttl_ms() == 0) spec.set_lease_ttl_ms(kDefaultLeaseTtlMs);
  if (spec.shuffle() && spec.shuffle_window() == 0)
    spec.set_shuffle_window(kDefaultShuffleWindow);
  return spec;
}

}  // namespace sluice
