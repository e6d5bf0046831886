#include "server/dataserver/decoders.h"

#include <png.h>
#include <stb/stb_image_resize.h>
#include <turbojpeg.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "google/protobuf/stubs/common.h"
#include "server/common/status_macros.h"

namespace sluice::dataserver {
namespace {

std::shared_ptr<uint8_t> AllocateBytes(size_t n) {
  return std::shared_ptr<uint8_t>(new uint8_t[std::max<size_t>(n, 1)],
                                  std::default_delete<uint8_t[]>());
}

DecodedField ImageTensor(std::shared_ptr<uint8_t> pixels, int width,
                         int height, int channels, int sample_bytes) {
  DecodedField field;
  field.kind = DecodedField::Kind::kTensor;
  field.dtype = sample_bytes == 2 ? v1::DTYPE_UINT16 : v1::DTYPE_UINT8;
  field.shape = {height, width, channels};
  field.bytes.bytes = absl::string_view(
      reinterpret_cast<const char*>(pixels.get()),
      static_cast<size_t>(width) * height * channels * sample_bytes);
  field.bytes.owner = std::move(pixels);
  return field;
}

// Resize (shorter side) then center-crop an HWC image of uint8 samples
// (sample_bytes 1) or little-endian uint16 ones (2).
absl::StatusOr<DecodedField> ResizeAndCrop(std::shared_ptr<uint8_t> pixels,
                                           int width, int height, int channels,
                                           const ImageOptions& options,
                                           int sample_bytes = 1) {
  if (options.resize_shorter_side > 0) {
    int out_w = 0, out_h = 0;
    ResizedSize(width, height, options.resize_shorter_side, &out_w, &out_h);
    if (out_w != width || out_h != height) {
      auto resized =
          AllocateBytes(static_cast<size_t>(out_w) * out_h * channels * sample_bytes);
      const int ok =
          sample_bytes == 2
              ? stbir_resize_uint16_generic(
                    reinterpret_cast<const stbir_uint16*>(pixels.get()), width, height, 0,
                    reinterpret_cast<stbir_uint16*>(resized.get()), out_w, out_h, 0, channels,
                    STBIR_ALPHA_CHANNEL_NONE, 0, STBIR_EDGE_CLAMP, STBIR_FILTER_DEFAULT,
                    STBIR_COLORSPACE_LINEAR, nullptr)
              : stbir_resize_uint8(pixels.get(), width, height, 0, resized.get(), out_w,
                                   out_h, 0, channels);
      if (ok != 1) {
        return absl::InternalError(absl::StrCat("resize ", width, "x", height,
                                                " -> ", out_w, "x", out_h,
                                                " failed"));
      }
      pixels = std::move(resized);
      width = out_w;
      height = out_h;
    }
  }
  if (options.crop_height > 0 && options.crop_width > 0 &&
      (options.crop_height != height || options.crop_width != width)) {
    const int ch = options.crop_height, cw = options.crop_width;
    const int pixel_bytes = channels * sample_bytes;
    auto cropped = AllocateBytes(static_cast<size_t>(cw) * ch * pixel_bytes);
    std::memset(cropped.get(), 0, static_cast<size_t>(cw) * ch * pixel_bytes);
    // torchvision's CenterCrop: top = round((H - ch) / 2), left likewise;
    // negative offsets mean padding.
    const int top = static_cast<int>(std::lround((height - ch) / 2.0));
    const int left = static_cast<int>(std::lround((width - cw) / 2.0));
    for (int y = 0; y < ch; ++y) {
      int sy = y + top;
      if (sy < 0 || sy >= height) continue;
      int x0 = std::max(0, -left), x1 = std::min(cw, width - left);
      if (x1 <= x0) continue;
      std::memcpy(cropped.get() + (static_cast<size_t>(y) * cw + x0) * pixel_bytes,
                  pixels.get() +
                      (static_cast<size_t>(sy) * width + x0 + left) * pixel_bytes,
                  static_cast<size_t>(x1 - x0) * pixel_bytes);
    }
    pixels = std::move(cropped);
    width = cw;
    height = ch;
  }
  return ImageTensor(std::move(pixels), width, height, channels, sample_bytes);
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
    case Codec::kJpeg: return "jpeg";
    case Codec::kPng: return "png";
    case Codec::kInt: return "int";
    case Codec::kText: return "text";
    case Codec::kNpy: return "npy";
    case Codec::kRaw: return "raw";
  }
  return "raw";
}

void ResizedSize(int width, int height, int shorter, int* out_width,
                 int* out_height) {
  if (width <= height) {
    *out_width = shorter;
    *out_height = static_cast<int>(static_cast<int64_t>(shorter) * height / width);
  } else {
    *out_height = shorter;
    *out_width = static_cast<int>(static_cast<int64_t>(shorter) * width / height);
  }
  *out_width = std::max(1, *out_width);
  *out_height = std::max(1, *out_height);
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
    if (marker == 0xDA || marker == 0xD9) return false;  // scan or end: no more headers
    const size_t length = static_cast<size_t>(static_cast<uint8_t>(jpeg[pos + 2])) << 8 |
                          static_cast<uint8_t>(jpeg[pos + 3]);
    if (length < 2 || pos + 2 + length > jpeg.size()) return false;
    if (marker == 0xEE && length >= 7 && jpeg.substr(pos + 4, 5) == "Adobe") return true;
    pos += 2 + length;
  }
  return false;
}

// CMYK -> RGB as PIL's convert("RGB") does it (what a WebDataset pipeline
// decoding with PIL gets): un-invert Adobe CMYK, then
// channel = (255 - k) - (255 - k) * c / 255, rounded as PIL rounds.
std::shared_ptr<uint8_t> CmykToRgb(const uint8_t* cmyk, size_t pixels, bool inverted) {
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
absl::Status CheckPixels(absl::string_view format, int64_t width, int64_t height,
                         const ImageOptions& options) {
  if (options.max_pixels > 0 && width * height > options.max_pixels) {
    return absl::InvalidArgumentError(absl::StrCat(
        format, " of ", width, "x", height, " = ", width * height,
        " pixels is over the limit of ", options.max_pixels, " (--max_image_pixels)"));
  }
  return absl::OkStatus();
}

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
  // Scaled decode: the smallest DCT scaling factor whose output still has a
  // shorter side >= the requested one (the resize then finishes the job).
  int out_w = width, out_h = height;
  if (options.resize_shorter_side > 0) {
    int count = 0;
    tjscalingfactor* factors = tjGetScalingFactors(&count);
    for (int i = 0; i < count; ++i) {
      int w = TJSCALED(width, factors[i]);
      int h = TJSCALED(height, factors[i]);
      if (std::min(w, h) >= options.resize_shorter_side &&
          static_cast<int64_t>(w) * h < static_cast<int64_t>(out_w) * out_h) {
        out_w = w;
        out_h = h;
      }
    }
  }
  // CMYK and YCCK JPEGs (print workflows; ImageNet has a few) decode to
  // CMYK, which TurboJPEG leaves to the caller to turn into RGB.
  const bool cmyk = colorspace == TJCS_CMYK || colorspace == TJCS_YCCK;
  auto pixels = AllocateBytes(static_cast<size_t>(out_w) * out_h * (cmyk ? 4 : 3));
  if (tjDecompress2(handle, bytes, size, pixels.get(), out_w, 0, out_h,
                    cmyk ? TJPF_CMYK : TJPF_RGB, 0) != 0) {
    // Warnings too (a truncated file decodes to grey): that is not the image
    // the writer stored.
    return JpegError(handle, "data");
  }
  if (cmyk) {
    pixels = CmykToRgb(pixels.get(), static_cast<size_t>(out_w) * out_h,
                       HasAdobeMarker(data.bytes));
  }
  return ResizeAndCrop(std::move(pixels), out_w, out_h, 3, options);
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
absl::Status ReadPng16(const Payload& data, std::shared_ptr<uint8_t>* pixels, int* width,
                       int* height, int* channels) {
  PngMemory memory{reinterpret_cast<const unsigned char*>(data.bytes.data()),
                   data.bytes.size(), 0, {0}};
  png_structp png =
      png_create_read_struct(PNG_LIBPNG_VER_STRING, &memory, &PngError, &PngWarning);
  if (png == nullptr) return absl::ResourceExhaustedError("png_create_read_struct");
  png_infop info = png_create_info_struct(png);
  // Set after setjmp and freed on the error path: volatile.
  unsigned char* volatile buffer = nullptr;
  png_bytep* volatile rows = nullptr;
  if (info == nullptr || setjmp(png_jmpbuf(png))) {
    std::free(rows);
    std::free(buffer);
    png_destroy_read_struct(&png, &info, nullptr);
    return absl::InvalidArgumentError(absl::StrCat("undecodable PNG: ", memory.error));
  }
  png_set_read_fn(png, &memory, &PngRead);
  png_read_info(png, info);
  png_set_tRNS_to_alpha(png);  // a transparent colour becomes an alpha channel
  png_set_swap(png);           // PNG stores big-endian; tensors are little-endian
  png_set_interlace_handling(png);
  png_read_update_info(png, info);
  const png_uint_32 w = png_get_image_width(png, info);
  const png_uint_32 h = png_get_image_height(png, info);
  const int c = png_get_channels(png, info);
  const size_t row_bytes = png_get_rowbytes(png, info);
  if (png_get_bit_depth(png, info) != 16 || row_bytes != static_cast<size_t>(w) * c * 2) {
    png_error(png, "unexpected 16-bit layout");
  }
  if (static_cast<uint64_t>(row_bytes) * h > (uint64_t{1} << 30)) {
    png_error(png, "image larger than 1 GiB decoded");
  }
  buffer = static_cast<unsigned char*>(std::malloc(std::max<size_t>(row_bytes * h, 1)));
  rows = static_cast<png_bytep*>(std::malloc(sizeof(png_bytep) * std::max<png_uint_32>(h, 1)));
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

absl::StatusOr<DecodedField> DecodePng(const Payload& data,
                                       const ImageOptions& options) {
  png_image image;
  std::memset(&image, 0, sizeof(image));
  image.version = PNG_IMAGE_VERSION;
  if (!png_image_begin_read_from_memory(&image, data.bytes.data(),
                                        data.bytes.size())) {
    std::string message = image.message;
    png_image_free(&image);
    return absl::InvalidArgumentError(
        absl::StrCat("undecodable PNG: ", message));
  }
  if (absl::Status big = CheckPixels("PNG", image.width, image.height, options); !big.ok()) {
    png_image_free(&image);
    return big;
  }
  if ((image.format & PNG_FORMAT_FLAG_LINEAR) != 0) {
    // 16 bits per sample in the file: kept (uint16), not reduced to 8.
    png_image_free(&image);
    std::shared_ptr<uint8_t> pixels;
    int width = 0, height = 0, channels = 0;
    RETURN_IF_ERROR(ReadPng16(data, &pixels, &width, &height, &channels));
    return ResizeAndCrop(std::move(pixels), width, height, channels, options, 2);
  }
  image.format &= (PNG_FORMAT_FLAG_COLOR | PNG_FORMAT_FLAG_ALPHA);
  const int channels = static_cast<int>(PNG_IMAGE_SAMPLE_CHANNELS(image.format));
  const int width = static_cast<int>(image.width);
  const int height = static_cast<int>(image.height);
  auto pixels = AllocateBytes(PNG_IMAGE_SIZE(image));
  if (!png_image_finish_read(&image, nullptr, pixels.get(), 0, nullptr)) {
    std::string message = image.message;
    png_image_free(&image);
    return absl::InvalidArgumentError(
        absl::StrCat("undecodable PNG: ", message));
  }
  return ResizeAndCrop(std::move(pixels), width, height, channels, options);
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
        return absl::InvalidArgumentError(absl::StrCat(
            "not an integer: \"", text.substr(0, 32), "\""));
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
