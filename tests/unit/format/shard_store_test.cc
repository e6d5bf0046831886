#include "server/format/shard_store.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/tar_writer.h"
#include "tests/testing/temp_dir.h"

namespace sluice::dataserver {
namespace {

using ::sluice::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

class LocalShardStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = dir_.File("root");
    mkdir(root_.c_str(), 0755);
    mkdir((root_ + "/sub").c_str(), 0755);
    testing::WriteFile(root_ + "/sub/a.tar", "inside");
    testing::WriteFile(dir_.File("secret.tar"), "outside");
    ASSERT_EQ(
        symlink(dir_.File("secret.tar").c_str(), (root_ + "/out.tar").c_str()),
        0);
    ASSERT_EQ(
        symlink((root_ + "/sub/a.tar").c_str(), (root_ + "/in.tar").c_str()),
        0);
    auto store = LocalShardStore::Create({root_});
    ASSERT_OK(store.status());
    store_ = *std::move(store);
  }
  testing::TempDir dir_;
  std::string root_;
  std::unique_ptr<LocalShardStore> store_;
};

TEST_F(LocalShardStoreTest, OpensPathsAndFileUrlsInsideRoots) {
  auto a = store_->Open(root_ + "/sub/a.tar");
  ASSERT_OK(a.status());
  EXPECT_EQ((*a)->bytes(), "inside");
  auto b = store_->Open("file://" + root_ + "/sub/./a.tar");
  ASSERT_OK(b.status());
  EXPECT_EQ((*b)->bytes(), "inside");
  auto link = store_->Open(root_ + "/in.tar");  // symlink that stays inside
  ASSERT_OK(link.status());
  EXPECT_EQ((*link)->bytes(), "inside");
}

// A shard opened again is the same mapping while its URL names the same
// file; a file replaced, rewritten or swapped for a symlink leaving the
// roots is opened (and checked) afresh.
TEST_F(LocalShardStoreTest,
       AShardOpenedAgainIsReusedWhileItsUrlNamesTheSameFile) {
  const std::string a = root_ + "/sub/a.tar";
  auto first = store_->Open(a);
  ASSERT_OK(first.status());
  auto again = store_->Open(a);
  ASSERT_OK(again.status());
  EXPECT_EQ(first->get(), again->get());
  testing::WriteFile(a + ".new", "replaced");
  ASSERT_EQ(rename((a + ".new").c_str(), a.c_str()), 0);
  auto replaced = store_->Open(a);
  ASSERT_OK(replaced.status());
  EXPECT_EQ((*replaced)->bytes(), "replaced");
  EXPECT_EQ((*first)->bytes(), "inside");  // the old mapping keeps its bytes

  const std::string link = root_ + "/in.tar";
  ASSERT_OK(store_->Open(link).status());
  ASSERT_EQ(unlink(link.c_str()), 0);
  ASSERT_EQ(symlink(dir_.File("secret.tar").c_str(), link.c_str()), 0);
  EXPECT_THAT(store_->Open(link).status(),
              StatusIs(absl::StatusCode::kPermissionDenied));
}

TEST_F(LocalShardStoreTest, TraversalIsPermissionDenied) {
  for (const std::string& url :
       {root_ + "/../secret.tar", root_ + "/sub/../../secret.tar",
        "file://" + root_ + "/../secret.tar", root_ + "/out.tar",
        std::string("/etc/passwd"), root_ + "/../root-not/x.tar"}) {
    EXPECT_THAT(
        store_->Open(url).status(),
        StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("--roots")))
        << url;
  }
}

TEST_F(LocalShardStoreTest, MissingIsNotFoundAndBadUrlsAreInvalid) {
  EXPECT_THAT(store_->Open(root_ + "/nope.tar").status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("nope.tar")));
  EXPECT_THAT(
      store_->Open("relative/x.tar").status(),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("absolute")));
  EXPECT_THAT(
      store_->Open("ftp://host/x.tar").status(),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("scheme")));
  EXPECT_THAT(
      store_->Open(root_ + "/sub").status(),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("regular file")));
}

// A shard rewritten in place while mapped (against the contract: shards are
// replaced by rename) must end its readers with DATA_LOSS, not kill the
// server: reads of the pages the file lost would be SIGBUS.
class ChangedShardTest : public LocalShardStoreTest {
 protected:
  static constexpr size_t kPage = 4096;
  void SetUp() override {
    LocalShardStoreTest::SetUp();
    path_ = root_ + "/big.tar";
    testing::WriteFile(path_, std::string(6 * kPage, 'a'));
    // An old modification time, so a rewrite within the same clock tick is
    // still a different one.
    struct timespec old_times[2] = {{1600000000, 0}, {1600000000, 0}};
    ASSERT_EQ(utimensat(AT_FDCWD, path_.c_str(), old_times, 0), 0);
  }
  std::string path_;
};

TEST_F(ChangedShardTest, AnUnchangedShardIsIntact) {
  auto shard = store_->Open(path_);
  ASSERT_OK(shard.status());
  EXPECT_OK((*shard)->CheckIntact());
  EXPECT_OK(ShardData::FromString("in memory", "mem")->CheckIntact());
}

TEST_F(ChangedShardTest, ReadingPagesATruncationRemovedGivesZerosAndDataLoss) {
  auto shard = store_->Open(path_);
  ASSERT_OK(shard.status());
  absl::string_view bytes = (*shard)->bytes();
  ASSERT_EQ(truncate(path_.c_str(), kPage), 0);
  // Without the handler this read is SIGBUS and the test binary dies.
  const volatile char* p = bytes.data();
  EXPECT_EQ(p[3 * kPage + 5], '\0');
  EXPECT_EQ(p[6 * kPage - 1], '\0');  // each lost page faults on its own
  EXPECT_EQ(p[10], 'a');              // the page the file kept is untouched
  EXPECT_THAT((*shard)->CheckIntact(),
              StatusIs(absl::StatusCode::kDataLoss,
                       AllOf(HasSubstr(path_),
                             HasSubstr("truncated while being served"),
                             HasSubstr("rename"))));
  // Other shards mapped at the same time are not affected.
  auto other = store_->Open(root_ + "/sub/a.tar");
  ASSERT_OK(other.status());
  EXPECT_OK((*other)->CheckIntact());
  EXPECT_EQ((*other)->bytes(), "inside");
}

TEST_F(ChangedShardTest, ATruncationNotYetReadIsFoundByItsSize) {
  auto shard = store_->Open(path_);
  ASSERT_OK(shard.status());
  ASSERT_EQ(truncate(path_.c_str(), 2 * kPage + 100), 0);
  EXPECT_THAT(
      (*shard)->CheckIntact(),
      StatusIs(absl::StatusCode::kDataLoss,
               AllOf(HasSubstr(path_), HasSubstr("changed while being served"),
                     HasSubstr("24576 bytes when opened, 8292 now"))));
}

TEST_F(ChangedShardTest, ARewriteOfTheSameSizeIsFoundByItsModificationTime) {
  auto shard = store_->Open(path_);
  ASSERT_OK(shard.status());
  testing::WriteFile(path_, std::string(6 * kPage, 'b'));
  EXPECT_THAT((*shard)->CheckIntact(),
              StatusIs(absl::StatusCode::kDataLoss,
                       AllOf(HasSubstr(path_),
                             HasSubstr("modified since it was opened"))));
}

TEST_F(ChangedShardTest, ReplacingOrUnlinkingTheFileIsNotAChange) {
  // What the contract allows (and the shard cache does): a new file renamed
  // over the old one, or the old one unlinked. The open mapping keeps the
  // bytes it had.
  auto shard = store_->Open(path_);
  ASSERT_OK(shard.status());
  testing::WriteFile(path_ + ".new", std::string(2 * kPage, 'n'));
  ASSERT_EQ(rename((path_ + ".new").c_str(), path_.c_str()), 0);
  EXPECT_OK((*shard)->CheckIntact());
  ASSERT_EQ(unlink(path_.c_str()), 0);
  EXPECT_OK((*shard)->CheckIntact());
  EXPECT_EQ((*shard)->bytes(), std::string(6 * kPage, 'a'));
}

TEST_F(ChangedShardTest, AFaultOutsideAnyShardStillCrashes) {
  // The handler is installed by the first mapping; a SIGBUS that is not a
  // shard's keeps its default action.
  ASSERT_OK(store_->Open(path_).status());
  EXPECT_DEATH(
      {
        const int fd = open(path_.c_str(), O_RDONLY);
        void* addr = mmap(nullptr, 6 * kPage, PROT_READ, MAP_SHARED, fd, 0);
        if (addr == MAP_FAILED || truncate(path_.c_str(), 0) != 0) _exit(0);
        std::fprintf(stderr, "%d\n",
                     static_cast<const volatile char*>(addr)[3 * kPage]);
        _exit(0);
      },
      "");
}

TEST(LocalShardStoreCreateTest, RootsMustExist) {
  EXPECT_THAT(
      LocalShardStore::Create({}).status(),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--roots")));
  EXPECT_THAT(
      LocalShardStore::Create({"/no/such/dir"}).status(),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("/no/such/dir")));
}

TEST(NormalizeAbsolutePathTest, Collapses) {
  EXPECT_EQ(NormalizeAbsolutePath("/a/./b/../c//d"), "/a/c/d");
  EXPECT_EQ(NormalizeAbsolutePath("/../.."), "/");
}

}  // namespace
}  // namespace sluice::dataserver
