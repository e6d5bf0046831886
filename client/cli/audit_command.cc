// sluicectl audit: the samples one reader of a job took in an epoch, in the
// order it took them (sluice::Audit, sluice/audit.h), one line each.
#include <google/protobuf/text_format.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "client/cli/cli.h"
#include "nlohmann/json.hpp"
#include "sluice/audit.h"

ABSL_DECLARE_FLAG(std::string, coordinator);
ABSL_DECLARE_FLAG(absl::Duration, timeout);
ABSL_DECLARE_FLAG(bool, json);
ABSL_DECLARE_FLAG(int32_t, rank);
ABSL_DECLARE_FLAG(int32_t, worker);
ABSL_DECLARE_FLAG(std::string, decode_spec);
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
ABSL_FLAG(std::string, export_dir, "",
          "audit: write every kept epoch of every reader to "
          "DIR/JOB/epoch-E/rank-R-worker-W.jsonl (--json lines) instead.");
ABSL_FLAG(bool, rolled_back, false,
          "audit: list what resumes cut off the reader's record instead "
          "(samples read after the checkpoint a resume restored).");
ABSL_FLAG(bool, keys, true,
          "audit: look each sample's key up on a live data server.");

namespace sluice::cli {

void AddDrawsJson(const v1::SampleDraws& draws, nlohmann::ordered_json& out) {
  if (draws.source_width() == 0) return;
  out["source_size"] = {draws.source_width(), draws.source_height()};
  nlohmann::ordered_json steps = nlohmann::ordered_json::array();
  for (const v1::GeometryStep& s : draws.steps()) {
    nlohmann::ordered_json step;
    if (s.kind() == "crop") {
      step["crop"] = {s.left(), s.top(), s.width(), s.height()};
    } else {
      step["resize"] = {s.width(), s.height()};
    }
    steps.push_back(std::move(step));
  }
  out["steps"] = std::move(steps);
  out["flip_horizontal"] = draws.flip_horizontal();
  out["flip_vertical"] = draws.flip_vertical();
}

std::string DrawsWord(const v1::SampleDraws& draws) {
  if (draws.source_width() == 0) return "-";
  std::string word =
      absl::StrCat(draws.source_width(), "x", draws.source_height());
  for (const v1::GeometryStep& s : draws.steps()) {
    if (s.kind() == "crop") {
      absl::StrAppend(&word, ":crop(", s.left(), ",", s.top(), ",", s.width(),
                      ",", s.height(), ")");
    } else {
      absl::StrAppend(&word, ":resize(", s.width(), ",", s.height(), ")");
    }
  }
  if (draws.flip_horizontal()) absl::StrAppend(&word, ":hflip");
  if (draws.flip_vertical()) absl::StrAppend(&word, ":vflip");
  return word;
}

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
  if (s.reread) line["reread"] = true;
  AddDrawsJson(s.draws, line);
  // Keys are bytes from the shard: invalid UTF-8 is replaced, never an
  // exception.
  return line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) +
         "\n";
}

// --export_dir: every reader of every kept epoch, one file each.
int ExportAudit(AuditOptions options, const std::string& dir) {
  auto stub = CoordinatorStub(options.coordinator);
  v1::GetJobRequest request;
  request.set_name(options.job);
  v1::Job job;
  absl::Status s = Rpc(stub->GetJob(Deadline().get(), request, &job),
                       "audit " + options.job);
  if (!s.ok()) return Fail(s);
  const int32_t ranks = std::max(job.spec().world_size(), 1);
  int exported = 0;
  for (int64_t epoch = std::max<int64_t>(job.status().epoch() - 1, 0);
       epoch <= job.status().epoch(); ++epoch) {
    int32_t workers = 1;
    for (int32_t rank = 0; rank < ranks; ++rank) {
      for (int32_t worker = 0; worker < workers; ++worker) {
        const std::string path =
            absl::StrCat(dir, "/", options.job, "/epoch-", epoch);
        std::error_code error;
        std::filesystem::create_directories(path, error);
        if (error) {
          return Fail(absl::InternalError(absl::StrCat(
              "audit: cannot create ", path, ": ", error.message())));
        }
        const std::string file =
            absl::StrCat(path, "/rank-", rank, "-worker-", worker, ".jsonl");
        std::ofstream out(file, std::ios::trunc);
        options.epoch = epoch;
        options.rank = rank;
        options.worker = worker;
        absl::StatusOr<AuditResult> r =
            Audit(options, [&](const AuditedSample& a) { out << JsonLine(a); });
        if (!r.ok() && absl::IsFailedPrecondition(r.status()) && rank == 0 &&
            worker == 0) {
          out.close();
          std::filesystem::remove_all(path, error);
          rank = ranks;  // an epoch not kept: the next one
          break;
        }
        if (!r.ok()) {
          return Fail(absl::Status(
              r.status().code(),
              absl::StrCat("audit ", options.job, ": ", r.status().message())));
        }
        workers = r->workers_per_rank;
        out.close();
        if (!out) return Fail(absl::InternalError("cannot write " + file));
        std::fprintf(stderr,
                     "sluicectl audit: epoch %lld rank %d worker %d: %lld "
                     "samples -> %s\n",
                     static_cast<long long>(epoch), rank, worker,
                     static_cast<long long>(r->total), file.c_str());
        ++exported;
      }
    }
  }
  if (exported == 0) {
    return Fail(absl::FailedPreconditionError(
        absl::StrCat("audit ", options.job, ": no epoch is kept")));
  }
  return kOk;
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
  options.keys = absl::GetFlag(FLAGS_keys);
  options.rolled_back = absl::GetFlag(FLAGS_rolled_back);
  if (const std::string spec = absl::GetFlag(FLAGS_decode_spec);
      !spec.empty()) {
    options.decode.emplace();
    if (!google::protobuf::TextFormat::ParseFromString(spec,
                                                       &*options.decode)) {
      return Usage(
          "audit: --decode_spec is not a sluice.v1.DecodeSpec in text format");
    }
    options.decode->set_decode(true);
  }
  if (const std::string dir = absl::GetFlag(FLAGS_export_dir); !dir.empty())
    return ExportAudit(options, dir);
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
  const bool draws = options.decode.has_value();
  if (!json) {
    std::printf("# position key shard index source unit_kind unit%s\n",
                draws ? " draws" : "");
  }
  absl::StatusOr<AuditResult> audit =
      Audit(options, [json, draws](const AuditedSample& s) {
        if (json) {
          std::fputs(JsonLine(s).c_str(), stdout);
          return;
        }
        std::printf("%lld %s %s %lld %s %s %lld%s%s%s\n",
                    static_cast<long long>(s.position),
                    s.key.empty() ? "-" : s.key.c_str(), s.shard_url.c_str(),
                    static_cast<long long>(s.index),
                    s.source.empty() ? "-" : s.source.c_str(),
                    s.unit_kind.c_str(), static_cast<long long>(s.unit),
                    draws ? " " : "", draws ? DrawsWord(s.draws).c_str() : "",
                    s.reread ? " reread" : "");
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
