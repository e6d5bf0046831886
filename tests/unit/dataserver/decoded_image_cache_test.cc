#include "server/dataserver/decoded_image_cache.h"

#include <fcntl.h>

#include <atomic>
#include <cstring>
#include <thread>

#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/dataserver/augment_random.h"
#include "server/dataserver/decoders.h"
#include "server/dataserver/image_transforms.h"
#include "server/format/shard_store.h"
#include "tests/testing/image_fixtures.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/tar_writer.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/wait.h"

namespace sluice::dataserver {
namespace {

// A width x height RGB image whose bytes are all `value`.
ImageBuffer Image(int width, int height, uint8_t value) {
  ImageBuffer image = AllocateImage(width, height, 3, 1);
  std::memset(image.owner.get(), value, image.stride * height);
  return image;
}

TEST(DecodedImageCacheTest, AnImageIsDecodedOnceAndThenShared) {
  DecodedImageCache cache(1 << 20);
  int decodes = 0;
  auto decode = [&]() -> absl::StatusOr<ImageBuffer> {
    ++decodes;
    return Image(10, 10, 7);
  };
  bool hit = true;
  auto first = cache.GetOrDecode("a", 8, decode, &hit);
  ASSERT_OK(first.status());
  EXPECT_FALSE(hit);
  auto second = cache.GetOrDecode("a", 8, decode, &hit);
  ASSERT_OK(second.status());
  EXPECT_TRUE(hit);
  EXPECT_EQ(second->data, first->data);  // the same pixels, not a copy
  // Another scale of the same image is another entry.
  ASSERT_OK(cache.GetOrDecode("a", 4, decode, &hit).status());
  EXPECT_FALSE(hit);
  EXPECT_EQ(decodes, 2);
  const DecodedImageCache::Stats stats = cache.stats();
  EXPECT_EQ(stats.hits, 1);
  EXPECT_EQ(stats.misses, 2);
  EXPECT_EQ(stats.entries, 2);
  EXPECT_EQ(stats.bytes, 2 * 10 * 10 * 3);
}

TEST(DecodedImageCacheTest, ACallerWaitsForTheDecodeInFlightInsteadOfARepeat) {
  DecodedImageCache cache(1 << 20);
  absl::Notification release;
  std::atomic<int> decodes{0};
  auto slow = [&]() -> absl::StatusOr<ImageBuffer> {
    ++decodes;
    release.WaitForNotification();
    return Image(4, 4, 1);
  };
  bool first_hit = true, second_hit = false;
  std::thread first([&] { (void)cache.GetOrDecode("k", 8, slow, &first_hit); });
  ASSERT_TRUE(testing::WaitUntil([&] { return decodes.load() == 1; },
                                 absl::Seconds(10)));
  std::thread second(
      [&] { (void)cache.GetOrDecode("k", 8, slow, &second_hit); });
  ASSERT_TRUE(testing::WaitUntil([&] { return cache.stats().waiting == 1; },
                                 absl::Seconds(10)));
  release.Notify();
  first.join();
  second.join();
  EXPECT_EQ(decodes.load(), 1);
  EXPECT_FALSE(first_hit);
  EXPECT_TRUE(second_hit);
  EXPECT_EQ(cache.stats().hits, 1);
  EXPECT_EQ(cache.stats().waits, 1);
}

TEST(DecodedImageCacheTest, AFailedDecodeIsNotKept) {
  DecodedImageCache cache(1 << 20);
  int decodes = 0;
  auto failing = [&]() -> absl::StatusOr<ImageBuffer> {
    ++decodes;
    return absl::InvalidArgumentError("undecodable JPEG: test");
  };
  EXPECT_THAT(cache.GetOrDecode("bad", 8, failing).status(),
              testing::StatusIs(absl::StatusCode::kInvalidArgument,
                                ::testing::HasSubstr("undecodable JPEG")));
  EXPECT_EQ(cache.GetOrDecode("bad", 8, failing).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(decodes, 2);
  EXPECT_EQ(cache.stats().entries, 0);
}

TEST(DecodedImageCacheTest, TheLeastRecentlyUsedGoFirstAndTheBoundHolds) {
  const int64_t one = 10 * 10 * 3;
  DecodedImageCache cache(2 * one);
  int decodes = 0;
  auto decode = [&]() -> absl::StatusOr<ImageBuffer> {
    ++decodes;
    return Image(10, 10, 3);
  };
  ASSERT_OK(cache.GetOrDecode("a", 8, decode).status());
  ASSERT_OK(cache.GetOrDecode("b", 8, decode).status());
  ASSERT_OK(cache.GetOrDecode("a", 8, decode).status());  // a is newer now
  ASSERT_OK(cache.GetOrDecode("c", 8, decode).status());  // evicts b
  EXPECT_EQ(decodes, 3);
  EXPECT_EQ(cache.stats().evictions, 1);
  EXPECT_EQ(cache.stats().bytes, 2 * one);
  ASSERT_OK(cache.GetOrDecode("a", 8, decode).status());
  EXPECT_EQ(decodes, 3);
  ASSERT_OK(cache.GetOrDecode("b", 8, decode).status());
  EXPECT_EQ(decodes, 4);
  // An image larger than the whole cache is returned and not kept.
  auto big = cache.GetOrDecode("big", 8, [] { return Image(100, 100, 1); });
  ASSERT_OK(big.status());
  EXPECT_EQ(big->width, 100);
  EXPECT_EQ(cache.stats().entries, 2);
  EXPECT_LE(cache.stats().bytes, 2 * one);
}

TEST(DecodedImageCacheTest, ShardsAreSharedWhileAnotherJobHasAStreamOnThem) {
  DecodedImageCache cache(1 << 20);
  EXPECT_FALSE(cache.SharedWithOtherJob("s0.tar", "a"));
  cache.StreamOpened("s0.tar", "a");
  cache.StreamOpened("s0.tar", "a");
  EXPECT_FALSE(cache.SharedWithOtherJob("s0.tar", "a"));  // its own streams
  EXPECT_TRUE(cache.SharedWithOtherJob("s0.tar", "b"));
  EXPECT_FALSE(cache.SharedWithOtherJob("s1.tar", "b"));
  cache.StreamClosed("s0.tar", "a");
  EXPECT_TRUE(cache.SharedWithOtherJob("s0.tar", "b"));
  cache.StreamClosed("s0.tar", "a");
  EXPECT_FALSE(cache.SharedWithOtherJob("s0.tar", "b"));
}

// Keys of images of a mapped file name its version (size, mtime, inode)
// and the image's encoded size; of an in-memory shard, the bytes' hash.
TEST(DecodedImageCacheTest, KeysTellRewrittenShardsApart) {
  testing::TempDir dir;
  const auto mapped = [&](const std::string& bytes) {
    const std::string path = dir.File("s.tar");
    testing::WriteFile(path, bytes);
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    EXPECT_GE(fd, 0);
    auto shard = ShardData::Map(fd, path);
    EXPECT_TRUE(shard.ok()) << shard.status();
    return *std::move(shard);
  };
  const auto v1 = mapped("version one");
  const std::string a =
      DecodedImageCache::ImageKey("s.tar", *v1, 3, "jpg", "xyz");
  EXPECT_EQ(a, DecodedImageCache::ImageKey("s.tar", *v1, 3, "jpg", "xyw"));
  EXPECT_NE(a, DecodedImageCache::ImageKey("s.tar", *v1, 3, "jpg", "xyzw"));
  EXPECT_NE(a, DecodedImageCache::ImageKey("s.tar", *v1, 4, "jpg", "xyz"));
  EXPECT_NE(a, DecodedImageCache::ImageKey("s.tar", *v1, 3, "png", "xyz"));
  EXPECT_NE(a, DecodedImageCache::ImageKey("t.tar", *v1, 3, "jpg", "xyz"));
  // The file rewritten (another size and mtime).
  const auto v2 = mapped("version two, longer");
  EXPECT_NE(a, DecodedImageCache::ImageKey("s.tar", *v2, 3, "jpg", "xyz"));
  const auto in_memory = ShardData::FromString("abc", "s.tar");
  EXPECT_NE(DecodedImageCache::ImageKey("s.tar", *in_memory, 3, "jpg", "xyz"),
            DecodedImageCache::ImageKey("s.tar", *in_memory, 3, "jpg", "xyw"));
}

v1::Transform RandomResizedCrop(int size) {
  v1::Transform t;
  t.mutable_random_resized_crop()->set_height(size);
  t.mutable_random_resized_crop()->set_width(size);
  return t;
}

// Decodes `encoded` (w x h) with `decode` under each of `specs` and
// `seeds` seeds, alone and through `cache`, expecting the same tensor, and
// decoder CPU time counted for every call that decoded pixels and for none
// that found them decoded; returns how many of the shared decodes found the
// image decoded already.
template <typename Decode>
int SharedEqualsAlone(Decode decode, const std::string& encoded, int w, int h,
                      const std::vector<v1::DecodeSpec>& specs, int seeds,
                      DecodedImageCache& cache) {
  const Payload payload{encoded, nullptr};
  int hits = 0;
  for (size_t s = 0; s < specs.size(); ++s) {
    auto transforms = ImageTransforms::FromSpec(specs[s]);
    EXPECT_OK(transforms.status());
    if (!transforms.ok()) return hits;
    for (int seed = 0; seed < seeds; ++seed) {
      Geometry geometry = transforms->Plan(
          w, h, SampleRandom(static_cast<uint64_t>(seed), 0, 0, 9));
      ImageOptions options;
      options.transforms = &*transforms;
      options.geometry = &geometry;
      TransformTimes alone_times;
      options.times = &alone_times;
      auto alone = decode(payload, options);
      EXPECT_OK(alone.status());
      EXPECT_GT(alone_times.decoder_cpu, 0.0);
      TransformTimes shared_times;
      options.times = &shared_times;
      SharedDecode shared;
      shared.cache = &cache;
      shared.key = DecodedImageCache::ImageKey(
          "s.tar", *ShardData::FromString("s", "s.tar"), 9, "image", encoded);
      options.shared = &shared;
      auto together = decode(payload, options);
      EXPECT_OK(together.status());
      if (!alone.ok() || !together.ok()) return hits;
      hits += shared.hit ? 1 : 0;
      if (shared.hit) {
        EXPECT_EQ(shared_times.decoder_cpu, 0.0) << "spec " << s;
      } else {
        EXPECT_GT(shared_times.decoder_cpu, 0.0) << "spec " << s;
      }
      EXPECT_EQ(together->shape, alone->shape) << "spec " << s;
      EXPECT_EQ(together->dtype, alone->dtype);
      EXPECT_TRUE(together->bytes.bytes == alone->bytes.bytes)
          << "spec " << s << ", seed " << seed;
    }
  }
  return hits;
}

// Jobs sharing decodes get the tensors they get alone, bit for bit: random
// crops (whole-image decodes cropped instead of window decodes), flips,
// Resize + CenterCrop (a framed decode alone), and DCT-scaled decodes of a
// large image for a small output; the second job reads the first's entry.
TEST(DecodedImageCacheTest, SharedDecodesGiveTheTensorsOfADecodeAlone) {
  const int w = 640, h = 480;
  const std::string jpeg =
      testing::EncodeJpeg(testing::TestPixels(w, h, 3, 5), w, h);
  std::vector<v1::DecodeSpec> specs(4);
  for (v1::DecodeSpec& spec : specs) spec.set_decode(true);
  *specs[0].add_transforms() = RandomResizedCrop(224);
  specs[0].add_transforms()->mutable_horizontal_flip()->set_p(0.5);
  specs[1].add_transforms()->mutable_resize()->set_shorter_side(256);
  specs[1].add_transforms()->mutable_center_crop()->set_height(224);
  specs[1].mutable_transforms(1)->mutable_center_crop()->set_width(224);
  *specs[2].add_transforms() = RandomResizedCrop(32);  // DCT-scaled
  specs[3].add_transforms()->mutable_resize()->set_shorter_side(40);
  specs[3].mutable_to_float()->set_enabled(true);
  specs[3].set_layout(v1::IMAGE_LAYOUT_CHW);
  DecodedImageCache cache(64 << 20);
  const int hits = SharedEqualsAlone(DecodeJpeg, jpeg, w, h, specs, 12, cache);
  // One whole decode per scale used; every other call read it.
  const DecodedImageCache::Stats stats = cache.stats();
  EXPECT_EQ(stats.misses, stats.entries);
  EXPECT_GE(stats.entries, 2);  // full scale and a DCT scale
  EXPECT_EQ(hits, 4 * 12 - stats.misses);
}

// PNG fields are shared too: a whole decode (8 bits, or 16 as stored)
// transformed by each job gives what the job's own decode gives, including
// the decode of only the rows a crop needs; a damaged PNG's error is the
// same and is not kept.
TEST(DecodedImageCacheTest, SharedPngDecodesGiveTheTensorsOfADecodeAlone) {
  const int w = 160, h = 120;
  std::vector<uint16_t> deep(static_cast<size_t>(w) * h);
  for (size_t i = 0; i < deep.size(); ++i)
    deep[i] = static_cast<uint16_t>((i * 2654435761u) >> 16);
  const std::vector<std::string> pngs = {
      testing::EncodePng(testing::TestPixels(w, h, 3, 7), w, h, 3),
      testing::EncodePng(testing::TestPixels(w, h, 4, 8), w, h, 4),
      testing::EncodePng(testing::TestPixels(w, h, 1, 9), w, h, 1),
      testing::EncodePng16(deep, w, h, 1)};
  std::vector<v1::DecodeSpec> specs(3);
  for (v1::DecodeSpec& spec : specs) spec.set_decode(true);
  *specs[0].add_transforms() = RandomResizedCrop(48);
  specs[0].add_transforms()->mutable_horizontal_flip()->set_p(0.5);
  specs[1].add_transforms()->mutable_resize()->set_shorter_side(64);
  specs[1].add_transforms()->mutable_center_crop()->set_height(56);
  specs[1].mutable_transforms(1)->mutable_center_crop()->set_width(56);
  specs[2].add_transforms()->mutable_center_crop()->set_height(40);
  specs[2].mutable_transforms(0)->mutable_center_crop()->set_width(90);
  DecodedImageCache cache(64 << 20);
  int hits = 0;
  for (const std::string& png : pngs) {
    SCOPED_TRACE(&png - pngs.data());
    hits += SharedEqualsAlone(DecodePng, png, w, h, specs, 6, cache);
  }
  // One whole decode per image; every other call read it.
  EXPECT_EQ(cache.stats().misses, 4);
  EXPECT_EQ(hits, 4 * 3 * 6 - 4);

  std::string damaged = pngs[0];
  damaged.resize(damaged.size() / 2);
  const Payload payload{damaged, nullptr};
  ImageOptions options;
  auto alone = DecodePng(payload, options);
  SharedDecode shared;
  shared.cache = &cache;
  shared.key = DecodedImageCache::ImageKey(
      "s.tar", *ShardData::FromString("s", "s.tar"), 4, "png", damaged);
  options.shared = &shared;
  auto together = DecodePng(payload, options);
  ASSERT_FALSE(alone.ok());
  EXPECT_EQ(together.status(), alone.status());
  EXPECT_EQ(cache.stats().entries, 4);
}

}  // namespace
}  // namespace sluice::dataserver
