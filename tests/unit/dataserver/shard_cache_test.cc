// Shard cache start-up (what a crashed or concurrent process leaves in the
// directory), URL validation, and the reference SigV4 signer the S3
// integration test relies on.
#include "server/dataserver/shard_cache.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "server/dataserver/composite_shard_store.h"
#include "tests/testing/nginx.h"
#include "tests/testing/sigv4.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/tar_writer.h"
#include "tests/testing/temp_dir.h"

namespace sluice::dataserver {
namespace {

using ::sluice::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;

std::string Host() {
  char buf[256] = {0};
  gethostname(buf, sizeof(buf) - 1);
  return buf;
}

// A pid that is certainly not running: a child that has exited and been
// reaped.
pid_t DeadPid() {
  pid_t pid = fork();
  if (pid == 0) _exit(0);
  waitpid(pid, nullptr, 0);
  return pid;
}

std::shared_ptr<ShardCache> NewCache(const std::string& dir,
                                     int64_t max_bytes = 0) {
  ShardCacheOptions options;
  options.dir = dir;
  options.max_bytes = max_bytes;
  auto cache = ShardCache::Create(
      options, std::make_unique<RemoteFetcher>(RemoteFetcherOptions{}));
  EXPECT_TRUE(cache.ok()) << cache.status();
  return cache.ok() ? *cache : nullptr;
}

void WriteEntry(const std::string& dir, const std::string& url,
                const std::string& body, int64_t recorded_size) {
  const std::string hash = testing::Sha256Hex(url);
  testing::WriteFile(absl::StrCat(dir, "/", hash, ".shard"), body);
  testing::WriteFile(absl::StrCat(dir, "/", hash, ".meta"),
                     absl::StrCat("sluice-cache-v1\n", url, "\n", recorded_size,
                                  "\n", testing::Sha256Hex(body), "\n"));
}

TEST(ShardCacheTest,
     StartUpRemovesLeftoversOfDeadProcessesAndKeepsCompleteEntries) {
  testing::TempDir dir;
  const std::string host = Host();
  const std::string dead_temp = absl::StrCat(".tmp-", DeadPid(), "-1-shard-",
                                             std::string(64, 'a'), "@", host);
  const std::string
      live_temp =  // this test's parent is alive: not ours to remove
      absl::StrCat(".tmp-", getppid(), "-1-shard-", std::string(64, 'b'), "@",
                   host);
  const std::string foreign_temp =
      absl::StrCat(".tmp-1-1-shard-", std::string(64, 'c'), "@some-other-host");
  for (const std::string& name : {dead_temp, live_temp, foreign_temp}) {
    testing::WriteFile(dir.File(name), "partial");
  }
  WriteEntry(dir.path(), "http://h/good.tar", "complete shard", 14);
  WriteEntry(dir.path(), "http://h/short.tar", "truncat",
             14);                                              // size disagrees
  const std::string orphan = std::string(64, 'd') + ".shard";  // no .meta, old
  testing::WriteFile(dir.File(orphan), "orphan");
  struct timespec old[2] = {{1, 0}, {1, 0}};
  utimensat(AT_FDCWD, dir.File(orphan).c_str(), old, 0);
  testing::WriteFile(dir.File("notes.txt"), "not ours");

  auto cache = NewCache(dir.path());
  ASSERT_NE(cache, nullptr);
  const std::string good = testing::Sha256Hex("http://h/good.tar");
  EXPECT_THAT(testing::FileNames(dir.path()),
              UnorderedElementsAre(live_temp, foreign_temp, good + ".shard",
                                   good + ".meta", "notes.txt", "LOCK"));
  EXPECT_EQ(cache->bytes_in_use(), 14);
  EXPECT_THAT(cache->CachedUrls(), UnorderedElementsAre("http://h/good.tar"));
  // A hit: no network needed.
  auto shard = cache->Open(ShardRef{"http://h/good.tar", 14, ""});
  ASSERT_TRUE(shard.ok()) << shard.status();
  EXPECT_EQ((*shard)->bytes(), "complete shard");
  EXPECT_EQ((*shard)->path(), "http://h/good.tar");
}

TEST(ShardCacheTest, StartUpEvictsDownToTheLimitOldestFirst) {
  testing::TempDir dir;
  WriteEntry(dir.path(), "http://h/old.tar", std::string(100, 'o'), 100);
  WriteEntry(dir.path(), "http://h/new.tar", std::string(100, 'n'), 100);
  struct timespec old[2] = {{1000, 0}, {1000, 0}};
  utimensat(AT_FDCWD,
            dir.File(testing::Sha256Hex("http://h/old.tar") + ".shard").c_str(),
            old, 0);
  auto cache = NewCache(dir.path(), 150);
  ASSERT_NE(cache, nullptr);
  EXPECT_THAT(cache->CachedUrls(), UnorderedElementsAre("http://h/new.tar"));
  EXPECT_EQ(cache->bytes_in_use(), 100);
}

// A disk smaller than --cache_bytes: entries go while the filesystem is
// short of min_free_bytes, oldest first, never a pinned one.
TEST(ShardCacheTest, EvictsToKeepTheFilesystemFromFillingUp) {
  testing::TempDir dir;
  WriteEntry(dir.path(), "http://h/old.tar", std::string(100, 'o'), 100);
  WriteEntry(dir.path(), "http://h/mid.tar", std::string(100, 'm'), 100);
  WriteEntry(dir.path(), "http://h/new.tar", std::string(100, 'n'), 100);
  int64_t t = 1000;
  for (const char* name : {"old", "mid", "new"}) {
    struct timespec when[2] = {{t, 0}, {t, 0}};
    t += 10;
    utimensat(
        AT_FDCWD,
        dir.File(testing::Sha256Hex(absl::StrCat("http://h/", name, ".tar")) +
                 ".shard")
            .c_str(),
        when, 0);
  }
  // A 400-byte "disk": free = 400 - bytes of the .shard files present -
  // what "someone else" wrote.
  auto extra = std::make_shared<int64_t>(0);
  auto free_bytes = [extra](const std::string& d) {
    int64_t used = *extra;
    for (const auto& e : std::filesystem::directory_iterator(d)) {
      if (e.path().extension() == ".shard")
        used += static_cast<int64_t>(e.file_size());
    }
    return 400 - used;
  };
  ShardCacheOptions options;
  options.dir = dir.path();
  options.max_bytes = 1 << 20;  // far above the disk
  options.min_free_bytes = 250;
  options.free_bytes = free_bytes;
  RemoteFetcherOptions no_retries;
  no_retries.max_attempts = 1;
  auto cache =
      ShardCache::Create(options, std::make_unique<RemoteFetcher>(no_retries));
  ASSERT_TRUE(cache.ok()) << cache.status();
  // 100 free at start: the two oldest go (free 300 >= 250).
  EXPECT_THAT((*cache)->CachedUrls(), UnorderedElementsAre("http://h/new.tar"));
  EXPECT_EQ(free_bytes(dir.path()), 300);
  // The disk fills up from elsewhere while a stream holds the last shard:
  // a new download makes room where it can, but a pinned shard stays.
  auto pinned = (*cache)->Open(ShardRef{"http://h/new.tar", 100, ""});
  ASSERT_TRUE(pinned.ok()) << pinned.status();
  *extra = 200;
  EXPECT_FALSE(
      (*cache)->Open(ShardRef{"http://127.0.0.1:1/refused.tar", 0, ""}).ok());
  EXPECT_THAT((*cache)->CachedUrls(), UnorderedElementsAre("http://h/new.tar"));
  // Released, it goes.
  pinned = absl::CancelledError("released");
  EXPECT_THAT((*cache)->CachedUrls(), ::testing::IsEmpty());
  EXPECT_EQ(free_bytes(dir.path()), 200);
}

// A manifest naming another version of a cached shard: the old files are
// removed without the cache's lock (the hook below would deadlock on it),
// and an Open arriving while they go waits for a fresh download instead of
// adopting the files being removed.
TEST(ShardCacheTest, ReplacedFilesGoOutsideTheLockAndOpensMeanwhileWait) {
  testing::TempDir dir;
  const std::string url = "http://127.0.0.1:1/s.tar";  // nothing listens
  WriteEntry(dir.path(), url, "old version", 11);
  ShardCache* cache = nullptr;
  std::vector<std::string> removed;
  std::set<std::string> names_before_removal;
  absl::StatusOr<std::shared_ptr<const ShardData>> meanwhile;
  absl::Notification meanwhile_done;
  ShardCacheOptions options;
  options.dir = dir.path();
  options.before_remove_for_testing = [&](const std::string& u) {
    removed.push_back(u);
    EXPECT_THAT(cache->CachedUrls(), ::testing::IsEmpty());
    names_before_removal = testing::FileNames(dir.path());
    // The old version's files are still there: not to be adopted.
    cache->OpenAsync(ShardRef{url, 11, ""},
                     [&](absl::StatusOr<std::shared_ptr<const ShardData>> r) {
                       meanwhile = std::move(r);
                       meanwhile_done.Notify();
                     });
  };
  RemoteFetcherOptions no_retries;
  no_retries.max_attempts = 1;
  auto created =
      ShardCache::Create(options, std::make_unique<RemoteFetcher>(no_retries));
  ASSERT_TRUE(created.ok()) << created.status();
  cache = created->get();
  EXPECT_EQ(cache->bytes_in_use(), 11);

  auto replaced = cache->Open(ShardRef{url, 12, ""});
  meanwhile_done.WaitForNotification();
  EXPECT_THAT(removed, ::testing::ElementsAre(url));
  EXPECT_EQ(names_before_removal.size(), 3u);  // .shard, .meta and LOCK
  // Both Opens waited for the one new download, which fails: nothing
  // listens on port 1.
  EXPECT_THAT(replaced.status(),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr(url)));
  EXPECT_THAT(meanwhile.status(),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr(url)));
  EXPECT_THAT(testing::FileNames(dir.path()), ElementsAre("LOCK"));
  EXPECT_THAT(cache->CachedUrls(), ::testing::IsEmpty());
  EXPECT_EQ(cache->bytes_in_use(), 0);
}

// Eight threads open four shards served by a real nginx, each in its own
// order, while holding the previous one: every Open returns the shard's
// bytes. Unbounded, each shard is downloaded once however many Opens
// overlap; with room for two, eviction only takes unpinned shards and the
// cache ends within its limit.
TEST(ShardCacheTest, ConcurrentOpensGetTheRightBytesAndShareDownloads) {
  testing::TempDir dir;
  std::vector<std::string> bodies;
  for (const char* round : {"0", "2003"}) {  // one URL set per round
    std::filesystem::create_directories(dir.File(absl::StrCat("www/", round)));
    for (int i = 0; i < 4; ++i) {
      bodies.resize(4);
      bodies[i] = std::string(1000 + i, static_cast<char>('a' + i));
      testing::WriteFile(dir.File(absl::StrCat("www/", round, "/s", i, ".tar")),
                         bodies[i]);
    }
  }
  std::filesystem::create_directories(dir.File("nginx"));
  auto nginx = testing::Nginx::Start(dir.File("nginx"), dir.File("www"));
  ASSERT_TRUE(nginx.ok()) << nginx.status();
  for (const int64_t max_bytes : {int64_t{0}, int64_t{2003}}) {
    SCOPED_TRACE(absl::StrCat("max_bytes ", max_bytes));
    const std::string cache_dir = dir.File(absl::StrCat("cache-", max_bytes));
    std::filesystem::create_directories(cache_dir);
    std::shared_ptr<ShardCache> cache = NewCache(cache_dir, max_bytes);
    ASSERT_NE(cache, nullptr);
    std::atomic<int> right{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 8; ++t) {
      threads.emplace_back([&, t] {
        std::shared_ptr<const ShardData> held;
        for (int k = 0; k < 12; ++k) {
          const int i = (t + k * (t % 3 + 1)) % 4;
          const std::string url = absl::StrCat((*nginx)->base_url(), "/",
                                               max_bytes, "/s", i, ".tar");
          auto shard = cache->Open(ShardRef{url, 1000 + i, ""});
          if (!shard.ok()) {
            ADD_FAILURE() << url << ": " << shard.status();
            continue;
          }
          if ((*shard)->bytes() == bodies[i]) ++right;
          held = *std::move(shard);  // the previous one is released
        }
      });
    }
    for (std::thread& t : threads) t.join();
    EXPECT_EQ(right.load(), 8 * 12);
    if (max_bytes == 0) {
      for (int i = 0; i < 4; ++i) {
        EXPECT_EQ((*nginx)->Count("GET", absl::StrCat("/0/s", i, ".tar")), 1)
            << "s" << i;
      }
    } else {
      EXPECT_LE(cache->bytes_in_use(), max_bytes);
    }
  }
}

// A cache directory has one owner: a second cache on it is refused, naming
// the holder's PID and the flag that allows sharing, until the first one is
// gone; with shared_dir both may use it and no LOCK is taken.
TEST(ShardCacheTest, ASecondCacheOnOneDirectoryIsRefusedUnlessShared) {
  testing::TempDir dir;
  auto first = NewCache(dir.path());
  ASSERT_NE(first, nullptr);
  ShardCacheOptions options;
  options.dir = dir.path();
  auto second = ShardCache::Create(
      options, std::make_unique<RemoteFetcher>(RemoteFetcherOptions{}));
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(second.status().message()),
              ::testing::AllOf(
                  ::testing::HasSubstr(dir.path()),
                  ::testing::HasSubstr(absl::StrCat("(PID ", getpid(), ")")),
                  ::testing::HasSubstr("--shared_cache_dir")));
  first.reset();
  EXPECT_NE(NewCache(dir.path()), nullptr);  // released with its owner

  testing::TempDir shared;
  options.dir = shared.path();
  options.shared_dir = true;
  auto a = ShardCache::Create(
      options, std::make_unique<RemoteFetcher>(RemoteFetcherOptions{}));
  auto b = ShardCache::Create(
      options, std::make_unique<RemoteFetcher>(RemoteFetcherOptions{}));
  EXPECT_TRUE(a.ok()) << a.status();
  EXPECT_TRUE(b.ok()) << b.status();
  EXPECT_NE(access(absl::StrCat(shared.path(), "/LOCK").c_str(), F_OK), 0);
}

TEST(ShardCacheTest, BadUrlsAndChecksumsAreRejectedBeforeAnyDownload) {
  testing::TempDir dir;
  auto cache = NewCache(dir.path());
  ASSERT_NE(cache, nullptr);
  EXPECT_THAT(cache->Open(ShardRef{"s3://bucket-only", 0, ""}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("s3://BUCKET/KEY")));
  EXPECT_THAT(
      cache->Open(ShardRef{"http://h/a b.tar", 0, ""}).status(),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("whitespace")));
  EXPECT_THAT(
      cache->Open(ShardRef{"http://h/a.tar", 0, "md5:abc"}).status(),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("md5:abc")));
  EXPECT_THAT(testing::FileNames(dir.path()), ElementsAre("LOCK"));
}

TEST(ShardCacheTest, CompositeStoreNamesTheMissingFlag) {
  CompositeShardStore store(nullptr, nullptr);
  EXPECT_THAT(store.Open("https://h/x.tar").status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("--cache_dir")));
  EXPECT_THAT(
      store.Open("/data/x.tar").status(),
      StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("--roots")));
  EXPECT_TRUE(store.IsRemote("s3://b/k"));
  EXPECT_FALSE(store.IsRemote("file:///b/k"));
}

TEST(ShardCacheTest, S3UrlsMapPathStyleOntoTheEndpoint) {
  RemoteFetcherOptions options;
  options.s3_endpoint = "http://127.0.0.1:9000/";
  RemoteFetcher fetcher(options);
  auto url = fetcher.HttpUrl("s3://bucket/dir/shard-0.tar");
  ASSERT_TRUE(url.ok()) << url.status();
  EXPECT_EQ(*url, "http://127.0.0.1:9000/bucket/dir/shard-0.tar");
}

// AWS's published SigV4 example (Amazon S3 API reference, "Signature
// Calculations for the Authorization Header", GET Object): the reference
// signer must reproduce it before it is trusted to judge libcurl's.
TEST(SigV4ReferenceTest, ReproducesAwsPublishedExample) {
  testing::SigV4Request r;
  r.method = "GET";
  r.canonical_uri = "/test.txt";
  r.headers = {
      {"host", "examplebucket.s3.amazonaws.com"},
      {"range", "bytes=0-9"},
      {"x-amz-content-sha256",
       "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
      {"x-amz-date", "20130524T000000Z"}};
  r.payload_sha256 =
      "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
  r.amz_date = "20130524T000000Z";
  r.region = "us-east-1";
  r.secret_key = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY";
  EXPECT_EQ(testing::Sha256Hex(testing::SigV4CanonicalRequest(r)),
            "7344ae5b7ee6c3e7e6b0fe0640412a37625d1fbfff95c48bbb2dc43964946972");
  EXPECT_EQ(testing::SigV4Signature(r),
            "f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41");
}

}  // namespace
}  // namespace sluice::dataserver
