// transform_bench (make bench; not a test): what decoding only the needed
// window saves, on one core, for the two transforms pipeline_bench runs.
//
//   train: RandomResizedCrop(224) + flip -- the JPEG window decode against
//          a full decode, then the same crop, resize and flip;
//   eval:  Resize(256) + CenterCrop(224) -- the rows and columns the crop
//          needs against a full decode, then the same resize and crop.
//
// Both sides produce the same pixels (tests/unit/dataserver/
// image_transforms_test.cc); the ratio is images/s of the window decode
// over the full decode. Ends with one JSON line.
//
// usage: transform_bench [--seconds=S]
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "server/common/malloc_tuning.h"
#include "server/dataserver/augment_random.h"
#include "server/dataserver/decoders.h"
#include "server/dataserver/image_transforms.h"
#include "tests/bench/bench_util.h"

ABSL_FLAG(double, seconds, 3.0, "Seconds per measurement.");

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

}  // namespace
}  // namespace sluice::dataserver

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
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
    std::printf(
        "%s: window decode %.0f images/s, full decode + the same transform "
        "%.0f "
        "images/s: x%.2f\n",
        name, window, full, window / full);
    char part[200];
    std::snprintf(part, sizeof(part),
                  ", \"%s\": {\"window_images_per_s\": %.1f, "
                  "\"full_images_per_s\": %.1f, "
                  "\"ratio\": %.3f}",
                  name, window, full, window / full);
    json += part;
  }
  std::printf("%s}\n", json.c_str());
  return 0;
}
