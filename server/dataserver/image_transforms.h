// Image transforms on the data server, with torchvision's semantics:
// Resize, CenterCrop, RandomResizedCrop and random flips (DecodeSpec.
// transforms), then the output layout (HWC or CHW) and an optional
// conversion to floats (ToTensor + Normalize).
//
// A spec is validated once per request (ImageTransforms::FromSpec). For each
// sample, Plan() turns it into concrete geometry for the image's size and
// the sample's SampleRandom: a list of crops (in the image's current
// coordinates, possibly past its edges: zero padding) and resizes, plus the
// flips, which commute with both and are applied when the output is
// written. Decoders may absorb leading steps (a JPEG decodes only the crop
// window, DCT-scaled); Apply() runs the rest.
#ifndef SLUICE_SERVER_DATASERVER_IMAGE_TRANSFORMS_H_
#define SLUICE_SERVER_DATASERVER_IMAGE_TRANSFORMS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/dataserver/augment_random.h"
#include "server/dataserver/decoded_field.h"
#include "server/dataserver/image_types.h"
#include "sluice/v1/dataserver.pb.h"

namespace sluice::dataserver {

class ImageTransforms {
 public:
  // INVALID_ARGUMENT naming the field
  // ("decode.transforms[1].random_resized_crop .scale_min ...") for a malformed
  // spec.
  static absl::StatusOr<ImageTransforms> FromSpec(const v1::DecodeSpec& spec);

  // True when images come out exactly as decoded.
  bool identity() const;
  bool random() const { return random_; }
  // DecodeSpec.exact_pixels: JPEGs are never decoded DCT-scaled.
  bool exact_pixels() const { return exact_pixels_; }

  // The geometry for an image of width x height.
  Geometry Plan(int width, int height, const SampleRandom& random) const;
  // `geometry` (planned for a width x height image) for another field of
  // the same sample of other_width x other_height: crops before the first
  // resize are scaled to the other image's size, so both fields cover the
  // same part of the scene.
  static Geometry ScaleTo(const Geometry& geometry, int width, int height,
                          int other_width, int other_height);

  Interpolation InterpolationFor(absl::string_view field) const;

  // Runs `steps` from `first` on; then flips, layout and float conversion.
  // Adds the time per kind of step to `*times` when non-null.
  absl::StatusOr<DecodedField> Finish(ImageBuffer image,
                                      const Geometry& geometry, size_t first,
                                      Interpolation interpolation,
                                      TransformTimes* times = nullptr) const;

 private:
  // The output of one plane per channel (8-bit, CHW): flips, then floats.
  absl::StatusOr<DecodedField> OutputPlanes(
      const std::vector<ImageBuffer>& planes, bool flip_horizontal,
      bool flip_vertical) const;
  // `bytes` (8-bit samples in the output layout, `plane` pixels per
  // channel) as the float32 or float16 values to_float asks for, in `out`.
  void WriteFloats(const uint8_t* bytes, int c, size_t plane,
                   uint8_t* out) const;

  struct Op {
    enum class Kind {
      kResize,
      kCenterCrop,
      kRandomResizedCrop,
      kHorizontalFlip,
      kVerticalFlip
    };
    Kind kind;
    int shorter_side = 0;
    int height = 0;
    int width = 0;
    double scale_min = 0, scale_max = 0, ratio_min = 0, ratio_max = 0;
    double p = 0;
  };
  std::vector<Op> ops_;
  bool chw_ = false;
  bool to_float_ = false;
  bool half_ = false;
  std::vector<float> mean_;
  std::vector<float> std_;
  absl::flat_hash_set<std::string> nearest_;
  bool random_ = false;
  bool exact_pixels_ = false;
};

// Size of an image whose shorter side is resized to `shorter`.
void ResizedSize(int width, int height, int shorter, int* out_width,
                 int* out_height);

// Resizes `image` (antialiased bilinear, or nearest) to width x height.
// Bilinear, 8-bit: Pillow's resize, every byte (pil_resample.h). Bilinear,
// 16-bit: libswscale, with the pixels whose filter an edge cuts off made
// PIL's unless `exact_edges` is false (the caller crops them away).
absl::StatusOr<ImageBuffer> ResizeImage(const ImageBuffer& image, int width,
                                        int height, Interpolation interpolation,
                                        bool exact_edges = true);
// The window (left, top, width, height) of `image`, zero-padded past its
// edges; a view when the window lies inside.
ImageBuffer CropImage(const ImageBuffer& image, int left, int top, int width,
                      int height);

}  // namespace sluice::dataserver

#endif  // SLUICE_SERVER_DATASERVER_IMAGE_TRANSFORMS_H_
