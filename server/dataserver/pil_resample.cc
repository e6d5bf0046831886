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

// Rows 0..15 of a 16x16 byte block, r[0..15], become columns 0..15 of
// `out`.
inline void Transpose16x16Rows(const __m128i* r, uint8_t* out,
                               size_t out_stride) {
  __m128i a[16], b[16];
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

// Rows 0..15 of `in` (16 bytes each) become columns 0..15 of `out`.
inline void Transpose16x16(const uint8_t* in, size_t in_stride, uint8_t* out,
                           size_t out_stride) {
  __m128i r[16];
  for (int i = 0; i < 16; ++i) {
    r[i] =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i * in_stride));
  }
  Transpose16x16Rows(r, out, out_stride);
}

// Columns 0..31 of rows 0..15 of a byte block, r[0..15] (a row's columns
// 0..15 in its low 128-bit lane, 16..31 in its high one), become rows
// 0..31 of `out` (16 bytes each): the SSE2 network on both lanes at once.
__attribute__((target("avx2"))) inline void Transpose16x32Rows(
    const __m256i* r, uint8_t* out, size_t out_stride) {
  __m256i a[16], b[16];
  for (int i = 0; i < 8; ++i) {
    a[2 * i] = _mm256_unpacklo_epi8(r[2 * i], r[2 * i + 1]);
    a[2 * i + 1] = _mm256_unpackhi_epi8(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {
    b[4 * i + 0] = _mm256_unpacklo_epi16(a[4 * i + 0], a[4 * i + 2]);
    b[4 * i + 1] = _mm256_unpackhi_epi16(a[4 * i + 0], a[4 * i + 2]);
    b[4 * i + 2] = _mm256_unpacklo_epi16(a[4 * i + 1], a[4 * i + 3]);
    b[4 * i + 3] = _mm256_unpackhi_epi16(a[4 * i + 1], a[4 * i + 3]);
  }
  for (int i = 0; i < 2; ++i) {
    for (int q = 0; q < 4; ++q) {
      a[8 * i + 2 * q] = _mm256_unpacklo_epi32(b[8 * i + q], b[8 * i + 4 + q]);
      a[8 * i + 2 * q + 1] =
          _mm256_unpackhi_epi32(b[8 * i + q], b[8 * i + 4 + q]);
    }
  }
  for (int c = 0; c < 8; ++c) {
    const __m256i lo = _mm256_unpacklo_epi64(a[c], a[8 + c]);
    const __m256i hi = _mm256_unpackhi_epi64(a[c], a[8 + c]);
    auto row = [out, out_stride](int k) {
      return reinterpret_cast<__m128i*>(out + k * out_stride);
    };
    _mm_storeu_si128(row(2 * c), _mm256_castsi256_si128(lo));
    _mm_storeu_si128(row(2 * c + 1), _mm256_castsi256_si128(hi));
    _mm_storeu_si128(row(16 + 2 * c), _mm256_extracti128_si256(lo, 1));
    _mm_storeu_si128(row(17 + 2 * c), _mm256_extracti128_si256(hi, 1));
  }
}

// Columns 0..31 of rows 0..15 of `in` become rows 0..31 of `out`.
__attribute__((target("avx2"))) void Transpose16x32(const uint8_t* in,
                                                    size_t in_stride,
                                                    uint8_t* out,
                                                    size_t out_stride) {
  __m256i r[16];
  for (int i = 0; i < 16; ++i) {
    r[i] = _mm256_loadu_si256(
        reinterpret_cast<const __m256i*>(in + i * in_stride));
  }
  Transpose16x32Rows(r, out, out_stride);
}

// vpshufb masks gathering channel c of 16 pixels of C interleaved bytes
// (held in C vectors of 16 bytes, pixel p's channel c at byte C * p + c)
// from vector v: the channel's byte i is byte C * i + c - 16 * v of vector
// v, or in another vector (0x80 gives zero). Both lanes alike.
template <int C>
struct ChannelMasks {
  alignas(32) uint8_t mask[C][C][32];
  constexpr ChannelMasks() : mask() {
    for (int c = 0; c < C; ++c) {
      for (int v = 0; v < C; ++v) {
        for (int i = 0; i < 32; ++i) {
          const int at = C * (i % 16) + c - 16 * v;
          mask[c][v][i] = at >= 0 && at < 16 ? static_cast<uint8_t>(at) : 0x80;
        }
      }
    }
  }
};

// Pixels 0..31 of rows 0..15 of `in` (C interleaved bytes a pixel)
// become, for each channel c, rows 0..31 of out[c]: the split into planes
// and the transpose in one pass. Each row's pixels 0..15 go to the low
// lanes, 16..31 to the high ones.
template <int C>
__attribute__((target("avx2"))) void SplitTranspose16x32(const uint8_t* in,
                                                         size_t in_stride,
                                                         uint8_t* const* out,
                                                         size_t out_stride) {
  static constexpr ChannelMasks<C> kMasks;
  __m256i rows[C][16];
  for (int i = 0; i < 16; ++i) {
    const uint8_t* row = in + i * in_stride;
    __m256i v[C];
    for (int k = 0; k < C; ++k) {
      v[k] = _mm256_inserti128_si256(
          _mm256_castsi128_si256(
              _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 16 * k))),
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 16 * (C + k))),
          1);
    }
    for (int c = 0; c < C; ++c) {
      __m256i x = _mm256_shuffle_epi8(
          v[0], _mm256_load_si256(
                    reinterpret_cast<const __m256i*>(kMasks.mask[c][0])));
      for (int k = 1; k < C; ++k) {
        x = _mm256_or_si256(
            x, _mm256_shuffle_epi8(
                   v[k], _mm256_load_si256(reinterpret_cast<const __m256i*>(
                             kMasks.mask[c][k]))));
      }
      rows[c][i] = x;
    }
  }
  for (int c = 0; c < C; ++c) Transpose16x32Rows(rows[c], out[c], out_stride);
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

// Calls block(x, y) for the blocks of `width` columns and 16 rows that
// cover columns x rows (both at least that), the last block of each axis
// overlapping the one before when the size is not a multiple.
template <typename Block>
void ForEachBlock(int columns, int rows, int width, Block block) {
  for (int y = 0;; y += 16) {
    if (y > rows - 16) y = rows - 16;
    for (int x = 0;; x += width) {
      if (x > columns - width) x = columns - width;
      block(x, y);
      if (x == columns - width) break;
    }
    if (y == rows - 16) break;
  }
}

// `out` (columns x rows, out_stride apart) = `in` (rows x columns,
// in_stride apart) transposed: AVX2 blocks of 32 columns and 16 rows, or
// SSE2 16x16 blocks (no AVX2, or under 32 columns); a side under 16 goes
// byte by byte.
void Transpose(const uint8_t* in, size_t in_stride, int columns, int rows,
               uint8_t* out, size_t out_stride) {
#if SLUICE_PIL_RESAMPLE_X86
  if (!scalar_only && rows >= 16 && columns >= 16) {
    if (columns >= 32 && CpuHasAvx2()) {
      ForEachBlock(columns, rows, 32, [&](int x, int y) {
        Transpose16x32(in + y * in_stride + x, in_stride,
                       out + x * out_stride + y, out_stride);
      });
    } else {
      ForEachBlock(columns, rows, 16, [&](int x, int y) {
        Transpose16x16(in + y * in_stride + x, in_stride,
                       out + x * out_stride + y, out_stride);
      });
    }
    return;
  }
#endif
  for (int y = 0; y < rows; ++y) {
    const uint8_t* row = in + y * in_stride;
    for (int x = 0; x < columns; ++x) out[x * out_stride + y] = row[x];
  }
}

// Each channel of `in` (rows of `columns` pixels of `channels` interleaved
// bytes, in_stride apart) transposed into out[c] (columns x rows,
// out_stride apart): the planes split and transposed in one pass, in AVX2
// blocks of 32 pixels and 16 rows as Transpose's; byte by byte without
// AVX2 or under 32 x 16 pixels.
void TransposeChannels(const uint8_t* in, size_t in_stride, int channels,
                       int columns, int rows, uint8_t* const* out,
                       size_t out_stride) {
  if (channels == 1) {
    Transpose(in, in_stride, columns, rows, out[0], out_stride);
    return;
  }
#if SLUICE_PIL_RESAMPLE_X86
  if (UseAvx2() && rows >= 16 && columns >= 32 && channels <= 4) {
    ForEachBlock(columns, rows, 32, [&](int x, int y) {
      uint8_t* block[4];
      for (int c = 0; c < channels; ++c) {
        block[c] = out[c] + x * out_stride + y;
      }
      const uint8_t* from = in + y * in_stride + x * channels;
      switch (channels) {
        case 2:
          SplitTranspose16x32<2>(from, in_stride, block, out_stride);
          break;
        case 3:
          SplitTranspose16x32<3>(from, in_stride, block, out_stride);
          break;
        default:
          SplitTranspose16x32<4>(from, in_stride, block, out_stride);
          break;
      }
    });
    return;
  }
#endif
  for (int y = 0; y < rows; ++y) {
    const uint8_t* row = in + y * in_stride;
    for (int x = 0; x < columns; ++x) {
      for (int c = 0; c < channels; ++c) {
        out[c][x * out_stride + y] = row[x * channels + c];
      }
    }
  }
}

// Row j - j0 of `out` (n bytes) = Clip8(half + sum over t of weight[j][t]
// * source row (first[j] - row_offset + t)), for j in [j0, j1); with
// `reverse`, that row is written at j1 - 1 - j.
void WeightedRows(const uint8_t* in, size_t in_stride, int row_offset, int n,
                  const PilTaps& taps, int j0, int j1, uint8_t* out,
                  size_t out_stride, bool reverse = false) {
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
    uint8_t* o = out + (reverse ? j1 - 1 - j : j - j0) * out_stride;
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
  PilResizeWindow(in, in_stride, 1, width, height, &out, out_stride, out_width,
                  out_height, 0, 0, out_width, out_height);
}

void PilResizePlaneWindow(const uint8_t* in, size_t in_stride, int width,
                          int height, uint8_t* out, size_t out_stride,
                          int out_width, int out_height, int left, int top,
                          int window_width, int window_height) {
  PilResizeWindow(in, in_stride, 1, width, height, &out, out_stride, out_width,
                  out_height, left, top, window_width, window_height);
}

void PilResizeWindow(const uint8_t* in, size_t in_stride, int channels,
                     int width, int height, uint8_t* const* out,
                     size_t out_stride, int out_width, int out_height, int left,
                     int top, int window_width, int window_height,
                     bool mirror) {
  thread_local PilTaps x_cache, y_cache;
  thread_local std::vector<uint8_t> transposed, resized, rows;
  thread_local std::vector<uint8_t*> planes;
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
  if (horizontal) {
    const PilTaps& xs = CachedTaps(width, out_width, &x_cache);
    // The columns the window's horizontal pass reads, rows [y0, y1), each
    // channel transposed (x1 - x0 rows of n); per channel, the horizontal
    // pass as weighted rows of that (window_width rows of n), transposed
    // back, then the vertical pass.
    const int x0 = xs.first[left];
    const int x1 = xs.first[right - 1] + xs.count[right - 1];
    const size_t plane = static_cast<size_t>(x1 - x0) * n;
    transposed.resize(plane * channels);
    planes.resize(channels);
    for (int c = 0; c < channels; ++c)
      planes[c] = transposed.data() + c * plane;
    TransposeChannels(in + static_cast<size_t>(y0) * in_stride +
                          static_cast<size_t>(x0) * channels,
                      in_stride, channels, x1 - x0, n, planes.data(), n);
    resized.resize(static_cast<size_t>(window_width) * n);
    rows.resize(static_cast<size_t>(n) * window_width);
    for (int c = 0; c < channels; ++c) {
      WeightedRows(planes[c], n, x0, n, xs, left, right, resized.data(), n,
                   mirror);
      Transpose(resized.data(), n, n, window_width, rows.data(), window_width);
      if (vertical) {
        WeightedRows(rows.data(), window_width, y0, window_width, *ys, top,
                     bottom, out[c], out_stride);
        continue;
      }
      for (int y = 0; y < window_height; ++y) {
        std::memcpy(out[c] + y * out_stride, rows.data() + y * window_width,
                    window_width);
      }
    }
    return;
  }
  // No horizontal pass: the vertical one on the window's columns, all
  // channels at once (the pass treats the bytes of a row alike), then the
  // channels split.
  const size_t row_bytes = static_cast<size_t>(window_width) * channels;
  const uint8_t* src = in + static_cast<size_t>(y0) * in_stride +
                       static_cast<size_t>(left) * channels;
  size_t src_stride = in_stride;
  if (vertical && channels == 1 && !mirror) {  // nothing to split
    WeightedRows(src, in_stride, y0, window_width, *ys, top, bottom, out[0],
                 out_stride);
    return;
  }
  if (vertical) {
    rows.resize(row_bytes * window_height);
    WeightedRows(src, in_stride, y0, static_cast<int>(row_bytes), *ys, top,
                 bottom, rows.data(), row_bytes);
    src = rows.data();
    src_stride = row_bytes;
  }
  for (int y = 0; y < window_height; ++y) {
    const uint8_t* row = src + y * src_stride;
    if (channels == 1 && !mirror) {
      std::memcpy(out[0] + y * out_stride, row, window_width);
      continue;
    }
    for (int x = 0; x < window_width; ++x) {
      const int to = mirror ? window_width - 1 - x : x;
      for (int c = 0; c < channels; ++c) {
        out[c][y * out_stride + to] = row[x * channels + c];
      }
    }
  }
}

void SetPilResampleScalarForTesting(bool scalar) { scalar_only = scalar; }

}  // namespace sluice::dataserver
