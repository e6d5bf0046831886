// Pillow's bilinear resize of 8-bit images, bit for bit.
//
// torchvision's Resize and RandomResizedCrop on PIL images call Pillow's
// ImagingResample: per axis, the triangle filter widened by the reduction
// factor, its taps inside the image renormalised to sum to 1 and rounded to
// 22-bit fixed point; a horizontal pass over the source rows the vertical
// pass needs, each value rounded and clipped to 8 bits, then a vertical
// pass. PilResizePlane computes exactly that, for one plane of 8-bit
// samples (an RGB image's channels are resized the same way, one by one).
//
// How: both passes run as "vertical" passes, each output row a weighted
// sum of whole source rows (vectorised across the row with AVX2 where the
// CPU has it, else scalar), with the horizontal pass on the transposed
// image: AVX2 transposes of 32 x 16 byte blocks (two SSE2 16 x 16 networks
// side by side, one per 128-bit lane), which for interleaved channels
// split them into planes in the same pass (vpshufb), so an RGB image is
// never split separately. The arithmetic is Pillow's integer arithmetic
// in any order, so every path gives the same bytes.
#ifndef SLUICE_SERVER_DATASERVER_PIL_RESAMPLE_H_
#define SLUICE_SERVER_DATASERVER_PIL_RESAMPLE_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace sluice::dataserver {

// Pillow's taps along one axis of `in` samples resized to `out`: for each
// output index the first source sample, how many follow, and their 22-bit
// fixed-point coefficients (`stride` per index, zero past `count`).
struct PilTaps {
  int in = 0;
  int out = 0;
  int stride = 0;
  std::vector<int> first;
  std::vector<int> count;
  std::vector<int32_t> coefficients;
};

// Fills `taps` for `in` -> `out` (both >= 1), reusing its capacity.
void ComputePilTaps(int in, int out, PilTaps* taps);

// Pillow's bilinear filter (Resample.c's precompute_coeffs) for output
// index `i` of `in` -> `out` samples: the triangle widened by the reduction,
// its taps inside the image renormalised to sum to 1. Sets the first source
// sample and how many follow, and writes their weights to
// weights[0, *count); `weights` holds PilFilterSize(in, out).
int PilFilterSize(int in, int out);
void PilFilterWeights(int in, int out, int i, int* first, int* count,
                      double* weights);

// Resizes the width x height plane at `in` (rows in_stride bytes apart) to
// out_width x out_height at `out` (rows out_stride bytes apart), as Pillow's
// Image.resize(..., BILINEAR) does. Sizes >= 1. Per-thread scratch: once
// warm, nothing is allocated.
void PilResizePlane(const uint8_t* in, size_t in_stride, int width, int height,
                    uint8_t* out, size_t out_stride, int out_width,
                    int out_height);

// Only the window [left, left + window_width) x [top, top + window_height)
// of PilResizePlane's out_width x out_height output, written at `out`: the
// same bytes, computed from the source pixels the window needs (a Resize
// followed by a CenterCrop computes only the crop). The window lies inside
// the output.
void PilResizePlaneWindow(const uint8_t* in, size_t in_stride, int width,
                          int height, uint8_t* out, size_t out_stride,
                          int out_width, int out_height, int left, int top,
                          int window_width, int window_height);

// PilResizePlaneWindow for each channel of an image of `channels`
// interleaved 8-bit samples a pixel (rows in_stride bytes apart), channel c
// written at out[c] (rows out_stride bytes apart): the same bytes, with no
// separate split into planes (the horizontal pass's transpose splits them).
// With `mirror`, the window is written flipped left to right (at no cost:
// the horizontal pass writes its columns in reverse order).
void PilResizeWindow(const uint8_t* in, size_t in_stride, int channels,
                     int width, int height, uint8_t* const* out,
                     size_t out_stride, int out_width, int out_height, int left,
                     int top, int window_width, int window_height,
                     bool mirror = false);

// Tests: the portable scalar passes only, on this thread.
void SetPilResampleScalarForTesting(bool scalar);

}  // namespace sluice::dataserver

#endif  // SLUICE_SERVER_DATASERVER_PIL_RESAMPLE_H_
