#include "server/dataserver/pil_resample.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#define SLUICE_PIL_RESAMPLE_X86 1
#endif

namespace sluice::dataserver {
namespace {

// Pillow's PRECISION_BITS for 8-bit images (Resample.c): 32 - 8 - 2.
constexpr int kPrecisionBits = 22;
constexpr int32_t kHalf = int32_t{1} << (kPrecisionBits - 1);

// Pillow's clip8: the sum shifted down to 8 bits, saturated.
inline uint8_t Clip8(int32_t sum) {
  if (sum >= (int32_t{255} << kPrecisionBits)) return 255;
  if (sum <= 0) return 0;
  return static_cast<uint8_t>(sum >> kPrecisionBits);
}

thread_local bool scalar_only = false;

#if SLUICE_PIL_RESAMPLE_X86
bool CpuHasAvx2() {
  static const bool has = [] {
    __builtin_cpu_init();  // may run before libgcc's own initialisation
    return __builtin_cpu_supports("avx2") != 0;
  }();
  return has;
}

// Rows 0..15 of `in` (16 bytes each) become columns 0..15 of `out`.
inline void Transpose16x16(const uint8_t* in, size_t in_stride, uint8_t* out,
                           size_t out_stride) {
  __m128i r[16], a[16], b[16];
  for (int i = 0; i < 16; ++i) {
    r[i] =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i * in_stride));
  }
  // a[2i], a[2i+1]: rows 2i and 2i+1 interleaved, columns 0-7 and 8-15.
  for (int i = 0; i < 8; ++i) {
    a[2 * i] = _mm_unpacklo_epi8(r[2 * i], r[2 * i + 1]);
    a[2 * i + 1] = _mm_unpackhi_epi8(r[2 * i], r[2 * i + 1]);
  }
  // b[4i + q]: rows 4i..4i+3, columns 4q..4q+3.
  for (int i = 0; i < 4; ++i) {
    b[4 * i + 0] = _mm_unpacklo_epi16(a[4 * i + 0], a[4 * i + 2]);
    b[4 * i + 1] = _mm_unpackhi_epi16(a[4 * i + 0], a[4 * i + 2]);
    b[4 * i + 2] = _mm_unpacklo_epi16(a[4 * i + 1], a[4 * i + 3]);
    b[4 * i + 3] = _mm_unpackhi_epi16(a[4 * i + 1], a[4 * i + 3]);
  }
  // a[8i + 2q + h]: rows 8i..8i+7, columns 4q + 2h and 4q + 2h + 1.
  for (int i = 0; i < 2; ++i) {
    for (int q = 0; q < 4; ++q) {
      a[8 * i + 2 * q] = _mm_unpacklo_epi32(b[8 * i + q], b[8 * i + 4 + q]);
      a[8 * i + 2 * q + 1] = _mm_unpackhi_epi32(b[8 * i + q], b[8 * i + 4 + q]);
    }
  }
  for (int c = 0; c < 8; ++c) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 2 * c * out_stride),
                     _mm_unpacklo_epi64(a[c], a[8 + c]));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + (2 * c + 1) * out_stride),
                     _mm_unpackhi_epi64(a[c], a[8 + c]));
  }
}

// 16 output bytes at `x` of one row: AVX2.
__attribute__((target("avx2"))) inline void Weighted16Avx2(
    const uint8_t* const* rows, const int32_t* weights, int taps, int x,
    uint8_t* out) {
  __m256i lo = _mm256_set1_epi32(kHalf), hi = lo;
  for (int t = 0; t < taps; ++t) {
    const __m128i px =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[t] + x));
    const __m256i w = _mm256_set1_epi32(weights[t]);
    lo = _mm256_add_epi32(lo, _mm256_mullo_epi32(_mm256_cvtepu8_epi32(px), w));
    hi = _mm256_add_epi32(
        hi, _mm256_mullo_epi32(_mm256_cvtepu8_epi32(_mm_srli_si128(px, 8)), w));
  }
  // Clip8: shift (a negative sum stays negative), then saturating packs
  // (negative -> 0, above 255 -> 255).
  lo = _mm256_srai_epi32(lo, kPrecisionBits);
  hi = _mm256_srai_epi32(hi, kPrecisionBits);
  const __m256i words =
      _mm256_permute4x64_epi64(_mm256_packus_epi32(lo, hi), 0xd8);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out + x),
                   _mm_packus_epi16(_mm256_castsi256_si128(words),
                                    _mm256_extracti128_si256(words, 1)));
}

// Output bytes [0, n) of one row, 16 at a time, the last 16 overlapping
// the ones before when n is not a multiple of 16 (the same bytes written
// twice); n < 16 is left to the caller. Returns how many it wrote.
__attribute__((target("avx2"))) int WeightedRowsAvx2(const uint8_t* const* rows,
                                                     const int32_t* weights,
                                                     int taps, int n,
                                                     uint8_t* out) {
  if (n < 16) return 0;
  int x = 0;
  for (; x + 16 <= n; x += 16) Weighted16Avx2(rows, weights, taps, x, out);
  if (x < n) Weighted16Avx2(rows, weights, taps, n - 16, out);
  return n;
}
#endif  // SLUICE_PIL_RESAMPLE_X86

bool UseAvx2() {
#if SLUICE_PIL_RESAMPLE_X86
  return !scalar_only && CpuHasAvx2();
#else
  return false;
#endif
}

// `out` (columns x rows, out_stride apart) = `in` (rows x columns,
// in_stride apart) transposed. SSE2 16x16 blocks, the last block of each
// axis overlapping the one before when the size is not a multiple of 16;
// a side under 16 goes byte by byte.
void Transpose(const uint8_t* in, size_t in_stride, int columns, int rows,
               uint8_t* out, size_t out_stride) {
#if SLUICE_PIL_RESAMPLE_X86
  if (!scalar_only && rows >= 16 && columns >= 16) {
    for (int y = 0;; y += 16) {
      if (y > rows - 16) y = rows - 16;
      for (int x = 0;; x += 16) {
        if (x > columns - 16) x = columns - 16;
        Transpose16x16(in + y * in_stride + x, in_stride,
                       out + x * out_stride + y, out_stride);
        if (x == columns - 16) break;
      }
      if (y == rows - 16) break;
    }
    return;
  }
#endif
  for (int y = 0; y < rows; ++y) {
    const uint8_t* row = in + y * in_stride;
    for (int x = 0; x < columns; ++x) out[x * out_stride + y] = row[x];
  }
}

// Row j - j0 of `out` (n bytes) = Clip8(half + sum over t of weight[j][t]
// * source row (first[j] - row_offset + t)), for j in [j0, j1).
void WeightedRows(const uint8_t* in, size_t in_stride, int row_offset, int n,
                  const PilTaps& taps, int j0, int j1, uint8_t* out,
                  size_t out_stride) {
  thread_local std::vector<const uint8_t*> rows;
  thread_local std::vector<int32_t> weights;
  rows.resize(taps.stride);
  weights.resize(taps.stride);
  const bool avx2 = UseAvx2();
  for (int j = j0; j < j1; ++j) {
    const int32_t* k = &taps.coefficients[static_cast<size_t>(j) * taps.stride];
    int used = 0;
    for (int t = 0; t < taps.count[j]; ++t) {
      if (k[t] == 0) continue;  // adds nothing to Pillow's sum either
      rows[used] = in + (taps.first[j] - row_offset + t) * in_stride;
      weights[used++] = k[t];
    }
    uint8_t* o = out + (j - j0) * out_stride;
    int x = 0;
#if SLUICE_PIL_RESAMPLE_X86
    if (avx2) x = WeightedRowsAvx2(rows.data(), weights.data(), used, n, o);
#else
    (void)avx2;
#endif
    for (; x < n; ++x) {
      int32_t sum = kHalf;
      for (int t = 0; t < used; ++t) sum += rows[t][x] * weights[t];
      o[x] = Clip8(sum);
    }
  }
}

// The taps for in -> out, recomputed only when the sizes change (the eval
// transform's images share one size).
const PilTaps& CachedTaps(int in, int out, PilTaps* cache) {
  if (cache->in != in || cache->out != out) ComputePilTaps(in, out, cache);
  return *cache;
}

}  // namespace

int PilFilterSize(int in, int out) {
  const double support = std::max(static_cast<double>(in) / out, 1.0);
  return static_cast<int>(std::ceil(support)) * 2 + 1;
}

void PilFilterWeights(int in, int out, int i, int* first, int* count,
                      double* weights) {
  const double scale = static_cast<double>(in) / out;
  const double filterscale = std::max(scale, 1.0);
  const double support = filterscale;  // the triangle's support is 1
  const double center = (i + 0.5) * scale;
  const double ss = 1.0 / filterscale;
  int xmin = static_cast<int>(center - support + 0.5);
  if (xmin < 0) xmin = 0;
  int xmax = static_cast<int>(center + support + 0.5);
  if (xmax > in) xmax = in;
  xmax -= xmin;
  double ww = 0.0;
  for (int x = 0; x < xmax; ++x) {
    double d = (x + xmin - center + 0.5) * ss;
    if (d < 0.0) d = -d;
    weights[x] = d < 1.0 ? 1.0 - d : 0.0;
    ww += weights[x];
  }
  if (ww != 0.0) {
    for (int x = 0; x < xmax; ++x) weights[x] /= ww;
  }
  *first = xmin;
  *count = xmax;
}

void ComputePilTaps(int in, int out, PilTaps* taps) {
  // The filter's weights in fixed point, as Pillow's normalize_coeffs_8bpc.
  PilTaps& t = *taps;
  t.in = in;
  t.out = out;
  t.stride = PilFilterSize(in, out);
  t.first.resize(out);
  t.count.resize(out);
  t.coefficients.assign(static_cast<size_t>(out) * t.stride, 0);
  thread_local std::vector<double> w;
  w.resize(t.stride);
  for (int i = 0; i < out; ++i) {
    PilFilterWeights(in, out, i, &t.first[i], &t.count[i], w.data());
    int32_t* k = &t.coefficients[static_cast<size_t>(i) * t.stride];
    for (int x = 0; x < t.count[i]; ++x) {
      const double v = w[x];
      k[x] = v < 0 ? static_cast<int32_t>(-0.5 + v * (1 << kPrecisionBits))
                   : static_cast<int32_t>(0.5 + v * (1 << kPrecisionBits));
    }
  }
}

void PilResizePlane(const uint8_t* in, size_t in_stride, int width, int height,
                    uint8_t* out, size_t out_stride, int out_width,
                    int out_height) {
  PilResizePlaneWindow(in, in_stride, width, height, out, out_stride, out_width,
                       out_height, 0, 0, out_width, out_height);
}

void PilResizePlaneWindow(const uint8_t* in, size_t in_stride, int width,
                          int height, uint8_t* out, size_t out_stride,
                          int out_width, int out_height, int left, int top,
                          int window_width, int window_height) {
  thread_local PilTaps x_cache, y_cache;
  thread_local std::vector<uint8_t> transposed, resized, rows;
  const bool horizontal = out_width != width;
  const bool vertical = out_height != height;
  const int right = left + window_width, bottom = top + window_height;
  const PilTaps* ys =
      vertical ? &CachedTaps(height, out_height, &y_cache) : nullptr;
  // The source rows the window's vertical pass reads (Pillow's ybox, for
  // the window's rows).
  const int y0 = vertical ? ys->first[top] : top;
  const int y1 =
      vertical ? ys->first[bottom - 1] + ys->count[bottom - 1] : bottom;
  const int n = y1 - y0;
  const uint8_t* src = in + static_cast<size_t>(y0) * in_stride + left;
  size_t src_stride = in_stride;
  if (horizontal) {
    const PilTaps& xs = CachedTaps(width, out_width, &x_cache);
    // The columns the window's horizontal pass reads, rows [y0, y1),
    // transposed (x1 - x0 rows of n); the horizontal pass as weighted rows
    // of that (window_width rows of n), transposed back.
    const int x0 = xs.first[left];
    const int x1 = xs.first[right - 1] + xs.count[right - 1];
    transposed.resize(static_cast<size_t>(x1 - x0) * n);
    resized.resize(static_cast<size_t>(window_width) * n);
    rows.resize(static_cast<size_t>(n) * window_width);
    Transpose(in + static_cast<size_t>(y0) * in_stride + x0, in_stride, x1 - x0,
              n, transposed.data(), n);
    WeightedRows(transposed.data(), n, x0, n, xs, left, right, resized.data(),
                 n);
    Transpose(resized.data(), n, n, window_width, rows.data(), window_width);
    src = rows.data();
    src_stride = window_width;
  }
  if (vertical) {
    WeightedRows(src, src_stride, y0, window_width, *ys, top, bottom, out,
                 out_stride);
    return;
  }
  for (int y = 0; y < window_height; ++y) {
    std::memcpy(out + y * out_stride, src + y * src_stride, window_width);
  }
}

void SetPilResampleScalarForTesting(bool scalar) { scalar_only = scalar; }

}  // namespace sluice::dataserver
