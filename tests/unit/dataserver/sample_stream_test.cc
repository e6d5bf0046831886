#include "server/dataserver/sample_stream.h"

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "server/dataserver/decode_budget.h"
#include "server/dataserver/fair_pool.h"
#include "server/format/shard_store.h"
#include "server/format/tar_shard_reader.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/tar_writer.h"
#include "tests/testing/temp_dir.h"
#include "tests/unit/dataserver/stream_reading.h"

namespace sluice::dataserver {
namespace {

// A stream needs nothing of a server but its StreamContext: it opens its
// shard through the context's store, indexes it through the context's
// index function, reads and frames on the context's pool, and reports its
// end to the context once.
TEST(SampleStreamTest, AStreamRunsOnItsContextAlone) {
  testing::TempDir dir;
  testing::TarWriter tar;
  for (int i = 0; i < 6; ++i) {
    tar.File(absl::StrCat("s", i, ".cls"), std::to_string(10 * i));
  }
  testing::WriteFile(dir.File("a.tar"), tar.Finish());
  auto store = LocalShardStore::Create({dir.path()});
  ASSERT_OK(store);

  auto pool = std::make_unique<FairPool>(2);
  DecodeMemoryBudget budget(1 << 20);
  std::atomic<int> indexed{0}, ended{0};
  StreamContext context;
  context.pool = pool.get();
  context.decode_budget = &budget;
  context.store = store->get();
  context.index = [&](const std::shared_ptr<const ShardData>& shard) {
    ++indexed;
    return std::make_shared<const ShardIndex>(BuildShardIndex(shard));
  };
  context.stream_ended = [&](const v1::Lease&) { ++ended; };

  SampleStream::Params params;
  SampleStream::Piece piece;
  piece.ref.url = dir.File("a.tar");  // opened through context.store
  params.pieces.push_back(piece);
  params.lease.set_lease_id("j/e0/u1/f1");
  params.start = 1;
  params.end = 5;
  params.batch_bytes = 1 << 20;
  auto stream = std::make_shared<SampleStream>(&context, std::move(params));

  std::vector<std::string> keys;
  std::vector<std::string> classes;
  for (;;) {
    absl::StatusOr<std::optional<EncodedMessage>> next = NextOf(*stream);
    ASSERT_OK(next);
    if (!next->has_value()) break;
    v1::SampleBatch batch;
    ASSERT_TRUE(batch.ParseFromString((*next)->Flatten()));
    for (const v1::Sample& s : batch.samples()) {
      keys.push_back(s.key());
      for (const auto& f : s.fields()) classes.push_back(f.raw());
    }
  }
  EXPECT_EQ(keys, (std::vector<std::string>{"s1", "s2", "s3", "s4"}));
  EXPECT_EQ(classes, (std::vector<std::string>{"10", "20", "30", "40"}));
  EXPECT_EQ(indexed.load(), 1);
  EXPECT_EQ(ended.load(), 0);
  stream.reset();
  pool.reset();  // its tasks, and the references to the stream they held
  EXPECT_EQ(ended.load(), 1);
}

}  // namespace
}  // namespace sluice::dataserver
