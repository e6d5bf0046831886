// Data-server throughput over loopback, next to its baselines measured in the
// same run:
//   --mode=raw      ReadSamples of ~100 KB JPEG samples, undecoded, vs a bare
//                   gRPC server stream of the same bytes in one-sample
//                   SampleBatch messages (sync server, same client code).
//   --mode=decoded  ReadSamples with decode=true vs TurboJPEG decoding the
//                   same files in a tight loop on every core.
//   --mode=shuffle  The same samples as units of one shuffle window over all
//                   shards vs units of one shard each, raw and decoded
//                   (--resize, default 224 here), alternating; and the
//                   window's shuffle quality.
// The data server is the real binary (started here on 127.0.0.1:0). Prints
// the figures, the ratio, and ends with one line of JSON.
#include <grpcpp/grpcpp.h>
#include <pthread.h>
#include <signal.h>
#include <turbojpeg.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "server/common/malloc_tuning.h"
#include "server/common/shuffle_window.h"
#include "server/dataserver/decoders.h"
#include "sluice/v1/dataserver.grpc.pb.h"
#include "tests/bench/bench_util.h"
#include "tests/testing/image_fixtures.h"
#include "tests/testing/process.h"
#include "tests/testing/tar_writer.h"
#include "tests/testing/temp_dir.h"

ABSL_FLAG(std::string, mode, "raw", "raw | decoded | shuffle");
ABSL_FLAG(int, shards, 8,
          "Shards to write (each --samples_per_shard samples).");
ABSL_FLAG(int, samples_per_shard, 250, "Samples per shard.");
ABSL_FLAG(double, seconds, 4, "Seconds per measurement.");
ABSL_FLAG(
    int, resize, 0,
    "decoded mode: resize the shorter side to this and center-crop a "
    "square of it (0 = full-size decode). The baseline then does the "
    "same work (TurboJPEG scaled decode + stb resize + crop) in its loop.");
ABSL_FLAG(std::string, serve_bare, "",
          "Internal: run only the bare gRPC baseline server and write its port "
          "to this file (the benchmark starts itself this way, so the baseline "
          "server is a separate process like the data server).");

namespace {

using Clock = std::chrono::steady_clock;
using sluice::v1::SampleBatch;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

// Bare gRPC: one message per sample, the bytes prebuilt in memory.
class BareService final : public sluice::v1::DataServer::Service {
 public:
  explicit BareService(const std::vector<std::string>* payloads)
      : payloads_(payloads) {}
  grpc::Status ReadSamples(grpc::ServerContext* ctx,
                           const sluice::v1::ReadRequest* request,
                           grpc::ServerWriter<SampleBatch>* writer) override {
    SampleBatch batch;
    auto* sample = batch.add_samples();
    auto* field = sample->add_fields();
    field->set_name("jpg");
    for (int64_t i = request->lease().unit().begin();
         i < request->lease().unit().end(); ++i) {
      if (ctx->IsCancelled()) break;
      sample->set_index(i);
      field->set_raw((*payloads_)[static_cast<size_t>(i) % payloads_->size()]);
      if (!writer->Write(batch)) break;
    }
    return grpc::Status::OK;
  }

 private:
  const std::vector<std::string>* payloads_;
};

struct Rate {
  double bytes_per_s = 0;
  double samples_per_s = 0;
};

// Sends `requests` in turn, repeatedly, for `seconds`; counts payload bytes.
Rate ReadRequestsFor(sluice::v1::DataServer::Stub& stub,
                     const std::vector<sluice::v1::ReadRequest>& requests,
                     double seconds) {
  int64_t bytes = 0, samples = 0;
  auto start = Clock::now();
  while (Seconds(start) < seconds) {
    for (const sluice::v1::ReadRequest& request : requests) {
      grpc::ClientContext ctx;
      auto reader = stub.ReadSamples(&ctx, request);
      SampleBatch batch;
      while (reader->Read(&batch)) {
        for (const auto& s : batch.samples()) {
          ++samples;
          for (const auto& f : s.fields()) {
            bytes += static_cast<int64_t>(
                f.has_tensor() ? f.tensor().data().size() : f.raw().size());
          }
        }
      }
      grpc::Status status = reader->Finish();
      if (!status.ok()) {
        std::fprintf(stderr, "ReadSamples failed: %s\n",
                     status.error_message().c_str());
        std::exit(1);
      }
      if (Seconds(start) >= seconds) break;
    }
  }
  double elapsed = Seconds(start);
  return Rate{bytes / elapsed, samples / elapsed};
}

void SetDecode(sluice::v1::ReadRequest& request, bool decode, int resize) {
  request.mutable_decode()->set_decode(decode);
  if (resize > 0) {
    request.mutable_decode()->set_resize_shorter_side(resize);
    request.mutable_decode()->set_crop_height(resize);
    request.mutable_decode()->set_crop_width(resize);
  }
  if (decode) request.add_fields("jpg");
}

// Reads `units` (url, count), each whole, repeatedly for `seconds`.
Rate ReadFor(sluice::v1::DataServer::Stub& stub,
             const std::vector<std::pair<std::string, int64_t>>& units,
             bool decode, double seconds, int resize = 0) {
  std::vector<sluice::v1::ReadRequest> requests;
  for (const auto& [url, count] : units) {
    sluice::v1::ReadRequest request;
    request.mutable_lease()->mutable_unit()->mutable_shard()->set_url(url);
    request.mutable_lease()->mutable_unit()->set_begin(0);
    request.mutable_lease()->mutable_unit()->set_end(count);
    SetDecode(request, decode, resize);
    requests.push_back(std::move(request));
  }
  return ReadRequestsFor(stub, requests, seconds);
}

// The same samples as units of one shuffle window over every shard: unit k
// covers window positions [k * n, (k + 1) * n), n = samples per shard.
std::vector<sluice::v1::ReadRequest> WindowRequests(
    const std::vector<std::pair<std::string, int64_t>>& units, bool decode,
    int resize, uint64_t order) {
  std::vector<sluice::v1::ReadRequest> requests;
  int64_t position = 0;
  for (const auto& [url, count] : units) {
    sluice::v1::ReadRequest request;
    sluice::v1::WorkUnit* unit = request.mutable_lease()->mutable_unit();
    unit->mutable_window()->set_window_order(order);
    for (size_t k = 0; k < units.size(); ++k) {
      sluice::v1::WindowPiece* piece = unit->mutable_window()->add_pieces();
      piece->set_shard_index(static_cast<int32_t>(k));
      piece->set_url(units[k].first);
      piece->set_num_samples(units[k].second);
    }
    unit->set_begin(position);
    unit->set_end(position + count);
    position += count;
    SetDecode(request, decode, resize);
    requests.push_back(std::move(request));
  }
  return requests;
}

// Shuffle quality of one window over `sizes`: the mean number of distinct
// shards per batch of 64 consecutive positions, and the correlation of a
// sample's position with its place in file order (shards concatenated).
struct Quality {
  double shards_per_batch = 0;
  double file_order_correlation = 0;
};
Quality WindowQuality(const std::vector<int64_t>& sizes, uint64_t order) {
  const std::vector<uint16_t> labels = sluice::WindowLabels(sizes, order);
  std::vector<int64_t> first(sizes.size(), 0), next(sizes.size(), 0);
  for (size_t k = 1; k < sizes.size(); ++k)
    first[k] = first[k - 1] + sizes[k - 1];
  Quality q;
  // Distinct shards per whole batch.
  const size_t batches = labels.size() / 64;
  for (size_t b = 0; b < batches; ++b) {
    std::vector<bool> seen(sizes.size(), false);
    for (size_t p = b * 64; p < (b + 1) * 64; ++p) {
      if (!seen[labels[p]]) q.shards_per_batch += 1;
      seen[labels[p]] = true;
    }
  }
  if (batches > 0) q.shards_per_batch /= static_cast<double>(batches);
  // Pearson correlation of (position, place in file order).
  const double n = static_cast<double>(labels.size());
  double sx = 0, sy = 0, sxx = 0, syy = 0, sxy = 0;
  for (size_t p = 0; p < labels.size(); ++p) {
    const double x = static_cast<double>(p);
    const double y = static_cast<double>(first[labels[p]] + next[labels[p]]++);
    sx += x, sy += y, sxx += x * x, syy += y * y, sxy += x * y;
  }
  q.file_order_correlation =
      (n * sxy - sx * sy) /
      std::sqrt((n * sxx - sx * sx) * (n * syy - sy * sy));
  return q;
}

double DecodeLoopRate(const std::vector<std::string>& jpegs, double seconds,
                      int resize) {
  int threads = static_cast<int>(std::thread::hardware_concurrency());
  std::atomic<int64_t> decoded{0};
  auto start = Clock::now();
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      tjhandle h = tjInitDecompress();
      std::vector<unsigned char> out;
      size_t i = static_cast<size_t>(t);
      while (Seconds(start) < seconds) {
        const std::string& j = jpegs[i++ % jpegs.size()];
        if (resize > 0) {
          auto d = sluice::dataserver::DecodeJpeg(
              sluice::dataserver::Payload{j, nullptr},
              {resize, resize, resize});
          if (!d.ok()) std::exit(1);
          ++decoded;
          continue;
        }
        int w, hgt, sub, cs;
        tjDecompressHeader3(h, reinterpret_cast<const unsigned char*>(j.data()),
                            j.size(), &w, &hgt, &sub, &cs);
        out.resize(static_cast<size_t>(w) * hgt * 3);
        tjDecompress2(h, reinterpret_cast<const unsigned char*>(j.data()),
                      j.size(), out.data(), w, 0, hgt, TJPF_RGB, 0);
        ++decoded;
      }
      tjDestroy(h);
    });
  }
  for (auto& t : pool) t.join();
  return decoded / Seconds(start);
}

using sluice::bench::MakeJpegs;

int ServeBare(const std::string& port_file) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  // The same allocator settings as the data server (--tune_malloc, on by
  // default), so the ratio compares the serving code, not malloc tuning.
  (void)sluice::TuneMallocForStreaming();
  std::vector<std::string> payloads = MakeJpegs();
  BareService bare(&payloads);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                           &port);
  builder.RegisterService(&bare);
  auto server = builder.BuildAndStart();
  sluice::testing::WriteFile(
      port_file + ".tmp",
      absl::StrCat("grpc=127.0.0.1:", port, "\nmetrics=off\n"));
  std::rename((port_file + ".tmp").c_str(), port_file.c_str());
  int signo = 0;
  sigwait(&set, &signo);
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (!absl::GetFlag(FLAGS_serve_bare).empty())
    return ServeBare(absl::GetFlag(FLAGS_serve_bare));
  const std::string mode = absl::GetFlag(FLAGS_mode);
  const double seconds = absl::GetFlag(FLAGS_seconds);
  sluice::testing::TempDir dir;
  std::vector<std::string> jpegs = MakeJpegs();
  size_t mean = 0;
  for (const auto& j : jpegs) mean += j.size();
  mean /= jpegs.size();
  const int per_shard = absl::GetFlag(FLAGS_samples_per_shard);
  std::vector<std::pair<std::string, int64_t>> units =
      sluice::bench::WriteShards(dir.path(), absl::GetFlag(FLAGS_shards),
                                 per_shard, jpegs);
  std::fprintf(stderr,
               "%zu shards x %d samples, JPEG mean %zu bytes (500x375)\n",
               units.size(), per_shard, mean);

  auto server = sluice::testing::StartServer("sluice-dataserver", dir.path(),
                                             {"--metrics_listen=off"});
  if (!server.ok()) {
    std::fprintf(stderr, "cannot start sluice-dataserver: %s\n",
                 std::string(server.status().message()).c_str());
    return 1;
  }
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  auto stub = sluice::v1::DataServer::NewStub(grpc::CreateCustomChannel(
      server->grpc_address, grpc::InsecureChannelCredentials(), args));
  ReadFor(*stub, units, mode == "decoded",
          0.5);  // warm the page cache and index

  if (mode == "shuffle") {
    const int resize =
        absl::GetFlag(FLAGS_resize) > 0 ? absl::GetFlag(FLAGS_resize) : 224;
    const uint64_t order = 0x5EED;
    std::vector<int64_t> sizes;
    for (const auto& u : units) sizes.push_back(u.second);
    double rates[2][2] = {};  // [decoded][window]
    for (int decoded = 0; decoded < 2; ++decoded) {
      const auto window = WindowRequests(units, decoded, resize, order);
      ReadRequestsFor(*stub, window, 0.5);  // warm
      // Alternate, so that drift on a shared machine hits both alike.
      for (int round = 0; round < 4; ++round) {
        rates[decoded][0] +=
            ReadFor(*stub, units, decoded, seconds / 4, resize).samples_per_s;
        rates[decoded][1] +=
            ReadRequestsFor(*stub, window, seconds / 4).samples_per_s;
      }
    }
    server->process.Signal(SIGTERM);
    (void)server->process.Wait(absl::Seconds(20));
    const Quality q = WindowQuality(sizes, order);
    const double raw_ratio = rates[0][1] / rates[0][0];
    const double decoded_ratio = rates[1][1] / rates[1][0];
    std::printf(
        "shuffle window of %zu shards: %.1f shards per batch of 64 (1 without),"
        " position/file-order correlation %.3f\n"
        "raw:     window %.0f samples/s   shard units %.0f samples/s   ratio "
        "%.2f\n"
        "decoded (resize %d + crop): window %.0f samples/s   shard units %.0f "
        "samples/s   ratio %.2f\n",
        units.size(), q.shards_per_batch, q.file_order_correlation,
        rates[0][1] / 4, rates[0][0] / 4, raw_ratio, resize, rates[1][1] / 4,
        rates[1][0] / 4, decoded_ratio);
    std::printf(
        "{\"bench\":\"dataserver_shuffle\",\"window_shards\":%zu,"
        "\"shards_per_batch_64\":%.1f,\"file_order_correlation\":%.3f,"
        "\"raw_ratio\":%.2f,\"decoded_ratio\":%.2f}\n",
        units.size(), q.shards_per_batch, q.file_order_correlation, raw_ratio,
        decoded_ratio);
    return 0;
  }

  if (mode == "raw") {
    Rate sluice_rate = ReadFor(*stub, units, false, seconds);
    server->process.Signal(SIGTERM);
    (void)server->process.Wait(absl::Seconds(20));
    // Baseline: the same bytes (one sample per message, the sample i of
    // every unit is jpegs[i % 16] there too) from a bare gRPC server in its
    // own process, read by the same client loop.
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n <= 0) return 1;
    self[n] = '\0';
    std::string port_file = dir.File("bare.ports");
    auto bare = sluice::testing::ChildProcess::Start(
        {self, "--serve_bare=" + port_file}, dir.File("bare.log"));
    if (!bare.ok()) return 1;
    std::optional<std::string> ports;
    for (int i = 0;
         i < 2000 && !(ports = sluice::testing::ReadWholeFile(port_file));
         ++i) {
      std::this_thread::sleep_for(
          std::chrono::milliseconds(10));  // poll for the port file
    }
    if (!ports) return 1;
    auto bare_stub = sluice::v1::DataServer::NewStub(grpc::CreateCustomChannel(
        sluice::testing::ParseKeyValueFile(*ports)["grpc"],
        grpc::InsecureChannelCredentials(), args));
    ReadFor(*bare_stub, units, false, 0.5);
    Rate base = ReadFor(*bare_stub, units, false, seconds);
    bare->Signal(SIGTERM);
    (void)bare->Wait(absl::Seconds(10));
    double ratio = sluice_rate.bytes_per_s / base.bytes_per_s;
    std::printf(
        "raw:      sluice %.0f MB/s (%.0f samples/s)   bare gRPC %.0f MB/s "
        "(%.0f msg/s)   "
        "ratio %.2f\n",
        sluice_rate.bytes_per_s / 1e6, sluice_rate.samples_per_s,
        base.bytes_per_s / 1e6, base.samples_per_s, ratio);
    std::printf(
        "{\"bench\":\"dataserver_raw\",\"mb_per_s\":%.0f,\"samples_per_s\":%."
        "0f,"
        "\"baseline_mb_per_s\":%.0f,\"ratio\":%.2f}\n",
        sluice_rate.bytes_per_s / 1e6, sluice_rate.samples_per_s,
        base.bytes_per_s / 1e6, ratio);
    return 0;
  }
  const int resize = absl::GetFlag(FLAGS_resize);
  Rate decoded = ReadFor(*stub, units, true, seconds, resize);
  server->process.Signal(SIGTERM);
  (void)server->process.Wait(absl::Seconds(20));
  double loop = DecodeLoopRate(jpegs, seconds, resize);
  double ratio = decoded.samples_per_s / loop;
  std::string what = resize > 0 ? absl::StrFormat("resize %d + crop %dx%d",
                                                  resize, resize, resize)
                                : "full size";
  std::printf(
      "decoded (%s):  sluice %.0f samples/s (%.0f MB/s of pixels)   same "
      "decode in a "
      "loop on %u cores %.0f images/s   ratio %.2f\n",
      what.c_str(), decoded.samples_per_s, decoded.bytes_per_s / 1e6,
      std::thread::hardware_concurrency(), loop, ratio);
  std::printf(
      "{\"bench\":\"dataserver_decoded\",\"resize\":%d,\"samples_per_s\":%.0f,"
      "\"baseline_samples_per_s\":%.0f,\"ratio\":%.2f}\n",
      resize, decoded.samples_per_s, loop, ratio);
  return 0;
}
