// Field decoders, chosen by the field's last extension as webdataset's
// default decoders are ("seg.png" decodes as png):
//
//   jpg, jpeg  -> uint8 [H, W, 3] RGB (TurboJPEG; scaled decode when resizing)
//   png        -> uint8 [H, W, C], C = 1 gray, 2 gray+alpha, 3 RGB, 4 RGBA
//                 (libpng's simplified API; 16-bit samples become 8-bit)
//   cls, index -> int64 (ASCII decimal, surrounding whitespace allowed)
//   json, txt  -> text, as is (must be valid UTF-8)
//   npy        -> tensor with the dtype and shape of its header (C order;
//                 Fortran order and big-endian data are converted)
//   anything else -> raw bytes
//
// Images then go through ImageTransforms (image_transforms.h): the
// geometry planned for them, layout and float conversion. A JPEG decodes
// only what the output needs: the first crop window (libjpeg-turbo's
// jpeg_crop_scanline / jpeg_skip_scanlines) at the smallest DCT scale that
// keeps it at least as large as the resize that follows. Decoders are pure
// functions and thread-safe.
#ifndef SLUICE_SERVER_DATASERVER_DECODERS_H_
#define SLUICE_SERVER_DATASERVER_DECODERS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/dataserver/decoded_field.h"
#include "server/dataserver/image_types.h"
#include "server/format/tar_shard_reader.h"
#include "sluice/v1/dataserver.pb.h"

namespace sluice::dataserver {

enum class Codec { kRaw, kJpeg, kPng, kInt, kText, kNpy };

// The codec for a field name ("jpg", "seg.png", "cls") by its last extension.
Codec CodecForField(absl::string_view field);
// "jpeg", "png", ... for metric labels.
const char* CodecName(Codec codec);

// PIL's DecompressionBombError threshold (2 x Image.MAX_IMAGE_PIXELS).
inline constexpr int64_t kDefaultMaxImagePixels = 178956970;

// A progressive JPEG may repeat valid scans without end, each one a pass
// over every block: 100 KB of 2,000 scans over a 4096x4096 image take
// seconds of CPU to decode, a megabyte minutes. One of more scans is a
// corrupt sample; the limit is TurboJPEG's TJFLAG_LIMITSCANS (encoders
// write about 10).
inline constexpr int kMaxJpegScans = 500;

class DecodedImageCache;
class ImageTransforms;

// Shared decoding (decoded_image_cache.h): a JPEG is decoded whole at the
// DCT scale its transforms need, through `cache` under `key`, and its
// window is cropped from that (the same pixels as a window decode).
struct SharedDecode {
  DecodedImageCache* cache = nullptr;
  std::string key;   // DecodedImageCache::ImageKey
  bool hit = false;  // set by the decoder: another call decoded the image
};

struct ImageOptions {
  // Shorthand for transforms [Resize(shorter side), CenterCrop(h, w)], used
  // when `transforms` is null. 0 = none.
  int resize_shorter_side = 0;
  int crop_height = 0;
  int crop_width = 0;
  // An image whose header claims more pixels is refused before any pixel
  // memory is allocated (a 60000x60000 header would ask for 10 GB).
  int64_t max_pixels = kDefaultMaxImagePixels;
  // With `geometry`: the transforms and the geometry planned for this image
  // (null = the shorthand above). Both outlive the call.
  const ImageTransforms* transforms = nullptr;
  const Geometry* geometry = nullptr;
  Interpolation interpolation = Interpolation::kBilinear;
  // Time per kind of transform step is added here when non-null.
  TransformTimes* times = nullptr;
  // Non-null: JPEGs decode through the shared cache (other codecs ignore
  // it).
  SharedDecode* shared = nullptr;
};

// An image's size from its header, without decoding pixels.
struct ImageSize {
  int width = 0;
  int height = 0;
};
absl::StatusOr<ImageSize> ReadImageSize(Codec codec, const Payload& data);

// Decodes one field. An error is the data's fault (INVALID_ARGUMENT /
// DATA_LOSS with the reason); the caller names shard and member.
absl::StatusOr<DecodedField> DecodeField(Codec codec, const Payload& data,
                                         const ImageOptions& image);

// Pieces exposed for tests.
absl::StatusOr<DecodedField> DecodeJpeg(const Payload& data,
                                        const ImageOptions& image);
absl::StatusOr<DecodedField> DecodePng(const Payload& data,
                                       const ImageOptions& image);
absl::StatusOr<DecodedField> DecodeNpy(const Payload& data);

}  // namespace sluice::dataserver

#endif  // SLUICE_SERVER_DATASERVER_DECODERS_H_
