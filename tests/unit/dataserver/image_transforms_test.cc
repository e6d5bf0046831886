#include "server/dataserver/image_transforms.h"

#include <cmath>
#include <cstring>
#include <set>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/dataserver/augment_random.h"
#include "server/dataserver/decoders.h"
#include "tests/testing/image_fixtures.h"
#include "tests/testing/status_matchers.h"

namespace sluice::dataserver {
namespace {

using ::sluice::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Random123's known answers for Philox4x32-10.
TEST(PhiloxTest, KnownAnswers) {
  EXPECT_THAT(Philox4x32({0, 0, 0, 0}, {0, 0}),
              ElementsAre(0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u));
  EXPECT_THAT(Philox4x32({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
                         {0xffffffffu, 0xffffffffu}),
              ElementsAre(0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu));
  EXPECT_THAT(Philox4x32({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
                         {0xa4093822u, 0x299f31d0u}),
              ElementsAre(0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u));
}

TEST(SampleRandomTest, EveryKeyPartChangesTheWords) {
  const SampleRandom base(7, 0, 3, 11);
  const auto words = base.Words(0, 0);
  EXPECT_EQ(SampleRandom(7, 0, 3, 11).Words(0, 0), words);  // a pure function
  EXPECT_NE(SampleRandom(8, 0, 3, 11).Words(0, 0), words);
  EXPECT_NE(SampleRandom(7, 1, 3, 11).Words(0, 0), words);
  EXPECT_NE(SampleRandom(7, 0, 4, 11).Words(0, 0), words);
  EXPECT_NE(SampleRandom(7, 0, 3, 12).Words(0, 0), words);
  EXPECT_NE(SampleRandom(7, 0, 3, int64_t{11} + (int64_t{1} << 40)).Words(0, 0),
            words);
  EXPECT_NE(base.Words(1, 0), words);
  EXPECT_NE(base.Words(0, 1), words);
}

v1::DecodeSpec Spec(std::initializer_list<v1::Transform> transforms) {
  v1::DecodeSpec spec;
  spec.set_decode(true);
  for (const v1::Transform& t : transforms) *spec.add_transforms() = t;
  return spec;
}

v1::Transform Rrc(int h, int w, float smin = 0, float smax = 0, float rmin = 0,
                  float rmax = 0) {
  v1::Transform t;
  auto* c = t.mutable_random_resized_crop();
  c->set_height(h);
  c->set_width(w);
  c->set_scale_min(smin);
  c->set_scale_max(smax);
  c->set_ratio_min(rmin);
  c->set_ratio_max(rmax);
  return t;
}

v1::Transform HFlip(float p) {
  v1::Transform t;
  t.mutable_horizontal_flip()->set_p(p);
  return t;
}

v1::Transform Resize(int shorter) {
  v1::Transform t;
  t.mutable_resize()->set_shorter_side(shorter);
  return t;
}

v1::Transform CenterCrop(int h, int w) {
  v1::Transform t;
  t.mutable_center_crop()->set_height(h);
  t.mutable_center_crop()->set_width(w);
  return t;
}

TEST(ImageTransformsTest, BadSpecsNameTheField) {
  auto bad = [](v1::DecodeSpec spec) {
    return ImageTransforms::FromSpec(spec).status();
  };
  EXPECT_THAT(
      bad(Spec({Rrc(0, 224)})),
      StatusIs(
          absl::StatusCode::kInvalidArgument,
          HasSubstr("decode.transforms[0].random_resized_crop.height is 0")));
  EXPECT_THAT(
      bad(Spec({HFlip(0.5), Rrc(224, 224, 0.5, 1.5)})),
      StatusIs(
          absl::StatusCode::kInvalidArgument,
          HasSubstr(
              "decode.transforms[1].random_resized_crop.scale_max is 1.5")));
  EXPECT_THAT(bad(Spec({Rrc(224, 224, 0.9, 0.5)})),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("random_resized_crop.scale_min (0.9) is "
                                 "greater than scale_max")));
  EXPECT_THAT(
      bad(Spec({Rrc(224, 224, 0.1, 1, 2, 1)})),
      StatusIs(
          absl::StatusCode::kInvalidArgument,
          HasSubstr(
              "random_resized_crop.ratio_min (2) is greater than ratio_max")));
  EXPECT_THAT(
      bad(Spec({HFlip(1.5)})),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("decode.transforms[0].horizontal_flip.p is 1.5")));
  EXPECT_THAT(bad(Spec({v1::Transform()})),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("decode.transforms[0] sets no transform")));
  EXPECT_THAT(bad(Spec({Resize(0)})),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("decode.transforms[0].resize.height is 0")));
  v1::DecodeSpec normalize = Spec({});
  normalize.mutable_to_float()->set_enabled(true);
  normalize.mutable_to_float()->add_mean(0.5f);
  EXPECT_THAT(
      bad(normalize),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("decode.to_float.mean has 1 values and std 0")));
  normalize.mutable_to_float()->add_std(0.0f);
  EXPECT_THAT(bad(normalize),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("decode.to_float.std[0] is 0")));
  v1::DecodeSpec both = Spec({Resize(10)});
  both.set_resize_shorter_side(10);
  EXPECT_THAT(bad(both),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("decode.transforms cannot be combined")));
}

// torchvision's get_params, as its code reads: the accepted window's area
// fraction and log aspect ratio are uniform in their ranges (up to the
// rejection of windows that do not fit), its position uniform.
TEST(ImageTransformsTest, RandomResizedCropSamplesAsTorchvision) {
  auto t = ImageTransforms::FromSpec(Spec({Rrc(224, 224)}));
  ASSERT_OK(t.status());
  const int w = 500, h = 375;
  int n = 0, fallbacks = 0;
  double area_sum = 0, log_ratio_sum = 0;
  int left_third = 0;
  for (int index = 0; index < 10000; ++index) {
    Geometry g = t->Plan(w, h, SampleRandom(42, 0, 0, index));
    ASSERT_EQ(g.steps.size(), 2u);
    const GeometryStep& crop = g.steps[0];
    ASSERT_EQ(crop.kind, GeometryStep::Kind::kCrop);
    ASSERT_GE(crop.left, 0);
    ASSERT_GE(crop.top, 0);
    ASSERT_LE(crop.left + crop.width, w);
    ASSERT_LE(crop.top + crop.height, h);
    EXPECT_EQ(g.steps[1].kind, GeometryStep::Kind::kResize);
    EXPECT_EQ(g.steps[1].width, 224);
    const double area = static_cast<double>(crop.width) * crop.height / (w * h);
    EXPECT_GE(area, 0.08 * 0.95);
    EXPECT_LE(area, 1.0);
    const double ratio = static_cast<double>(crop.width) / crop.height;
    if (crop.width == w && crop.height == h) ++fallbacks;
    EXPECT_GE(ratio, 3.0 / 4.0 * 0.97);
    EXPECT_LE(ratio, 4.0 / 3.0 * 1.03);
    area_sum += area;
    log_ratio_sum += std::log(ratio);
    if (crop.left + crop.width / 2.0 < w / 3.0) ++left_third;
    ++n;
  }
  // torchvision 0.14's RandomResizedCrop.get_params over 10,000 draws on a
  // 500x375 image (torch.manual_seed(0)): mean area fraction 0.4331, mean
  // log aspect ratio 0.0309, no fallback. The same sampling gives the same
  // means up to the draws' own spread (~0.003).
  EXPECT_NEAR(area_sum / n, 0.4331, 0.01);
  EXPECT_NEAR(log_ratio_sum / n, 0.0309, 0.01);
  EXPECT_LT(fallbacks, 10);
  EXPECT_GT(left_third, 1000);  // positions spread across the image
}

TEST(ImageTransformsTest, FallbackIsTheCentralCropOfTheRatioLimit) {
  // A 10:1 image fits no window with ratio in [3/4, 4/3] of area >= 0.9:
  // the central crop with ratio 4/3 at full height.
  auto t = ImageTransforms::FromSpec(Spec({Rrc(32, 32, 0.9, 1.0)}));
  ASSERT_OK(t.status());
  Geometry g = t->Plan(1000, 100, SampleRandom(1, 0, 0, 0));
  ASSERT_EQ(g.steps.size(), 2u);
  EXPECT_EQ(g.steps[0].height, 100);
  EXPECT_EQ(g.steps[0].width, 133);  // round(100 * 4/3)
  EXPECT_EQ(g.steps[0].left, (1000 - 133) / 2);
  EXPECT_EQ(g.steps[0].top, 0);
}

TEST(ImageTransformsTest, TheSameKeyGivesTheSameGeometryAndEpochsDiffer) {
  auto t = ImageTransforms::FromSpec(Spec({Rrc(224, 224), HFlip(0.5)}));
  ASSERT_OK(t.status());
  int differ = 0, flips = 0;
  for (int index = 0; index < 200; ++index) {
    Geometry a = t->Plan(640, 480, SampleRandom(9, 3, 5, index));
    Geometry b = t->Plan(640, 480, SampleRandom(9, 3, 5, index));
    EXPECT_EQ(a.steps[0].left, b.steps[0].left);
    EXPECT_EQ(a.steps[0].width, b.steps[0].width);
    EXPECT_EQ(a.flip_horizontal, b.flip_horizontal);
    Geometry next_epoch = t->Plan(640, 480, SampleRandom(9, 4, 5, index));
    differ += next_epoch.steps[0].left != a.steps[0].left ||
              next_epoch.steps[0].width != a.steps[0].width;
    flips += a.flip_horizontal;
  }
  EXPECT_GT(differ, 190);
  EXPECT_GT(flips, 70);  // p = 0.5 over 200 draws
  EXPECT_LT(flips, 130);
}

TEST(ImageTransformsTest, CenterCropRoundsHalvesToEvenAndPads) {
  auto t = ImageTransforms::FromSpec(Spec({Resize(256), CenterCrop(224, 224)}));
  ASSERT_OK(t.status());
  // 500x375 -> 341x256; left = round((341 - 224) / 2) = round(58.5) = 58.
  Geometry g = t->Plan(500, 375, SampleRandom(0, 0, 0, 0));
  ASSERT_EQ(g.steps.size(), 2u);
  EXPECT_EQ(g.steps[0].width, 341);
  EXPECT_EQ(g.steps[1].left, 58);
  EXPECT_EQ(g.steps[1].top, 16);
  auto pad = ImageTransforms::FromSpec(Spec({CenterCrop(9, 9)}));
  ASSERT_OK(pad.status());
  Geometry p = pad->Plan(4, 6, SampleRandom(0, 0, 0, 0));
  EXPECT_EQ(p.steps[0].left, -2);  // torchvision pads floor(5 / 2) on the left
  EXPECT_EQ(p.steps[0].top, -1);
}

ImageBuffer Pixels(int w, int h, int c, const std::string& bytes) {
  ImageBuffer image = AllocateImage(w, h, c, 1);
  std::memcpy(image.owner.get(), bytes.data(), bytes.size());
  return image;
}

TEST(ImageTransformsTest, FlipsLayoutAndFloats) {
  // 2x2 RGB: pixel (y, x) = 10 * (2y + x) + channel.
  std::string px;
  for (int i = 0; i < 4; ++i) {
    for (int c = 0; c < 3; ++c) px.push_back(static_cast<char>(10 * i + c));
  }
  v1::DecodeSpec spec = Spec({HFlip(1.0)});
  spec.set_layout(v1::IMAGE_LAYOUT_CHW);
  auto t = ImageTransforms::FromSpec(spec);
  ASSERT_OK(t.status());
  Geometry g = t->Plan(2, 2, SampleRandom(0, 0, 0, 0));
  EXPECT_TRUE(g.flip_horizontal);
  auto out = t->Finish(Pixels(2, 2, 3, px), g, 0, Interpolation::kBilinear);
  ASSERT_OK(out.status());
  EXPECT_THAT(out->shape, ElementsAre(3, 2, 2));
  const auto* o = reinterpret_cast<const uint8_t*>(out->bytes.bytes.data());
  // Channel 0, row 0: pixels x=1 then x=0.
  EXPECT_EQ(o[0], 10);
  EXPECT_EQ(o[1], 0);
  EXPECT_EQ(o[4 + 2], 31);  // channel 1, row 1, x=0 <- pixel (1, 1)
  v1::DecodeSpec floats = Spec({});
  floats.mutable_to_float()->set_enabled(true);
  for (float m : {0.5f, 0.25f, 0.0f}) floats.mutable_to_float()->add_mean(m);
  for (float s : {0.5f, 1.0f, 2.0f}) floats.mutable_to_float()->add_std(s);
  auto f = ImageTransforms::FromSpec(floats);
  ASSERT_OK(f.status());
  auto fo =
      f->Finish(Pixels(2, 2, 3, px), Geometry(), 0, Interpolation::kBilinear);
  ASSERT_OK(fo.status());
  EXPECT_EQ(fo->dtype, v1::DTYPE_FLOAT32);
  EXPECT_THAT(fo->shape, ElementsAre(2, 2, 3));
  float v[12];
  std::memcpy(v, fo->bytes.bytes.data(), sizeof(v));
  EXPECT_FLOAT_EQ(v[3 * 3 + 0], (30 / 255.0f - 0.5f) / 0.5f);
  EXPECT_FLOAT_EQ(v[3 * 3 + 2], (32 / 255.0f - 0.0f) / 2.0f);
}

// 8-bit CHW output after a resize is written from the resize's planes;
// every value equals the HWC output of the same geometry with its axes
// moved: crops inside and past the edges, flips, floats, 3 and 4 channels.
TEST(ImageTransformsTest, ChwOutputIsTheHwcOutputTransposed) {
  using Kind = GeometryStep::Kind;
  struct Case {
    std::string name;
    std::vector<GeometryStep> steps;
    bool flip_h, flip_v, floats;
  };
  const std::vector<Case> cases = {
      {"no step", {}, false, false, false},
      {"crop only, flip", {{Kind::kCrop, 3, 4, 50, 40}}, true, false, false},
      {"resize only", {{Kind::kResize, 0, 0, 97, 61}}, false, false, false},
      {"crop, resize, flip",
       {{Kind::kCrop, 10, 5, 150, 100}, {Kind::kResize, 0, 0, 64, 64}},
       true,
       false,
       false},
      {"resize, crop inside, flip both",
       {{Kind::kResize, 0, 0, 128, 96}, {Kind::kCrop, 16, 16, 96, 64}},
       true,
       true,
       false},
      {"resize, crop past the edges",
       {{Kind::kResize, 0, 0, 50, 40}, {Kind::kCrop, -5, -3, 60, 47}},
       false,
       true,
       false},
      {"crop, resize, floats",
       {{Kind::kCrop, 0, 0, 201, 150}, {Kind::kResize, 0, 0, 33, 29}},
       true,
       false,
       true},
  };
  for (int c : {3, 4}) {
    const int w = 201, h = 150;
    const std::string px = testing::TestPixels(w, h, c, /*seed=*/c);
    for (const Case& k : cases) {
      SCOPED_TRACE(absl::StrCat(k.name, ", ", c, " channels"));
      v1::DecodeSpec spec = Spec({});
      if (k.floats) {
        spec.mutable_to_float()->set_enabled(true);
        for (int ch = 0; ch < c; ++ch) {
          spec.mutable_to_float()->add_mean(0.1f * ch);
          spec.mutable_to_float()->add_std(0.5f + ch);
        }
      }
      auto hwc = ImageTransforms::FromSpec(spec);
      spec.set_layout(v1::IMAGE_LAYOUT_CHW);
      auto chw = ImageTransforms::FromSpec(spec);
      ASSERT_OK(hwc.status());
      ASSERT_OK(chw.status());
      Geometry g;
      g.steps = k.steps;
      g.flip_horizontal = k.flip_h;
      g.flip_vertical = k.flip_v;
      auto a = hwc->Finish(Pixels(w, h, c, px), g, 0, Interpolation::kBilinear);
      auto b = chw->Finish(Pixels(w, h, c, px), g, 0, Interpolation::kBilinear);
      ASSERT_OK(a.status());
      ASSERT_OK(b.status());
      ASSERT_EQ(a->shape.size(), 3u);
      const int64_t oh = a->shape[0], ow = a->shape[1];
      EXPECT_THAT(b->shape, ElementsAre(c, oh, ow));
      EXPECT_EQ(a->dtype, b->dtype);
      const size_t value = k.floats ? 4 : 1;
      ASSERT_EQ(a->bytes.bytes.size(), b->bytes.bytes.size());
      ASSERT_EQ(a->bytes.bytes.size(),
                static_cast<size_t>(oh * ow * c) * value);
      int mismatches = 0;
      for (int64_t y = 0; y < oh; ++y) {
        for (int64_t x = 0; x < ow; ++x) {
          for (int ch = 0; ch < c; ++ch) {
            const size_t at_hwc = static_cast<size_t>((y * ow + x) * c + ch);
            const size_t at_chw = static_cast<size_t>((ch * oh + y) * ow + x);
            mismatches +=
                std::memcmp(a->bytes.bytes.data() + at_hwc * value,
                            b->bytes.bytes.data() + at_chw * value, value) != 0;
          }
        }
      }
      EXPECT_EQ(mismatches, 0);
    }
  }
}

TEST(ImageTransformsTest, BilinearEdgesRenormaliseTheFilterAsPilDoes) {
  // Every output pixel of these small images has a filter cut off by the
  // top or bottom edge (3 rows to 2). The expected values are PIL's
  // Image.resize(BILINEAR) of the same
  // input (Pillow 9.4): the taps inside the image renormalised to sum to 1,
  // a horizontal pass rounded to 8 bits, then a vertical one.
  const int w = 4, h = 3;
  const std::vector<int> in = {0,  100, 200, 250, 50, 60,
                               70, 80,  90,  10,  30, 255};
  std::string px;
  for (int v : in) px.push_back(static_cast<char>(v));
  struct Case {
    int ow, oh;
    std::vector<int> want;
  };
  for (const Case& c : std::vector<Case>{
           {3, 2, {39, 118, 176, 61, 37, 146}},
           {7,
            2,
            {19, 43, 80, 118, 154, 174, 186, 75, 58, 32, 37, 55, 138, 189}}}) {
    auto out =
        ResizeImage(Pixels(w, h, 1, px), c.ow, c.oh, Interpolation::kBilinear);
    ASSERT_OK(out.status());
    std::vector<int> got;
    for (int i = 0; i < c.ow * c.oh; ++i) got.push_back(out->data[i]);
    EXPECT_EQ(got, c.want) << c.ow << "x" << c.oh;
  }
}

TEST(ImageTransformsTest, NearestKeepsTheInputValues) {
  // A label map with values {0, 7, 200}: nearest resizing (up and down)
  // never invents a value between them; bilinear does.
  const int w = 40, h = 30;
  std::string px(w * h, 0);
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x)
      px[y * w + x] = static_cast<char>(x < 13 ? 0 : (y < 11 ? 7 : 200));
  }
  for (auto [ow, oh] : {std::pair{17, 13}, std::pair{97, 71}}) {
    auto nearest =
        ResizeImage(Pixels(w, h, 1, px), ow, oh, Interpolation::kNearest);
    ASSERT_OK(nearest.status());
    std::set<int> values;
    for (int i = 0; i < ow * oh; ++i) values.insert(nearest->data[i]);
    EXPECT_EQ(values, (std::set<int>{0, 7, 200}));
    auto bilinear =
        ResizeImage(Pixels(w, h, 1, px), ow, oh, Interpolation::kBilinear);
    ASSERT_OK(bilinear.status());
    std::set<int> blended;
    for (int i = 0; i < ow * oh; ++i) blended.insert(bilinear->data[i]);
    EXPECT_GT(blended.size(), 3u);
  }
}

TEST(ImageTransformsTest, FieldsOfOtherSizesGetTheSameWindow) {
  Geometry g;
  g.steps.push_back({GeometryStep::Kind::kCrop, 100, 50, 200, 100});
  g.steps.push_back({GeometryStep::Kind::kResize, 0, 0, 64, 64});
  Geometry half = ImageTransforms::ScaleTo(g, 400, 300, 200, 150);
  EXPECT_EQ(half.steps[0].left, 50);
  EXPECT_EQ(half.steps[0].top, 25);
  EXPECT_EQ(half.steps[0].width, 100);
  EXPECT_EQ(half.steps[0].height, 50);
  EXPECT_EQ(half.steps[1].width, 64);
}

// The window decode equals a full decode cropped, pixel for pixel: on and
// off iMCU boundaries, at the image's edges (the decoder reads a column of
// context on each side for chroma upsampling).
TEST(ImageTransformsTest, JpegWindowDecodeMatchesFullDecodeThenCrop) {
  const int w = 320, h = 240;
  std::string jpeg = testing::EncodeJpeg(testing::TestPixels(w, h, 3), w, h);
  auto full = DecodeJpeg(Payload{jpeg, nullptr}, {});
  ASSERT_OK(full.status());
  for (auto [left, top, cw, ch] :
       {std::array<int, 4>{64, 32, 96, 80},
        std::array<int, 4>{37, 51, 150, 101}, std::array<int, 4>{0, 0, 33, 17},
        std::array<int, 4>{171, 123, 149, 117}}) {
    v1::DecodeSpec spec = Spec({CenterCrop(ch, cw)});
    auto t = ImageTransforms::FromSpec(spec);
    ASSERT_OK(t.status());
    Geometry g;
    g.steps.push_back({GeometryStep::Kind::kCrop, left, top, cw, ch});
    ImageOptions options;
    options.transforms = &*t;
    options.geometry = &g;
    auto window = DecodeJpeg(Payload{jpeg, nullptr}, options);
    ASSERT_OK(window.status());
    ASSERT_THAT(window->shape, ElementsAre(ch, cw, 3));
    int max_diff = 0;
    double total = 0;
    for (int y = 0; y < ch; ++y) {
      for (int x = 0; x < cw * 3; ++x) {
        const int a =
            static_cast<uint8_t>(window->bytes.bytes[(y * cw) * 3 + x]);
        const int b = static_cast<uint8_t>(
            full->bytes.bytes[((y + top) * w + left) * 3 + x]);
        max_diff = std::max(max_diff, std::abs(a - b));
        total += std::abs(a - b);
      }
    }
    EXPECT_EQ(max_diff, 0) << "window at " << left << "," << top
                           << ": mean difference " << total / (cw * ch * 3);
  }
}

// A crop that ends above the last row inflates only the rows down to its
// bottom: the same pixels as a full decode, then the crop, for every channel
// layout.
TEST(ImageTransformsTest, PngCropDecodesRowsToItsBottomWithTheSamePixels) {
  const int w = 120, h = 90;
  for (int c = 1; c <= 4; ++c) {
    const std::string pixels = testing::TestPixels(w, h, c);
    const std::string png = testing::EncodePng(pixels, w, h, c);
    for (auto [left, top, cw, ch] :
         {std::array<int, 4>{10, 0, 50, 20}, std::array<int, 4>{0, 33, 120, 40},
          std::array<int, 4>{71, 5, 49, 84}}) {
      v1::DecodeSpec spec = Spec({CenterCrop(ch, cw)});
      auto t = ImageTransforms::FromSpec(spec);
      ASSERT_OK(t.status());
      Geometry g;
      g.steps.push_back({GeometryStep::Kind::kCrop, left, top, cw, ch});
      ImageOptions options;
      options.transforms = &*t;
      options.geometry = &g;
      auto window = DecodePng(Payload{png, nullptr}, options);
      ASSERT_OK(window.status());
      ASSERT_THAT(window->shape, ElementsAre(ch, cw, c));
      std::string want;
      for (int y = top; y < top + ch; ++y) {
        want += pixels.substr((static_cast<size_t>(y) * w + left) * c,
                              static_cast<size_t>(cw) * c);
      }
      EXPECT_TRUE(window->bytes.bytes == want)
          << c << " channels, window at " << left << "," << top;
    }
  }
  // A file cut off after the window's rows: the window decodes (nothing
  // past its bottom is read), a window reaching into the cut is an error,
  // and so is a full decode.
  const std::string pixels = testing::TestPixels(w, h, 3);
  std::string png = testing::EncodePng(pixels, w, h, 3);
  png.resize(png.size() * 6 / 10);
  auto decode = [&](int top, int rows) {
    v1::DecodeSpec spec = Spec({CenterCrop(rows, w)});
    auto t = ImageTransforms::FromSpec(spec);
    Geometry g;
    g.steps.push_back({GeometryStep::Kind::kCrop, 0, top, w, rows});
    ImageOptions options;
    options.transforms = &*t;
    options.geometry = &g;
    return DecodePng(Payload{png, nullptr}, options);
  };
  auto top_rows = decode(5, 20);
  ASSERT_OK(top_rows.status());
  EXPECT_TRUE(top_rows->bytes.bytes == pixels.substr(5 * w * 3, 20 * w * 3));
  EXPECT_EQ(decode(5, 80).status().code(), absl::StatusCode::kInvalidArgument);
  auto broken = DecodePng(Payload{png, nullptr}, {});
  EXPECT_EQ(broken.status().code(), absl::StatusCode::kInvalidArgument);
}

// Resize then crop decodes only the rows and columns the crop needs: the
// output equals resizing and cropping a full decode, bit for bit.
TEST(ImageTransformsTest, ResizeThenCropDecodesLessWithTheSamePixels) {
  const int w = 500, h = 375;
  std::string jpeg = testing::EncodeJpeg(testing::TestPixels(w, h, 3), w, h);
  auto full = DecodeJpeg(Payload{jpeg, nullptr}, {});
  ASSERT_OK(full.status());
  ImageBuffer image = AllocateImage(w, h, 3, 1);
  std::memcpy(image.owner.get(), full->bytes.bytes.data(),
              full->bytes.bytes.size());
  for (int shorter : {256, 300, 150}) {
    v1::DecodeSpec spec =
        Spec({Resize(shorter), CenterCrop(shorter * 7 / 8, shorter * 7 / 8)});
    auto t = ImageTransforms::FromSpec(spec);
    ASSERT_OK(t.status());
    Geometry g = t->Plan(w, h, SampleRandom(0, 0, 0, 0));
    ImageOptions options;
    options.transforms = &*t;
    options.geometry = &g;
    auto windowed = DecodeJpeg(Payload{jpeg, nullptr}, options);
    ASSERT_OK(windowed.status());
    auto reference = t->Finish(image, g, 0, Interpolation::kBilinear);
    ASSERT_OK(reference.status());
    EXPECT_EQ(windowed->shape, reference->shape);
    EXPECT_TRUE(windowed->bytes.bytes == reference->bytes.bytes)
        << "shorter side " << shorter;
  }
}

}  // namespace
}  // namespace sluice::dataserver
