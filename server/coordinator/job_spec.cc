#include "server/coordinator/job_spec.h"

#include <fcntl.h>
#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>
#include <google/protobuf/util/json_util.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "server/common/mix_order.h"
#include "server/common/pool_name.h"
#include "server/common/quote.h"
#include "server/common/shuffle_window.h"
#include "server/common/status_macros.h"
#include "server/coordinator/lease_table.h"
#include "server/coordinator/mix_plan.h"

namespace sluice {
namespace {

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
// Sources times window shards of a mixed job (a unit holds at most about
// four times this many shards).
constexpr int64_t kMaxMixWindowShards = 4096;

absl::Status Invalid(absl::string_view field, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", why));
}

// The manifest at `path`, read only inside `files.roots`: a regular file
// (a FIFO or device is refused without blocking) of at most
// files.max_bytes. Errors name the path, never the file's content.
absl::StatusOr<v1::Manifest> ReadManifestFile(const std::string& path,
                                              const ManifestFiles& files,
                                              const std::string& field) {
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

// Checks every shard of `manifest` (fields named under `where`) and adds its
// samples to *total.
absl::Status CheckManifest(const v1::Manifest& manifest,
                           const std::string& where, int64_t* total,
                           bool allow_empty = false) {
  const auto& shards = manifest.shards();
  if (shards.empty() && !allow_empty)
    return Invalid(where, "empty dataset (no shards)");
  // Views into the spec's own strings: a million-shard manifest must not be
  // copied again just to find duplicates.
  absl::flat_hash_map<absl::string_view, int> seen;
  seen.reserve(static_cast<size_t>(shards.size()));
  for (int i = 0; i < shards.size(); ++i) {
    const v1::Shard& s = shards[i];
    const std::string field = absl::StrCat(where, ".shards[", i, "]");
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
    if (s.num_samples() > kMaxTotalSamples - *total) {
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
    *total += s.num_samples();
  }
  return absl::OkStatus();
}

// Sources: names, datasets, shares and policies; fills in the manifests and
// samples_per_epoch.
absl::Status NormalizeSources(v1::JobSpec& spec, const ManifestFiles& files) {
  if (spec.sources_size() > kMaxMixSources) {
    return Invalid("spec.sources",
                   absl::StrCat(spec.sources_size(), " sources; at most ",
                                kMaxMixSources));
  }
  absl::flat_hash_map<std::string, int> names;
  int64_t total = 0;
  int64_t fixed = 0;
  bool weighted = false;
  for (int i = 0; i < spec.sources_size(); ++i) {
    v1::Source& src = *spec.mutable_sources(i);
    const std::string field = absl::StrCat("spec.sources[", i, "]");
    if (!ValidName(src.name())) {
      return Invalid(field + ".name",
                     absl::StrCat(QuotePrefix(src.name()),
                                  " must be 1-128 characters of "
                                  "[A-Za-z0-9._-]"));
    }
    auto [it, inserted] = names.emplace(src.name(), i);
    if (!inserted) {
      return Invalid(field + ".name",
                     absl::StrCat("\"", src.name(), "\" duplicates sources[",
                                  it->second, "]"));
    }
    if (src.dataset_case() == v1::Source::kManifestPath) {
      ASSIGN_OR_RETURN(v1::Manifest manifest,
                       ReadManifestFile(src.manifest_path(), files,
                                        field + ".manifest_path"));
      *src.mutable_manifest() = std::move(manifest);
    } else if (src.dataset_case() != v1::Source::kManifest) {
      return Invalid(field, "set manifest or manifest_path");
    }
    if (!v1::OnExhausted_IsValid(src.on_exhausted()))
      return Invalid(field + ".on_exhausted", "unknown value");
    if (src.on_exhausted() == v1::ON_EXHAUSTED_UNSPECIFIED)
      src.set_on_exhausted(v1::ON_EXHAUSTED_REPEAT);
    int64_t samples = 0;
    RETURN_IF_ERROR(CheckManifest(src.manifest(), field + ".manifest", &samples,
                                  /*allow_empty=*/true));
    if (samples > kMaxTotalSamples - total) {
      return Invalid(field + ".manifest",
                     absl::StrCat("brings the sources past ", kMaxTotalSamples,
                                  " samples"));
    }
    total += samples;
    const bool has_weight = src.weight() != 0;
    if (has_weight && !(std::isfinite(src.weight()) && src.weight() > 0)) {
      return Invalid(field + ".weight",
                     absl::StrCat(src.weight(), " must be a positive number"));
    }
    if (src.samples_per_epoch() < 0) {
      return Invalid(field + ".samples_per_epoch",
                     absl::StrCat(src.samples_per_epoch(), " must be > 0"));
    }
    if (has_weight == (src.samples_per_epoch() > 0)) {
      return Invalid(field + ".weight",
                     has_weight ? "set weight or samples_per_epoch, not both"
                                : "set a positive weight or samples_per_epoch");
    }
    if (samples == 0 && src.on_exhausted() == v1::ON_EXHAUSTED_REPEAT) {
      return Invalid(field + ".manifest",
                     absl::StrCat("source \"", src.name(),
                                  "\" has 0 samples, so with on_exhausted "
                                  "REPEAT it can never fill its share"));
    }
    if (src.samples_per_epoch() > kMaxTotalSamples - fixed) {
      return Invalid(
          field + ".samples_per_epoch",
          absl::StrCat("brings the epoch past ", kMaxTotalSamples, " samples"));
    }
    fixed += src.samples_per_epoch();
    weighted = weighted || has_weight;
  }
  const int64_t length = spec.samples_per_epoch();
  if (length < 0 || length > kMaxTotalSamples) {
    return Invalid(
        "spec.samples_per_epoch",
        absl::StrCat(length, " is outside [0, ", kMaxTotalSamples, "]"));
  }
  if (weighted) {
    if (length <= fixed) {
      return Invalid(
          "spec.samples_per_epoch",
          absl::StrCat(length, " leaves nothing for the weighted sources",
                       fixed > 0 ? absl::StrCat(" after the ", fixed,
                                                " samples given by count")
                                 : std::string(" (set the epoch's length)")));
    }
  } else if (length == 0) {
    spec.set_samples_per_epoch(fixed);
  } else if (length != fixed) {
    return Invalid("spec.samples_per_epoch",
                   absl::StrCat(length, " differs from the ", fixed,
                                " samples the sources' counts add up to"));
  }
  return absl::OkStatus();
}

// When every source stops, the epochs after the last one with samples would
// be empty: num_epochs must end before.
absl::Status CheckStoppingSources(const v1::JobSpec& spec,
                                  const std::vector<int64_t>& shares) {
  int64_t last = 0;  // epochs that hold samples
  for (int i = 0; i < spec.sources_size(); ++i) {
    const v1::Source& src = spec.sources(i);
    if (src.on_exhausted() != v1::ON_EXHAUSTED_STOP) return absl::OkStatus();
    int64_t samples = 0;
    for (const v1::Shard& s : src.manifest().shards())
      samples += s.num_samples();
    const int64_t c = shares[static_cast<size_t>(i)];
    if (c > 0) last = std::max(last, (samples + c - 1) / c);
  }
  if (spec.num_epochs() == 0 || spec.num_epochs() > last) {
    return Invalid(
        "spec.num_epochs",
        absl::StrCat(spec.num_epochs(), ": every source stops, and they hold ",
                     "samples for ", last,
                     " epoch(s); set num_epochs to at "
                     "most ",
                     last, " or let a source repeat"));
  }
  return absl::OkStatus();
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
  if (!ValidPoolName(spec.pool())) {
    return Invalid("spec.pool",
                   absl::StrCat(QuotePrefix(spec.pool()),
                                " must be 0-64 characters of [A-Za-z0-9._-]"));
  }
  if (!ValidPoolName(spec.tenant())) {
    return Invalid("spec.tenant",
                   absl::StrCat(QuotePrefix(spec.tenant()),
                                " must be 0-64 characters of [A-Za-z0-9._-]"));
  }
  if (spec.weight() < 0 || spec.weight() > kMaxJobWeight) {
    return Invalid("spec.weight",
                   absl::StrCat(spec.weight(), " is outside [0, ",
                                kMaxJobWeight, "] (0 = 1)"));
  }
  const bool mixed = spec.sources_size() > 0;
  int64_t total = 0;
  if (mixed) {
    if (spec.dataset_case() != v1::JobSpec::DATASET_NOT_SET) {
      return Invalid("spec.sources",
                     "set either sources or manifest/manifest_path, not both");
    }
    RETURN_IF_ERROR(NormalizeSources(spec, files));
  } else {
    if (spec.dataset_case() == v1::JobSpec::kManifestPath) {
      ASSIGN_OR_RETURN(
          v1::Manifest manifest,
          ReadManifestFile(spec.manifest_path(), files, "spec.manifest_path"));
      *spec.mutable_manifest() = std::move(manifest);
    } else if (spec.dataset_case() != v1::JobSpec::kManifest) {
      return Invalid("spec.dataset", "set manifest, manifest_path or sources");
    }
    RETURN_IF_ERROR(CheckManifest(spec.manifest(), "spec.manifest", &total));
    if (total == 0)
      return Invalid("spec.manifest", "empty dataset (0 samples)");
    if (spec.samples_per_epoch() != 0) {
      return Invalid("spec.samples_per_epoch",
                     "applies to jobs with sources only; one dataset's epoch "
                     "is its manifest");
    }
  }
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
  // the journal): one per max_samples_per_lease samples of each shard (or
  // block of a mixed sequence), plus a cut per rank.
  int64_t units = spec.world_size();
  auto add_units = [&](int64_t samples) -> absl::Status {
    const int64_t per = spec.max_samples_per_lease() > 0
                            ? spec.max_samples_per_lease()
                            : std::max<int64_t>(samples, 1);
    units += samples / per + 1;
    if (units > limits.max_units_per_epoch) {
      return Invalid(
          "spec.max_samples_per_lease",
          absl::StrCat(spec.max_samples_per_lease(),
                       " cuts an epoch into more than ",
                       limits.max_units_per_epoch,
                       " units (--max_units_per_epoch); use larger units"));
    }
    return absl::OkStatus();
  };
  if (!mixed) {
    for (const v1::Shard& s : spec.manifest().shards())
      RETURN_IF_ERROR(add_units(s.num_samples()));
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
  if (spec.shuffle() && spec.shuffle_window() == 0)
    spec.set_shuffle_window(kDefaultShuffleWindow);
  if (mixed) {
    // A unit reads about one window of every source, two where it crosses
    // a window's end, each window of fewer than 2 * shuffle_window shards.
    const int64_t window =
        spec.shuffle() && spec.shuffle_window() > 1 ? spec.shuffle_window() : 1;
    if (spec.sources_size() * window > kMaxMixWindowShards) {
      return Invalid(
          "spec.shuffle_window",
          absl::StrCat(
              spec.sources_size(), " sources with windows of ", window,
              " shards could put more than ", 4 * kMaxMixWindowShards,
              " shards in one unit; use shuffle_window <= ",
              std::max<int64_t>(1, kMaxMixWindowShards / spec.sources_size())));
    }
    const std::vector<int64_t> shares = SourceShares(spec);
    const int64_t block = MixBlockSamples(spec, shares);
    int64_t length = 0;
    for (int64_t c : shares) length += c;
    for (int64_t at = 0; at < length; at += block)
      RETURN_IF_ERROR(add_units(std::min(block, length - at)));
    RETURN_IF_ERROR(CheckStoppingSources(spec, shares));
  }
  return spec;
}

std::string CopyJobName(absl::string_view job, int32_t world_size) {
  return absl::StrCat(job, ".w", world_size);
}

bool IsCopyJobName(absl::string_view name, absl::string_view job) {
  if (!absl::ConsumePrefix(&name, job) || !absl::ConsumePrefix(&name, ".w"))
    return false;
  int32_t world_size = 0;
  // CopyJobName's spelling only: "x.w03" or "x.w+3" is a job of its own.
  return absl::SimpleAtoi(name, &world_size) && world_size >= 1 &&
         absl::StrCat(world_size) == name;
}

absl::Status CheckCopyRequest(const v1::CreateJobRequest& request) {
  if (request.spec().name().empty()) {
    return Invalid("spec.name", "the copy's name is required");
  }
  v1::JobSpec rest = request.spec();
  rest.clear_name();
  rest.clear_world_size();
  std::vector<const google::protobuf::FieldDescriptor*> set;
  rest.GetReflection()->ListFields(rest, &set);
  if (!set.empty()) {
    return Invalid(
        absl::StrCat("spec.", set.front()->name()),
        absl::StrCat("a copy of job ", QuotePrefix(request.copy_of()),
                     " takes every field from it but name and world_size"));
  }
  return absl::OkStatus();
}

}  // namespace sluice
