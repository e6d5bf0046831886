// sluicectl read: a job's samples as JSON lines, through the C++ Reader.
#include <google/protobuf/text_format.h>

#include <algorithm>
#include <cstdio>
#include <map>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/cli/cli.h"
#include "nlohmann/json.hpp"
#include "server/common/grpc_status.h"
#include "server/common/grpc_target.h"
#include "server/common/status_macros.h"
#include "server/common/tls_probe.h"
#include "sluice/reader.h"

ABSL_DECLARE_FLAG(std::string, coordinator);
ABSL_DECLARE_FLAG(absl::Duration, timeout);
ABSL_DECLARE_FLAG(std::string, ca_cert);
// read
ABSL_FLAG(std::string, job, "", "read: job name.");
ABSL_FLAG(int32_t, rank, 0, "read, audit, replay: rank.");
ABSL_FLAG(
    int32_t, worker, 0,
    "read, audit, replay: this reader's index among the rank's --workers.");
ABSL_FLAG(int32_t, workers, 0,
          "read: readers sharing the rank (0 = 1); each reads a fixed share of "
          "its quota.");
ABSL_FLAG(int64_t, read_epochs, 0,
          "read: stop after this many epochs end (0 = until the job is done).");
ABSL_FLAG(bool, decode, false,
          "read, replay: ask the data server to decode fields.");
ABSL_FLAG(
    std::string, decode_spec, "",
    "read, replay, audit: a sluice.v1.DecodeSpec in protobuf text format, e.g. "
    "image "
    "transforms: "
    "'transforms { random_resized_crop { height: 224 width: 224 } } "
    "transforms { horizontal_flip { p: 0.5 } }' (implies --decode).");
ABSL_FLAG(std::string, trainer_id, "",
          "read: trainer id (default host-pid-rank-worker).");
ABSL_FLAG(double, rate, 0,
          "read: at most this many samples/s (emulates a training step of "
          "1/N s per sample; time spent waiting for samples is not made up "
          "later; 0 = as fast as possible).");
ABSL_FLAG(absl::Duration, progress_interval, absl::Milliseconds(500),
          "read: longest time between delivering a sample and reporting it.");
ABSL_FLAG(absl::Duration, stall_timeout, absl::Seconds(60),
          "read: a data server stream that sends nothing for this long while "
          "its samples are awaited is given up and the unit re-routed.");

namespace sluice::cli {

namespace {

// One `read` output line: the documented shape (client/README.md).
std::string SampleJsonLine(const Sample& s) {
  nlohmann::ordered_json line;
  line["epoch"] = s.epoch;
  line["rank"] = s.rank;
  if (!s.source.empty()) line["source"] = s.source;
  line["shard"] = s.shard_index;
  line["index"] = s.index;
  // Keys and names are bytes from the shard: invalid UTF-8 is replaced,
  // never an exception.
  line["key"] = s.key;
  nlohmann::ordered_json fields = nlohmann::ordered_json::object();
  nlohmann::ordered_json shapes = nlohmann::ordered_json::object();
  for (const v1::Field& f : s.fields) {
    const size_t size = f.has_tensor()      ? f.tensor().data().size()
                        : f.has_text()      ? f.text().size()
                        : f.has_int_value() ? 8
                                            : f.raw().size();
    fields[f.name()] = size;
    if (f.has_tensor()) {
      shapes[f.name()] = std::vector<int64_t>(f.tensor().shape().begin(),
                                              f.tensor().shape().end());
    }
  }
  line["fields"] = std::move(fields);
  if (!shapes.empty()) line["shapes"] = std::move(shapes);
  if (s.skipped) {
    line["skipped"] = true;
    line["skip_reason"] = s.skip_reason;
  }
  return line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) +
         "\n";
}

}  // namespace

int ReadCommand(const std::vector<std::string>& args) {
  if (!args.empty()) return Usage("read takes no positional arguments");
  ReaderOptions options;
  options.coordinator = absl::GetFlag(FLAGS_coordinator);
  options.tls = ClientTlsOrNone();
  options.job = absl::GetFlag(FLAGS_job);
  if (options.job.empty()) return Usage("read: --job is required");
  options.rank = absl::GetFlag(FLAGS_rank);
  options.worker = absl::GetFlag(FLAGS_worker);
  options.num_workers = absl::GetFlag(FLAGS_workers);
  options.trainer_id = absl::GetFlag(FLAGS_trainer_id);
  if (const std::string spec = absl::GetFlag(FLAGS_decode_spec);
      !spec.empty()) {
    google::protobuf::TextFormat::Parser parser;
    if (!parser.ParseFromString(spec, &options.decode)) {
      return Usage(
          "read: --decode_spec is not a sluice.v1.DecodeSpec in text format");
    }
    options.decode.set_decode(true);
  }
  if (absl::GetFlag(FLAGS_decode)) options.decode.set_decode(true);
  options.progress_interval = absl::GetFlag(FLAGS_progress_interval);
  options.stall_timeout = absl::GetFlag(FLAGS_stall_timeout);
  if (options.stall_timeout <= absl::ZeroDuration()) {
    return Usage("read: --stall_timeout must be positive");
  }
  // Unreachable at the start: fail within --timeout. Once reading, ride out
  // a coordinator restart of up to 30 s (or --timeout, if longer).
  {
    auto channel = CoordinatorChannel(options.coordinator, Credentials());
    const absl::Time deadline = absl::Now() + absl::GetFlag(FLAGS_timeout);
    // A first, short wait: a coordinator that speaks TLS while this client
    // does not (or the reverse) never connects, and is named at once.
    bool connected = channel->WaitForConnected(absl::ToChronoTime(
        std::min(deadline, absl::Now() + absl::Milliseconds(500))));
    if (!connected) {
      absl::Status mismatch =
          CheckTransport("coordinator", options.coordinator,
                         !absl::GetFlag(FLAGS_ca_cert).empty(), "--ca_cert");
      if (!mismatch.ok()) {
        return Fail(absl::Status(mismatch.code(),
                                 absl::StrCat("read: ", mismatch.message())));
      }
      connected = channel->WaitForConnected(absl::ToChronoTime(deadline));
    }
    if (!connected) {
      return Fail(absl::UnavailableError(absl::StrCat(
          "read: coordinator ", options.coordinator, " unreachable for ",
          absl::FormatDuration(absl::GetFlag(FLAGS_timeout)), " (--timeout)")));
    }
  }
  options.reconnect_timeout =
      std::max(absl::GetFlag(FLAGS_timeout), absl::Seconds(30));
  // This process only reads: keep freed megabyte buffers (malloc_tuning.h).
  (void)TuneMallocForStreaming();
  auto reader = Reader::Create(options);
  if (!reader.ok()) return Fail(reader.status());
  const int64_t max_epochs = absl::GetFlag(FLAGS_read_epochs);
  const double rate = absl::GetFlag(FLAGS_rate);
  const absl::Duration step =
      rate > 0 ? absl::Seconds(1 / rate) : absl::ZeroDuration();
  absl::Time step_end = absl::InfinitePast();
  int64_t epochs_done = 0;
  bool began =
      false;  // an epoch began for this reader (else a done job is an error)
  while (true) {
    auto event = (*reader)->Next();
    if (!event.ok()) return Fail(event.status());
    if (event->kind == ReaderEvent::Kind::kDone) {
      if (began) break;
      std::fprintf(stderr, "sluicectl: %s\n", event->message.c_str());
      return kJobDone;
    }
    if (event->kind == ReaderEvent::Kind::kEpochBegin) {
      began = true;
      std::fprintf(stderr,
                   "epoch %lld begins: %lld samples for rank %d (%lld already "
                   "consumed)\n",
                   static_cast<long long>(event->epoch),
                   static_cast<long long>(event->samples_for_rank),
                   options.rank,
                   static_cast<long long>(event->already_consumed));
      continue;
    }
    if (event->kind == ReaderEvent::Kind::kEpochEnd) {
      std::fprintf(stderr, "epoch %lld ends\n",
                   static_cast<long long>(event->epoch));
      if (max_epochs > 0 && ++epochs_done >= max_epochs) break;
      continue;
    }
    const std::string line = SampleJsonLine(event->sample);
    // One write per line: a reader killed mid-run leaves whole lines behind.
    if (write(STDOUT_FILENO, line.data(), line.size()) < 0)
      return Fail(absl::InternalError("stdout closed"));
    if (rate > 0) {
      // An emulated training step: this sample's step ends one step after the
      // last one's. Time spent waiting for samples (leases, an epoch's
      // end) is not saved up for a burst: at most one step of it counts.
      const absl::Time now = absl::Now();
      step_end = std::max(step_end, now - step) + step;
      if (step_end > now) absl::SleepFor(step_end - now);
    }
  }
  ReaderStats stats = (*reader)->stats();
  (*reader)->Close();
  std::fprintf(stderr,
               "read %lld samples (%lld units, %lld re-routed, %lld handed "
               "back, %lld dropped, %lld reconnects)\n",
               static_cast<long long>(stats.delivered),
               static_cast<long long>(stats.units_completed),
               static_cast<long long>(stats.reroutes),
               static_cast<long long>(stats.handed_back),
               static_cast<long long>(stats.dropped_units),
               static_cast<long long>(stats.reconnects));
  return kOk;
}

}  // namespace sluice::cli
