#include "server/dataserver/shard_store.h"

#include <sys/stat.h>
#include <unistd.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/tar_writer.h"
#include "tests/testing/temp_dir.h"

namespace sluice::dataserver {
namespace {

using ::sluice::testing::StatusIs;
using ::testing::HasSubstr;

class LocalShardStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = dir_.File("root");
    mkdir(root_.c_str(), 0755);
    mkdir((root_ + "/sub").c_str(), 0755);
    testing::WriteFile(root_ + "/sub/a.tar", "inside");
    testing::WriteFile(dir_.File("secret.tar"), "outside");
    ASSERT_EQ(symlink(dir_.File("secret.tar").c_str(), (root_ + "/out.tar").c_str()), 0);
    ASSERT_EQ(symlink((root_ + "/sub/a.tar").c_str(), (root_ + "/in.tar").c_str()), 0);
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

TEST_F(LocalShardStoreTest, TraversalIsPermissionDenied) {
  for (const std::string& url :
       {root_ + "/../secret.tar", root_ + "/sub/../../secret.tar",
        "file://" + root_ + "/../secret.tar", root_ + "/out.tar",
        std::string("/etc/passwd"), root_ + "/../root-not/x.tar"}) {
    EXPECT_THAT(store_->Open(url).status(),
                StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("--roots")))
        << url;
  }
}

TEST_F(LocalShardStoreTest, MissingIsNotFoundAndBadUrlsAreInvalid) {
  EXPECT_THAT(store_->Open(root_ + "/nope.tar").status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("nope.tar")));
  EXPECT_THAT(store_->Open("relative/x.tar").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("absolute")));
  EXPECT_THAT(store_->Open("ftp://host/x.tar").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("scheme")));
  EXPECT_THAT(store_->Open(root_ + "/sub").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("regular file")));
}

TEST(LocalShardStoreCreateTest, RootsMustExist) {
  EXPECT_THAT(LocalShardStore::Create({}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--roots")));
  EXPECT_THAT(LocalShardStore::Create({"/no/such/dir"}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("/no/such/dir")));
}

TEST(NormalizeAbsolutePathTest, Collapses) {
  EXPECT_EQ(NormalizeAbsolutePath("/a/./b/../c//d"), "/a/c/d");
  EXPECT_EQ(NormalizeAbsolutePath("/../.."), "/");
}

}  // namespace
}  // namespace sluice::dataserver
