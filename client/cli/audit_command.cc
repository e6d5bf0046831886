// sluicectl audit: the samples one reader of a job took in an epoch, in the
// order it took them (sluice::Audit, sluice/audit.h), one line each.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "client/cli/cli.h"
#include "nlohmann/json.hpp"
#include "sluice/audit.h"

ABSL_DECLARE_FLAG(std::string, coordinator);
ABSL_DECLARE_FLAG(absl::Duration, timeout);
ABSL_DECLARE_FLAG(bool, json);
ABSL_DECLARE_FLAG(int32_t, rank);
ABSL_DECLARE_FLAG(int32_t, worker);
ABSL_FLAG(int64_t, epoch, -1, "audit, replay: the epoch (required).");
ABSL_FLAG(int64_t, from, 0,
          "audit: the first position listed (0-based, in the reader's order).");
ABSL_FLAG(int64_t, count, -1,
          "audit: most samples listed (-1 = all from --from on).");
ABSL_FLAG(int64_t, step, -1,
          "audit: the samples of this training step (with --batch_size, "
          "--num_workers) instead of --from/--count.");
ABSL_FLAG(int64_t, batch_size, 0, "audit: samples per step (with --step).");
ABSL_FLAG(int32_t, num_workers, 0,
          "audit: the loop's DataLoader workers (with --step; 0 = none).");
ABSL_FLAG(bool, keys, true,
          "audit: look each sample's key up on a live data server.");

namespace sluice::cli {
namespace {

// One `audit --json` line: the documented shape (client/README.md).
std::string JsonLine(const AuditedSample& s) {
  nlohmann::ordered_json line;
  line["position"] = s.position;
  line["key"] = s.key;
  if (!s.source.empty()) line["source"] = s.source;
  line["shard"] = s.shard_index;
  line["url"] = s.shard_url;
  line["index"] = s.index;
  line["unit"] = s.unit;
  line["unit_kind"] = s.unit_kind;
  // Keys are bytes from the shard: invalid UTF-8 is replaced, never an
  // exception.
  return line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) +
         "\n";
}

}  // namespace

int AuditCommand(const std::vector<std::string>& args) {
  if (args.size() != 1)
    return Usage("audit takes one job name (sluicectl audit JOB --epoch E)");
  AuditOptions options;
  options.coordinator = absl::GetFlag(FLAGS_coordinator);
  options.tls = ClientTlsOrNone();
  options.timeout = absl::GetFlag(FLAGS_timeout);
  options.job = args[0];
  options.epoch = absl::GetFlag(FLAGS_epoch);
  if (options.epoch < 0) return Usage("audit: --epoch is required (0 or more)");
  options.rank = absl::GetFlag(FLAGS_rank);
  options.worker = absl::GetFlag(FLAGS_worker);
  options.from = absl::GetFlag(FLAGS_from);
  if (options.from < 0) return Usage("audit: --from must be 0 or more");
  options.count = absl::GetFlag(FLAGS_count);
  if (options.count < -1)
    return Usage("audit: --count must be -1 (all) or more");
  options.step = absl::GetFlag(FLAGS_step);
  options.batch_size = absl::GetFlag(FLAGS_batch_size);
  options.num_workers = absl::GetFlag(FLAGS_num_workers);
  if (options.step >= 0 && options.batch_size <= 0)
    return Usage("audit: --step needs --batch_size");
  if (options.step >= 0) {
    options.worker = static_cast<int32_t>(
        options.step % std::max<int64_t>(options.num_workers, 1));
  }
  options.keys = absl::GetFlag(FLAGS_keys);
  const bool json = absl::GetFlag(FLAGS_json);
  if (!json) std::printf("# position key shard index source unit_kind unit\n");
  absl::StatusOr<AuditResult> audit =
      Audit(options, [json](const AuditedSample& s) {
        if (json) {
          std::fputs(JsonLine(s).c_str(), stdout);
          return;
        }
        std::printf("%lld %s %s %lld %s %s %lld\n",
                    static_cast<long long>(s.position),
                    s.key.empty() ? "-" : s.key.c_str(), s.shard_url.c_str(),
                    static_cast<long long>(s.index),
                    s.source.empty() ? "-" : s.source.c_str(),
                    s.unit_kind.c_str(), static_cast<long long>(s.unit));
      });
  if (!audit.ok()) {
    return Fail(absl::Status(
        audit.status().code(),
        "audit " + options.job + ": " + std::string(audit.status().message())));
  }
  if (options.keys && !audit->keys_missing.empty()) {
    std::fprintf(stderr, "sluicectl audit: keys not shown: %s\n",
                 audit->keys_missing.c_str());
  }
  if (!json) {
    std::printf(
        "# job %s epoch %lld rank %d worker %d: %lld samples "
        "acknowledged\n",
        options.job.c_str(), static_cast<long long>(options.epoch),
        options.rank, options.worker, static_cast<long long>(audit->total));
  }
  return kOk;
}

}  // namespace sluice::cli
