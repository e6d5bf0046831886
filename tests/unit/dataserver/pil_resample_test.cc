#include "server/dataserver/pil_resample.h"

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace sluice::dataserver {
namespace {

// Resample.c's two passes for one 8-bit plane, as Pillow writes them: a
// horizontal pass over the rows the vertical pass needs, each value
// rounded and clipped to 8 bits, then the vertical pass; each skipped when
// its axis keeps its size.
std::vector<uint8_t> PillowLoops(const std::vector<uint8_t>& in, int w, int h,
                                 int ow, int oh) {
  auto clip8 = [](int32_t v) -> uint8_t {
    if (v >= (255 << 22)) return 255;
    if (v <= 0) return 0;
    return static_cast<uint8_t>(v >> 22);
  };
  PilTaps xs, ys;
  ComputePilTaps(w, ow, &xs);
  ComputePilTaps(h, oh, &ys);
  const int y0 = oh != h ? ys.first[0] : 0;
  const int y1 = oh != h ? ys.first[oh - 1] + ys.count[oh - 1] : h;
  std::vector<uint8_t> tmp(static_cast<size_t>(y1 - y0) * ow);
  for (int y = y0; y < y1; ++y) {
    for (int x = 0; x < ow; ++x) {
      if (ow == w) {
        tmp[(y - y0) * ow + x] = in[y * w + x];
        continue;
      }
      int32_t sum = 1 << 21;
      for (int t = 0; t < xs.count[x]; ++t) {
        sum += in[y * w + xs.first[x] + t] * xs.coefficients[x * xs.stride + t];
      }
      tmp[(y - y0) * ow + x] = clip8(sum);
    }
  }
  std::vector<uint8_t> out(static_cast<size_t>(ow) * oh);
  for (int y = 0; y < oh; ++y) {
    for (int x = 0; x < ow; ++x) {
      if (oh == h) {
        out[y * ow + x] = tmp[y * ow + x];
        continue;
      }
      int32_t sum = 1 << 21;
      for (int t = 0; t < ys.count[y]; ++t) {
        sum += tmp[(ys.first[y] - y0 + t) * ow + x] *
               ys.coefficients[y * ys.stride + t];
      }
      out[y * ow + x] = clip8(sum);
    }
  }
  return out;
}

// PilResizePlane through strided rows: `pad` bytes past each input and
// output row, the output's padding filled with 0xA5 and checked untouched.
std::vector<uint8_t> Resize(const std::vector<uint8_t>& in, int w, int h,
                            int ow, int oh, int pad, std::string* damage) {
  const size_t in_stride = w + pad, out_stride = ow + pad;
  std::vector<uint8_t> src(in_stride * h, 0x5A);
  for (int y = 0; y < h; ++y) {
    std::copy(in.begin() + y * w, in.begin() + (y + 1) * w,
              src.begin() + y * in_stride);
  }
  std::vector<uint8_t> dst(out_stride * oh, 0xA5);
  PilResizePlane(src.data(), in_stride, w, h, dst.data(), out_stride, ow, oh);
  std::vector<uint8_t> out(static_cast<size_t>(ow) * oh);
  for (int y = 0; y < oh; ++y) {
    for (int x = 0; x < static_cast<int>(out_stride); ++x) {
      const uint8_t v = dst[y * out_stride + x];
      if (x < ow) {
        out[y * ow + x] = v;
      } else if (v != 0xA5 && damage->empty()) {
        *damage = absl::StrCat("row ", y, " padding byte ", x, " written");
      }
    }
  }
  return out;
}

// Param: the scalar passes only (true), or the vectorised ones, which
// need a CPU with AVX2.
class PilResampleTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
#if defined(__x86_64__)
    __builtin_cpu_init();
    const bool avx2 = __builtin_cpu_supports("avx2") != 0;
#else
    const bool avx2 = false;
#endif
    if (!GetParam() && !avx2) {
      GTEST_SKIP() << "no AVX2 on this CPU: the weighted sums and the "
                      "channel split would run the scalar code the Scalar "
                      "variant tests";
    }
    SetPilResampleScalarForTesting(GetParam());
  }
  void TearDown() override { SetPilResampleScalarForTesting(false); }
};

TEST_P(PilResampleTest, KnownAnswersFromPillow) {
  // Image.fromarray(a, "L").resize((ow, oh), Image.BILINEAR), Pillow 9.4,
  // for a[y][x] = (37x + 11y) % 256, 7 x 5.
  std::vector<uint8_t> in;
  for (int y = 0; y < 5; ++y) {
    for (int x = 0; x < 7; ++x) {
      in.push_back(static_cast<uint8_t>((37 * x + 11 * y) % 256));
    }
  }
  std::string damage;
  EXPECT_EQ(Resize(in, 7, 5, 3, 4, 0, &damage),
            std::vector<uint8_t>(
                {35, 114, 193, 48, 127, 206, 60, 139, 218, 73, 152, 163}));
  EXPECT_EQ(Resize(in, 7, 5, 11, 2, 0, &damage),
            std::vector<uint8_t>({11,  28,  51,  75,  98,  122, 146, 169,
                                  193, 216, 233, 33,  50,  73,  97,  120,
                                  144, 168, 191, 215, 194, 174}));
}

TEST_P(PilResampleTest, EveryByteIsPillowsOverRandomSizes) {
  std::mt19937 rng(11);
  auto uniform = [&rng](int lo, int hi) {
    return std::uniform_int_distribution<int>(lo, hi)(rng);
  };
  for (int i = 0; i < 200; ++i) {
    // Reductions up to 100x (taps wider than 16), enlargements, one axis
    // kept, single rows and columns, sizes off multiples of 16.
    int w = uniform(1, 700), h = uniform(1, 500);
    int ow = uniform(1, 400), oh = uniform(1, 400);
    if (i % 7 == 0) ow = w;
    if (i % 11 == 0) oh = h;
    if (i % 13 == 0) ow = std::max(1, w / 100);
    std::vector<uint8_t> in(static_cast<size_t>(w) * h);
    for (uint8_t& v : in) v = static_cast<uint8_t>(uniform(0, 255));
    if (i % 2 == 0) {  // smooth: the sums near every rounding boundary
      for (int y = 0; y < h; ++y) {
        for (int x = 0; x < w; ++x) in[y * w + x] = (x * 3 + y * 5) % 256;
      }
    }
    std::string damage;
    const std::vector<uint8_t> got =
        Resize(in, w, h, ow, oh, i % 3 == 0 ? 0 : 13, &damage);
    const std::string what = absl::StrCat(w, "x", h, " -> ", ow, "x", oh);
    ASSERT_EQ(got, PillowLoops(in, w, h, ow, oh)) << what;
    ASSERT_TRUE(damage.empty()) << what << ": " << damage;
  }
}

TEST_P(PilResampleTest, AWindowIsThatPartOfTheWholeResize) {
  std::mt19937 rng(5);
  auto uniform = [&rng](int lo, int hi) {
    return std::uniform_int_distribution<int>(lo, hi)(rng);
  };
  for (int i = 0; i < 100; ++i) {
    const int w = uniform(1, 600), h = uniform(1, 500);
    const int ow = i % 5 == 0 ? w : uniform(1, 400);
    const int oh = i % 7 == 0 ? h : uniform(1, 400);
    const int left = uniform(0, ow - 1), top = uniform(0, oh - 1);
    const int ww = uniform(1, ow - left), wh = uniform(1, oh - top);
    std::vector<uint8_t> in(static_cast<size_t>(w) * h);
    for (uint8_t& v : in) v = static_cast<uint8_t>(uniform(0, 255));
    std::string damage;
    const std::vector<uint8_t> whole = Resize(in, w, h, ow, oh, 0, &damage);
    const size_t stride = ww + 3;
    std::vector<uint8_t> window(stride * wh, 0xA5);
    PilResizePlaneWindow(in.data(), w, w, h, window.data(), stride, ow, oh,
                         left, top, ww, wh);
    const std::string what =
        absl::StrCat(w, "x", h, " -> ", ow, "x", oh, " window ", left, ",", top,
                     " ", ww, "x", wh);
    for (int y = 0; y < wh; ++y) {
      for (int x = 0; x < ww; ++x) {
        ASSERT_EQ(window[y * stride + x], whole[(top + y) * ow + left + x])
            << what << " at " << x << "," << y;
      }
      for (size_t x = ww; x < stride; ++x) {
        ASSERT_EQ(window[y * stride + x], 0xA5) << what << ": padding written";
      }
    }
  }
}

TEST_P(PilResampleTest, InterleavedChannelsAreEachResizedAsAPlaneOrMirrored) {
  std::mt19937 rng(7);
  auto uniform = [&rng](int lo, int hi) {
    return std::uniform_int_distribution<int>(lo, hi)(rng);
  };
  for (int i = 0; i < 120; ++i) {
    const int channels = 1 + i % 4;
    const int w = uniform(1, 500), h = uniform(1, 400);
    const int ow = i % 5 == 0 ? w : uniform(1, 300);
    const int oh = i % 7 == 0 ? h : uniform(1, 300);
    const bool whole = i % 3 == 0;
    const int left = whole ? 0 : uniform(0, ow - 1);
    const int top = whole ? 0 : uniform(0, oh - 1);
    const int ww = whole ? ow : uniform(1, ow - left);
    const int wh = whole ? oh : uniform(1, oh - top);
    // Interleaved rows with 5 bytes of padding, and each channel's plane.
    const size_t in_stride = static_cast<size_t>(w) * channels + 5;
    std::vector<uint8_t> in(in_stride * h, 0x5A);
    std::vector<std::vector<uint8_t>> planes(
        channels, std::vector<uint8_t>(static_cast<size_t>(w) * h));
    for (int y = 0; y < h; ++y) {
      for (int x = 0; x < w; ++x) {
        for (int c = 0; c < channels; ++c) {
          const uint8_t v = static_cast<uint8_t>(
              i % 2 == 0 ? uniform(0, 255) : (x * (3 + c) + y * 5) % 256);
          in[y * in_stride + x * channels + c] = v;
          planes[c][y * w + x] = v;
        }
      }
    }
    const size_t out_stride = ww + 3;
    std::vector<std::vector<uint8_t>> got(
        channels, std::vector<uint8_t>(out_stride * wh, 0xA5));
    std::vector<uint8_t*> out;
    for (auto& g : got) out.push_back(g.data());
    const bool mirror = i % 4 >= 2;
    PilResizeWindow(in.data(), in_stride, channels, w, h, out.data(),
                    out_stride, ow, oh, left, top, ww, wh, mirror);
    const std::string what = absl::StrCat(
        channels, " channels ", w, "x", h, " -> ", ow, "x", oh, " window ",
        left, ",", top, " ", ww, "x", wh, mirror ? " mirrored" : "");
    for (int c = 0; c < channels; ++c) {
      std::vector<uint8_t> want(out_stride * wh, 0xA5);
      PilResizePlaneWindow(planes[c].data(), w, w, h, want.data(), out_stride,
                           ow, oh, left, top, ww, wh);
      if (mirror) {
        for (int y = 0; y < wh; ++y) {
          std::reverse(want.begin() + y * out_stride,
                       want.begin() + y * out_stride + ww);
        }
      }
      ASSERT_EQ(got[c], want) << what << ", channel " << c;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(VectorisedAndScalar, PilResampleTest,
                         ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "Scalar" : "Vectorised";
                         });

}  // namespace
}  // namespace sluice::dataserver
