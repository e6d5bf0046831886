// Plain types shared by the decoders and the image transforms.
#ifndef SLUICE_SERVER_DATASERVER_IMAGE_TYPES_H_
#define SLUICE_SERVER_DATASERVER_IMAGE_TYPES_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace sluice::dataserver {

// An image in memory: rows of width * channels samples of sample_bytes
// each (1 = uint8, 2 = little-endian uint16), `stride` bytes apart.
struct ImageBuffer {
  std::shared_ptr<uint8_t> owner;
  const uint8_t* data = nullptr;
  int width = 0;
  int height = 0;
  int channels = 0;
  int sample_bytes = 1;
  size_t stride = 0;
};

// A buffer of width x height x channels samples, rows packed.
ImageBuffer AllocateImage(int width, int height, int channels,
                          int sample_bytes);

enum class Interpolation { kBilinear, kNearest };

struct GeometryStep {
  enum class Kind { kCrop, kResize };
  Kind kind = Kind::kCrop;
  // kCrop: the window's top-left corner in the current image (negative or
  // past the edge: zero padding) and its size; kResize: the new size.
  int left = 0;
  int top = 0;
  int width = 0;
  int height = 0;
};

// What happens to one image: steps in order, then the flips (which commute
// with crops and resizes once crop windows are mirrored, so they are
// applied when the output is written).
struct Geometry {
  std::vector<GeometryStep> steps;
  bool flip_horizontal = false;
  bool flip_vertical = false;
};

// Seconds spent per kind of transform step, summed over calls (metrics).
struct TransformTimes {
  double resize = 0;
  double crop = 0;
  double output = 0;  // flips, layout, float conversion
  // Thread CPU seconds in the image decoder itself (libjpeg-turbo, libpng)
  // for the pixels this call decoded: 0 for a shared image another call
  // decoded.
  double decoder_cpu = 0;
};

}  // namespace sluice::dataserver

#endif  // SLUICE_SERVER_DATASERVER_IMAGE_TYPES_H_
