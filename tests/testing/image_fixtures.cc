#include "tests/testing/image_fixtures.h"

#include <png.h>
#include <turbojpeg.h>

#include <cstring>
#include <stdexcept>

namespace sluice::testing {

std::string TestPixels(int width, int height, int channels, int seed) {
  std::string out(static_cast<size_t>(width) * height * channels, '\0');
  uint32_t state = 2463534242u + static_cast<uint32_t>(seed);
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < width; ++x) {
      for (int c = 0; c < channels; ++c) {
        state ^= state << 13;
        state ^= state >> 17;
        state ^= state << 5;
        int v = (x * 255 / std::max(1, width - 1) + y * 3 + c * 40 + seed * 7 +
                 static_cast<int>(state % 16)) &
                0xff;
        out[(static_cast<size_t>(y) * width + x) * channels + c] =
            static_cast<char>(v);
      }
    }
  }
  return out;
}

namespace {

// Entropy-coded bits, most significant first, with the 0xFF byte stuffing
// of JPEG scans; Finish pads with 1 bits.
class ScanBits {
 public:
  void Put(uint32_t value, int bits) {
    for (int i = bits - 1; i >= 0; --i) {
      byte_ = static_cast<uint8_t>((byte_ << 1) | ((value >> i) & 1));
      if (++filled_ == 8) Flush();
    }
  }
  std::string Finish() {
    while (filled_ != 0) Put(1, 1);
    return std::move(out_);
  }

 private:
  void Flush() {
    out_.push_back(static_cast<char>(byte_));
    if (byte_ == 0xFF) out_.push_back('\0');
    byte_ = 0;
    filled_ = 0;
  }
  std::string out_;
  uint8_t byte_ = 0;
  int filled_ = 0;
};

// Marker `marker` with its length and `payload`.
std::string Segment(uint8_t marker, const std::string& payload) {
  const size_t length = payload.size() + 2;
  std::string out = {'\xFF', static_cast<char>(marker),
                     static_cast<char>(length >> 8),
                     static_cast<char>(length & 0xFF)};
  return out + payload;
}

}  // namespace

std::string ScanBombJpeg(int width, int height, int ac_scans, int components) {
  if (components != 1 && components != 4) {
    throw std::invalid_argument("ScanBombJpeg: 1 or 4 components");
  }
  const int64_t blocks =
      static_cast<int64_t>((width + 7) / 8) * ((height + 7) / 8);
  auto u16 = [](int v) {
    return std::string{static_cast<char>(v >> 8), static_cast<char>(v & 0xFF)};
  };
  std::string out = "\xFF\xD8";
  if (components == 4) {
    // APP14 "Adobe": version 100, flags 0, 0, transform 0 (CMYK as stored).
    out += Segment(0xEE, std::string("Adobe\x00\x64\x00\x00\x00\x00\x00", 12));
  }
  out += Segment(0xDB, std::string(1, '\0') + std::string(64, '\x01'));
  // SOF2 (progressive): 8 bits, height, width, the components (ids 1..n,
  // sampling 1x1, quantisation table 0).
  std::string sof = "\x08" + u16(height) + u16(width) +
                    std::string(1, static_cast<char>(components));
  for (int c = 1; c <= components; ++c) {
    sof += std::string{static_cast<char>(c), '\x11', '\x00'};
  }
  out += Segment(0xC2, sof);
  // Huffman tables with one 1-bit code each: DC table 0 codes category 0
  // (a zero difference), AC table 0 codes 0xE0 (an end-of-band run of
  // 2^14 + 14 more bits: up to 32,767 blocks).
  std::string one_code(16, '\0');
  one_code[0] = 1;
  out +=
      Segment(0xC4, std::string(1, '\x00') + one_code + std::string(1, '\x00'));
  out +=
      Segment(0xC4, std::string(1, '\x10') + one_code + std::string(1, '\xE0'));
  ScanBits dc;
  for (int64_t i = 0; i < blocks * components; ++i) dc.Put(0, 1);
  // SOS: every component (interleaved, tables 0/0), Ss 0, Se 0, Ah/Al 0.
  std::string dc_scan(1, static_cast<char>(components));
  for (int c = 1; c <= components; ++c) {
    dc_scan += std::string{static_cast<char>(c), '\x00'};
  }
  out += Segment(0xDA, dc_scan + std::string(3, '\0')) + dc.Finish();
  const int64_t runs = (blocks + 32766) / 32767;
  for (int s = 0; s < ac_scans; ++s) {
    ScanBits ac;
    for (int64_t r = 0; r < runs; ++r) {
      ac.Put(0, 1);
      ac.Put(0x3FFF, 14);
    }
    // Component 1, Ss 1, Se 63, Ah/Al 0: a first AC scan, valid again after
    // itself.
    out +=
        Segment(0xDA, std::string("\x01\x01\x00\x01\x3F\x00", 6)) + ac.Finish();
  }
  return out + "\xFF\xD9";
}

std::string EncodeJpeg(const std::string& rgb, int width, int height,
                       int quality) {
  tjhandle h = tjInitCompress();
  unsigned char* jpeg = nullptr;
  unsigned long size = 0;
  if (tjCompress2(h, reinterpret_cast<const unsigned char*>(rgb.data()), width,
                  0, height, TJPF_RGB, &jpeg, &size, TJSAMP_420, quality,
                  0) != 0) {
    tjDestroy(h);
    throw std::runtime_error("tjCompress2 failed");
  }
  std::string out(reinterpret_cast<char*>(jpeg), size);
  tjFree(jpeg);
  tjDestroy(h);
  return out;
}

std::string EncodePng(const std::string& pixels, int width, int height,
                      int channels) {
  png_image image;
  std::memset(&image, 0, sizeof(image));
  image.version = PNG_IMAGE_VERSION;
  image.width = static_cast<png_uint_32>(width);
  image.height = static_cast<png_uint_32>(height);
  static const png_uint_32 kFormats[] = {0, PNG_FORMAT_GRAY, PNG_FORMAT_GA,
                                         PNG_FORMAT_RGB, PNG_FORMAT_RGBA};
  image.format = kFormats[channels];
  png_alloc_size_t size = 0;
  if (!png_image_write_to_memory(&image, nullptr, &size, 0, pixels.data(), 0,
                                 nullptr)) {
    throw std::runtime_error("png size failed");
  }
  std::string out(size, '\0');
  if (!png_image_write_to_memory(&image, out.data(), &size, 0, pixels.data(), 0,
                                 nullptr)) {
    throw std::runtime_error("png write failed");
  }
  out.resize(size);
  return out;
}

namespace {
void AppendPng(png_structp png, png_bytep data, png_size_t n) {
  static_cast<std::string*>(png_get_io_ptr(png))
      ->append(reinterpret_cast<char*>(data), n);
}
void NoFlush(png_structp) {}
}  // namespace

std::string EncodePng16(const std::vector<uint16_t>& pixels, int width,
                        int height, int channels, double gamma) {
  static const int kColorTypes[] = {
      0, PNG_COLOR_TYPE_GRAY, PNG_COLOR_TYPE_GRAY_ALPHA, PNG_COLOR_TYPE_RGB,
      PNG_COLOR_TYPE_RGB_ALPHA};
  std::string out;
  png_structp png =
      png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png_create_info_struct(png);
  if (setjmp(png_jmpbuf(png))) throw std::runtime_error("png16 write failed");
  png_set_write_fn(png, &out, &AppendPng, &NoFlush);
  png_set_IHDR(png, info, static_cast<png_uint_32>(width),
               static_cast<png_uint_32>(height), 16, kColorTypes[channels],
               PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT,
               PNG_FILTER_TYPE_DEFAULT);
  if (gamma > 0) png_set_gAMA(png, info, gamma);
  png_write_info(png, info);
  // Big-endian in the file, as PNG stores 16-bit samples.
  std::vector<unsigned char> row(static_cast<size_t>(width) * channels * 2);
  for (int y = 0; y < height; ++y) {
    for (int i = 0; i < width * channels; ++i) {
      const uint16_t v = pixels[static_cast<size_t>(y) * width * channels + i];
      row[2 * i] = static_cast<unsigned char>(v >> 8);
      row[2 * i + 1] = static_cast<unsigned char>(v & 0xff);
    }
    png_write_row(png, row.data());
  }
  png_write_end(png, nullptr);
  png_destroy_write_struct(&png, &info);
  return out;
}

std::string MakeNpy(const std::string& descr, const std::vector<int64_t>& shape,
                    const std::string& data, bool fortran_order) {
  std::string dims;
  for (int64_t d : shape) dims += std::to_string(d) + ", ";
  if (shape.size() > 1)
    dims.resize(dims.size() - 2);  // "(2, 3)"; "(4,)"
  else if (shape.size() == 1)
    dims.resize(dims.size() - 1);
  std::string header = "{'descr': '" + descr + "', 'fortran_order': " +
                       (fortran_order ? "True" : "False") + ", 'shape': (" +
                       dims + "), }";
  size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  std::string out = "\x93NUMPY";
  out += '\x01';
  out += '\x00';
  out += static_cast<char>(header.size() & 0xff);
  out += static_cast<char>(header.size() >> 8);
  return out + header + data;
}

}  // namespace sluice::testing
