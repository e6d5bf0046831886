#include "server/dataserver/dataserver_service.h"

#include <google/protobuf/text_format.h>
#include <prometheus/registry.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <set>
#include <thread>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/common/lease_token.h"
#include "server/common/shuffle_window.h"
#include "tests/testing/image_fixtures.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/tar_writer.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/wait.h"
#include "tests/unit/dataserver/stream_reading.h"

namespace sluice::dataserver {
namespace {

using ::sluice::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Counts Open calls, to prove a request was refused before any I/O.
class CountingStore : public ShardStore {
 public:
  explicit CountingStore(std::unique_ptr<ShardStore> inner)
      : inner_(std::move(inner)) {}
  using ShardStore::Open;
  absl::StatusOr<std::shared_ptr<const ShardData>> Open(
      const ShardRef& shard) override {
    ++opens;
    return inner_->Open(shard);
  }
  std::atomic<int> opens{0};

 private:
  std::unique_ptr<ShardStore> inner_;
};

absl::StatusOr<std::vector<v1::SampleBatch>> ReadAll(SampleStream& stream) {
  std::vector<v1::SampleBatch> out;
  while (true) {
    absl::StatusOr<std::optional<EncodedMessage>> next = NextOf(stream);
    if (!next.ok()) return next.status();
    if (!next->has_value()) return out;
    v1::SampleBatch batch;
    if (!batch.ParseFromString((*next)->Flatten())) {
      return absl::InternalError("message does not parse");
    }
    out.push_back(std::move(batch));
  }
}

// Reads a stream expected to end in an error: the indices of the samples
// delivered before it, and the error (OK if the stream ended cleanly,
// DEADLINE_EXCEEDED if it stalled).
struct UntilError {
  std::vector<int64_t> indices;
  absl::Status error;
};
UntilError ReadUntilError(SampleStream& stream) {
  UntilError out;
  while (true) {
    absl::StatusOr<std::optional<EncodedMessage>> next = NextOf(stream);
    if (!next.ok()) {
      out.error = next.status();
      return out;
    }
    if (!next->has_value()) return out;  // ended without an error
    v1::SampleBatch batch;
    if (!batch.ParseFromString((*next)->Flatten())) {
      out.error = absl::InternalError("message does not parse");
      return out;
    }
    for (const auto& sample : batch.samples())
      out.indices.push_back(sample.index());
  }
}

std::vector<v1::Sample> Samples(const std::vector<v1::SampleBatch>& batches) {
  std::vector<v1::Sample> out;
  for (const auto& b : batches)
    out.insert(out.end(), b.samples().begin(), b.samples().end());
  return out;
}

// Hands out the given shards in turn (the same path, so the same index
// cache entry when their sizes match): a shard that changed under its index.
class SequenceStore : public ShardStore {
 public:
  explicit SequenceStore(std::vector<std::shared_ptr<const ShardData>> shards)
      : shards_(std::move(shards)) {}
  using ShardStore::Open;
  absl::StatusOr<std::shared_ptr<const ShardData>> Open(
      const ShardRef&) override {
    size_t i = std::min(next_++, shards_.size() - 1);
    return shards_[i];
  }

 private:
  std::vector<std::shared_ptr<const ShardData>> shards_;
  size_t next_ = 0;
};

class DataServerServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    jpeg_ = testing::EncodeJpeg(testing::TestPixels(64, 48, 3), 64, 48);
    testing::TarWriter tar;
    for (int i = 0; i < 20; ++i) {
      std::string key = absl::StrCat("img/", i);
      tar.File(key + ".jpg", i == 7 ? std::string("not a jpeg") : jpeg_)
          .File(key + ".cls", std::to_string(i))
          .File(key + ".json", absl::StrCat("{\"i\": ", i, "}"));
    }
    shard_ = dir_.File("a.tar");
    testing::WriteFile(shard_, tar.Finish());
    Make("");
  }

  void Make(const std::string& secret,
            std::function<void(int64_t)> before_decode = nullptr) {
    auto local = LocalShardStore::Create({dir_.path()});
    ASSERT_OK(local.status());
    auto store = std::make_unique<CountingStore>(*std::move(local));
    store_ = store.get();
    DataServerOptions options;
    options.store = std::move(store);
    options.lease_secret = secret;
    options.decode_threads = 2;
    options.metrics = &metrics_;
    options.before_decode_for_testing = std::move(before_decode);
    options.max_streams_per_tenant = max_streams_per_tenant_;
    auto service = DataServerService::Create(std::move(options));
    ASSERT_OK(service.status());
    service_ = *std::move(service);
  }

  v1::ReadRequest Request(int64_t begin, int64_t end) {
    v1::ReadRequest r;
    r.mutable_lease()->set_lease_id("j/e0/u1/f1");
    r.mutable_lease()->set_job("j");
    r.mutable_lease()->set_fence(1);
    r.mutable_lease()->mutable_unit()->mutable_shard()->set_url(shard_);
    r.mutable_lease()->mutable_unit()->set_begin(begin);
    r.mutable_lease()->mutable_unit()->set_end(end);
    return r;
  }

  absl::StatusOr<std::vector<v1::Sample>> Read(const v1::ReadRequest& r) {
    auto stream = service_->ReadSamples(r);
    if (!stream.ok()) return stream.status();
    auto batches = ReadAll(**stream);
    if (!batches.ok()) return batches.status();
    return Samples(*batches);
  }

  double Metric(prometheus::Counter& c) { return c.Value(); }

  testing::TempDir dir_;
  std::string shard_, jpeg_;
  prometheus::Registry registry_;
  DataServerMetrics metrics_{registry_};
  CountingStore* store_ = nullptr;
  int32_t max_streams_per_tenant_ = 0;
  std::unique_ptr<DataServerService> service_;
};

TEST_F(DataServerServiceTest, RawRangeInOrderWithExactBytes) {
  auto samples = Read(Request(3, 12));
  ASSERT_OK(samples.status());
  ASSERT_EQ(samples->size(), 9u);
  for (int i = 0; i < 9; ++i) {
    const v1::Sample& s = (*samples)[i];
    EXPECT_EQ(s.index(), 3 + i);
    EXPECT_EQ(s.key(), absl::StrCat("img/", 3 + i));
    ASSERT_EQ(s.fields_size(), 3);
    EXPECT_EQ(s.fields(0).name(), "jpg");
    EXPECT_EQ(s.fields(0).raw(), 3 + i == 7 ? "not a jpeg" : jpeg_);
    EXPECT_EQ(s.fields(1).raw(), std::to_string(3 + i));
  }
  EXPECT_EQ(metrics_.samples_served.Value(), 9);
}

// --max_streams_per_tenant: a tenant's next stream beyond the limit is
// refused naming the tenant and the flag; another tenant's is not; a
// stream that ends frees its place.
TEST_F(DataServerServiceTest, StreamsPerTenantAreCapped) {
  max_streams_per_tenant_ = 2;
  Make("");
  auto request = [&](const char* tenant, int unit) {
    v1::ReadRequest r = Request(0, 5);
    r.mutable_lease()->set_lease_id(absl::StrCat("j/e0/u", unit, "/f1"));
    r.mutable_lease()->set_tenant(tenant);
    return r;
  };
  auto first = service_->ReadSamples(request("a", 1));
  ASSERT_OK(first.status());
  auto second = service_->ReadSamples(request("a", 2));
  ASSERT_OK(second.status());
  EXPECT_THAT(service_->ReadSamples(request("a", 3)),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("tenant \"a\" has 2 streams open on this "
                                 "data server; the limit is 2 "
                                 "(--max_streams_per_tenant)")));
  auto other = service_->ReadSamples(request("b", 4));
  ASSERT_OK(other.status());
  EXPECT_EQ(service_->active_streams(), 3);

  std::weak_ptr<SampleStream> weak = *first;
  ASSERT_OK(ReadAll(**first).status());
  first->reset();
  ASSERT_TRUE(
      testing::WaitUntil([&] { return weak.expired(); }, absl::Seconds(20)));
  auto third = service_->ReadSamples(request("a", 3));
  ASSERT_OK(third.status());
  EXPECT_EQ(Samples(*ReadAll(**third)).size(), 5u);
}

TEST_F(DataServerServiceTest, StartResumesInsideTheUnit) {
  auto r = Request(3, 12);
  r.set_start(10);
  auto samples = Read(r);
  ASSERT_OK(samples.status());
  ASSERT_EQ(samples->size(), 2u);
  EXPECT_EQ((*samples)[0].index(), 10);
}

TEST_F(DataServerServiceTest, DecodedFieldsAndSelection) {
  auto r = Request(0, 3);
  r.mutable_decode()->set_decode(true);
  r.add_fields("jpg");
  r.add_fields("cls");
  auto samples = Read(r);
  ASSERT_OK(samples.status());
  ASSERT_EQ(samples->size(), 3u);
  const v1::Sample& s = (*samples)[2];
  ASSERT_EQ(s.fields_size(), 2);
  EXPECT_EQ(s.fields(0).tensor().dtype(), v1::DTYPE_UINT8);
  EXPECT_THAT(s.fields(0).tensor().shape(), ElementsAre(48, 64, 3));
  EXPECT_EQ(s.fields(0).tensor().data().size(), 48u * 64 * 3);
  EXPECT_EQ(s.fields(1).int_value(), 2);
}

// A lease that says another job reads the same shards decodes through the
// shared cache though no other job has a stream open; a lease that does not
// say so decodes alone. Either way the tensors are the same.
TEST_F(DataServerServiceTest, ALeaseOfSharedShardsDecodesThroughTheCache) {
  auto alone = Request(0, 3);
  alone.mutable_decode()->set_decode(true);
  alone.add_fields("jpg");
  auto first = Read(alone);
  ASSERT_OK(first.status());
  ASSERT_NE(service_->decoded_images(), nullptr);
  EXPECT_EQ(service_->decoded_images()->stats().misses, 0);
  auto shared = alone;
  shared.mutable_lease()->set_shared_shards(true);
  auto second = Read(shared);
  ASSERT_OK(second.status());
  EXPECT_EQ(service_->decoded_images()->stats().misses, 3);
  EXPECT_EQ(service_->decoded_images()->stats().hits, 0);
  shared.mutable_lease()->set_job("k");
  shared.mutable_lease()->set_lease_id("k/e0/u1/f1");
  auto third = Read(shared);
  ASSERT_OK(third.status());
  EXPECT_EQ(service_->decoded_images()->stats().hits, 3);
  ASSERT_EQ(first->size(), 3u);
  for (const auto* got : {&*second, &*third}) {
    ASSERT_EQ(got->size(), 3u);
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_EQ((*got)[i].fields(0).tensor().data(),
                (*first)[i].fields(0).tensor().data());
    }
  }
}

TEST_F(DataServerServiceTest, SmallBatchesStayUnderTheLimit) {
  auto r = Request(0, 20);
  r.set_max_batch_bytes(3 * 1024);
  auto stream = service_->ReadSamples(r);
  ASSERT_OK(stream.status());
  auto batches = ReadAll(**stream);
  ASSERT_OK(batches.status());
  EXPECT_GT(batches->size(), 5u);
  for (const auto& b : *batches) {
    if (b.samples_size() > 1) {
      EXPECT_LE(b.ByteSizeLong(), 3u * 1024);
    }
  }
  EXPECT_EQ(Samples(*batches).size(), 20u);
}

TEST_F(DataServerServiceTest, UndecodableImageIsSkippedUnderSkip) {
  auto r = Request(5, 10);
  r.mutable_decode()->set_decode(true);
  auto samples = Read(r);
  ASSERT_OK(samples.status());
  ASSERT_EQ(samples->size(), 5u);
  const v1::Sample& bad = (*samples)[2];
  EXPECT_EQ(bad.index(), 7);
  EXPECT_EQ(bad.key(), "img/7");
  EXPECT_TRUE(bad.skipped());
  EXPECT_THAT(bad.skip_reason(), HasSubstr("img/7.jpg"));
  EXPECT_THAT(bad.skip_reason(), HasSubstr(shard_));
  EXPECT_EQ(bad.fields_size(), 0);
  EXPECT_FALSE((*samples)[3].skipped());
  // Counted under its job (the job-less series stays at 0).
  EXPECT_EQ(metrics_.Skipped(CorruptReason::kUndecodable, "j").Value(), 1);
  EXPECT_EQ(metrics_.Skipped(CorruptReason::kUndecodable).Value(), 0);
}

TEST_F(DataServerServiceTest, UndecodableImageFailsTheStreamUnderFail) {
  auto r = Request(5, 10);
  r.mutable_decode()->set_decode(true);
  r.mutable_lease()->set_on_corrupt(v1::CORRUPT_POLICY_FAIL);
  EXPECT_THAT(Read(r).status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("img/7.jpg")));
  EXPECT_EQ(metrics_.Corrupt(CorruptReason::kUndecodable).Value(), 1);
  EXPECT_EQ(metrics_.Skipped(CorruptReason::kUndecodable, "j").Value(), 0);
}

TEST_F(DataServerServiceTest, BadRequests) {
  EXPECT_THAT(Read(Request(15, 25)).status(),
              StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("20 samples")));
  EXPECT_THAT(Read(Request(5, 5)).status(),
              StatusIs(absl::StatusCode::kOutOfRange));
  auto missing = Request(0, 1);
  missing.mutable_lease()->mutable_unit()->mutable_shard()->set_url(
      dir_.File("nope.tar"));
  EXPECT_THAT(Read(missing).status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("nope.tar")));
  auto outside = Request(0, 1);
  outside.mutable_lease()->mutable_unit()->mutable_shard()->set_url(
      dir_.path() + "/../x.tar");
  EXPECT_THAT(Read(outside).status(),
              StatusIs(absl::StatusCode::kPermissionDenied));
  auto crop = Request(0, 1);
  crop.mutable_decode()->set_crop_height(10);
  EXPECT_THAT(Read(crop).status(), StatusIs(absl::StatusCode::kInvalidArgument,
                                            HasSubstr("crop_width")));
  auto start = Request(2, 4);
  start.set_start(9);
  EXPECT_THAT(Read(start).status(),
              StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("start")));
  // A unit without a kind (what a peer of another protocol version sends):
  // refused naming the lease and the field.
  auto no_kind = Request(0, 1);
  no_kind.mutable_lease()->mutable_unit()->clear_kind();
  EXPECT_THAT(Read(no_kind).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("\"j/e0/u1/f1\""),
                             HasSubstr("lease.unit names no kind"))));
  auto no_url = Request(0, 1);
  no_url.mutable_lease()->mutable_unit()->mutable_shard()->clear_url();
  EXPECT_THAT(Read(no_url).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("lease.unit.shard.url is empty")));
}

// A window unit over three shards of 4, 6 and 5 samples (keys "sN/i").
class WindowUnitTest : public DataServerServiceTest {
 protected:
  void SetUp() override {
    DataServerServiceTest::SetUp();
    for (int s = 0; s < 3; ++s) {
      testing::TarWriter tar;
      for (int i = 0; i < sizes_[s]; ++i) {
        tar.File(absl::StrCat("s", s, "/", i, ".cls"), std::to_string(i));
      }
      urls_.push_back(dir_.File(absl::StrCat("w", s, ".tar")));
      testing::WriteFile(urls_.back(), tar.Finish());
    }
  }

  v1::ReadRequest WindowRequest(int64_t begin, int64_t end) {
    v1::ReadRequest r = Request(begin, end);
    v1::WindowUnit* unit = r.mutable_lease()->mutable_unit()->mutable_window();
    unit->set_window_index(1);
    unit->set_window_order(kOrder);
    for (int s = 0; s < 3; ++s) {
      v1::WindowPiece* piece = unit->add_pieces();
      piece->set_shard_index(10 + s);
      piece->set_url(urls_[s]);
      piece->set_num_samples(sizes_[s]);
    }
    return r;
  }

  // What position p serves, from the labels: (piece, sample).
  std::vector<std::pair<int, int>> Expected() const {
    std::vector<std::pair<int, int>> out;
    std::vector<int> next(3, 0);
    for (uint16_t l : WindowLabels({4, 6, 5}, kOrder))
      out.emplace_back(l, next[l]++);
    return out;
  }

  static constexpr uint64_t kOrder = 0x5EED;
  const int sizes_[3] = {4, 6, 5};
  std::vector<std::string> urls_;
};

TEST_F(WindowUnitTest, ServesThePositionsInTheWindowsOrder) {
  auto samples = Read(WindowRequest(0, 15));
  ASSERT_OK(samples.status());
  const auto want = Expected();
  ASSERT_EQ(samples->size(), want.size());
  int switches = 0;
  for (size_t p = 0; p < want.size(); ++p) {
    const v1::Sample& s = (*samples)[p];
    EXPECT_EQ(s.piece(), want[p].first) << p;
    EXPECT_EQ(s.index(), want[p].second) << p;
    EXPECT_EQ(s.key(), absl::StrCat("s", want[p].first, "/", want[p].second));
    ASSERT_EQ(s.fields_size(), 1);
    EXPECT_EQ(s.fields(0).raw(), std::to_string(want[p].second));
    if (p > 0 && want[p].first != want[p - 1].first) ++switches;
  }
  EXPECT_GT(switches, 3);  // the shards are interleaved, not concatenated
}

TEST_F(WindowUnitTest, UnitsAndStartsServeTheirPartOfTheSameOrder) {
  const auto want = Expected();
  std::vector<std::pair<int, int>> got;
  // Units [0, 4), [4, 11), [11, 15); the second resumed at 7.
  for (auto [begin, end, start] : std::vector<std::tuple<int, int, int>>{
           {0, 4, 0}, {4, 11, 7}, {11, 15, 0}}) {
    v1::ReadRequest r = WindowRequest(begin, end);
    r.set_start(start);
    auto samples = Read(r);
    ASSERT_OK(samples.status());
    for (const v1::Sample& s : *samples)
      got.emplace_back(s.piece(), static_cast<int>(s.index()));
  }
  std::vector<std::pair<int, int>> expected(want.begin(), want.begin() + 4);
  expected.insert(expected.end(), want.begin() + 7, want.end());
  EXPECT_EQ(got, expected);
}

TEST_F(WindowUnitTest, BadWindowsAreRefusedNamingTheShard) {
  EXPECT_THAT(Read(WindowRequest(10, 16)).status(),
              StatusIs(absl::StatusCode::kOutOfRange,
                       HasSubstr("15 samples of its shuffle window")));
  auto more = WindowRequest(0, 15);
  more.mutable_lease()
      ->mutable_unit()
      ->mutable_window()
      ->mutable_pieces(2)
      ->set_num_samples(9);
  EXPECT_THAT(Read(more).status(),
              StatusIs(absl::StatusCode::kOutOfRange,
                       AllOf(HasSubstr(urls_[2]), HasSubstr("has 5 samples"),
                             HasSubstr("manifest says 9"))));
  auto empty_url = WindowRequest(0, 3);
  empty_url.mutable_lease()
      ->mutable_unit()
      ->mutable_window()
      ->mutable_pieces(1)
      ->clear_url();
  EXPECT_THAT(Read(empty_url).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("lease.unit.window.pieces[1]")));
}

// A store whose every shard is remote: opens wait until the test releases
// them, in any order; a URL in `fail` is NOT_FOUND.
class HeldRemoteStore : public ShardStore {
 public:
  explicit HeldRemoteStore(std::unique_ptr<ShardStore> inner)
      : inner_(std::move(inner)) {}
  using ShardStore::Open;
  absl::StatusOr<std::shared_ptr<const ShardData>> Open(
      const ShardRef& shard) override {
    return inner_->Open(shard);
  }
  bool IsRemote(absl::string_view) const override { return true; }
  void OpenAsync(const ShardRef& shard, OpenCallback done) override {
    absl::MutexLock lock(&mu_);
    held_.emplace_back(shard, std::move(done));
  }
  // Waits for `n` opens, then answers them last first.
  void ReleaseInReverse(size_t n, const std::string& fail = "") {
    std::vector<std::pair<ShardRef, OpenCallback>> held;
    {
      absl::MutexLock lock(&mu_);
      wanted_ = n;
      mu_.Await(absl::Condition(this, &HeldRemoteStore::Enough));
      held.swap(held_);
    }
    for (auto it = held.rbegin(); it != held.rend(); ++it) {
      if (it->first.url == fail) {
        it->second(absl::NotFoundError("no " + fail));
      } else {
        it->second(inner_->Open(it->first));
      }
    }
  }

 private:
  bool Enough() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return held_.size() >= wanted_;
  }
  std::unique_ptr<ShardStore> inner_;
  absl::Mutex mu_;
  std::vector<std::pair<ShardRef, OpenCallback>> held_ ABSL_GUARDED_BY(mu_);
  size_t wanted_ ABSL_GUARDED_BY(mu_) = 0;
};

// Remote pieces are opened in parallel; the stream starts once the last
// arrives, whatever their order, and the first one that fails ends it.
TEST_F(WindowUnitTest, RemotePiecesOpenInAnyOrderAndAFailureEndsTheStream) {
  for (const std::string& fail : {std::string(), urls_[1]}) {
    auto local = LocalShardStore::Create({dir_.path()});
    ASSERT_OK(local.status());
    auto held = std::make_unique<HeldRemoteStore>(*std::move(local));
    HeldRemoteStore* store = held.get();
    DataServerOptions options;
    options.store = std::move(held);
    options.decode_threads = 2;
    auto service = DataServerService::Create(std::move(options));
    ASSERT_OK(service.status());
    auto stream = (*service)->ReadSamples(WindowRequest(0, 15));
    ASSERT_OK(stream.status());
    absl::StatusOr<std::vector<v1::SampleBatch>> batches;
    std::thread reader([&] { batches = ReadAll(**stream); });
    store->ReleaseInReverse(3, fail);
    reader.join();
    if (!fail.empty()) {
      EXPECT_THAT(batches.status(),
                  StatusIs(absl::StatusCode::kNotFound, HasSubstr(fail)));
      continue;
    }
    ASSERT_OK(batches.status());
    std::vector<std::pair<int, int>> got;
    for (const v1::Sample& s : Samples(*batches))
      got.emplace_back(s.piece(), static_cast<int>(s.index()));
    EXPECT_EQ(got, Expected());
  }
}

TEST_F(WindowUnitTest, TheTokenSignsThePieces) {
  Make("s3cret");
  auto r = WindowRequest(0, 15);
  r.mutable_lease()->set_token(SignLease(r.lease(), "s3cret"));
  ASSERT_OK(Read(r).status());
  auto other = r;
  other.mutable_lease()
      ->mutable_unit()
      ->mutable_window()
      ->mutable_pieces(0)
      ->set_url(urls_[1]);
  EXPECT_THAT(Read(other).status(),
              StatusIs(absl::StatusCode::kPermissionDenied));
  auto order = r;
  order.mutable_lease()->mutable_unit()->mutable_window()->set_window_order(
      kOrder + 1);
  EXPECT_THAT(Read(order).status(),
              StatusIs(absl::StatusCode::kPermissionDenied));
}

TEST_F(DataServerServiceTest, TokensAreCheckedBeforeAnyIo) {
  Make("s3cret");
  auto r = Request(0, 2);
  EXPECT_THAT(Read(r).status(), StatusIs(absl::StatusCode::kPermissionDenied,
                                         HasSubstr("j/e0/u1/f1")));
  r.mutable_lease()->set_token(SignLease(r.lease(), "other secret"));
  EXPECT_THAT(Read(r).status(), StatusIs(absl::StatusCode::kPermissionDenied));
  EXPECT_EQ(store_->opens, 0);
  r.mutable_lease()->set_token(SignLease(r.lease(), "s3cret"));
  auto ok = Read(r);
  ASSERT_OK(ok.status());
  EXPECT_EQ(ok->size(), 2u);
  // A token does not survive a change of the range it signs.
  r.mutable_lease()->mutable_unit()->set_end(3);
  EXPECT_THAT(Read(r).status(), StatusIs(absl::StatusCode::kPermissionDenied));
}

TEST_F(DataServerServiceTest, OlderFenceForTheSameUnitIsAborted) {
  Make("s3cret");
  auto newer = Request(0, 2);
  newer.mutable_lease()->set_fence(3);
  newer.mutable_lease()->set_token(SignLease(newer.lease(), "s3cret"));
  ASSERT_OK(Read(newer).status());
  auto older = Request(0, 2);
  older.mutable_lease()->set_fence(2);
  older.mutable_lease()->set_token(SignLease(older.lease(), "s3cret"));
  EXPECT_THAT(Read(older).status(),
              StatusIs(absl::StatusCode::kAborted, HasSubstr("fence 3")));
}

// The answer of an asynchronous call of the service: `call(done)`.
template <typename Response, typename Call>
absl::StatusOr<Response> Await(Call call) {
  absl::Notification done;
  absl::StatusOr<Response> out = absl::UnknownError("no answer");
  call([&](absl::StatusOr<Response> r) {
    out = std::move(r);
    done.Notify();
  });
  done.WaitForNotification();
  return out;
}

absl::StatusOr<v1::ReplayedSample> Replay(DataServerService& service,
                                          const v1::ReadRequest& request) {
  return Await<v1::ReplayedSample>(
      [&](auto done) { service.ReplaySample(request, std::move(done)); });
}

// A replay lease of one sample is served as the stream served it, beside
// a newer fence for the same unit (its fence is not checked; its token
// is), with the geometry the transforms drew. Anything but one sample of
// one shard is refused.
TEST_F(DataServerServiceTest, AReplayServesOneSampleAsTheStreamDid) {
  Make("s3cret");
  v1::DecodeSpec spec;
  ASSERT_TRUE(google::protobuf::TextFormat::ParseFromString(
      "decode: true transforms { random_resized_crop { height: 16 width: 16 "
      "} } transforms { horizontal_flip { p: 0.5 } }",
      &spec));
  auto unit = Request(0, 6);
  unit.mutable_lease()->set_fence(3);
  unit.mutable_lease()->set_augment_seed(11);
  unit.mutable_lease()->set_token(SignLease(unit.lease(), "s3cret"));
  *unit.mutable_decode() = spec;
  auto streamed = Read(unit);
  ASSERT_OK(streamed.status());
  ASSERT_EQ(streamed->size(), 6u);
  for (int64_t i : {2, 5}) {
    auto one = Request(i, i + 1);
    one.mutable_lease()->set_fence(0);
    one.mutable_lease()->set_augment_seed(11);
    one.mutable_lease()->set_token(SignLease(one.lease(), "s3cret"));
    *one.mutable_decode() = spec;
    absl::StatusOr<v1::ReplayedSample> replayed = Replay(*service_, one);
    ASSERT_OK(replayed.status());
    EXPECT_EQ(replayed->sample().SerializeAsString(),
              (*streamed)[static_cast<size_t>(i)].SerializeAsString());
    const v1::SampleDraws& draws = replayed->draws();
    EXPECT_EQ(draws.source_width(), 64);
    EXPECT_EQ(draws.source_height(), 48);
    ASSERT_EQ(draws.steps_size(), 2);
    EXPECT_EQ(draws.steps(0).kind(), "crop");
    EXPECT_EQ(draws.steps(1).kind(), "resize");
    EXPECT_EQ(draws.steps(1).width(), 16);
    // The fence check a stream of the same lease gets.
    EXPECT_THAT(Read(one).status(), StatusIs(absl::StatusCode::kAborted));
    one.mutable_lease()->set_token(SignLease(one.lease(), "other"));
    EXPECT_THAT(Replay(*service_, one).status(),
                StatusIs(absl::StatusCode::kPermissionDenied));
  }
  EXPECT_THAT(Replay(*service_, unit).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("covers exactly one sample of one shard; "
                                 "this one is a shard unit [0, 6)")));
}

absl::StatusOr<v1::ReplayDrawsResponse> Draws(
    DataServerService& service, const v1::ReplayDrawsRequest& request) {
  return Await<v1::ReplayDrawsResponse>(
      [&](auto done) { service.ReplayDraws(request, std::move(done)); });
}

// ReplayDraws plans each replay lease's draws from its image's header: the
// same draws a replay of that sample reports, in the leases' order, over
// every sample of the shard (both flips drawn). Leases are checked as for
// a replay; anything but replay leases, or more than 10,000, is refused.
TEST_F(DataServerServiceTest, ReplayDrawsAreTheDrawsOfEachSamplesReplay) {
  Make("s3cret");
  v1::ReplayDrawsRequest request;
  ASSERT_TRUE(google::protobuf::TextFormat::ParseFromString(
      "decode: true transforms { random_resized_crop { height: 16 width: 16 "
      "} } transforms { horizontal_flip { p: 0.5 } }",
      request.mutable_decode()));
  std::vector<v1::ReadRequest> ones;
  for (int64_t i : {5, 0, 3, 1, 4, 2}) {
    auto one = Request(i, i + 1);
    one.mutable_lease()->set_augment_seed(7);
    one.mutable_lease()->set_token(SignLease(one.lease(), "s3cret"));
    *one.mutable_decode() = request.decode();
    *request.add_leases() = one.lease();
    ones.push_back(std::move(one));
  }
  absl::StatusOr<v1::ReplayDrawsResponse> planned = Draws(*service_, request);
  ASSERT_OK(planned.status());
  ASSERT_EQ(planned->draws_size(), 6);
  std::set<bool> flips;
  for (size_t i = 0; i < ones.size(); ++i) {
    absl::StatusOr<v1::ReplayedSample> replayed = Replay(*service_, ones[i]);
    ASSERT_OK(replayed.status());
    const v1::SampleDraws& draws = planned->draws(static_cast<int>(i));
    EXPECT_EQ(draws.SerializeAsString(), replayed->draws().SerializeAsString())
        << "lease " << i;
    EXPECT_EQ(draws.source_width(), 64);
    ASSERT_EQ(draws.steps_size(), 2);
    flips.insert(draws.flip_horizontal());
  }
  EXPECT_EQ(flips, (std::set<bool>{false, true}));

  // Without decoding there are no draws: one empty entry per lease.
  v1::ReplayDrawsRequest raw = request;
  raw.mutable_decode()->Clear();
  absl::StatusOr<v1::ReplayDrawsResponse> none = Draws(*service_, raw);
  ASSERT_OK(none.status());
  ASSERT_EQ(none->draws_size(), 6);
  EXPECT_EQ(none->draws(3).source_width(), 0);

  v1::ReplayDrawsRequest forged = request;
  forged.mutable_leases(4)->set_token(SignLease(forged.leases(4), "other"));
  EXPECT_THAT(Draws(*service_, forged).status(),
              StatusIs(absl::StatusCode::kPermissionDenied));
  v1::ReplayDrawsRequest unit = request;
  *unit.add_leases() = Request(0, 6).lease();
  EXPECT_THAT(Draws(*service_, unit).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("this one is a shard unit [0, 6)")));
  v1::ReplayDrawsRequest many = request;
  while (many.leases_size() <= 10000) *many.add_leases() = request.leases(0);
  EXPECT_THAT(Draws(*service_, many).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("replay_draws.leases has 10001 leases")));
}

// Draws are planned for the first image field among the fields the
// trainer asked for, as its stream planned them: with a small image
// before the one a trainer chose, a replay and ReplayDraws given its
// fields match its stream, and without them plan for the other image.
TEST_F(DataServerServiceTest, ReplaysPlanForTheFieldsTheTrainerChose) {
  testing::TarWriter tar;
  const std::string thumb =
      testing::EncodePng(testing::TestPixels(16, 12, 3, 4), 16, 12, 3);
  for (int i = 0; i < 4; ++i) {
    tar.File(absl::StrCat("s/", i, ".aux.png"), thumb)
        .File(absl::StrCat("s/", i, ".jpg"), jpeg_);
  }
  const std::string url = dir_.File("two-images.tar");
  testing::WriteFile(url, tar.Finish());
  v1::DecodeSpec spec;
  ASSERT_TRUE(google::protobuf::TextFormat::ParseFromString(
      "decode: true transforms { random_resized_crop { height: 8 width: 8 "
      "} } transforms { horizontal_flip { p: 0.5 } }",
      &spec));
  auto unit = Request(0, 4);
  unit.mutable_lease()->mutable_unit()->mutable_shard()->set_url(url);
  unit.mutable_lease()->set_augment_seed(3);
  *unit.mutable_decode() = spec;
  unit.add_fields("jpg");
  auto streamed = Read(unit);
  ASSERT_OK(streamed.status());
  ASSERT_EQ(streamed->size(), 4u);
  v1::ReplayDrawsRequest chosen, all;
  *chosen.mutable_decode() = spec;
  chosen.add_fields("jpg");
  *all.mutable_decode() = spec;
  for (int64_t i = 0; i < 4; ++i) {
    auto one = unit;
    one.mutable_lease()->mutable_unit()->set_begin(i);
    one.mutable_lease()->mutable_unit()->set_end(i + 1);
    *chosen.add_leases() = one.lease();
    *all.add_leases() = one.lease();
    absl::StatusOr<v1::ReplayedSample> replayed = Replay(*service_, one);
    ASSERT_OK(replayed.status());
    EXPECT_EQ(replayed->sample().SerializeAsString(),
              (*streamed)[static_cast<size_t>(i)].SerializeAsString());
    EXPECT_EQ(replayed->draws().source_width(), 64);
  }
  absl::StatusOr<v1::ReplayDrawsResponse> planned = Draws(*service_, chosen);
  ASSERT_OK(planned.status());
  absl::StatusOr<v1::ReplayDrawsResponse> thumbs = Draws(*service_, all);
  ASSERT_OK(thumbs.status());
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(planned->draws(i).source_width(), 64);
    EXPECT_EQ(thumbs->draws(i).source_width(), 16);
  }
}

// A token signs its lease's expiry: past it (plus the allowed clock skew,
// 30 s by default) the lease is refused before anything is read; a token
// for a lease with time left, or within the skew, is served.
TEST_F(DataServerServiceTest, AnExpiredLeasesTokenIsRefused) {
  Make("s3cret");
  const int64_t now = absl::ToUnixMillis(absl::Now());
  auto at = [&](int64_t expires_at, uint64_t fence) {
    auto r = Request(0, 2);
    r.mutable_lease()->set_fence(fence);
    r.mutable_lease()->set_expires_at_unix_ms(expires_at);
    r.mutable_lease()->set_token(SignLease(r.lease(), "s3cret"));
    return r;
  };
  EXPECT_THAT(Read(at(now - 60'000, 1)).status(),
              StatusIs(absl::StatusCode::kAborted, HasSubstr("expired")));
  EXPECT_EQ(store_->opens, 0);
  ASSERT_OK(Read(at(now - 5'000, 2)).status());  // within the skew
  ASSERT_OK(Read(at(now + 10'000, 3)).status());
  // The expiry is signed: moving it forward breaks the token.
  auto moved = at(now - 60'000, 4);
  moved.mutable_lease()->set_expires_at_unix_ms(now + 10'000);
  EXPECT_THAT(Read(moved).status(),
              StatusIs(absl::StatusCode::kPermissionDenied));
}

// A unit split where a rank's quota ends: both pieces keep the unit's
// sequence number, with their own fences. Whichever is read first, the other
// is still valid; a lease over samples a newer lease covers is not.
TEST_F(DataServerServiceTest, PiecesOfASplitUnitAreBothServedInEitherOrder) {
  Make("s3cret");
  auto piece = [&](int64_t begin, int64_t end, uint64_t fence) {
    auto r = Request(begin, end);
    r.mutable_lease()->mutable_unit()->set_sequence(4);
    r.mutable_lease()->set_lease_id(absl::StrCat("j/e0/f", fence));
    r.mutable_lease()->set_fence(fence);
    r.mutable_lease()->set_token(SignLease(r.lease(), "s3cret"));
    return r;
  };
  auto high = Read(piece(1, 3, 8));  // read first
  ASSERT_OK(high.status());
  EXPECT_EQ(high->size(), 2u);
  auto low = Read(piece(0, 1, 7));
  ASSERT_OK(low.status());
  EXPECT_EQ(low->size(), 1u);
  // [2, 3) granted again (fence 9): the fence-8 piece overlaps it.
  ASSERT_OK(Read(piece(2, 3, 9)).status());
  EXPECT_THAT(Read(piece(1, 3, 8)).status(),
              StatusIs(absl::StatusCode::kAborted, HasSubstr("fence 9")));
  ASSERT_OK(Read(piece(0, 1, 7)).status());
}

// Leases as the coordinator grants them: fences grow across units, epochs
// and jobs; a lease of epoch e+1 exists only once epoch e is complete.
TEST_F(DataServerServiceTest, ALeaseOfAnEpochTheJobHasLeftIsAborted) {
  Make("s3cret");
  auto lease = [&](int64_t epoch, int64_t sequence, uint64_t fence) {
    auto r = Request(0, 2);
    r.mutable_lease()->set_lease_id(absl::StrCat("j/e", epoch, "/f", fence));
    r.mutable_lease()->set_epoch(epoch);
    r.mutable_lease()->mutable_unit()->set_sequence(sequence);
    r.mutable_lease()->set_fence(fence);
    r.mutable_lease()->set_token(SignLease(r.lease(), "s3cret"));
    return r;
  };
  for (int unit = 0; unit < 5; ++unit)
    ASSERT_OK(Read(lease(0, unit, 1 + unit)).status());
  EXPECT_EQ(service_->fence_units(), 5u);
  // Epoch 1 begins: epoch 0's units are forgotten...
  ASSERT_OK(Read(lease(1, 0, 6)).status());
  EXPECT_EQ(service_->fence_units(), 1u);
  // ...and a holder of an epoch-0 lease, even for a unit never read here,
  // is refused: that epoch is over.
  EXPECT_THAT(
      Read(lease(0, 7, 4)).status(),
      StatusIs(absl::StatusCode::kAborted, HasSubstr("epoch 1 up to fence 6")));
  // Leases of the current epoch are still checked per unit.
  ASSERT_OK(Read(lease(1, 1, 8)).status());
  ASSERT_OK(Read(lease(1, 2, 7)).status());
  EXPECT_THAT(Read(lease(1, 0, 5)).status(),
              StatusIs(absl::StatusCode::kAborted));
  // The job deleted and created again (fences above all seen, epoch 0
  // again) or rolled back by a resume: served, and tracked from there.
  ASSERT_OK(Read(lease(0, 0, 9)).status());
  EXPECT_EQ(service_->fence_units(), 1u);
  EXPECT_THAT(Read(lease(1, 1, 8)).status(),
              StatusIs(absl::StatusCode::kAborted));
}

TEST_F(DataServerServiceTest, OneSlowImageDoesNotHoldBackTheDecodingBehindIt) {
  // Sample 0's decode is held; the second pool thread must go on decoding
  // the samples behind it, up to the stream's window (four samples per pool
  // thread), and no further while sample 0 is not framed.
  absl::Mutex mu;
  std::vector<int64_t> started;
  absl::Notification release;
  service_.reset();
  Make("", [&](int64_t index) {
    {
      absl::MutexLock lock(&mu);
      started.push_back(index);
    }
    if (index == 0) release.WaitForNotification();
  });
  auto r = Request(0, 20);
  r.mutable_decode()->set_decode(true);
  auto stream = service_->ReadSamples(r);
  ASSERT_OK(stream.status());
  absl::StatusOr<std::vector<v1::SampleBatch>> batches;
  std::thread reader([&] { batches = ReadAll(**stream); });
  auto deadline = absl::Now() + absl::Seconds(20);
  auto count = [&] {
    absl::MutexLock lock(&mu);
    return started.size();
  };
  while (count() < 8 && absl::Now() < deadline)
    absl::SleepFor(absl::Milliseconds(1));
  {
    absl::MutexLock lock(&mu);
    std::vector<int64_t> sorted = started;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_THAT(sorted, ElementsAre(0, 1, 2, 3, 4, 5, 6, 7));
  }
  release.Notify();
  reader.join();
  ASSERT_OK(batches.status());
  std::vector<v1::Sample> samples = Samples(*batches);
  ASSERT_EQ(samples.size(), 20u);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(samples[i].index(), i);
  EXPECT_TRUE(samples[7].skipped());
  EXPECT_EQ(samples[8].fields(0).tensor().shape(0), 48);
}

TEST_F(DataServerServiceTest,
       AShardTruncatedWhileDecodingEndsTheStreamWithDataLoss) {
  // The file loses all but its first page just before sample 10 is decoded:
  // the decoder's reads of the pages gone would be SIGBUS (a dead server);
  // they read zeros instead, and the stream ends with DATA_LOSS naming the
  // shard before anything read after the truncation is sent.
  service_.reset();
  Make("", [&](int64_t index) {
    if (index == 10) {
      ASSERT_EQ(truncate(shard_.c_str(), 4096), 0);
    }
  });
  auto r = Request(0, 20);
  r.mutable_decode()->set_decode(true);
  auto stream = service_->ReadSamples(r);
  ASSERT_OK(stream.status());
  EXPECT_THAT(ReadAll(**stream).status(),
              StatusIs(absl::StatusCode::kDataLoss,
                       AllOf(HasSubstr("j/e0/u1/f1"), HasSubstr(shard_),
                             HasSubstr("while being served"))));
  EXPECT_EQ(metrics_.shards_changed.Value(), 1);
}

TEST_F(DataServerServiceTest, SamplesDecodedInlineDoNotCountAgainstTheWindow) {
  // 200 tiny samples whose only field (cls) is decoded on the producing
  // thread: the window (eight samples for the pool here) does not limit
  // them, so they leave in one message, as raw samples would.
  testing::TarWriter tar;
  for (int i = 0; i < 200; ++i)
    tar.File(absl::StrCat("t/", i, ".cls"), std::to_string(i));
  testing::WriteFile(dir_.File("tiny.tar"), tar.Finish());
  auto r = Request(0, 200);
  r.mutable_lease()->mutable_unit()->mutable_shard()->set_url(
      dir_.File("tiny.tar"));
  r.mutable_decode()->set_decode(true);
  auto stream = service_->ReadSamples(r);
  ASSERT_OK(stream.status());
  auto batches = ReadAll(**stream);
  ASSERT_OK(batches.status());
  ASSERT_EQ(batches->size(), 1u);
  ASSERT_EQ((*batches)[0].samples_size(), 200);
  for (int i = 0; i < 200; ++i) {
    EXPECT_EQ((*batches)[0].samples(i).fields(0).int_value(), i);
  }
}

TEST_F(DataServerServiceTest,
       CancelWithDecodesInFlightEndsTheStreamAndFreesIt) {
  // A client goes away while both pool threads are decoding (samples 0 and
  // 1 held) and six more decodes wait in the pool's queue: the stream
  // answers CANCELLED at once, the two running decodes finish into nothing,
  // the queued ones are not run, and the stream is freed.
  absl::Notification release;
  absl::Mutex mu;
  int held = 0;
  std::atomic<int> decodes{0};
  service_.reset();
  Make("", [&](int64_t index) {
    ++decodes;
    if (index < 2) {
      {
        absl::MutexLock lock(&mu);
        ++held;
      }
      release.WaitForNotification();
    }
  });
  auto r = Request(0, 20);
  r.mutable_decode()->set_decode(true);
  auto stream = service_->ReadSamples(r);
  ASSERT_OK(stream.status());
  absl::Notification first;
  absl::Status first_status;
  (*stream)->Next([&](absl::StatusOr<std::optional<EncodedMessage>> v) {
    first_status = v.status();
    first.Notify();
  });
  {
    absl::MutexLock lock(&mu);
    auto both_held = [&] {
      mu.AssertHeld();
      return held == 2;
    };
    ASSERT_TRUE(
        mu.AwaitWithTimeout(absl::Condition(&both_held), absl::Seconds(20)));
  }
  EXPECT_EQ(service_->active_streams(), 1);
  (*stream)->Cancel();
  ASSERT_TRUE(first.WaitForNotificationWithTimeout(absl::Seconds(20)));
  EXPECT_THAT(first_status, StatusIs(absl::StatusCode::kCancelled));
  std::weak_ptr<SampleStream> weak = *stream;
  stream->reset();
  release.Notify();
  // The last owner (a decode task) may still be inside the stream's
  // destructor, which ends the count, once the weak pointer has expired.
  auto deadline = absl::Now() + absl::Seconds(20);
  while ((!weak.expired() || service_->active_streams() != 0) &&
         absl::Now() < deadline)
    absl::SleepFor(absl::Milliseconds(1));  // poll with a deadline
  EXPECT_TRUE(weak.expired());
  EXPECT_EQ(service_->active_streams(), 0);
  EXPECT_EQ(decodes.load(), 2);
}

TEST_F(DataServerServiceTest, SamplesBeforeAReadErrorAreDeliveredThenTheError) {
  // The second open of the shard finds sample 13 renamed (same size, so the
  // index built on the first open is reused): reading stops there with
  // DATA_LOSS, after samples 0..12 of the same read step were delivered.
  auto tar = [](const std::string& thirteen) {
    testing::TarWriter w;
    for (int i = 0; i < 20; ++i) {
      w.File((i == 13 ? thirteen : absl::StrCat("s/", 10 + i)) + ".cls",
             std::to_string(i));
    }
    return w.Finish();
  };
  DataServerOptions options;
  options.store = std::make_unique<SequenceStore>(
      std::vector<std::shared_ptr<const ShardData>>{
          ShardData::FromString(tar("s/23"), "/data/x.tar"),
          ShardData::FromString(tar("s/zz"), "/data/x.tar")});
  options.decode_threads = 2;
  auto service = DataServerService::Create(std::move(options));
  ASSERT_OK(service.status());
  auto r = Request(0, 20);
  r.mutable_lease()->mutable_unit()->mutable_shard()->set_url("/data/x.tar");
  auto first = (*service)->ReadSamples(r);
  ASSERT_OK(first.status());
  auto all = ReadAll(**first);
  ASSERT_OK(all.status());
  ASSERT_EQ(Samples(*all).size(), 20u);

  auto second = (*service)->ReadSamples(r);
  ASSERT_OK(second.status());
  UntilError read = ReadUntilError(**second);
  EXPECT_THAT(read.error, StatusIs(absl::StatusCode::kDataLoss,
                                   HasSubstr("expected sample 13 \"s/23\"")));
  std::vector<int64_t> expected;
  for (int i = 0; i < 13; ++i) expected.push_back(i);
  EXPECT_EQ(read.indices, expected);
}

TEST_F(DataServerServiceTest, AShardThatEndsBeforeItsIndexIsDataLoss) {
  // The second open finds the same number of bytes but only ten samples
  // (zeros after them, which tar reads as its end): the stream delivers the
  // ten and ends with DATA_LOSS saying where (not libarchive's complaint
  // about being asked for a header after the end).
  testing::TarWriter full, half;
  for (int i = 0; i < 20; ++i) {
    full.File(absl::StrCat("s/", i, ".cls"), std::to_string(i));
    if (i < 10) half.File(absl::StrCat("s/", i, ".cls"), std::to_string(i));
  }
  std::string whole = full.Finish(), cut = half.Finish();
  cut.resize(whole.size(), '\0');
  DataServerOptions options;
  options.store = std::make_unique<SequenceStore>(
      std::vector<std::shared_ptr<const ShardData>>{
          ShardData::FromString(whole, "/data/x.tar"),
          ShardData::FromString(cut, "/data/x.tar")});
  options.decode_threads = 2;
  auto service = DataServerService::Create(std::move(options));
  ASSERT_OK(service.status());
  auto r = Request(0, 20);
  r.mutable_lease()->mutable_unit()->mutable_shard()->set_url("/data/x.tar");
  r.set_max_batch_bytes(1);  // one sample per message
  auto first = (*service)->ReadSamples(r);
  ASSERT_OK(first.status());
  ASSERT_OK(ReadAll(**first).status());

  auto second = (*service)->ReadSamples(r);
  ASSERT_OK(second.status());
  UntilError read = ReadUntilError(**second);
  EXPECT_EQ(read.indices, (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
  EXPECT_THAT(
      read.error,
      StatusIs(
          absl::StatusCode::kDataLoss,
          AllOf(
              HasSubstr("/data/x.tar"),
              HasSubstr(
                  "ended before sample 10 (\"s/10\") that its index lists"))));
}

TEST_F(DataServerServiceTest, CancelStopsTheStream) {
  auto r = Request(0, 20);
  r.set_max_batch_bytes(1);  // one sample per message
  auto stream = service_->ReadSamples(r);
  ASSERT_OK(stream.status());
  (*stream)->Cancel();
  absl::Notification done;
  absl::Status status;
  (*stream)->Next([&](absl::StatusOr<std::optional<EncodedMessage>> v) {
    status = v.status();
    done.Notify();
  });
  done.WaitForNotification();
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kCancelled));
}

TEST_F(DataServerServiceTest, IndexShardIsCached) {
  v1::IndexShardRequest r;
  r.set_url(shard_);
  r.set_include_samples(true);
  auto a = service_->IndexShard(r);
  ASSERT_OK(a.status());
  EXPECT_EQ(a->num_samples(), 20);
  EXPECT_EQ(a->keys(19), "img/19");
  EXPECT_EQ(a->sample_bytes(7), 10 + 1 + 8);
  ASSERT_OK(service_->IndexShard(r).status());
  EXPECT_EQ(metrics_.index_cache_misses.Value(), 1);
  EXPECT_EQ(metrics_.index_cache_hits.Value(), 1);
}

// Many streams decoding large images at once stay within
// --max_decode_memory: samples wait for room (in order) instead of all
// allocating together, and every sample is still delivered.
TEST(DecodeMemoryTest, ConcurrentStreamsStayWithinTheBudget) {
  testing::TempDir dir;
  const std::string png =
      testing::EncodePng(testing::TestPixels(512, 512, 3), 512, 512, 3);
  testing::TarWriter tar;
  for (int i = 0; i < 5; ++i) tar.File(absl::StrCat("s", i, ".png"), png);
  testing::WriteFile(dir.File("big.tar"), tar.Finish());
  auto local = LocalShardStore::Create({dir.path()});
  ASSERT_OK(local.status());
  DataServerOptions options;
  options.store = *std::move(local);
  options.decode_threads = 4;
  // One sample is estimated at 512 x 512 x 8 x 2 = 4 MiB: two fit.
  options.max_decode_memory = 10 << 20;
  auto service = DataServerService::Create(std::move(options));
  ASSERT_OK(service.status());
  std::vector<std::thread> readers;
  std::atomic<int> delivered{0};
  for (int r = 0; r < 6; ++r) {
    readers.emplace_back([&, r] {
      v1::ReadRequest request;
      request.mutable_lease()->set_lease_id(absl::StrCat("j/e0/u", r, "/f1"));
      request.mutable_lease()->set_job("j");
      request.mutable_lease()->mutable_unit()->mutable_shard()->set_url(
          dir.File("big.tar"));
      request.mutable_lease()->mutable_unit()->set_end(5);
      request.mutable_decode()->set_decode(true);
      auto stream = (*service)->ReadSamples(request);
      ASSERT_OK(stream.status());
      auto batches = ReadAll(**stream);
      ASSERT_OK(batches.status());
      for (const v1::Sample& s : Samples(*batches)) {
        EXPECT_EQ(s.fields(0).tensor().data().size(), 512u * 512 * 3);
        ++delivered;
      }
    });
  }
  for (auto& t : readers) t.join();
  EXPECT_EQ(delivered.load(), 30);
  EXPECT_LE((*service)->decode_budget().peak(), 10 << 20);
  EXPECT_GT((*service)->decode_budget().waits(), 0);
  // A decode task drops its slot, and the slot's memory, just after handing
  // the sample over: the last may still be returning when the readers end.
  for (const absl::Time deadline = absl::Now() + absl::Seconds(10);
       (*service)->decode_budget().in_use() != 0 && absl::Now() < deadline;) {
    absl::SleepFor(absl::Milliseconds(1));  // poll with a deadline
  }
  EXPECT_EQ((*service)->decode_budget().in_use(), 0);
}

}  // namespace
}  // namespace sluice::dataserver
