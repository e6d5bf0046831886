#include "server/dataserver/decoders.h"

#include <jpeglib.h>
#include <png.h>
#include <turbojpeg.h>

#include <algorithm>
#include <cmath>
#include <csetjmp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "google/protobuf/stubs/common.h"
#include "server/common/status_macros.h"
#include "server/common/thread_cpu.h"
#include "server/dataserver/decoded_image_cache.h"
#include "server/dataserver/image_transforms.h"

namespace sluice::dataserver {
namespace {

std::shared_ptr<uint8_t> AllocateBytes(size_t n) {
  return std::shared_ptr<uint8_t>(new uint8_t[std::max<size_t>(n, 1)],
                                  std::default_delete<uint8_t[]>());
}

// decode(), a call into a decoder library, with its thread CPU time added
// to `times->decoder_cpu` when `times` is non-null.
template <typename Decode>
auto DecoderCall(TransformTimes* times, Decode decode) {
  if (times == nullptr) return decode();
  const double start = ThreadCpuSeconds();
  auto result = decode();
  times->decoder_cpu += ThreadCpuSeconds() - start;
  return result;
}

// The transforms and geometry for an image of width x height: the caller's,
// or those of the shorthand resize/crop options.
struct ResolvedTransforms {
  std::optional<ImageTransforms> own_transforms;
  Geometry own_geometry;
  const ImageTransforms* transforms = nullptr;
  const Geometry* geometry = nullptr;
};

absl::Status Resolve(const ImageOptions& options, int width, int height,
                     ResolvedTransforms* out) {
  if (options.transforms != nullptr && options.geometry != nullptr) {
    out->transforms = options.transforms;
    out->geometry = options.geometry;
    return absl::OkStatus();
  }
  v1::DecodeSpec spec;
  spec.set_resize_shorter_side(options.resize_shorter_side);
  spec.set_crop_height(options.crop_height);
  spec.set_crop_width(options.crop_width);
  ASSIGN_OR_RETURN(ImageTransforms transforms, ImageTransforms::FromSpec(spec));
  out->own_transforms.emplace(std::move(transforms));
  out->own_geometry =
      out->own_transforms->Plan(width, height, SampleRandom(0, 0, 0, 0));
  out->transforms = &*out->own_transforms;
  out->geometry = &out->own_geometry;
  return absl::OkStatus();
}

absl::StatusOr<DecodedField> Transform(const ImageBuffer& image,
                                       const ResolvedTransforms& r,
                                       size_t first,
                                       const ImageOptions& options) {
  return r.transforms->Finish(image, *r.geometry, first, options.interpolation,
                              options.times);
}

// One TurboJPEG decompressor per thread (handles are not thread-safe).
struct TurboJpegHandle {
  tjhandle handle = tjInitDecompress();
  ~TurboJpegHandle() {
    if (handle != nullptr) tjDestroy(handle);
  }
};

tjhandle ThreadJpegHandle() {
  thread_local TurboJpegHandle h;
  return h.handle;
}

absl::Status JpegError(tjhandle handle, absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("undecodable JPEG: ", what, ": ", tjGetErrorStr2(handle)));
}

// numpy descr -> (dtype, item size).
bool NpyDtype(absl::string_view type, v1::DType* dtype, int* size) {
  struct Entry {
    const char* name;
    v1::DType dtype;
    int size;
  };
  static const Entry kTypes[] = {
      {"u1", v1::DTYPE_UINT8, 1},   {"i1", v1::DTYPE_INT8, 1},
      {"b1", v1::DTYPE_BOOL, 1},    {"i2", v1::DTYPE_INT16, 2},
      {"u2", v1::DTYPE_UINT16, 2},  {"i4", v1::DTYPE_INT32, 4},
      {"u4", v1::DTYPE_UINT32, 4},  {"i8", v1::DTYPE_INT64, 8},
      {"u8", v1::DTYPE_UINT64, 8},  {"f2", v1::DTYPE_FLOAT16, 2},
      {"f4", v1::DTYPE_FLOAT32, 4}, {"f8", v1::DTYPE_FLOAT64, 8},
  };
  for (const Entry& e : kTypes) {
    if (type == e.name) {
      *dtype = e.dtype;
      *size = e.size;
      return true;
    }
  }
  return false;
}

// The value text after 'key': in a numpy header dict.
absl::StatusOr<absl::string_view> NpyHeaderValue(absl::string_view header,
                                                 absl::string_view key) {
  std::string quoted = absl::StrCat("'", key, "'");
  size_t at = header.find(quoted);
  if (at == absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("npy header has no ", quoted));
  }
  absl::string_view rest = header.substr(at + quoted.size());
  rest = absl::StripLeadingAsciiWhitespace(rest);
  if (rest.empty() || rest[0] != ':') {
    return absl::InvalidArgumentError(
        absl::StrCat("npy header: no ':' after ", quoted));
  }
  return absl::StripLeadingAsciiWhitespace(rest.substr(1));
}

}  // namespace

Codec CodecForField(absl::string_view field) {
  size_t dot = field.rfind('.');
  absl::string_view ext =
      dot == absl::string_view::npos ? field : field.substr(dot + 1);
  if (ext == "jpg" || ext == "jpeg") return Codec::kJpeg;
  if (ext == "png") return Codec::kPng;
  if (ext == "cls" || ext == "index") return Codec::kInt;
  if (ext == "json" || ext == "txt") return Codec::kText;
  if (ext == "npy") return Codec::kNpy;
  return Codec::kRaw;
}

const char* CodecName(Codec codec) {
  switch (codec) {
    case Codec::kJpeg:
      return "jpeg";
    case Codec::kPng:
      return "png";
    case Codec::kInt:
      return "int";
    case Codec::kText:
      return "text";
    case Codec::kNpy:
      return "npy";
    case Codec::kRaw:
      return "raw";
  }
  return "raw";
}

// Whether the JPEG has an Adobe APP14 segment before its scan: Photoshop
// (and libjpeg, and PIL) store CMYK inverted in such files.
bool HasAdobeMarker(absl::string_view jpeg) {
  size_t pos = 2;  // after SOI
  while (pos + 4 <= jpeg.size()) {
    if (static_cast<uint8_t>(jpeg[pos]) != 0xFF) return false;
    const uint8_t marker = static_cast<uint8_t>(jpeg[pos + 1]);
    if (marker == 0xFF) {  // fill byte
      ++pos;
      continue;
    }
    if (marker == 0xDA || marker == 0xD9)
      return false;  // scan or end: no more headers
    const size_t length =
        static_cast<size_t>(static_cast<uint8_t>(jpeg[pos + 2])) << 8 |
        static_cast<uint8_t>(jpeg[pos + 3]);
    if (length < 2 || pos + 2 + length > jpeg.size()) return false;
    if (marker == 0xEE && length >= 7 && jpeg.substr(pos + 4, 5) == "Adobe")
      return true;
    pos += 2 + length;
  }
  return false;
}

// CMYK -> RGB as PIL's convert("RGB") does it (what a WebDataset pipeline
// decoding with PIL gets): un-invert Adobe CMYK, then
// channel = (255 - k) - (255 - k) * c / 255, rounded as PIL rounds.
std::shared_ptr<uint8_t> CmykToRgb(const uint8_t* cmyk, size_t pixels,
                                   bool inverted) {
  auto rgb = AllocateBytes(pixels * 3);
  uint8_t* out = rgb.get();
  auto muldiv255 = [](int a, int b) {
    const int t = a * b + 128;
    return ((t >> 8) + t) >> 8;
  };
  const int flip = inverted ? 255 : 0;
  for (size_t i = 0; i < pixels; ++i, cmyk += 4, out += 3) {
    const int nk = 255 - (cmyk[3] ^ flip);
    for (int c = 0; c < 3; ++c) {
      const int v = nk - muldiv255(cmyk[c] ^ flip, nk);
      out[c] = static_cast<uint8_t>(std::clamp(v, 0, 255));
    }
  }
  return rgb;
}

// INVALID_ARGUMENT (a corrupt sample, under the job's on_corrupt policy)
// when a header claims more than options.max_pixels pixels.
absl::Status CheckPixels(absl::string_view format, int64_t width,
                         int64_t height, const ImageOptions& options) {
  if (options.max_pixels > 0 && width * height > options.max_pixels) {
    return absl::InvalidArgumentError(
        absl::StrCat(format, " of ", width, "x", height, " = ", width * height,
                     " pixels is over the limit of ", options.max_pixels,
                     " (--max_image_pixels)"));
  }
  return absl::OkStatus();
}

namespace {

// libjpeg's error handling: errors jump back to the decoding call; the
// first warning (corrupt data libjpeg would paper over with grey) is kept
// and turns the result into an error too. `progress` refuses a JPEG of
// more than kMaxJpegScans scans.
struct JpegErrors {
  jpeg_error_mgr manager;
  jpeg_progress_mgr progress;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
  bool warned;
};

// Called by libjpeg as it reads the scans of a progressive JPEG.
void JpegCheckScans(j_common_ptr info) {
  const auto* decompress = reinterpret_cast<j_decompress_ptr>(info);
  if (decompress->input_scan_number <= kMaxJpegScans) return;
  auto* errors = reinterpret_cast<JpegErrors*>(info->err);
  std::snprintf(errors->message, sizeof(errors->message),
                "progressive JPEG of more than %d scans", kMaxJpegScans);
  std::longjmp(errors->jump, 1);
}

void JpegErrorExit(j_common_ptr info) {
  auto* errors = reinterpret_cast<JpegErrors*>(info->err);
  (*info->err->format_message)(info, errors->message);
  std::longjmp(errors->jump, 1);
}

void JpegEmitMessage(j_common_ptr info, int level) {
  auto* errors = reinterpret_cast<JpegErrors*>(info->err);
  if (level < 0 && !errors->warned) {
    errors->warned = true;
    (*info->err->format_message)(info, errors->message);
  }
}

// Decodes rows [y, y + h) and columns [x, x + w) of the JPEG scaled by
// scale_eighths / 8 (coordinates in the scaled image) into `*out` as RGB:
// the window alone, or with `in_frame` the whole image with zeros outside
// the window. Plain C data only between setjmp and the reads (a longjmp
// skips destructors).
absl::Status DecodeJpegWindow(const Payload& data, int scale_eighths, int x,
                              int y, int w, int h, bool in_frame,
                              ImageBuffer* out) {
  jpeg_decompress_struct info;
  JpegErrors errors;
  info.err = jpeg_std_error(&errors.manager);
  errors.manager.error_exit = &JpegErrorExit;
  errors.manager.emit_message = &JpegEmitMessage;
  errors.warned = false;
  errors.message[0] = 0;
  unsigned char* volatile buffer = nullptr;
  if (setjmp(errors.jump)) {
    jpeg_destroy_decompress(&info);
    std::free(buffer);
    return absl::InvalidArgumentError(
        absl::StrCat("undecodable JPEG: ", errors.message));
  }
  jpeg_create_decompress(&info);
  errors.progress = jpeg_progress_mgr{};
  errors.progress.progress_monitor = &JpegCheckScans;
  info.progress = &errors.progress;
  jpeg_mem_src(&info, reinterpret_cast<const unsigned char*>(data.bytes.data()),
               static_cast<unsigned long>(data.bytes.size()));
  jpeg_read_header(&info, TRUE);
  info.out_color_space = JCS_RGB;
  info.scale_num = static_cast<unsigned int>(scale_eighths);
  info.scale_denom = 8;
  jpeg_start_decompress(&info);
  if (x < 0 || y < 0 || x + w > static_cast<int>(info.output_width) ||
      y + h > static_cast<int>(info.output_height) || w <= 0 || h <= 0) {
    std::snprintf(errors.message, sizeof(errors.message),
                  "window outside the %ux%u image", info.output_width,
                  info.output_height);
    std::longjmp(errors.jump, 1);
  }
  // The decoded columns start at an iMCU boundary at or left of x. One
  // column more on each side (where the image has it): chroma upsampling at
  // the decoded region's edges would otherwise lack its neighbours and
  // differ from a full decode.
  const int ask_left = std::max(0, x - 1);
  const int ask_right =
      std::min(static_cast<int>(info.output_width), x + w + 1);
  JDIMENSION x_offset = static_cast<JDIMENSION>(ask_left);
  JDIMENSION width = static_cast<JDIMENSION>(ask_right - ask_left);
  // (jpeg_crop_scanline sets output_width to the cropped width.)
  const JDIMENSION full_width = info.output_width;
  if (x_offset != 0 || width != info.output_width)
    jpeg_crop_scanline(&info, &x_offset, &width);
  const size_t row_bytes = static_cast<size_t>(width) * 3;
  // In a frame: rows of the whole scaled width, the window's at their place.
  const size_t stride =
      in_frame ? static_cast<size_t>(full_width) * 3 : row_bytes;
  const size_t rows_allocated =
      in_frame ? info.output_height : static_cast<size_t>(h);
  buffer = static_cast<unsigned char*>(
      std::malloc(std::max<size_t>(stride * rows_allocated, 1)));
  if (buffer == nullptr) {
    std::snprintf(errors.message, sizeof(errors.message), "out of memory");
    std::longjmp(errors.jump, 1);
  }
  unsigned char* first_row = buffer;
  if (in_frame) {
    std::memset(buffer, 0, stride * y);
    std::memset(buffer + stride * (y + h), 0,
                stride * (info.output_height - y - h));
    first_row = buffer + stride * y + static_cast<size_t>(x_offset) * 3;
    for (int row = 0; row < h; ++row) {
      unsigned char* line = buffer + stride * (y + row);
      std::memset(line, 0, static_cast<size_t>(x_offset) * 3);
      const size_t right = static_cast<size_t>(x_offset + width) * 3;
      std::memset(line + right, 0, stride - right);
    }
  }
  if (y > 0) jpeg_skip_scanlines(&info, static_cast<JDIMENSION>(y));
  for (int row = 0; row < h;) {
    JSAMPROW rows[1] = {first_row + static_cast<size_t>(row) * stride};
    const JDIMENSION read = jpeg_read_scanlines(&info, rows, 1);
    if (read == 0) break;
    row += static_cast<int>(read);
  }
  if (static_cast<JDIMENSION>(y + h) == info.output_height) {
    jpeg_finish_decompress(&info);
  } else {
    jpeg_abort_decompress(&info);
  }
  const bool warned = errors.warned;
  const int frame_w = static_cast<int>(full_width);
  const int frame_h = static_cast<int>(info.output_height);
  jpeg_destroy_decompress(&info);
  if (warned) {
    std::free(buffer);
    return absl::InvalidArgumentError(
        absl::StrCat("undecodable JPEG: data: ", errors.message));
  }
  out->owner =
      std::shared_ptr<uint8_t>(buffer, [](uint8_t* p) { std::free(p); });
  out->channels = 3;
  out->sample_bytes = 1;
  out->stride = stride;
  if (in_frame) {
    out->data = buffer;
    out->width = frame_w;
    out->height = frame_h;
    return absl::OkStatus();
  }
  out->data = buffer + (static_cast<size_t>(x) - x_offset) * 3;
  out->width = w;
  out->height = h;
  return absl::OkStatus();
}

// For steps starting [Resize, Crop]: the window of the source (width x
// height) that the crop's pixels depend on, with a margin past the resize
// filter's reach (the bilinear filter reaches one source pixel per unit of
// reduction on each side, at least one, plus rounding); false when that is
// most of the image anyway.
bool NeededForResizeThenCrop(const std::vector<GeometryStep>& steps, int width,
                             int height, int* x0, int* y0, int* x1, int* y1) {
  if (steps.size() < 2 || steps[0].kind != GeometryStep::Kind::kResize ||
      steps[1].kind != GeometryStep::Kind::kCrop) {
    return false;
  }
  const GeometryStep& resize = steps[0];
  const GeometryStep& crop = steps[1];
  const int cx0 = std::max(0, crop.left),
            cx1 = std::min(resize.width, crop.left + crop.width);
  const int cy0 = std::max(0, crop.top),
            cy1 = std::min(resize.height, crop.top + crop.height);
  if (cx1 <= cx0 || cy1 <= cy0) return false;
  const double sx = static_cast<double>(width) / resize.width;
  const double sy = static_cast<double>(height) / resize.height;
  const double mx = 2 * std::max(1.0, sx) + 4, my = 2 * std::max(1.0, sy) + 4;
  *x0 = std::max(0, static_cast<int>(std::floor(cx0 * sx - mx)));
  *x1 = std::min(width, static_cast<int>(std::ceil(cx1 * sx + mx)));
  *y0 = std::max(0, static_cast<int>(std::floor(cy0 * sy - my)));
  *y1 = std::min(height, static_cast<int>(std::ceil(cy1 * sy + my)));
  return static_cast<int64_t>(*x1 - *x0) * (*y1 - *y0) <
         int64_t{9} * width * height / 10;
}

}  // namespace

absl::StatusOr<DecodedField> DecodeJpeg(const Payload& data,
                                        const ImageOptions& options) {
  tjhandle handle = ThreadJpegHandle();
  if (handle == nullptr) return absl::InternalError("tjInitDecompress failed");
  const auto* bytes = reinterpret_cast<const unsigned char*>(data.bytes.data());
  const unsigned long size = data.bytes.size();
  int width = 0, height = 0, subsamp = 0, colorspace = 0;
  if (tjDecompressHeader3(handle, bytes, size, &width, &height, &subsamp,
                          &colorspace) != 0) {
    return JpegError(handle, "header");
  }
  if (width <= 0 || height <= 0) {
    return absl::InvalidArgumentError("undecodable JPEG: empty image");
  }
  RETURN_IF_ERROR(CheckPixels("JPEG", width, height, options));
  ResolvedTransforms r;
  RETURN_IF_ERROR(Resolve(options, width, height, &r));
  const std::vector<GeometryStep>& steps = r.geometry->steps;
  // Decode only the first crop's window when it lies inside the image...
  size_t first = 0;
  int wx = 0, wy = 0, ww = width, wh = height;
  if (!steps.empty() && steps[0].kind == GeometryStep::Kind::kCrop &&
      steps[0].left >= 0 && steps[0].top >= 0 &&
      steps[0].left + steps[0].width <= width &&
      steps[0].top + steps[0].height <= height) {
    wx = steps[0].left;
    wy = steps[0].top;
    ww = steps[0].width;
    wh = steps[0].height;
    first = 1;
  }
  // ...at the smallest DCT scale (1/8, 1/4 or 1/2) that keeps it at least
  // twice as large as the resize that follows, which then finishes the job
  // with its antialiasing filter: DCT scaling is a sharper low-pass than
  // torchvision's bilinear, so scaling all the way with it would drift
  // further from the pixels torchvision computes (mean 2.4, max 69 levels
  // at 2x on a photo; with the margin, mean 0.1-1.0 and max 14-43, see
  // README.md "Geometry and decoding"). Unless the job asks for exact
  // pixels.
  int eighths = 8;
  if (!r.transforms->exact_pixels() && first < steps.size() &&
      steps[first].kind == GeometryStep::Kind::kResize) {
    for (int n : {1, 2, 4}) {
      if ((static_cast<int64_t>(ww) * n + 7) / 8 >=
              int64_t{2} * steps[first].width &&
          (static_cast<int64_t>(wh) * n + 7) / 8 >=
              int64_t{2} * steps[first].height) {
        eighths = n;
        break;
      }
    }
  }
  const int scaled_w =
      static_cast<int>((static_cast<int64_t>(width) * eighths + 7) / 8);
  const int scaled_h =
      static_cast<int>((static_cast<int64_t>(height) * eighths + 7) / 8);
  const int x0 = static_cast<int>(static_cast<int64_t>(wx) * eighths / 8);
  const int y0 = static_cast<int>(static_cast<int64_t>(wy) * eighths / 8);
  const int x1 = std::min<int>(
      scaled_w,
      static_cast<int>((static_cast<int64_t>(wx + ww) * eighths + 7) / 8));
  const int y1 = std::min<int>(
      scaled_h,
      static_cast<int>((static_cast<int64_t>(wy + wh) * eighths + 7) / 8));
  // CMYK and YCCK JPEGs (print workflows; ImageNet has a few) decode to
  // CMYK, which libjpeg leaves to the caller to turn into RGB: decoded
  // whole through TurboJPEG, then windowed.
  if (colorspace == TJCS_CMYK || colorspace == TJCS_YCCK) {
    auto cmyk = AllocateBytes(static_cast<size_t>(scaled_w) * scaled_h * 4);
    // TJFLAG_LIMITSCANS: kMaxJpegScans, as the libjpeg path above.
    if (DecoderCall(options.times, [&] {
          return tjDecompress2(handle, bytes, size, cmyk.get(), scaled_w, 0,
                               scaled_h, TJPF_CMYK, TJFLAG_LIMITSCANS);
        }) != 0) {
      // Warnings too (a truncated file decodes to grey): that is not the
      // image the writer stored.
      return JpegError(handle, "data");
    }
    ImageBuffer rgb;
    rgb.owner = CmykToRgb(cmyk.get(), static_cast<size_t>(scaled_w) * scaled_h,
                          HasAdobeMarker(data.bytes));
    rgb.data = rgb.owner.get();
    rgb.width = scaled_w;
    rgb.height = scaled_h;
    rgb.channels = 3;
    rgb.stride = static_cast<size_t>(scaled_w) * 3;
    return Transform(CropImage(rgb, x0, y0, x1 - x0, y1 - y0), r, first,
                     options);
  }
  if (options.shared != nullptr && options.shared->cache != nullptr) {
    // The whole image at this scale, shared with the other jobs reading
    // it; the window is a view of it. (A Resize + CenterCrop over the
    // whole image gives what its framed decode below gives.)
    absl::StatusOr<ImageBuffer> whole = options.shared->cache->GetOrDecode(
        options.shared->key, eighths,
        [&]() -> absl::StatusOr<ImageBuffer> {
          ImageBuffer image;
          RETURN_IF_ERROR(DecoderCall(options.times, [&] {
            return DecodeJpegWindow(data, eighths, 0, 0, scaled_w, scaled_h,
                                    false, &image);
          }));
          return image;
        },
        &options.shared->hit);
    if (!whole.ok()) return whole.status();
    return Transform(CropImage(*whole, x0, y0, x1 - x0, y1 - y0), r, first,
                     options);
  }
  ImageBuffer window;
  int nx0 = 0, ny0 = 0, nx1 = 0, ny1 = 0;
  if (first == 0 && eighths == 8 &&
      NeededForResizeThenCrop(steps, width, height, &nx0, &ny0, &nx1, &ny1)) {
    // A resize then a crop (Resize + CenterCrop): decode the rows and
    // columns the crop needs (with the resize filter's reach) into a
    // zeroed frame; the resize runs over the frame as over a full decode,
    // and the pixels it takes from the zeros are the ones cropped away.
    RETURN_IF_ERROR(DecoderCall(options.times, [&] {
      return DecodeJpegWindow(data, 8, nx0, ny0, nx1 - nx0, ny1 - ny0, true,
                              &window);
    }));
    return Transform(window, r, 0, options);
  }
  RETURN_IF_ERROR(DecoderCall(options.times, [&] {
    return DecodeJpegWindow(data, eighths, x0, y0, x1 - x0, y1 - y0, false,
                            &window);
  }));
  return Transform(window, r, first, options);
}

// libpng's low-level reader over a byte range, for 16-bit images: the
// simplified API reads them as linear light and would either premultiply
// alpha (16-bit formats) or gamma-encode them into 8 bits (a depth map's
// values companded by the sRGB curve). This returns the stored samples.
struct PngMemory {
  const unsigned char* data;
  size_t size;
  size_t pos;
  char error[200];
};

void PngRead(png_structp png, png_bytep out, png_size_t n) {
  auto* m = static_cast<PngMemory*>(png_get_io_ptr(png));
  if (n > m->size - m->pos) png_error(png, "truncated");
  std::memcpy(out, m->data + m->pos, n);
  m->pos += n;
}

void PngError(png_structp png, png_const_charp message) {
  auto* m = static_cast<PngMemory*>(png_get_error_ptr(png));
  std::snprintf(m->error, sizeof(m->error), "%s", message);
  png_longjmp(png, 1);
}

void PngWarning(png_structp, png_const_charp) {}

// Decodes a 16-bit PNG into `*pixels` (HWC, little-endian uint16). Plain C
// data only between setjmp and the reads (a longjmp skips destructors).
absl::Status ReadPng16(const Payload& data, std::shared_ptr<uint8_t>* pixels,
                       int* width, int* height, int* channels) {
  PngMemory memory{reinterpret_cast<const unsigned char*>(data.bytes.data()),
                   data.bytes.size(),
                   0,
                   {0}};
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &memory,
                                           &PngError, &PngWarning);
  if (png == nullptr)
    return absl::ResourceExhaustedError("png_create_read_struct");
  png_infop info = png_create_info_struct(png);
  // Set after setjmp and freed on the error path: volatile.
  unsigned char* volatile buffer = nullptr;
  png_bytep* volatile rows = nullptr;
  if (info == nullptr || setjmp(png_jmpbuf(png))) {
    std::free(rows);
    std::free(buffer);
    png_destroy_read_struct(&png, &info, nullptr);
    return absl::InvalidArgumentError(
        absl::StrCat("undecodable PNG: ", memory.error));
  }
  png_set_read_fn(png, &memory, &PngRead);
  png_read_info(png, info);
  png_set_tRNS_to_alpha(png);  // a transparent colour becomes an alpha channel
  png_set_swap(png);  // PNG stores big-endian; tensors are little-endian
  png_set_interlace_handling(png);
  png_read_update_info(png, info);
  const png_uint_32 w = png_get_image_width(png, info);
  const png_uint_32 h = png_get_image_height(png, info);
  const int c = png_get_channels(png, info);
  const size_t row_bytes = png_get_rowbytes(png, info);
  if (png_get_bit_depth(png, info) != 16 ||
      row_bytes != static_cast<size_t>(w) * c * 2) {
    png_error(png, "unexpected 16-bit layout");
  }
  if (static_cast<uint64_t>(row_bytes) * h > (uint64_t{1} << 30)) {
    png_error(png, "image larger than 1 GiB decoded");
  }
  buffer = static_cast<unsigned char*>(
      std::malloc(std::max<size_t>(row_bytes * h, 1)));
  rows = static_cast<png_bytep*>(
      std::malloc(sizeof(png_bytep) * std::max<png_uint_32>(h, 1)));
  if (buffer == nullptr || rows == nullptr) png_error(png, "out of memory");
  for (png_uint_32 y = 0; y < h; ++y) rows[y] = buffer + y * row_bytes;
  png_read_image(png, rows);
  png_read_end(png, nullptr);
  std::free(rows);
  png_destroy_read_struct(&png, &info, nullptr);
  *pixels = std::shared_ptr<uint8_t>(buffer, [](uint8_t* p) { std::free(p); });
  *width = static_cast<int>(w);
  *height = static_cast<int>(h);
  *channels = c;
  return absl::OkStatus();
}

namespace {

// Decodes rows [0, bottom) of an 8-bit PNG, keeping rows [top, bottom), into
// `*pixels` (HWC uint8, the file's channels after expansion: palette to
// RGB(A), 1/2/4-bit gray to 8 bits, a transparent colour to alpha), as
// libpng's simplified API would for the whole image. The rows past `bottom`
// are never inflated. Only for non-interlaced sRGB files (no gAMA chunk
// unless an sRGB chunk overrides it, no iCCP; a cHRM matters only to
// colour-to-gray conversions, which are not made), where the simplified API
// converts nothing else: `*eligible` is false (and nothing decoded)
// otherwise.
absl::Status ReadPng8Rows(const Payload& data, int top, int bottom,
                          std::shared_ptr<uint8_t>* pixels, int* channels,
                          bool* eligible) {
  PngMemory memory{reinterpret_cast<const unsigned char*>(data.bytes.data()),
                   data.bytes.size(),
                   0,
                   {0}};
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &memory,
                                           &PngError, &PngWarning);
  if (png == nullptr)
    return absl::ResourceExhaustedError("png_create_read_struct");
  png_infop info = png_create_info_struct(png);
  // Set after setjmp and freed on the error path: volatile.
  unsigned char* volatile buffer = nullptr;
  unsigned char* volatile scratch = nullptr;
  if (info == nullptr || setjmp(png_jmpbuf(png))) {
    std::free(scratch);
    std::free(buffer);
    png_destroy_read_struct(&png, &info, nullptr);
    return absl::InvalidArgumentError(
        absl::StrCat("undecodable PNG: ", memory.error));
  }
  png_set_read_fn(png, &memory, &PngRead);
  png_read_info(png, info);
  *eligible = png_get_interlace_type(png, info) == PNG_INTERLACE_NONE &&
              png_get_bit_depth(png, info) <= 8 &&
              png_get_valid(png, info, PNG_INFO_iCCP) == 0 &&
              (png_get_valid(png, info, PNG_INFO_gAMA) == 0 ||
               png_get_valid(png, info, PNG_INFO_sRGB) != 0) &&
              bottom <= static_cast<int>(png_get_image_height(png, info));
  if (!*eligible) {
    png_destroy_read_struct(&png, &info, nullptr);
    return absl::OkStatus();
  }
  png_set_expand(png);
  png_read_update_info(png, info);
  const size_t row_bytes = png_get_rowbytes(png, info);
  *channels = png_get_channels(png, info);
  if (png_get_bit_depth(png, info) != 8 ||
      row_bytes !=
          static_cast<size_t>(png_get_image_width(png, info)) * *channels) {
    png_error(png, "unexpected 8-bit layout");
  }
  buffer = static_cast<unsigned char*>(
      std::malloc(std::max<size_t>(row_bytes * (bottom - top), 1)));
  scratch = static_cast<unsigned char*>(std::malloc(row_bytes));
  if (buffer == nullptr || scratch == nullptr) png_error(png, "out of memory");
  for (int y = 0; y < bottom; ++y) {
    png_read_row(png, y < top ? scratch : buffer + (y - top) * row_bytes,
                 nullptr);
  }
  std::free(scratch);
  png_destroy_read_struct(&png, &info, nullptr);
  *pixels = std::shared_ptr<uint8_t>(buffer, [](uint8_t* p) { std::free(p); });
  return absl::OkStatus();
}

// Reads the PNG's header into `*image` (libpng's simplified API); on an
// error `*image` is freed.
absl::Status BeginPng(const Payload& data, png_image* image) {
  std::memset(image, 0, sizeof(*image));
  image->version = PNG_IMAGE_VERSION;
  if (!png_image_begin_read_from_memory(image, data.bytes.data(),
                                        data.bytes.size())) {
    std::string message = image->message;
    png_image_free(image);
    return absl::InvalidArgumentError(
        absl::StrCat("undecodable PNG: ", message));
  }
  return absl::OkStatus();
}

}  // namespace

// The whole image of a PNG `image` begun with BeginPng (and freed here):
// 16 bits per sample when the file stores them (kept, not reduced to 8),
// 8 otherwise.
absl::StatusOr<ImageBuffer> DecodeWholePng(const Payload& data,
                                           png_image* image) {
  ImageBuffer buffer;
  if ((image->format & PNG_FORMAT_FLAG_LINEAR) != 0) {
    png_image_free(image);
    std::shared_ptr<uint8_t> pixels;
    int width = 0, height = 0, channels = 0;
    RETURN_IF_ERROR(ReadPng16(data, &pixels, &width, &height, &channels));
    buffer.owner = std::move(pixels);
    buffer.data = buffer.owner.get();
    buffer.width = width;
    buffer.height = height;
    buffer.channels = channels;
    buffer.sample_bytes = 2;
    buffer.stride = static_cast<size_t>(width) * channels * 2;
    return buffer;
  }
  image->format &= (PNG_FORMAT_FLAG_COLOR | PNG_FORMAT_FLAG_ALPHA);
  const int channels =
      static_cast<int>(PNG_IMAGE_SAMPLE_CHANNELS(image->format));
  auto pixels = AllocateBytes(PNG_IMAGE_SIZE(*image));
  if (!png_image_finish_read(image, nullptr, pixels.get(), 0, nullptr)) {
    std::string message = image->message;
    png_image_free(image);
    return absl::InvalidArgumentError(
        absl::StrCat("undecodable PNG: ", message));
  }
  buffer.owner = std::move(pixels);
  buffer.data = buffer.owner.get();
  buffer.width = static_cast<int>(image->width);
  buffer.height = static_cast<int>(image->height);
  buffer.channels = channels;
  buffer.stride = static_cast<size_t>(buffer.width) * channels;
  return buffer;
}

absl::StatusOr<DecodedField> DecodePng(const Payload& data,
                                       const ImageOptions& options) {
  png_image image;
  RETURN_IF_ERROR(BeginPng(data, &image));
  if (absl::Status big = CheckPixels("PNG", image.width, image.height, options);
      !big.ok()) {
    png_image_free(&image);
    return big;
  }
  const int width = static_cast<int>(image.width);
  const int height = static_cast<int>(image.height);
  ResolvedTransforms r;
  if (absl::Status resolved = Resolve(options, width, height, &r);
      !resolved.ok()) {
    png_image_free(&image);
    return resolved;
  }
  if (options.shared != nullptr && options.shared->cache != nullptr) {
    // The whole image, shared with the other jobs reading it; each applies
    // its own geometry to it (what the band decode below gives too).
    absl::StatusOr<ImageBuffer> whole = options.shared->cache->GetOrDecode(
        options.shared->key, 8,
        [&]() -> absl::StatusOr<ImageBuffer> {
          return DecoderCall(options.times,
                             [&] { return DecodeWholePng(data, &image); });
        },
        &options.shared->hit);
    if (options.shared->hit) png_image_free(&image);
    if (!whole.ok()) return whole.status();
    return Transform(*whole, r, 0, options);
  }
  const std::vector<GeometryStep>& steps = r.geometry->steps;
  // A first crop inside an 8-bit image that ends above its last rows:
  // inflate only the rows down to the crop's bottom (a PNG decodes top to
  // bottom).
  if ((image.format & PNG_FORMAT_FLAG_LINEAR) == 0 && !steps.empty() &&
      steps[0].kind == GeometryStep::Kind::kCrop && steps[0].left >= 0 &&
      steps[0].top >= 0 && steps[0].left + steps[0].width <= width &&
      steps[0].top + steps[0].height < height) {
    const int channels = static_cast<int>(PNG_IMAGE_SAMPLE_CHANNELS(
        image.format & (PNG_FORMAT_FLAG_COLOR | PNG_FORMAT_FLAG_ALPHA)));
    const GeometryStep& crop = steps[0];
    std::shared_ptr<uint8_t> rows;
    int row_channels = 0;
    bool eligible = false;
    const absl::Status read = DecoderCall(options.times, [&] {
      return ReadPng8Rows(data, crop.top, crop.top + crop.height, &rows,
                          &row_channels, &eligible);
    });
    if (!read.ok() || (eligible && row_channels == channels)) {
      png_image_free(&image);
    }
    RETURN_IF_ERROR(read);
    if (eligible && row_channels == channels) {
      ImageBuffer band;
      band.owner = std::move(rows);
      band.data = band.owner.get();
      band.width = width;
      band.height = crop.height;
      band.channels = channels;
      band.stride = static_cast<size_t>(width) * channels;
      return Transform(CropImage(band, crop.left, 0, crop.width, crop.height),
                       r, 1, options);
    }
  }
  ASSIGN_OR_RETURN(ImageBuffer whole, DecoderCall(options.times, [&] {
                     return DecodeWholePng(data, &image);
                   }));
  return Transform(whole, r, 0, options);
}

absl::StatusOr<DecodedField> DecodeNpy(const Payload& data) {
  absl::string_view bytes = data.bytes;
  if (bytes.size() < 10 || bytes.substr(0, 6) != "\x93NUMPY") {
    return absl::InvalidArgumentError("npy: bad magic");
  }
  const auto major = static_cast<uint8_t>(bytes[6]);
  size_t header_len = 0, header_start = 0;
  if (major == 1) {
    header_len = static_cast<uint8_t>(bytes[8]) |
                 (static_cast<size_t>(static_cast<uint8_t>(bytes[9])) << 8);
    header_start = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) return absl::InvalidArgumentError("npy: truncated");
    for (int i = 3; i >= 0; --i) {
      header_len = (header_len << 8) | static_cast<uint8_t>(bytes[8 + i]);
    }
    header_start = 12;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("npy: unsupported format version ", major));
  }
  if (header_start + header_len > bytes.size()) {
    return absl::InvalidArgumentError("npy: header runs past the data");
  }
  absl::string_view header = bytes.substr(header_start, header_len);
  ASSIGN_OR_RETURN(absl::string_view descr, NpyHeaderValue(header, "descr"));
  if (descr.size() < 2 || descr[0] != '\'') {
    return absl::InvalidArgumentError("npy: descr is not a simple dtype");
  }
  descr = descr.substr(1, descr.find('\'', 1) - 1);
  char order = '|';
  if (!descr.empty() && (descr[0] == '<' || descr[0] == '>' ||
                         descr[0] == '|' || descr[0] == '=')) {
    order = descr[0];
    descr.remove_prefix(1);
  }
  v1::DType dtype;
  int item = 0;
  if (!NpyDtype(descr, &dtype, &item)) {
    return absl::InvalidArgumentError(
        absl::StrCat("npy: unsupported dtype '", descr, "'"));
  }
  ASSIGN_OR_RETURN(absl::string_view fortran,
                   NpyHeaderValue(header, "fortran_order"));
  const bool fortran_order = absl::StartsWith(fortran, "True");
  ASSIGN_OR_RETURN(absl::string_view shape_text,
                   NpyHeaderValue(header, "shape"));
  if (shape_text.empty() || shape_text[0] != '(') {
    return absl::InvalidArgumentError("npy: shape is not a tuple");
  }
  shape_text = shape_text.substr(1, shape_text.find(')') - 1);
  std::vector<int64_t> shape;
  int64_t count = 1;
  for (absl::string_view dim : absl::StrSplit(shape_text, ',')) {
    dim = absl::StripAsciiWhitespace(dim);
    if (dim.empty()) continue;
    int64_t n = 0;
    if (!absl::SimpleAtoi(dim, &n) || n < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("npy: bad dimension '", dim, "'"));
    }
    shape.push_back(n);
    if (n != 0 && count > (int64_t{1} << 40) / n) {
      return absl::InvalidArgumentError("npy: shape too large");
    }
    count *= n;
  }
  const size_t data_start = header_start + header_len;
  const size_t nbytes = static_cast<size_t>(count) * item;
  if (bytes.size() - data_start < nbytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("npy: header promises ", nbytes, " bytes of data, has ",
                     bytes.size() - data_start));
  }
  DecodedField field;
  field.kind = DecodedField::Kind::kTensor;
  field.dtype = dtype;
  field.shape = shape;
  absl::string_view payload = bytes.substr(data_start, nbytes);
  const bool swap = order == '>' && item > 1;
  if (!swap && (!fortran_order || shape.size() < 2)) {
    field.bytes = Payload{payload, data.owner};  // no copy
    return field;
  }
  auto out = AllocateBytes(nbytes);
  const auto* in = reinterpret_cast<const uint8_t*>(payload.data());
  // Element i in C order sits at Fortran position f(i).
  std::vector<int64_t> index(shape.size(), 0);
  for (int64_t i = 0; i < count; ++i) {
    int64_t src = i;
    if (fortran_order && shape.size() >= 2) {
      src = 0;
      int64_t stride = 1;
      for (size_t d = 0; d < shape.size(); ++d) {
        src += index[d] * stride;
        stride *= shape[d];
      }
      for (size_t d = shape.size(); d-- > 0;) {  // advance the C-order index
        if (++index[d] < shape[d]) break;
        index[d] = 0;
      }
    }
    const uint8_t* from = in + src * item;
    uint8_t* to = out.get() + i * item;
    if (swap) {
      for (int b = 0; b < item; ++b) to[b] = from[item - 1 - b];
    } else {
      std::memcpy(to, from, item);
    }
  }
  field.bytes.bytes =
      absl::string_view(reinterpret_cast<const char*>(out.get()), nbytes);
  field.bytes.owner = std::move(out);
  return field;
}

absl::StatusOr<ImageSize> ReadImageSize(Codec codec, const Payload& data) {
  if (codec == Codec::kJpeg) {
    tjhandle handle = ThreadJpegHandle();
    if (handle == nullptr)
      return absl::InternalError("tjInitDecompress failed");
    int width = 0, height = 0, subsamp = 0, colorspace = 0;
    if (tjDecompressHeader3(
            handle, reinterpret_cast<const unsigned char*>(data.bytes.data()),
            data.bytes.size(), &width, &height, &subsamp, &colorspace) != 0) {
      return JpegError(handle, "header");
    }
    return ImageSize{width, height};
  }
  if (codec == Codec::kPng) {
    png_image image;
    RETURN_IF_ERROR(BeginPng(data, &image));
    png_image_free(&image);
    return ImageSize{static_cast<int>(image.width),
                     static_cast<int>(image.height)};
  }
  return absl::InvalidArgumentError("not an image");
}

absl::StatusOr<DecodedField> DecodeField(Codec codec, const Payload& data,
                                         const ImageOptions& image) {
  switch (codec) {
    case Codec::kJpeg:
      return DecodeJpeg(data, image);
    case Codec::kPng:
      return DecodePng(data, image);
    case Codec::kNpy:
      return DecodeNpy(data);
    case Codec::kInt: {
      DecodedField field;
      field.kind = DecodedField::Kind::kInt;
      absl::string_view text = absl::StripAsciiWhitespace(data.bytes);
      if (!absl::SimpleAtoi(text, &field.int_value)) {
        return absl::InvalidArgumentError(
            absl::StrCat("not an integer: \"", text.substr(0, 32), "\""));
      }
      return field;
    }
    case Codec::kText: {
      if (!google::protobuf::internal::IsStructurallyValidUTF8(
              data.bytes.data(), static_cast<int>(data.bytes.size()))) {
        return absl::InvalidArgumentError("text is not valid UTF-8");
      }
      DecodedField field;
      field.kind = DecodedField::Kind::kText;
      field.bytes = data;
      return field;
    }
    case Codec::kRaw:
      break;
  }
  DecodedField field;
  field.kind = DecodedField::Kind::kRaw;
  field.bytes = data;
  return field;
}

}  // namespace sluice::dataserver
