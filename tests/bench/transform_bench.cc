// transform_bench (make bench; not a test): what decoding only the needed
// window saves, on one core, for the two transforms pipeline_bench runs.
//
//   train: RandomResizedCrop(224) + flip -- the JPEG window decode against
//          a full decode, then the same crop, resize and flip;
//   eval:  Resize(256) + CenterCrop(224) -- the rows and columns the crop
//          needs against a full decode, then the same resize and crop.
//
// and the transform alone on full decodes made beforehand (CPU-ms per
// image on this thread): what crop, resize and flip cost; and four jobs
// with their own transforms and seeds decoding each image, each its own
// window against one whole decode shared through a DecodedImageCache.
//
// Both sides produce the same pixels (tests/unit/dataserver/
// image_transforms_test.cc); the ratio is images/s of the window decode
// over the full decode. Ends with one JSON line.
//
// With --floor_dir=DIR it measures only the floor pipeline_bench compares
// the data server's CPU per sample with: a bare TurboJPEG decode
// (tjDecompress2 to RGB, full size) of every .jpg in DIR, on one thread,
// as CPU milliseconds per image.
//
// usage: transform_bench [--seconds=S] [--floor_dir=DIR]
#include <stdlib.h>
#include <turbojpeg.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "server/common/malloc_tuning.h"
#include "server/common/thread_cpu.h"
#include "server/dataserver/augment_random.h"
#include "server/dataserver/decoded_image_cache.h"
#include "server/dataserver/decoders.h"
#include "server/dataserver/image_transforms.h"
#include "tests/bench/bench_util.h"

ABSL_FLAG(double, seconds, 3.0, "Seconds per measurement.");
ABSL_FLAG(std::string, floor_dir, "",
          "Only measure a bare TurboJPEG decode of the .jpg files here.");

namespace sluice::dataserver {
namespace {

using Clock = std::chrono::steady_clock;

v1::DecodeSpec Spec(bool train) {
  v1::DecodeSpec spec;
  spec.set_decode(true);
  if (train) {
    auto* crop = spec.add_transforms()->mutable_random_resized_crop();
    crop->set_height(224);
    crop->set_width(224);
    spec.add_transforms()->mutable_horizontal_flip()->set_p(0.5f);
  } else {
    spec.add_transforms()->mutable_resize()->set_shorter_side(256);
    auto* crop = spec.add_transforms()->mutable_center_crop();
    crop->set_height(224);
    crop->set_width(224);
  }
  // uint8 CHW, as pipeline_bench.py asks for.
  spec.set_layout(v1::IMAGE_LAYOUT_CHW);
  return spec;
}

// Images per second: `window` decodes through DecodeJpeg with the planned
// geometry; otherwise a full decode, then the same geometry from step 0.
double Rate(const std::vector<std::string>& jpegs, bool train, bool window,
            double seconds) {
  auto transforms = ImageTransforms::FromSpec(Spec(train));
  if (!transforms.ok()) std::abort();
  int64_t n = 0;
  size_t bytes = 0;
  const Clock::time_point start = Clock::now();
  while (std::chrono::duration<double>(Clock::now() - start).count() <
         seconds) {
    const std::string& jpeg = jpegs[n % jpegs.size()];
    Geometry g = transforms->Plan(500, 375, SampleRandom(1, 0, 0, n));
    ImageOptions options;
    options.transforms = &*transforms;
    options.geometry = &g;
    absl::StatusOr<DecodedField> out;
    if (window) {
      out = DecodeJpeg(Payload{jpeg, nullptr}, options);
    } else {
      auto full = DecodeJpeg(Payload{jpeg, nullptr}, {});
      if (!full.ok()) std::abort();
      ImageBuffer image;
      image.owner = full->bytes.owner == nullptr
                        ? nullptr
                        : std::shared_ptr<uint8_t>(
                              full->bytes.owner,
                              reinterpret_cast<uint8_t*>(
                                  const_cast<char*>(full->bytes.bytes.data())));
      image.data = reinterpret_cast<const uint8_t*>(full->bytes.bytes.data());
      image.width = 500;
      image.height = 375;
      image.channels = 3;
      image.stride = 500 * 3;
      out = transforms->Finish(image, g, 0, Interpolation::kBilinear);
    }
    if (!out.ok()) std::abort();
    bytes += out->bytes.bytes.size();
    ++n;
  }
  const double elapsed =
      std::chrono::duration<double>(Clock::now() - start).count();
  if (bytes == 0) std::abort();
  return n / elapsed;
}

// CPU milliseconds per full-size RGB decode of `jpegs` with tjDecompress2.
double FloorCpuMs(const std::vector<std::string>& jpegs, double seconds) {
  tjhandle handle = tjInitDecompress();
  if (handle == nullptr) std::abort();
  std::vector<unsigned char> pixels;
  int64_t n = 0;
  const double start = ThreadCpuSeconds();
  double used = 0;
  while (used < seconds) {
    const std::string& jpeg = jpegs[n % jpegs.size()];
    const auto* bytes = reinterpret_cast<const unsigned char*>(jpeg.data());
    int width = 0, height = 0, subsamp = 0, colorspace = 0;
    if (tjDecompressHeader3(handle, bytes, jpeg.size(), &width, &height,
                            &subsamp, &colorspace) != 0)
      std::abort();
    pixels.resize(static_cast<size_t>(width) * height * 3);
    if (tjDecompress2(handle, bytes, jpeg.size(), pixels.data(), width, 0,
                      height, TJPF_RGB, 0) != 0)
      std::abort();
    ++n;
    used = ThreadCpuSeconds() - start;
  }
  tjDestroy(handle);
  return 1000 * used / static_cast<double>(n);
}

// CPU milliseconds per image of the transform alone (crop, resize, flip)
// on full decodes made beforehand: what the resize costs.
double TransformCpuMs(const std::vector<std::string>& jpegs, bool train,
                      double seconds) {
  auto transforms = ImageTransforms::FromSpec(Spec(train));
  if (!transforms.ok()) std::abort();
  std::vector<ImageBuffer> images;
  for (const std::string& jpeg : jpegs) {
    auto full = DecodeJpeg(Payload{jpeg, nullptr}, {});
    if (!full.ok()) std::abort();
    ImageBuffer image = AllocateImage(500, 375, 3, 1);
    std::memcpy(image.owner.get(), full->bytes.bytes.data(), 500 * 375 * 3);
    images.push_back(image);
  }
  int64_t n = 0;
  const double start = ThreadCpuSeconds();
  double used = 0;
  while (used < seconds) {
    Geometry g = transforms->Plan(500, 375, SampleRandom(1, 0, 0, n));
    auto out = transforms->Finish(images[n % images.size()], g, 0,
                                  Interpolation::kBilinear);
    if (!out.ok()) std::abort();
    ++n;
    used = ThreadCpuSeconds() - start;
  }
  return 1000 * used / static_cast<double>(n);
}

// CPU milliseconds per image for four jobs (the train transform at 224, 160
// and 128 and the eval transform, each with its own seed) decoding each
// image: each on its own (window decodes), or through one
// DecodedImageCache (one whole decode, four crops of it). The cache is
// filled once before the clock starts: the first fill of fresh memory costs
// page faults (about as much again as the decode on this machine) that a
// server pays once, not per image.
double FourJobsCpuMs(const std::vector<std::string>& jpegs, bool shared,
                     double seconds) {
  std::vector<ImageTransforms> jobs;
  for (int size : {224, 160, 128}) {
    v1::DecodeSpec spec = Spec(true);
    spec.mutable_transforms(0)->mutable_random_resized_crop()->set_height(size);
    spec.mutable_transforms(0)->mutable_random_resized_crop()->set_width(size);
    jobs.push_back(*ImageTransforms::FromSpec(spec));
  }
  jobs.push_back(*ImageTransforms::FromSpec(Spec(false)));
  constexpr int64_t kCacheBytes = int64_t{32} << 20;
  DecodedImageCache cache(kCacheBytes);
  // A mapped file, as the server's shards are: its keys name the file's
  // version, without hashing each image's bytes as an in-memory shard's do.
  char path[] = "/tmp/transform_bench-XXXXXX";
  const int fd = mkstemp(path);
  if (fd < 0 || write(fd, "tar", 3) != 3) std::abort();
  unlink(path);
  const absl::StatusOr<std::shared_ptr<const ShardData>> bench_shard =
      ShardData::Map(fd, path);
  if (!bench_shard.ok()) std::abort();
  int64_t n = 0;
  auto one_image = [&] {
    const std::string& jpeg = jpegs[n % jpegs.size()];
    for (size_t j = 0; j < jobs.size(); ++j) {
      Geometry g = jobs[j].Plan(500, 375, SampleRandom(j, 0, 0, n));
      ImageOptions options;
      options.transforms = &jobs[j];
      options.geometry = &g;
      SharedDecode shared_decode;
      if (shared) {
        shared_decode.cache = &cache;
        shared_decode.key = DecodedImageCache::ImageKey(
            "bench.tar", **bench_shard, n, "jpg", jpeg);
        options.shared = &shared_decode;
      }
      if (!DecodeJpeg(Payload{jpeg, nullptr}, options).ok()) std::abort();
    }
    ++n;
  };
  // Twice the cache's worth of images: full, then evicting.
  while (shared && n < 2 * kCacheBytes / (500 * 375 * 3)) one_image();
  const int64_t first = n;
  const double start = ThreadCpuSeconds();
  double used = 0;
  while (used < seconds) {
    one_image();
    used = ThreadCpuSeconds() - start;
  }
  return 1000 * used / static_cast<double>(n - first);
}

int FloorMain(const std::string& dir, double seconds) {
  std::vector<std::string> jpegs;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".jpg") continue;
    std::ifstream in(entry.path(), std::ios::binary);
    jpegs.emplace_back(std::istreambuf_iterator<char>(in),
                       std::istreambuf_iterator<char>());
  }
  if (jpegs.empty()) {
    std::fprintf(stderr, "transform_bench: no .jpg files in %s\n", dir.c_str());
    return 2;
  }
  const double ms = FloorCpuMs(jpegs, seconds);
  std::printf("bare TurboJPEG decode: %.3f CPU-ms per image (%zu images)\n", ms,
              jpegs.size());
  std::printf("{\"bench\": \"transform_floor\", \"cpu_ms_per_image\": %.4f}\n",
              ms);
  return 0;
}

}  // namespace
}  // namespace sluice::dataserver

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (!absl::GetFlag(FLAGS_floor_dir).empty()) {
    return sluice::dataserver::FloorMain(absl::GetFlag(FLAGS_floor_dir),
                                         absl::GetFlag(FLAGS_seconds));
  }
  // The data server's malloc settings (--tune_malloc): without them glibc's
  // dynamic mmap threshold makes the decoded frames' cost depend on what
  // the process allocated before.
  sluice::TuneMallocForStreaming();
  const double seconds = absl::GetFlag(FLAGS_seconds);
  const std::vector<std::string> jpegs = sluice::bench::MakeJpegs();
  std::string json = "{\"bench\": \"transform\"";
  for (bool train : {true, false}) {
    const char* name = train ? "train" : "eval";
    const double full = sluice::dataserver::Rate(jpegs, train, false, seconds);
    const double window = sluice::dataserver::Rate(jpegs, train, true, seconds);
    const double transform_ms =
        sluice::dataserver::TransformCpuMs(jpegs, train, seconds);
    std::printf("%s: the transform alone (crop, resize, flip): %.3f CPU-ms\n",
                name, transform_ms);
    std::printf(
        "%s: window decode %.0f images/s, full decode + the same transform "
        "%.0f "
        "images/s: x%.2f\n",
        name, window, full, window / full);
    char part[256];
    std::snprintf(part, sizeof(part),
                  ", \"%s\": {\"window_images_per_s\": %.1f, "
                  "\"full_images_per_s\": %.1f, "
                  "\"ratio\": %.3f, \"transform_cpu_ms\": %.4f}",
                  name, window, full, window / full, transform_ms);
    json += part;
  }
  const double alone = sluice::dataserver::FourJobsCpuMs(jpegs, false, seconds);
  const double shared = sluice::dataserver::FourJobsCpuMs(jpegs, true, seconds);
  std::printf(
      "four jobs per image: each decoding alone %.3f CPU-ms, through the "
      "shared cache %.3f CPU-ms: x%.2f\n",
      alone, shared, shared / alone);
  char part[256];
  std::snprintf(part, sizeof(part),
                ", \"four_jobs\": {\"alone_cpu_ms\": %.4f, "
                "\"shared_cpu_ms\": %.4f, \"ratio\": %.3f}",
                alone, shared, shared / alone);
  json += part;
  std::printf("%s}\n", json.c_str());
  return 0;
}
