// Remote shards through the shard cache, against a real nginx on 127.0.0.1:
// one GET for many concurrent readers, SIGKILL mid-download, the size limit
// with a pinned shard, retries, 404 and lying Content-Length, the seed
// scenario (two data servers sharing one cache directory, no lock files),
// and S3 requests signed with SigV4.
#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <map>
#include <set>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "sluice/v1/coordinator.grpc.pb.h"
#include "sluice/v1/dataserver.grpc.pb.h"
#include "tests/testing/coordinator_client.h"
#include "tests/testing/http.h"
#include "tests/testing/nginx.h"
#include "tests/testing/process.h"
#include "tests/testing/sigv4.h"
#include "tests/testing/tar_writer.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/tls_fixture.h"
#include "tests/testing/wait.h"

namespace sluice {
namespace {

using ::sluice::testing::Nginx;
using ::sluice::testing::ServerProcess;
using ::sluice::testing::TempDir;
using ::testing::HasSubstr;

// A shard of `samples` samples, each a `bytes`-byte .bin (content unique to
// (name, sample)) and a .cls.
std::string Payload(const std::string& name, int i, int bytes) {
  std::string payload(static_cast<size_t>(bytes), '\0');
  uint64_t x = 0x9e3779b97f4a7c15ull * static_cast<uint64_t>(i + 1);
  for (char c : name) x = x * 131 + static_cast<unsigned char>(c);
  x |= 1;
  for (char& c : payload) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    c = static_cast<char>(x);
  }
  return payload;
}

std::string MakeShard(const std::string& name, int samples, int bytes) {
  testing::TarWriter tar;
  for (int i = 0; i < samples; ++i) {
    tar.File(absl::StrCat("k", i, ".bin"), Payload(name, i, bytes))
        .File(absl::StrCat("k", i, ".cls"), std::to_string(i));
  }
  return tar.Finish();
}

struct ReadResult {
  grpc::Status status;
  std::vector<v1::Sample> samples;
};

// Files in `dir` by name -> size.
// The cache directory's files but its owner's LOCK (shard_cache.h).
std::map<std::string, int64_t> Listing(const std::string& dir) {
  std::map<std::string, int64_t> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    if (e.path().filename() == "LOCK") continue;
    out[e.path().filename().string()] =
        e.is_regular_file() ? static_cast<int64_t>(e.file_size()) : -1;
  }
  return out;
}

int64_t ShardBytes(const std::string& dir) {
  int64_t total = 0;
  for (const auto& [name, size] : Listing(dir)) {
    if (absl::EndsWith(name, ".shard")) total += size;
  }
  return total;
}

bool PollUntil(const std::function<bool()>& condition,
               absl::Duration timeout = absl::Seconds(20)) {
  return testing::WaitUntil(condition, timeout, absl::Milliseconds(5));
}

class RemoteShardsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    docroot_ = dir_.File("www");
    cache_ = dir_.File("cache");
    mkdir(docroot_.c_str(), 0755);
    mkdir(dir_.File("nginx").c_str(), 0755);
    auto nginx = Nginx::Start(dir_.File("nginx"), docroot_, 2 << 20);
    ASSERT_TRUE(nginx.ok()) << nginx.status();
    nginx_ = std::move(*nginx);
  }

  // Writes a shard into nginx's docroot and remembers its bytes.
  void Publish(const std::string& name, int samples, int bytes) {
    std::string data = MakeShard(name, samples, bytes);
    const std::string path = docroot_ + "/" + name;
    std::filesystem::create_directories(
        std::filesystem::path(path).parent_path());
    testing::WriteFile(path, data);
    shards_[name] = std::move(data);
    counts_[name] = samples;
  }

  ServerProcess StartDataServer(const std::string& name,
                                std::vector<std::string> flags = {}) {
    mkdir(dir_.File(name).c_str(), 0755);
    flags.push_back("--cache_dir=" + cache_);
    // The byte limits under test are --cache_bytes; a nearly full disk on
    // the test machine must not evict on its own.
    flags.push_back("--cache_min_free_bytes=0");
    auto server =
        testing::StartServer("sluice-dataserver", dir_.File(name), flags);
    EXPECT_TRUE(server.ok()) << server.status();
    return server.ok() ? std::move(*server) : ServerProcess();
  }

  static std::unique_ptr<v1::DataServer::Stub> Stub(
      const ServerProcess& server) {
    return v1::DataServer::NewStub(grpc::CreateChannel(
        server.grpc_address, grpc::InsecureChannelCredentials()));
  }

  v1::ReadRequest Request(const std::string& url, const std::string& name) {
    v1::ReadRequest r;
    r.mutable_lease()->set_lease_id("remote-test");
    auto* unit = r.mutable_lease()->mutable_unit();
    unit->mutable_shard()->set_url(url);
    unit->set_begin(0);
    unit->set_end(counts_[name]);
    unit->mutable_shard()->set_size_bytes(
        static_cast<int64_t>(shards_[name].size()));
    return r;
  }

  static ReadResult Read(v1::DataServer::Stub* stub,
                         const v1::ReadRequest& request) {
    ReadResult out;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(60));
    auto reader = stub->ReadSamples(&ctx, request);
    v1::SampleBatch batch;
    while (reader->Read(&batch)) {
      for (const auto& s : batch.samples()) out.samples.push_back(s);
    }
    out.status = reader->Finish();
    return out;
  }

  // Every sample of shard `name`, in order, with the bytes written.
  void ExpectWholeShard(const ReadResult& r, const std::string& name) {
    ASSERT_TRUE(r.status.ok())
        << r.status.error_code() << " " << r.status.error_message();
    ASSERT_EQ(static_cast<int>(r.samples.size()), counts_[name]);
    for (int i = 0; i < counts_[name]; ++i) {
      const v1::Sample& s = r.samples[static_cast<size_t>(i)];
      ASSERT_EQ(s.key(), absl::StrCat("k", i));
      ASSERT_EQ(s.index(), i);
      ASSERT_EQ(s.fields_size(), 2);
      ASSERT_EQ(s.fields(0).raw(), Payload(name, i, BinBytes(name)))
          << name << " sample " << i;
      ASSERT_EQ(s.fields(1).raw(), std::to_string(i));
    }
  }

  int BinBytes(const std::string& name) {
    return bin_bytes_.count(name) ? bin_bytes_[name] : 0;
  }
  void PublishSized(const std::string& name, int samples, int bytes) {
    bin_bytes_[name] = bytes;
    Publish(name, samples, bytes);
  }

  std::string Metrics(const ServerProcess& server) {
    auto r = testing::HttpGet("http://" + server.metrics_address + "/metrics");
    return r.ok() ? r->body : "";
  }

  TempDir dir_;
  std::string docroot_, cache_;
  std::unique_ptr<Nginx> nginx_;
  std::map<std::string, std::string> shards_;
  std::map<std::string, int> counts_;
  std::map<std::string, int> bin_bytes_;
};

TEST_F(RemoteShardsTest, ConcurrentReadsOfAnUncachedShardMakeOneGet) {
  PublishSized("train-0.tar", 64, 64 << 10);  // 4 MiB, ~2 s through /slow/
  ServerProcess server = StartDataServer("ds");
  auto stub = Stub(server);
  const std::string url = nginx_->base_url() + "/slow/train-0.tar";
  std::vector<ReadResult> results(32);
  std::vector<std::thread> readers;
  for (auto& result : results) {
    readers.emplace_back([&, out = &result] {
      *out = Read(stub.get(), Request(url, "train-0.tar"));
    });
  }
  for (auto& t : readers) t.join();
  for (const ReadResult& r : results) ExpectWholeShard(r, "train-0.tar");
  EXPECT_EQ(nginx_->Count("GET", "/slow/train-0.tar"), 1);
  const std::string metrics = Metrics(server);
  EXPECT_THAT(metrics, HasSubstr(absl::StrCat(
                           "sluice_dataserver_cache_downloaded_bytes_total ",
                           shards_["train-0.tar"].size())));
  // Once cached, a read is a hit and makes no request at all.
  ExpectWholeShard(Read(stub.get(), Request(url, "train-0.tar")),
                   "train-0.tar");
  EXPECT_EQ(nginx_->Count("GET", "/slow/train-0.tar"), 1);
  EXPECT_TRUE(testing::WaitForMetric(server.metrics_address,
                                     "sluice_dataserver_cache_hits_total"));
  EXPECT_THAT(Metrics(server),
              HasSubstr("sluice_dataserver_cache_download_seconds_count 1"));
}

TEST_F(RemoteShardsTest, KilledMidDownloadNeverLeavesAPartialShard) {
  PublishSized("train-1.tar", 64, 64 << 10);
  const std::string url = nginx_->base_url() + "/slow/train-1.tar";
  {
    ServerProcess server = StartDataServer("ds1");
    auto stub = Stub(server);
    std::thread reader([&] { Read(stub.get(), Request(url, "train-1.tar")); });
    // Wait until the download is well under way, then kill the server.
    ASSERT_TRUE(PollUntil([&] {
      for (const auto& [name, size] : Listing(cache_)) {
        if (absl::StartsWith(name, ".tmp-") && size >= (1 << 20)) return true;
      }
      return false;
    }));
    server.process.Kill();
    reader.join();
    auto listing = Listing(cache_);
    for (const auto& [name, size] : listing) {
      EXPECT_TRUE(absl::StartsWith(name, ".tmp-")) << name << " after SIGKILL";
      EXPECT_LT(size, static_cast<int64_t>(shards_["train-1.tar"].size()));
    }
  }
  // The restarted server removes the dead process's temp file, then downloads
  // the shard again from the start.
  ServerProcess server = StartDataServer("ds2");
  for (const auto& [name, size] : Listing(cache_)) {
    EXPECT_FALSE(absl::StartsWith(name, ".tmp-"))
        << name << " survived the restart";
  }
  auto stub = Stub(server);
  ExpectWholeShard(Read(stub.get(), Request(url, "train-1.tar")),
                   "train-1.tar");
  const std::string cached = cache_ + "/" + testing::Sha256Hex(url) + ".shard";
  EXPECT_EQ(testing::ReadFileOrDie(cached), shards_["train-1.tar"]);
  EXPECT_EQ(Listing(cache_).size(), 2u);  // .shard and .meta
  auto log = nginx_->AccessLog();
  ASSERT_EQ(nginx_->Count("GET", "/slow/train-1.tar"), 2);
  EXPECT_EQ(log.back().body_bytes,
            static_cast<int64_t>(shards_["train-1.tar"].size()));
}

TEST_F(RemoteShardsTest, CacheStaysUnderItsLimitAndNeverEvictsAPinnedShard) {
  PublishSized("pinned.tar", 64, 64 << 10);  // ~4 MiB
  for (int i = 0; i < 8; ++i)
    PublishSized(absl::StrCat("s", i, ".tar"), 16, 64 << 10);  // ~1 MiB
  const int64_t limit = 6 << 20;
  ServerProcess server =
      StartDataServer("ds", {absl::StrCat("--cache_bytes=", limit)});
  auto stub = Stub(server);
  const std::string pinned_url = nginx_->base_url() + "/pinned.tar";
  const std::string pinned_file =
      cache_ + "/" + testing::Sha256Hex(pinned_url) + ".shard";

  // A live stream on the pinned shard: read one message, then hold it. A
  // small flow-control window (no BDP growth) keeps the rest on the server,
  // like a trainer busy with its first batch.
  grpc::ChannelArguments slow_args;
  slow_args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  slow_args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 64 << 10);
  auto slow_stub = v1::DataServer::NewStub(grpc::CreateCustomChannel(
      server.grpc_address, grpc::InsecureChannelCredentials(), slow_args));
  grpc::ClientContext pinned_ctx;
  v1::ReadRequest pinned_request = Request(pinned_url, "pinned.tar");
  pinned_request.set_max_batch_bytes(64 << 10);
  auto pinned_reader = slow_stub->ReadSamples(&pinned_ctx, pinned_request);
  v1::SampleBatch first;
  ASSERT_TRUE(pinned_reader->Read(&first));
  ASSERT_TRUE(testing::WaitForMetric(server.metrics_address,
                                     "sluice_dataserver_active_streams 1"));

  int64_t read_bytes = static_cast<int64_t>(shards_["pinned.tar"].size());
  for (int round = 0; round < 2; ++round) {
    for (int i = 0; i < 8; ++i) {
      const std::string name = absl::StrCat("s", i, ".tar");
      ExpectWholeShard(
          Read(stub.get(), Request(nginx_->base_url() + "/" + name, name)),
          name);
      read_bytes += static_cast<int64_t>(shards_[name].size());
      EXPECT_LE(ShardBytes(cache_), limit) << "after " << name;
      if (round == 0) {
        EXPECT_TRUE(std::filesystem::exists(pinned_file))
            << "pinned shard evicted";
      }
    }
    if (round == 0) {
      // The stream is still alive (the gauge settles to it once the reads
      // above have ended on the server too) and still reads correct bytes.
      ASSERT_TRUE(testing::WaitForMetric(server.metrics_address,
                                         "sluice_dataserver_active_streams 1"));
      pinned_ctx.TryCancel();
      while (pinned_reader->Read(&first)) {
      }
      pinned_reader->Finish();
      ASSERT_TRUE(testing::WaitForMetric(server.metrics_address,
                                         "sluice_dataserver_active_streams 0"));
    }
  }
  EXPECT_GE(read_bytes, 3 * limit);
  // 17 downloads one after another: connections are reused, not one each.
  std::set<int64_t> connections;
  int gets = 0;
  for (const auto& l : nginx_->AccessLog()) {
    gets += l.method == "GET";
    connections.insert(l.connection);
  }
  EXPECT_GE(gets, 17);
  EXPECT_LE(connections.size(), 4u) << gets << " GETs";
  // Unpinned, the big shard was the least recently used: gone now.
  EXPECT_FALSE(std::filesystem::exists(pinned_file));
  EXPECT_THAT(Metrics(server),
              HasSubstr("sluice_dataserver_cache_evictions_total"));
  EXPECT_LE(ShardBytes(cache_), limit);
}

TEST_F(RemoteShardsTest, A500IsRetriedUntilTheServerRecovers) {
  PublishSized("flaky.tar", 8, 4 << 10);
  ServerProcess server = StartDataServer("ds", {"--download_attempts=8"});
  auto stub = Stub(server);
  const std::string url = nginx_->base_url() + "/flaky/flaky.tar";
  ReadResult result;
  std::thread reader(
      [&] { result = Read(stub.get(), Request(url, "flaky.tar")); });
  ASSERT_TRUE(
      PollUntil([&] { return nginx_->Count("GET", "/flaky/flaky.tar") >= 1; }));
  nginx_->MakeFlakyHealthy();
  reader.join();
  ExpectWholeShard(result, "flaky.tar");
  int ok = 0, failed = 0;
  for (const auto& l : nginx_->AccessLog()) {
    if (l.uri != "/flaky/flaky.tar") continue;
    ok += l.status == 200;
    failed += l.status == 500;
  }
  EXPECT_EQ(ok, 1);
  EXPECT_GE(failed, 1);
}

TEST_F(RemoteShardsTest, MissingShardIsNotFoundNamingTheUrl) {
  ServerProcess server = StartDataServer("ds");
  auto stub = Stub(server);
  const std::string url = nginx_->base_url() + "/no-such-shard.tar";
  counts_["none"] = 1;
  ReadResult r = Read(stub.get(), Request(url, "none"));
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(r.status.error_message(), HasSubstr(url));
  EXPECT_THAT(r.status.error_message(), HasSubstr("404"));
  EXPECT_EQ(nginx_->Count("GET", "/no-such-shard.tar"),
            1);  // 404 is final: no retries
  EXPECT_TRUE(Listing(cache_).empty());
  EXPECT_TRUE(testing::WaitForMetric(server.metrics_address,
                                     "sluice_dataserver_cache_download_"
                                     "failures_total{reason=\"not_found\"} 1"));
}

// The one fault nginx will not produce: a body shorter than the
// Content-Length it announced. A listener that does exactly that.
class LyingHttpServer {
 public:
  LyingHttpServer() {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    listen(fd_, 16);
    getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] {
      while (true) {
        int c = accept(fd_, nullptr, nullptr);
        if (c < 0) return;
        char buf[4096];
        std::string request;
        while (request.find("\r\n\r\n") == std::string::npos) {
          ssize_t n = read(c, buf, sizeof(buf));
          if (n <= 0) break;
          request.append(buf, static_cast<size_t>(n));
        }
        if (absl::StartsWith(request, "GET")) ++requests;
        std::string response =
            "HTTP/1.1 200 OK\r\nContent-Length: 100000\r\nConnection: "
            "close\r\n\r\n" +
            std::string(1000, 'x');
        (void)!write(c, response.data(), response.size());
        close(c);
      }
    });
  }
  ~LyingHttpServer() {
    shutdown(fd_, SHUT_RDWR);
    close(fd_);
    thread_.join();
  }
  std::string url(const std::string& path) const {
    return absl::StrCat("http://127.0.0.1:", port_, path);
  }
  std::atomic<int> requests{0};

 private:
  int fd_ = -1;
  int port_ = 0;
  std::thread thread_;
};

TEST_F(RemoteShardsTest, TruncatedBodyIsRejectedAndNotCached) {
  LyingHttpServer liar;
  ServerProcess server = StartDataServer("ds", {"--download_attempts=3"});
  auto stub = Stub(server);
  const std::string url = liar.url("/short.tar");
  counts_["short"] = 1;
  ReadResult r = Read(stub.get(), Request(url, "short"));
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(r.status.error_message(), HasSubstr(url));
  EXPECT_THAT(r.status.error_message(), HasSubstr("after 3 attempts"));
  EXPECT_EQ(liar.requests.load(), 3);
  EXPECT_TRUE(Listing(cache_).empty());
  EXPECT_TRUE(testing::WaitForMetric(server.metrics_address,
                                     "sluice_dataserver_cache_download_"
                                     "failures_total{reason=\"truncated\"} 1"));
}

TEST_F(RemoteShardsTest, DownloadsAreCheckedAgainstTheManifest) {
  PublishSized("checked.tar", 4, 1 << 10);
  ServerProcess server = StartDataServer("ds");
  auto stub = Stub(server);
  const std::string url = nginx_->base_url() + "/checked.tar";
  v1::ReadRequest wrong_size = Request(url, "checked.tar");
  wrong_size.mutable_lease()->mutable_unit()->mutable_shard()->set_size_bytes(
      12345);
  ReadResult r = Read(stub.get(), wrong_size);
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::DATA_LOSS);
  EXPECT_THAT(r.status.error_message(), HasSubstr("size_bytes 12345"));
  EXPECT_TRUE(Listing(cache_).empty());

  v1::ReadRequest wrong_sum = Request(url, "checked.tar");
  wrong_sum.mutable_lease()->mutable_unit()->mutable_shard()->set_checksum(
      "sha256:" + std::string(64, '0'));
  r = Read(stub.get(), wrong_sum);
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::DATA_LOSS);
  EXPECT_THAT(r.status.error_message(), HasSubstr("not cached"));
  EXPECT_TRUE(Listing(cache_).empty());

  v1::ReadRequest right = Request(url, "checked.tar");
  right.mutable_lease()->mutable_unit()->mutable_shard()->set_checksum(
      "sha256:" + testing::Sha256Hex(shards_["checked.tar"]));
  ExpectWholeShard(Read(stub.get(), right), "checked.tar");
  EXPECT_EQ(Listing(cache_).size(), 2u);
  EXPECT_TRUE(
      testing::WaitForMetric(server.metrics_address,
                             "sluice_dataserver_cache_download_failures_total{"
                             "reason=\"checksum_mismatch\"} 1"));
}

// The seed scenario (WebDataset's vanishing .tar.lock): two data servers on
// one cache directory they were told to share, 16 concurrent readers each, a
// cache too small for the dataset so both evict while the other reads. Zero
// errors, zero lock files, every sample correct.
TEST_F(RemoteShardsTest, TwoServersShareOneCacheDirectoryWithoutLocks) {
  for (int i = 0; i < 6; ++i)
    PublishSized(absl::StrCat("seed-", i, ".tar"), 16, 32 << 10);
  const int64_t limit = 3 * static_cast<int64_t>(shards_["seed-0.tar"].size());
  std::vector<ServerProcess> servers;
  servers.push_back(StartDataServer(
      "a", {absl::StrCat("--cache_bytes=", limit), "--shared_cache_dir"}));
  servers.push_back(StartDataServer(
      "b", {absl::StrCat("--cache_bytes=", limit), "--shared_cache_dir"}));
  std::vector<std::unique_ptr<v1::DataServer::Stub>> stubs;
  for (const auto& s : servers) stubs.push_back(Stub(s));
  std::atomic<int> errors{0}, samples{0};
  for (int round = 0; round < 3; ++round) {
    std::vector<std::thread> readers;
    for (int server = 0; server < 2; ++server) {
      for (int r = 0; r < 16; ++r) {
        const std::string name =
            absl::StrCat("seed-", (r + round + server) % 6, ".tar");
        v1::ReadRequest request =
            Request(nginx_->base_url() + "/" + name, name);
        readers.emplace_back([&, stub = stubs[server].get(), request, name] {
          ReadResult result = Read(stub, request);
          if (!result.status.ok()) {
            ++errors;
            ADD_FAILURE() << name << ": " << result.status.error_message();
            return;
          }
          ExpectWholeShard(result, name);
          samples += static_cast<int>(result.samples.size());
        });
      }
    }
    for (auto& t : readers) t.join();
  }
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(samples.load(), 3 * 2 * 16 * 16);
  for (const auto& [name, size] : Listing(cache_)) {
    EXPECT_TRUE(absl::EndsWith(name, ".shard") || absl::EndsWith(name, ".meta"))
        << "unexpected file " << name;
    EXPECT_FALSE(absl::StrContains(name, "lock")) << name;
  }
}

// A second data server started on a cache directory another one owns
// exits 1 at start-up, naming the directory and the owner's PID; once the
// owner is gone (SIGKILL: the kernel drops its lock) the directory is free.
TEST_F(RemoteShardsTest, ASecondServerOnAnOwnedCacheDirectoryIsRefused) {
  ServerProcess owner = StartDataServer("owner");
  const std::string log = dir_.File("second.log");
  auto second = testing::ChildProcess::Start(
      {testing::BinDir() + "/sluice-dataserver", "--listen=127.0.0.1:0",
       "--metrics_listen=127.0.0.1:0", "--cache_dir=" + cache_},
      log);
  ASSERT_TRUE(second.ok());
  auto code = second->Wait(absl::Seconds(60));
  ASSERT_TRUE(code.ok());
  EXPECT_EQ(*code, 1);
  EXPECT_THAT(testing::ReadWholeFile(log).value_or(""),
              ::testing::HasSubstr(absl::StrCat(
                  "--cache_dir ", cache_, " is in use by another process (PID ",
                  owner.process.pid(), ")")));
  EXPECT_TRUE(owner.process.running());
  owner.process.Signal(SIGKILL);
  ASSERT_TRUE(owner.process.Wait(absl::Seconds(10)).ok());
  ServerProcess third = StartDataServer("third");
  EXPECT_TRUE(third.process.running());
}

// s3://bucket/key through the S3 endpoint (nginx serving the bucket as a
// directory), signed by libcurl's SigV4; the signature is checked against the
// reference signer that reproduces AWS's published example.
TEST_F(RemoteShardsTest, S3RequestsAreSignedWithSigV4) {
  PublishSized("bucket/data/s3-0.tar", 8, 4 << 10);
  setenv("AWS_ACCESS_KEY_ID", "AKIDSLUICETEST", 1);
  setenv("AWS_SECRET_ACCESS_KEY", "sluice/secret/KEY", 1);
  setenv("AWS_SESSION_TOKEN", "session-token-1", 1);
  ServerProcess server = StartDataServer(
      "ds", {"--s3_endpoint=" + nginx_->base_url(), "--s3_region=eu-west-3"});
  unsetenv("AWS_ACCESS_KEY_ID");
  unsetenv("AWS_SECRET_ACCESS_KEY");
  unsetenv("AWS_SESSION_TOKEN");
  auto stub = Stub(server);
  ExpectWholeShard(Read(stub.get(), Request("s3://bucket/data/s3-0.tar",
                                            "bucket/data/s3-0.tar")),
                   "bucket/data/s3-0.tar");
  auto log = nginx_->AccessLog();
  ASSERT_EQ(log.size(), 1u);
  const testing::NginxLogLine& l = log[0];
  EXPECT_EQ(l.uri, "/bucket/data/s3-0.tar");
  ASSERT_TRUE(absl::StartsWith(l.authorization, "AWS4-HMAC-SHA256 "))
      << l.authorization;
  // "AWS4-HMAC-SHA256 Credential=AKID/DATE/REGION/s3/aws4_request,
  //  SignedHeaders=a;b;c, Signature=HEX"
  std::map<std::string, std::string> parts;
  for (absl::string_view part : absl::StrSplit(l.authorization.substr(17), ',',
                                               absl::SkipWhitespace())) {
    std::pair<std::string, std::string> kv =
        absl::StrSplit(absl::StripAsciiWhitespace(part), '=');
    parts[kv.first] = kv.second;
  }
  EXPECT_EQ(parts["Credential"],
            absl::StrCat("AKIDSLUICETEST/", l.amz_date.substr(0, 8),
                         "/eu-west-3/s3/aws4_request"));
  testing::SigV4Request r;
  r.canonical_uri = "/bucket/data/s3-0.tar";
  r.amz_date = l.amz_date;
  r.region = "eu-west-3";
  r.secret_key = "sluice/secret/KEY";
  r.payload_sha256 = l.amz_content_sha256.empty() ? testing::Sha256Hex("")
                                                  : l.amz_content_sha256;
  const std::map<std::string, std::string> logged = {
      {"host", l.host},
      {"x-amz-date", l.amz_date},
      {"x-amz-content-sha256", l.amz_content_sha256},
      {"x-amz-security-token", l.amz_security_token}};
  for (absl::string_view name : absl::StrSplit(parts["SignedHeaders"], ';')) {
    auto it = logged.find(std::string(name));
    ASSERT_NE(it, logged.end())
        << "signed header " << name << " is not in the access log";
    r.headers[it->first] = it->second;
  }
  EXPECT_EQ(l.amz_security_token, "session-token-1");
  EXPECT_EQ(parts["Signature"], testing::SigV4Signature(r))
      << "canonical request:\n"
      << testing::SigV4CanonicalRequest(r);
}

// Publishing a dataset over http: index the local copy with --url_prefix and
// --checksum, or index the remote URLs through a data server; both give the
// same manifest, and the checksum is what the cache verifies.
TEST_F(RemoteShardsTest, SluicectlIndexesPublishedAndRemoteShards) {
  PublishSized("pub/a.tar", 5, 1 << 10);
  PublishSized("pub/b.tar", 7, 1 << 10);
  auto run = [&](std::vector<std::string> args) {
    args.insert(args.begin(), testing::BinDir() + "/sluicectl");
    auto child = testing::ChildProcess::Start(args, dir_.File("ctl.log"));
    EXPECT_TRUE(child.ok());
    auto code = child->Wait(absl::Seconds(60));
    EXPECT_TRUE(code.ok() && *code == 0)
        << testing::ReadWholeFile(dir_.File("ctl.log")).value_or("");
  };
  const std::string prefix = nginx_->base_url() + "/pub/";
  run({"index", docroot_ + "/pub", "--url_prefix=" + prefix, "--checksum", "-o",
       dir_.File("local.json")});
  const std::string local = testing::ReadFileOrDie(dir_.File("local.json"));
  for (const std::string name : {"a.tar", "b.tar"}) {
    EXPECT_THAT(local, HasSubstr("\"" + prefix + name + "\""));
    EXPECT_THAT(local, HasSubstr("sha256:" +
                                 testing::Sha256Hex(shards_["pub/" + name])));
  }
  EXPECT_THAT(local, HasSubstr("\"num_samples\": \"7\""));

  ServerProcess server = StartDataServer("ds");
  run({"index", "--data_server=" + server.grpc_address, prefix + "a.tar",
       prefix + "b.tar", "-o", dir_.File("remote.json")});
  const std::string remote = testing::ReadFileOrDie(dir_.File("remote.json"));
  EXPECT_THAT(remote, HasSubstr("\"" + prefix + "b.tar\""));
  EXPECT_THAT(remote, HasSubstr("\"num_samples\": \"5\""));
  EXPECT_THAT(remote,
              HasSubstr(absl::StrCat("\"size_bytes\": \"",
                                     shards_["pub/b.tar"].size(), "\"")));
  // Indexing downloaded them into the cache: reading is a hit.
  EXPECT_EQ(nginx_->Count("GET", "/pub/a.tar"), 1);
  ExpectWholeShard(
      Read(Stub(server).get(), Request(prefix + "a.tar", "pub/a.tar")),
      "pub/a.tar");
  EXPECT_EQ(nginx_->Count("GET", "/pub/a.tar"), 1);
}

// https: verified against the CA given with --ca_bundle; without it (the
// system's CAs do not know this one) the download is refused, not retried.
TEST(RemoteShardsTlsTest, HttpsIsVerifiedAgainstTheCaBundle) {
  TempDir dir;
  auto pki = testing::MakeTestPki(dir.path());
  ASSERT_TRUE(pki.ok()) << pki.status();
  mkdir(dir.File("www").c_str(), 0755);
  mkdir(dir.File("nginx").c_str(), 0755);
  testing::TarWriter tar;
  for (int i = 0; i < 3; ++i)
    tar.File(absl::StrCat("k", i, ".cls"), std::to_string(i));
  testing::WriteFile(dir.File("www/tls.tar"), tar.Finish());
  auto nginx =
      Nginx::Start(dir.File("nginx"), dir.File("www"), 2 << 20,
                   testing::NginxTls{pki->server_cert, pki->server_key});
  ASSERT_TRUE(nginx.ok()) << nginx.status();
  const std::string url = (*nginx)->base_url() + "/tls.tar";
  ASSERT_TRUE(absl::StartsWith(url, "https://127.0.0.1:"));
  v1::ReadRequest request;
  request.mutable_lease()->mutable_unit()->mutable_shard()->set_url(url);
  request.mutable_lease()->mutable_unit()->set_begin(0);
  request.mutable_lease()->mutable_unit()->set_end(3);
  for (bool with_ca : {false, true}) {
    const std::string sub = with_ca ? "with-ca" : "without-ca";
    mkdir(dir.File(sub).c_str(), 0755);
    std::vector<std::string> flags = {"--cache_dir=" +
                                      dir.File(sub + "/cache")};
    if (with_ca) flags.push_back("--ca_bundle=" + pki->ca_cert);
    auto server =
        testing::StartServer("sluice-dataserver", dir.File(sub), flags);
    ASSERT_TRUE(server.ok()) << server.status();
    auto stub = v1::DataServer::NewStub(grpc::CreateChannel(
        server->grpc_address, grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    auto reader = stub->ReadSamples(&ctx, request);
    v1::SampleBatch batch;
    std::vector<std::string> keys;
    while (reader->Read(&batch)) {
      for (const auto& s : batch.samples()) keys.push_back(s.key());
    }
    grpc::Status status = reader->Finish();
    if (with_ca) {
      EXPECT_TRUE(status.ok()) << status.error_message();
      EXPECT_THAT(keys, ::testing::ElementsAre("k0", "k1", "k2"));
    } else {
      EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
      EXPECT_THAT(status.error_message(), HasSubstr("TLS verification failed"));
      EXPECT_THAT(status.error_message(), HasSubstr("--ca_bundle"));
      EXPECT_TRUE(testing::WaitForMetric(
          server->metrics_address,
          "sluice_dataserver_cache_download_failures_total{reason=\"tls\"} 1"));
    }
  }
  EXPECT_EQ((*nginx)->Count("GET", "/tls.tar"),
            1);  // the refused one never got a request
}

// The coordinator knows which units come next: after a grant it hints their
// remote shards to the data server they will be routed to, which downloads
// them before anyone asks; the later reads are cache hits and nothing is
// fetched twice.
TEST_F(RemoteShardsTest, PrefetchHintsDownloadUpcomingShardsBeforeTheirReads) {
  for (int i = 0; i < 6; ++i)
    PublishSized(absl::StrCat("p", i, ".tar"), 4, 4 << 10);
  mkdir(dir_.File("coord").c_str(), 0755);
  auto coordinator =
      testing::StartServer("sluice-coordinator", dir_.File("coord"),
                           {"--journal_dir=" + dir_.File("coord/journal"),
                            "--heartbeat_interval=200ms"});
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  ServerProcess server = StartDataServer(
      "ds", {"--coordinator=" + coordinator->grpc_address, "--prefetch=8"});
  ASSERT_TRUE(testing::WaitForMetric(coordinator->metrics_address,
                                     "sluice_coordinator_data_servers 1"));
  v1::JobSpec spec;
  spec.set_name("prefetch");
  for (int i = 0; i < 6; ++i) {
    const std::string name = absl::StrCat("p", i, ".tar");
    auto* shard = spec.mutable_manifest()->add_shards();
    shard->set_url(nginx_->base_url() + "/" + name);
    shard->set_num_samples(4);
    shard->set_size_bytes(static_cast<int64_t>(shards_[name].size()));
    shard->set_checksum("sha256:" + testing::Sha256Hex(shards_[name]));
  }
  spec.set_world_size(1);
  spec.set_num_epochs(1);
  spec.set_shuffle(false);
  ASSERT_TRUE(testing::CreateJob(coordinator->grpc_address, spec).ok());
  auto granted =
      testing::FirstGrant(coordinator->grpc_address, "prefetch", "t0");
  ASSERT_TRUE(granted.ok()) << granted.status();
  const v1::Lease first = *granted;
  EXPECT_EQ(first.unit().shard().url(), nginx_->base_url() + "/p0.tar");
  // One grant, no reads at all: the other five shards arrive anyway.
  ASSERT_TRUE(PollUntil([&] {
    int fetched = 0;
    for (int i = 1; i < 6; ++i)
      fetched += nginx_->Count("GET", absl::StrCat("/p", i, ".tar"));
    return fetched == 5;
  }));
  EXPECT_EQ(nginx_->Count("GET", "/p0.tar"), 0);
  ASSERT_TRUE(testing::WaitForMetric(
      server.metrics_address,
      "sluice_dataserver_cache_download_seconds_count 5"));
  // Reading the granted unit downloads p0; the others are hits.
  auto data = Stub(server);
  for (int i = 0; i < 6; ++i) {
    const std::string name = absl::StrCat("p", i, ".tar");
    v1::ReadRequest r = Request(nginx_->base_url() + "/" + name, name);
    if (i == 0) *r.mutable_lease() = first;
    ExpectWholeShard(Read(data.get(), r), name);
    EXPECT_EQ(nginx_->Count("GET", "/" + name), 1) << name;
  }
  EXPECT_THAT(Metrics(server),
              HasSubstr("sluice_dataserver_cache_hits_total 5"));
}

}  // namespace
}  // namespace sluice
