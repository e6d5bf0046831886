// Remote shards through the shard cache, next to baselines measured in the
// same run:
//   cold  ReadSamples of every shard from a fresh cache (each shard is
//         downloaded from nginx on 127.0.0.1, verified, installed, then
//         streamed), --streams reads in flight like a Reader, vs `curl`
//         downloading the same files to disk (one process, one connection).
//   warm  the same reads again (cache hits) vs ReadSamples of the same shards
//         as local files (--roots) on a second data server: the local-disk
//         figure of the data-server benchmark.
// Both data servers are the real binary; nginx is Debian's. Prints the
// figures and ratios and ends with one line of JSON.
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "sluice/v1/dataserver.grpc.pb.h"
#include "tests/bench/bench_util.h"
#include "tests/testing/nginx.h"
#include "tests/testing/process.h"
#include "tests/testing/temp_dir.h"

ABSL_FLAG(int, shards, 8,
          "Shards to write (each --samples_per_shard samples).");
ABSL_FLAG(int, samples_per_shard, 250, "Samples per shard (~85 KB each).");
ABSL_FLAG(int, streams, 4,
          "ReadSamples streams in flight (units a Reader prefetches).");
ABSL_FLAG(double, seconds, 4, "Seconds per warm measurement.");

namespace {

using Clock = std::chrono::steady_clock;
using Units = std::vector<std::pair<std::string, int64_t>>;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

// Reads every unit once with `streams` concurrent streams; returns payload
// bytes read.
int64_t ReadAll(sluice::v1::DataServer::Stub& stub, const Units& units,
                int streams) {
  std::atomic<size_t> next{0};
  std::atomic<int64_t> bytes{0};
  std::vector<std::thread> workers;
  for (int w = 0; w < streams; ++w) {
    workers.emplace_back([&] {
      for (size_t i = next++; i < units.size(); i = next++) {
        grpc::ClientContext ctx;
        sluice::v1::ReadRequest request;
        request.mutable_lease()->mutable_unit()->mutable_shard()->set_url(
            units[i].first);
        request.mutable_lease()->mutable_unit()->set_begin(0);
        request.mutable_lease()->mutable_unit()->set_end(units[i].second);
        auto reader = stub.ReadSamples(&ctx, request);
        sluice::v1::SampleBatch batch;
        while (reader->Read(&batch)) {
          for (const auto& s : batch.samples()) {
            for (const auto& f : s.fields())
              bytes += static_cast<int64_t>(f.raw().size());
          }
        }
        grpc::Status status = reader->Finish();
        if (!status.ok()) {
          std::fprintf(stderr, "ReadSamples %s failed: %s\n",
                       units[i].first.c_str(), status.error_message().c_str());
          std::exit(1);
        }
      }
    });
  }
  for (auto& t : workers) t.join();
  return bytes.load();
}

// Payload bytes per second reading `units` over and over for `seconds`.
double ReadRate(sluice::v1::DataServer::Stub& stub, const Units& units,
                int streams, double seconds) {
  int64_t bytes = 0;
  auto start = Clock::now();
  while (Seconds(start) < seconds) bytes += ReadAll(stub, units, streams);
  return bytes / Seconds(start);
}

std::unique_ptr<sluice::v1::DataServer::Stub> Stub(const std::string& address) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  return sluice::v1::DataServer::NewStub(grpc::CreateCustomChannel(
      address, grpc::InsecureChannelCredentials(), args));
}

int64_t FileSize(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 ? st.st_size : 0;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  signal(SIGPIPE, SIG_IGN);
  sluice::testing::TempDir dir;
  const std::string docroot = dir.File("www");
  mkdir(docroot.c_str(), 0755);
  mkdir(dir.File("nginx").c_str(), 0755);
  mkdir(dir.File("curl").c_str(), 0755);
  std::fprintf(stderr, "writing %d shards of %d samples...\n",
               absl::GetFlag(FLAGS_shards),
               absl::GetFlag(FLAGS_samples_per_shard));
  auto shards = sluice::bench::WriteShards(
      docroot, absl::GetFlag(FLAGS_shards),
      absl::GetFlag(FLAGS_samples_per_shard), sluice::bench::MakeJpegs());
  auto nginx = sluice::testing::Nginx::Start(dir.File("nginx"), docroot);
  if (!nginx.ok()) {
    std::fprintf(stderr, "%s\n", nginx.status().ToString().c_str());
    return 1;
  }
  Units remote, local;
  int64_t shard_bytes = 0;
  std::vector<std::string> curl_argv = {"/usr/bin/curl", "-s", "--fail"};
  for (const auto& [path, count] : shards) {
    const std::string name = path.substr(path.rfind('/') + 1);
    const std::string url = (*nginx)->base_url() + "/" + name;
    remote.emplace_back(url, count);
    local.emplace_back(path, count);
    shard_bytes += FileSize(path);
    curl_argv.push_back("-o");
    curl_argv.push_back(dir.File("curl/" + name));
    curl_argv.push_back(url);
  }

  // Baseline: curl downloads every shard to disk (connection reused).
  std::fprintf(stderr, "curl baseline...\n");
  double curl_seconds = 0;
  for (int round = 0; round < 3;
       ++round) {  // best of three, like the data server gets
    auto start = Clock::now();
    auto child = sluice::testing::ChildProcess::Start(curl_argv);
    if (!child.ok() || *child->Wait(absl::Minutes(5)) != 0) {
      std::fprintf(stderr, "curl failed\n");
      return 1;
    }
    double s = Seconds(start);
    if (round == 0 || s < curl_seconds) curl_seconds = s;
  }

  // Cold: a fresh cache per round; best of three.
  std::fprintf(stderr, "cold reads...\n");
  double cold_seconds = 0;
  std::unique_ptr<sluice::testing::ServerProcess> cached;
  for (int round = 0; round < 3; ++round) {
    const std::string sub = absl::StrCat("ds-cold-", round);
    mkdir(dir.File(sub).c_str(), 0755);
    auto server = sluice::testing::StartServer(
        "sluice-dataserver", dir.File(sub),
        {"--cache_dir=" + dir.File(sub + "/cache")});
    if (!server.ok()) {
      std::fprintf(stderr, "%s\n", server.status().ToString().c_str());
      return 1;
    }
    auto stub = Stub(server->grpc_address);
    auto start = Clock::now();
    ReadAll(*stub, remote, absl::GetFlag(FLAGS_streams));
    double s = Seconds(start);
    if (round == 0 || s < cold_seconds) cold_seconds = s;
    cached =
        std::make_unique<sluice::testing::ServerProcess>(std::move(*server));
  }

  std::fprintf(stderr, "warm reads and local-disk reads...\n");
  const double seconds = absl::GetFlag(FLAGS_seconds);
  auto warm_stub = Stub(cached->grpc_address);
  mkdir(dir.File("ds-local").c_str(), 0755);
  auto local_server = sluice::testing::StartServer(
      "sluice-dataserver", dir.File("ds-local"), {"--roots=" + docroot});
  if (!local_server.ok()) return 1;
  auto local_stub = Stub(local_server->grpc_address);
  const int streams = absl::GetFlag(FLAGS_streams);
  ReadAll(*local_stub, local, streams);  // page cache and index warm for both
  ReadAll(*warm_stub, remote, streams);
  double warm = ReadRate(*warm_stub, remote, streams, seconds);
  double local_rate = ReadRate(*local_stub, local, streams, seconds);

  const double mb = 1e6;
  const double curl_rate = shard_bytes / curl_seconds;
  const double cold_rate = shard_bytes / cold_seconds;
  std::printf("shards: %zu, %.1f MB; %d streams in flight\n", shards.size(),
              shard_bytes / mb, streams);
  std::printf("cold (download + verify + install + stream): %8.1f MB/s\n",
              cold_rate / mb);
  std::printf("curl to disk (baseline):                     %8.1f MB/s\n",
              curl_rate / mb);
  std::printf("cold / curl:                                 %8.2f\n",
              cold_rate / curl_rate);
  std::printf(
      "warm (cache hits):                           %8.1f MB/s payload\n",
      warm / mb);
  std::printf(
      "local disk (--roots, baseline):              %8.1f MB/s payload\n",
      local_rate / mb);
  std::printf("warm / local:                                %8.2f\n",
              warm / local_rate);
  std::printf("%s\n", absl::StrFormat(
                          "{\"bench\":\"remote_shards\",\"cold_mb_per_s\":%.0f,"
                          "\"curl_mb_per_s\":%.0f,\"cold_ratio\":%.2f,"
                          "\"warm_mb_per_s\":%.0f,\"local_mb_per_s\":%.0f,"
                          "\"warm_ratio\":%.2f}",
                          cold_rate / mb, curl_rate / mb, cold_rate / curl_rate,
                          warm / mb, local_rate / mb, warm / local_rate)
                          .c_str());
  return 0;
}
