// The shard cache's directory on its own: install, verification, lookup,
// mapping and removal, with a fetch the test writes instead of a download.
#include "server/dataserver/cache_directory.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "tests/testing/sigv4.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/tar_writer.h"
#include "tests/testing/temp_dir.h"

namespace sluice::dataserver {
namespace {

using ::sluice::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;

// A fetch that writes `body` (and hashes it when asked).
CacheDirectory::Fetch Serving(std::string body) {
  return [body](int fd, bool sha256,
                FetchFailure*) -> absl::StatusOr<FetchResult> {
    EXPECT_EQ(write(fd, body.data(), body.size()),
              static_cast<ssize_t>(body.size()));
    FetchResult r;
    r.bytes = static_cast<int64_t>(body.size());
    r.attempts = 1;
    if (sha256) r.sha256 = testing::Sha256Hex(body);
    return r;
  };
}

constexpr char kUrl[] = "http://h/a.tar";

// Installs kUrl holding "body", unhashed (the manifest has no checksum).
void InstallBody(const CacheDirectory& directory) {
  FetchFailure failure = FetchFailure::kNone;
  std::string sha;
  auto data = directory.Install(ShardRef{kUrl, 0, ""}, 1, Serving("body"),
                                &failure, &sha);
  ASSERT_TRUE(data.ok()) << data.status();
}

TEST(CacheDirectoryTest, InstallsAVerifiedShardUnderItsFinalNamesOnly) {
  testing::TempDir dir;
  CacheDirectory directory(dir.path());
  const std::string body = "shard body";
  const ShardRef shard{kUrl, 10, "sha256:" + testing::Sha256Hex(body)};
  FetchFailure failure = FetchFailure::kNone;
  std::string sha;
  auto data = directory.Install(shard, 1, Serving(body), &failure, &sha);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ((*data)->bytes(), body);
  EXPECT_EQ(sha, testing::Sha256Hex(body));
  const std::string hash = testing::Sha256Hex(kUrl);
  EXPECT_THAT(testing::FileNames(dir.path()),
              UnorderedElementsAre(hash + ".shard", hash + ".meta"));
  EXPECT_EQ(directory.ShardPath(kUrl), dir.File(hash + ".shard"));
  EXPECT_EQ(testing::ReadFileOrDie(dir.File(hash + ".meta")),
            absl::StrCat("sluice-cache-v1\n", kUrl, "\n10\n",
                         testing::Sha256Hex(body), "\n"));
  auto record = directory.Find(shard, testing::Sha256Hex(body));
  ASSERT_TRUE(record.has_value());
  EXPECT_EQ(record->size, 10);
  auto mapped = directory.Map(*record);
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  EXPECT_EQ((*mapped)->bytes(), body);
}

TEST(CacheDirectoryTest, AChecksumMismatchInstallsNothing) {
  testing::TempDir dir;
  CacheDirectory directory(dir.path());
  const ShardRef shard{kUrl, 0, "sha256:" + testing::Sha256Hex("other")};
  FetchFailure failure = FetchFailure::kNone;
  std::string sha;
  auto data = directory.Install(shard, 1, Serving("body"), &failure, &sha);
  EXPECT_THAT(data.status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("not cached")));
  EXPECT_EQ(failure, FetchFailure::kChecksumMismatch);
  EXPECT_THAT(testing::FileNames(dir.path()), ::testing::IsEmpty());
}

TEST(CacheDirectoryTest, ASizeMismatchOrAFailedFetchLeavesNoFile) {
  testing::TempDir dir;
  CacheDirectory directory(dir.path());
  FetchFailure failure = FetchFailure::kNone;
  std::string sha;
  auto data = directory.Install(ShardRef{kUrl, 99, ""}, 1, Serving("body"),
                                &failure, &sha);
  EXPECT_THAT(data.status(), StatusIs(absl::StatusCode::kDataLoss,
                                      HasSubstr("size_bytes 99")));
  EXPECT_EQ(failure, FetchFailure::kSizeMismatch);
  auto failed = directory.Install(
      ShardRef{kUrl, 0, ""}, 2,
      [](int, bool, FetchFailure* f) -> absl::StatusOr<FetchResult> {
        *f = FetchFailure::kNetwork;
        return absl::UnavailableError("connection refused");
      },
      &failure, &sha);
  EXPECT_THAT(failed.status(), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_EQ(failure, FetchFailure::kNetwork);
  EXPECT_THAT(testing::FileNames(dir.path()), ::testing::IsEmpty());
}

TEST(CacheDirectoryTest, FindRefusesARecordThatDisagreesWithTheManifest) {
  testing::TempDir dir;
  CacheDirectory directory(dir.path());
  ASSERT_NO_FATAL_FAILURE(InstallBody(directory));
  EXPECT_TRUE(directory.Find(ShardRef{kUrl, 0, ""}, "").has_value());
  EXPECT_TRUE(directory.Find(ShardRef{kUrl, 4, ""}, "").has_value());
  EXPECT_FALSE(directory.Find(ShardRef{kUrl, 5, ""}, "").has_value());
  // Installed without hashing: a later request with a checksum must not
  // take it on trust.
  EXPECT_FALSE(directory.Find(ShardRef{kUrl, 0, ""}, testing::Sha256Hex("body"))
                   .has_value());
  EXPECT_FALSE(
      directory.Find(ShardRef{"http://h/b.tar", 0, ""}, "").has_value());
}

TEST(CacheDirectoryTest, RemovedEntriesAreGoneAndNoLongerMap) {
  testing::TempDir dir;
  CacheDirectory directory(dir.path());
  ASSERT_NO_FATAL_FAILURE(InstallBody(directory));
  directory.Remove(kUrl);
  EXPECT_THAT(testing::FileNames(dir.path()), ::testing::IsEmpty());
  EXPECT_FALSE(directory.Find(ShardRef{kUrl, 0, ""}, "").has_value());
  EXPECT_THAT(directory.Map(CacheDirectory::Record{kUrl, 4, ""}).status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("vanished")));
}

}  // namespace
}  // namespace sluice::dataserver
