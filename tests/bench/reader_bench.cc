// End-to-end throughput through sluice::Reader (coordinator + one data
// server, real binaries on loopback) next to direct ReadSamples calls to the
// same data server over the same shards, in the same run. Target: Reader
// >= 0.9x direct (coordination nearly free). --decode for decoded mode.
#include <grpcpp/grpcpp.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "sluice/reader.h"
#include "sluice/v1/coordinator.grpc.pb.h"
#include "sluice/v1/dataserver.grpc.pb.h"
#include "tests/bench/bench_util.h"
#include "tests/testing/coordinator_client.h"
#include "tests/testing/http.h"
#include "tests/testing/process.h"
#include "tests/testing/temp_dir.h"

ABSL_FLAG(bool, decode, false,
          "Decoded mode (full-size JPEG decode on the data server).");
ABSL_FLAG(double, seconds, 2, "Seconds per measurement.");
ABSL_FLAG(int, rounds, 3,
          "Alternating rounds of direct / Reader; medians are compared.");
ABSL_FLAG(int, shards, 8, "Shards.");
ABSL_FLAG(int, samples_per_shard, 250, "Samples per shard.");
ABSL_FLAG(int, units_in_flight, 4, "ReaderOptions.units_in_flight.");
ABSL_FLAG(int, buffer_samples, 256, "ReaderOptions.buffer_samples.");
ABSL_FLAG(std::string, coordinator, "",
          "Measure only the Reader against this running cluster's --job (used "
          "by the Python "
          "benchmark for its C++ figure); empty = start a cluster and compare "
          "with direct reads.");
ABSL_FLAG(std::string, job, "",
          "With --coordinator: the (endless) job to read.");
ABSL_FLAG(bool, tune_malloc, false,
          "Call sluice::TuneMallocForStreaming() first (as a program reading "
          "through a Reader "
          "may; the servers do it by default).");

namespace {

using Clock = std::chrono::steady_clock;

struct Rate {
  double bytes_per_s = 0, samples_per_s = 0;
};

int64_t FieldBytes(const sluice::v1::Field& f) {
  return static_cast<int64_t>(f.has_tensor() ? f.tensor().data().size()
                                             : f.raw().size());
}

Rate Direct(const std::string& address,
            const std::vector<std::pair<std::string, int64_t>>& units,
            bool decode, double seconds) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  auto stub = sluice::v1::DataServer::NewStub(grpc::CreateCustomChannel(
      address, grpc::InsecureChannelCredentials(), args));
  int64_t bytes = 0, samples = 0;
  auto start = Clock::now();
  auto elapsed = [&] {
    return std::chrono::duration<double>(Clock::now() - start).count();
  };
  while (elapsed() < seconds) {
    for (const auto& [url, count] : units) {
      grpc::ClientContext ctx;
      sluice::v1::ReadRequest r;
      r.mutable_lease()->mutable_unit()->mutable_shard()->set_url(url);
      r.mutable_lease()->mutable_unit()->set_end(count);
      r.mutable_decode()->set_decode(decode);
      auto reader = stub->ReadSamples(&ctx, r);
      sluice::v1::SampleBatch batch;
      while (reader->Read(&batch)) {
        for (const auto& s : batch.samples()) {
          ++samples;
          for (const auto& f : s.fields()) bytes += FieldBytes(f);
        }
      }
      if (!reader->Finish().ok()) std::exit(1);
      if (elapsed() >= seconds) break;
    }
  }
  return Rate{bytes / elapsed(), samples / elapsed()};
}

Rate ThroughReader(const std::string& coordinator, const std::string& job,
                   bool decode, double seconds) {
  sluice::ReaderOptions o;
  o.coordinator = coordinator;
  o.job = job;
  o.decode.set_decode(decode);
  o.units_in_flight = absl::GetFlag(FLAGS_units_in_flight);
  o.buffer_samples = absl::GetFlag(FLAGS_buffer_samples);
  auto reader = sluice::Reader::Create(o);
  if (!reader.ok()) std::exit(1);
  int64_t bytes = 0, samples = 0;
  auto start = Clock::now();
  auto elapsed = [&] {
    return std::chrono::duration<double>(Clock::now() - start).count();
  };
  while (elapsed() < seconds) {
    auto e = (*reader)->Next();
    if (!e.ok()) {
      std::fprintf(stderr, "Reader: %s\n", e.status().ToString().c_str());
      std::exit(1);
    }
    if (e->kind == sluice::ReaderEvent::Kind::kDone) break;
    if (e->kind != sluice::ReaderEvent::Kind::kSample) continue;
    ++samples;
    for (const auto& f : e->sample.fields) bytes += FieldBytes(f);
  }
  double t = elapsed();
  (*reader)->Close();
  return Rate{bytes / t, samples / t};
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_tune_malloc) && !sluice::TuneMallocForStreaming()) {
    std::fprintf(
        stderr,
        "--tune_malloc: the allocator refused glibc's mallopt settings\n");
    return 1;
  }
  const bool decode = absl::GetFlag(FLAGS_decode);
  const double seconds = absl::GetFlag(FLAGS_seconds);
  if (!absl::GetFlag(FLAGS_coordinator).empty()) {
    ThroughReader(absl::GetFlag(FLAGS_coordinator), absl::GetFlag(FLAGS_job),
                  decode, 0.5);
    const Rate r = ThroughReader(absl::GetFlag(FLAGS_coordinator),
                                 absl::GetFlag(FLAGS_job), decode, seconds);
    std::printf(
        "{\"bench\":\"cpp_reader\",\"samples_per_s\":%.0f,\"mb_per_s\":%.1f}\n",
        r.samples_per_s, r.bytes_per_s / 1e6);
    return 0;
  }
  sluice::testing::TempDir dir;
  auto units = sluice::bench::WriteShards(
      dir.path(), absl::GetFlag(FLAGS_shards),
      absl::GetFlag(FLAGS_samples_per_shard), sluice::bench::MakeJpegs());
  auto coordinator =
      sluice::testing::StartServer("sluice-coordinator", dir.path());
  if (!coordinator.ok()) return 1;
  auto data = sluice::testing::StartServer(
      "sluice-dataserver", dir.path(),
      {"--metrics_listen=off", "--coordinator=" + coordinator->grpc_address});
  if (!data.ok()) return 1;
  // An endless job over the shards (num_epochs 0): the Reader never runs dry.
  {
    sluice::v1::JobSpec spec;
    spec.set_name("bench");
    for (const auto& [url, n] : units) {
      auto* s = spec.mutable_manifest()->add_shards();
      s->set_url(url);
      s->set_num_samples(n);
    }
    spec.set_world_size(1);
    spec.set_num_epochs(0);
    absl::Status created =
        sluice::testing::CreateJob(coordinator->grpc_address, spec);
    if (!created.ok()) {
      std::fprintf(stderr, "CreateJob: %s\n", created.ToString().c_str());
      return 1;
    }
  }
  // Wait for the data server to register (grants would otherwise name none).
  for (int i = 0; i < 400; ++i) {
    auto page = sluice::testing::HttpGet(
        "http://" + coordinator->metrics_address + "/metrics");
    if (page.ok() && page->body.find("sluice_coordinator_data_servers 1") !=
                         std::string::npos) {
      break;
    }
    absl::SleepFor(absl::Milliseconds(25));  // poll
  }
  Direct(data->grpc_address, units, decode,
         0.5);  // warm the page cache and index
  // Alternate the two so machine noise hits both; compare medians.
  std::vector<Rate> directs, throughs;
  for (int r = 0; r < absl::GetFlag(FLAGS_rounds); ++r) {
    directs.push_back(Direct(data->grpc_address, units, decode, seconds));
    throughs.push_back(
        ThroughReader(coordinator->grpc_address, "bench", decode, seconds));
    std::fprintf(
        stderr, "round %d: direct %.0f samples/s, reader %.0f samples/s\n",
        r + 1, directs.back().samples_per_s, throughs.back().samples_per_s);
  }
  auto median = [](std::vector<Rate> v) {
    std::sort(v.begin(), v.end(), [](const Rate& a, const Rate& b) {
      return a.samples_per_s < b.samples_per_s;
    });
    return v[v.size() / 2];
  };
  Rate direct = median(directs), through = median(throughs);
  double ratio = through.samples_per_s / direct.samples_per_s;
  const char* mode = decode ? "decoded" : "raw";
  std::printf(
      "reader (%s): %.0f samples/s, %.0f MB/s   direct ReadSamples: %.0f "
      "samples/s, %.0f MB/s"
      "   ratio %.2f\n",
      mode, through.samples_per_s, through.bytes_per_s / 1e6,
      direct.samples_per_s, direct.bytes_per_s / 1e6, ratio);
  std::printf(
      "{\"bench\":\"reader_%s\",\"samples_per_s\":%.0f,\"mb_per_s\":%.0f,"
      "\"baseline_samples_per_s\":%.0f,\"baseline_mb_per_s\":%.0f,\"ratio\":%."
      "2f}\n",
      mode, through.samples_per_s, through.bytes_per_s / 1e6,
      direct.samples_per_s, direct.bytes_per_s / 1e6, ratio);
  data->process.Signal(SIGTERM);
  coordinator->process.Signal(SIGTERM);
  (void)data->process.Wait(absl::Seconds(20));
  (void)coordinator->process.Wait(absl::Seconds(20));
  return 0;
}
