#include "server/dataserver/decoders.h"

#include <turbojpeg.h>
#include <zlib.h>

#include <cstring>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/image_fixtures.h"
#include "tests/testing/status_matchers.h"

namespace sluice::dataserver {
namespace {

using ::sluice::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Callers keep the bytes alive for the whole expression (literals, lvalues).
Payload P(absl::string_view s) { return Payload{s, nullptr}; }

// libjpeg-turbo decoding the same bytes directly: the reference.
std::string ReferenceJpeg(const std::string& jpeg, int w, int h) {
  tjhandle t = tjInitDecompress();
  std::string out(static_cast<size_t>(w) * h * 3, '\0');
  EXPECT_EQ(
      tjDecompress2(t, reinterpret_cast<const unsigned char*>(jpeg.data()),
                    jpeg.size(), reinterpret_cast<unsigned char*>(out.data()),
                    w, 0, h, TJPF_RGB, 0),
      0);
  tjDestroy(t);
  return out;
}

TEST(CodecTest, ByLastExtension) {
  EXPECT_EQ(CodecForField("jpg"), Codec::kJpeg);
  EXPECT_EQ(CodecForField("jpeg"), Codec::kJpeg);
  EXPECT_EQ(CodecForField("seg.png"), Codec::kPng);
  EXPECT_EQ(CodecForField("cls"), Codec::kInt);
  EXPECT_EQ(CodecForField("index"), Codec::kInt);
  EXPECT_EQ(CodecForField("json"), Codec::kText);
  EXPECT_EQ(CodecForField("txt"), Codec::kText);
  EXPECT_EQ(CodecForField("npy"), Codec::kNpy);
  EXPECT_EQ(CodecForField("bin"), Codec::kRaw);
  EXPECT_EQ(CodecForField("png.bin"), Codec::kRaw);
}

// A header claiming more pixels than the limit is refused before any pixel
// memory is allocated (60000x60000 would ask for 10 GB); at the limit, the
// image decodes.
TEST(JpegTest, AHeaderClaimingTooManyPixelsIsRefusedBeforeAllocating) {
  std::string jpeg =
      testing::EncodeJpeg(testing::TestPixels(64, 48, 3), 64, 48);
  ImageOptions options;
  options.max_pixels = 64 * 48;
  ASSERT_OK(DecodeJpeg(P(jpeg), options).status());
  options.max_pixels = 64 * 48 - 1;
  EXPECT_THAT(
      DecodeJpeg(P(jpeg), options).status(),
      StatusIs(
          absl::StatusCode::kInvalidArgument,
          HasSubstr("JPEG of 64x48 = 3072 pixels is over the limit of 3071")));
  // The frame header (SOF0: FF C0, length, precision, height, width) made
  // to claim 60000x60000, with the default limit.
  const size_t sof = jpeg.find("\xff\xc0");
  ASSERT_NE(sof, std::string::npos);
  for (size_t at : {sof + 5, sof + 7}) {
    jpeg[at] = static_cast<char>(60000 >> 8);
    jpeg[at + 1] = static_cast<char>(60000 & 0xff);
  }
  EXPECT_THAT(
      DecodeJpeg(P(jpeg), {}).status(),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("60000x60000")));
}

TEST(PngTest, AHeaderClaimingTooManyPixelsIsRefused) {
  const std::string png8 =
      testing::EncodePng(testing::TestPixels(20, 10, 3), 20, 10, 3);
  const std::string png16 =
      testing::EncodePng16(std::vector<uint16_t>(20 * 10, 7), 20, 10, 1);
  ImageOptions options;
  options.max_pixels = 199;
  for (const std::string& png : {png8, png16}) {
    EXPECT_THAT(
        DecodePng(P(png), options).status(),
        StatusIs(
            absl::StatusCode::kInvalidArgument,
            HasSubstr("PNG of 20x10 = 200 pixels is over the limit of 199")));
  }
  options.max_pixels = 200;
  EXPECT_OK(DecodePng(P(png8), options).status());
  EXPECT_OK(DecodePng(P(png16), options).status());
}

TEST(JpegTest, PixelExactAgainstReferenceDecode) {
  std::string jpeg =
      testing::EncodeJpeg(testing::TestPixels(64, 48, 3), 64, 48);
  auto decoded = DecodeJpeg(P(jpeg), {});
  ASSERT_OK(decoded.status());
  EXPECT_EQ(decoded->dtype, v1::DTYPE_UINT8);
  EXPECT_THAT(decoded->shape, ElementsAre(48, 64, 3));
  EXPECT_EQ(decoded->bytes.bytes, ReferenceJpeg(jpeg, 64, 48));
}

TEST(JpegTest, ScaledDecodeThenResizeAndCrop) {
  std::string jpeg =
      testing::EncodeJpeg(testing::TestPixels(500, 375, 3), 500, 375);
  // 375 -> 1/2 scale (188) is the smallest with shorter side >= 100, then
  // resize to shorter side 100: 250 * 100 / 188 = 133 wide.
  auto resized = DecodeJpeg(P(jpeg), {100, 0, 0});
  ASSERT_OK(resized.status());
  EXPECT_THAT(resized->shape, ElementsAre(100, 133, 3));
  auto cropped = DecodeJpeg(P(jpeg), {100, 96, 96});
  ASSERT_OK(cropped.status());
  EXPECT_THAT(cropped->shape, ElementsAre(96, 96, 3));
  EXPECT_EQ(cropped->bytes.bytes.size(), 96u * 96 * 3);
  // Shorter side 188 (a 2x reduction) is resampled from the full decode,
  // not taken from the sharper 1/2 DCT-scaled decode: close to it, not equal.
  auto half = DecodeJpeg(P(jpeg), {188, 0, 0});
  ASSERT_OK(half.status());
  EXPECT_THAT(half->shape, ElementsAre(188, 250, 3));
  EXPECT_NE(half->bytes.bytes, ReferenceJpeg(jpeg, 250, 188));
}

// A progressive JPEG that repeats a valid scan past the limit is refused
// while its scans are read; at the limit (its DC scan and 499 AC scans) it
// decodes, to grey 128 (every coefficient zero).
TEST(JpegTest, AScanBombIsRefusedNamingTheLimit) {
  const std::string at_limit = testing::ScanBombJpeg(64, 48, kMaxJpegScans - 1);
  auto decoded = DecodeJpeg(P(at_limit), {});
  ASSERT_OK(decoded.status());
  EXPECT_THAT(decoded->shape, ElementsAre(48, 64, 3));
  EXPECT_EQ(decoded->bytes.bytes, std::string(48 * 64 * 3, '\x80'));
  const std::string bomb = testing::ScanBombJpeg(64, 48, kMaxJpegScans);
  EXPECT_THAT(DecodeJpeg(P(bomb), {}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("progressive JPEG of more than 500 scans")));
}

// The same limit on the CMYK path (decoded whole through TurboJPEG).
TEST(JpegTest, ACmykScanBombIsRefusedNamingTheLimit) {
  const std::string at_limit =
      testing::ScanBombJpeg(64, 48, kMaxJpegScans - 1, /*components=*/4);
  auto decoded = DecodeJpeg(P(at_limit), {});
  ASSERT_OK(decoded.status());
  EXPECT_THAT(decoded->shape, ElementsAre(48, 64, 3));
  // Every CMYK sample 128: one colour throughout, as PIL converts it.
  const std::string pixels(decoded->bytes.bytes);
  ASSERT_EQ(pixels.size(), 48u * 64 * 3);
  EXPECT_EQ(pixels, std::string(48 * 64 * 3, pixels[0]));
  const std::string bomb =
      testing::ScanBombJpeg(64, 48, kMaxJpegScans, /*components=*/4);
  EXPECT_THAT(DecodeJpeg(P(bomb), {}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("more than 500 scans")));
}

TEST(JpegTest, TruncatedOrGarbageIsAnError) {
  std::string jpeg =
      testing::EncodeJpeg(testing::TestPixels(64, 64, 3), 64, 64);
  EXPECT_THAT(DecodeJpeg(P(jpeg.substr(0, jpeg.size() / 2)), {}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("JPEG")));
  EXPECT_THAT(DecodeJpeg(P("not a jpeg"), {}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("JPEG")));
  EXPECT_THAT(DecodeJpeg(P(""), {}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(PngTest, LosslessRoundTripForEveryChannelCount) {
  for (int channels = 1; channels <= 4; ++channels) {
    std::string pixels = testing::TestPixels(31, 17, channels, channels);
    std::string png = testing::EncodePng(pixels, 31, 17, channels);
    auto decoded = DecodePng(P(png), {});
    ASSERT_OK(decoded.status());
    EXPECT_THAT(decoded->shape, ElementsAre(17, 31, channels));
    EXPECT_EQ(decoded->bytes.bytes, pixels) << channels << " channels";
  }
}

TEST(PngTest, CenterCropIsExactAndPadsWhenLarger) {
  std::string pixels = testing::TestPixels(10, 6, 1);
  std::string png = testing::EncodePng(pixels, 10, 6, 1);
  auto crop = DecodePng(P(png), {0, 2, 4});
  ASSERT_OK(crop.status());
  EXPECT_THAT(crop->shape, ElementsAre(2, 4, 1));
  // top = round((6-2)/2) = 2, left = round((10-4)/2) = 3
  std::string want;
  for (int y = 2; y < 4; ++y) want += pixels.substr(y * 10 + 3, 4);
  EXPECT_EQ(crop->bytes.bytes, want);
  auto pad = DecodePng(P(png), {0, 8, 10});
  ASSERT_OK(pad.status());
  EXPECT_THAT(pad->shape, ElementsAre(8, 10, 1));
  EXPECT_EQ(pad->bytes.bytes.substr(0, 10), std::string(10, '\0'));
  EXPECT_EQ(pad->bytes.bytes.substr(10, 10), pixels.substr(0, 10));
}

TEST(PngTest, ResizeShorterSide) {
  std::string png =
      testing::EncodePng(testing::TestPixels(40, 20, 3), 40, 20, 3);
  auto up = DecodePng(P(png), {30, 0, 0});
  ASSERT_OK(up.status());
  EXPECT_THAT(up->shape, ElementsAre(30, 60, 3));
  EXPECT_THAT(DecodePng(P(png.substr(0, 40)), {}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("PNG")));
}

std::vector<uint16_t> Pixels16(int width, int height, int channels) {
  std::vector<uint16_t> v(static_cast<size_t>(width) * height * channels);
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = static_cast<uint16_t>(i * 9973 + 12345);
  return v;
}

// The tensor's bytes as uint16 values (little-endian).
std::vector<uint16_t> Values16(const DecodedField& f) {
  std::vector<uint16_t> v(f.bytes.bytes.size() / 2);
  for (size_t i = 0; i < v.size(); ++i) {
    v[i] = static_cast<uint16_t>(static_cast<uint8_t>(f.bytes.bytes[2 * i]) |
                                 static_cast<uint8_t>(f.bytes.bytes[2 * i + 1])
                                     << 8);
  }
  return v;
}

TEST(PngTest, SixteenBitSamplesAreKeptExactly) {
  // Depth maps and masks with more than 256 classes: reduced to 8 bits (and,
  // through libpng's simplified reader, companded by the sRGB curve) they
  // lose their values. A gAMA chunk must not change them either.
  for (int channels = 1; channels <= 4; ++channels) {
    for (double gamma : {0.0, 1 / 2.2}) {
      const std::vector<uint16_t> pixels = Pixels16(13, 7, channels);
      auto decoded = DecodePng(
          P(testing::EncodePng16(pixels, 13, 7, channels, gamma)), {});
      ASSERT_OK(decoded.status());
      EXPECT_EQ(decoded->dtype, v1::DTYPE_UINT16);
      EXPECT_THAT(decoded->shape, ElementsAre(7, 13, channels));
      EXPECT_EQ(Values16(*decoded), pixels)
          << channels << " channels, gamma " << gamma;
    }
  }
}

TEST(PngTest, SixteenBitCropAndResize) {
  const std::vector<uint16_t> pixels = Pixels16(10, 6, 1);
  const std::string png = testing::EncodePng16(pixels, 10, 6, 1);
  auto crop = DecodePng(P(png), {0, 2, 4});
  ASSERT_OK(crop.status());
  EXPECT_THAT(crop->shape, ElementsAre(2, 4, 1));
  std::vector<uint16_t> want;  // top 2, left 3, as for 8 bits
  for (int y = 2; y < 4; ++y) {
    for (int x = 3; x < 7; ++x) want.push_back(pixels[y * 10 + x]);
  }
  EXPECT_EQ(Values16(*crop), want);
  // A flat image stays flat (and 16-bit) through the resize.
  const std::vector<uint16_t> flat(40 * 20 * 3, 40000);
  auto resized =
      DecodePng(P(testing::EncodePng16(flat, 40, 20, 3)), {30, 0, 0});
  ASSERT_OK(resized.status());
  EXPECT_EQ(resized->dtype, v1::DTYPE_UINT16);
  EXPECT_THAT(resized->shape, ElementsAre(30, 60, 3));
  EXPECT_EQ(Values16(*resized), std::vector<uint16_t>(30 * 60 * 3, 40000));
}

// A PNG whose header claims width x height (RGBA, `depth` bits) over a few
// bytes of pixel data: a decompression bomb's header.
std::string PngClaiming(uint32_t width, uint32_t height, int depth) {
  auto be32 = [](uint32_t v) {
    return std::string{static_cast<char>(v >> 24), static_cast<char>(v >> 16),
                       static_cast<char>(v >> 8), static_cast<char>(v)};
  };
  auto chunk = [&](const std::string& type, const std::string& data) {
    std::string body = type + data;
    const uint32_t crc = static_cast<uint32_t>(
        crc32(0, reinterpret_cast<const Bytef*>(body.data()),
              static_cast<uInt>(body.size())));
    return be32(static_cast<uint32_t>(data.size())) + body + be32(crc);
  };
  std::string ihdr = be32(width) + be32(height);
  ihdr += {static_cast<char>(depth), 6, 0, 0, 0};
  std::string raw(100, '\0'), idat(200, '\0');
  uLongf n = idat.size();
  compress(reinterpret_cast<Bytef*>(idat.data()), &n,
           reinterpret_cast<const Bytef*>(raw.data()), raw.size());
  idat.resize(n);
  return std::string("\x89PNG\r\n\x1a\n", 8) + chunk("IHDR", ihdr) +
         chunk("IDAT", idat) + chunk("IEND", "");
}

TEST(PngTest, AHeaderClaimingAHugeImageIsAnErrorNotAnAllocation) {
  for (int depth : {8, 16}) {
    EXPECT_THAT(DecodePng(P(PngClaiming(900000, 900000, depth)), {}).status(),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("PNG")))
        << depth << " bits";
  }
}

TEST(PngTest, TruncatedSixteenBitIsAnError) {
  const std::string png = testing::EncodePng16(Pixels16(64, 64, 3), 64, 64, 3);
  for (size_t cut : {png.size() / 2, png.size() - 20}) {
    EXPECT_THAT(DecodePng(P(png.substr(0, cut)), {}).status(),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("undecodable PNG")))
        << cut;
  }
}

TEST(NpyTest, DtypesAndShapes) {
  struct Case {
    std::string descr;
    v1::DType dtype;
    int size;
  };
  for (const Case& c : std::vector<Case>{{"|u1", v1::DTYPE_UINT8, 1},
                                         {"<i2", v1::DTYPE_INT16, 2},
                                         {"<f4", v1::DTYPE_FLOAT32, 4},
                                         {"<i8", v1::DTYPE_INT64, 8},
                                         {"<f8", v1::DTYPE_FLOAT64, 8},
                                         {"|b1", v1::DTYPE_BOOL, 1}}) {
    std::string data(static_cast<size_t>(2 * 3 * c.size), '\x05');
    std::string npy = testing::MakeNpy(c.descr, {2, 3}, data);
    auto decoded = DecodeNpy(Payload{npy, nullptr});
    ASSERT_OK(decoded.status()) << c.descr;
    EXPECT_EQ(decoded->dtype, c.dtype);
    EXPECT_THAT(decoded->shape, ElementsAre(2, 3));
    EXPECT_EQ(decoded->bytes.bytes, data);
  }
  auto scalar =
      DecodeNpy(Payload{testing::MakeNpy("<f4", {}, "abcd"), nullptr});
  ASSERT_OK(scalar.status());
  EXPECT_TRUE(scalar->shape.empty());
  auto vec = DecodeNpy(
      Payload{testing::MakeNpy("<i4", {2}, std::string(8, 'x')), nullptr});
  ASSERT_OK(vec.status());
  EXPECT_THAT(vec->shape, ElementsAre(2));
}

TEST(NpyTest, FortranOrderAndBigEndianAreConverted) {
  // 2x3 Fortran order: column-major 0..5 -> C order 0,2,4,1,3,5.
  std::string col = {0, 1, 2, 3, 4, 5};
  auto f =
      DecodeNpy(Payload{testing::MakeNpy("|u1", {2, 3}, col, true), nullptr});
  ASSERT_OK(f.status());
  EXPECT_EQ(f->bytes.bytes, std::string({0, 2, 4, 1, 3, 5}));
  auto be = DecodeNpy(
      Payload{testing::MakeNpy(">i2", {2}, std::string("\x01\x02\x03\x04", 4)),
              nullptr});
  ASSERT_OK(be.status());
  EXPECT_EQ(be->dtype, v1::DTYPE_INT16);
  EXPECT_EQ(be->bytes.bytes, std::string("\x02\x01\x04\x03", 4));
}

TEST(NpyTest, BadInputIsAnError) {
  EXPECT_THAT(DecodeNpy(Payload{"garbage!!!!!", nullptr}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("magic")));
  EXPECT_THAT(DecodeNpy(Payload{testing::MakeNpy("<f4", {4}, "short"), nullptr})
                  .status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("promises 16 bytes")));
  EXPECT_THAT(
      DecodeNpy(Payload{testing::MakeNpy("<c8", {1}, "12345678"), nullptr})
          .status(),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("dtype")));
}

TEST(ScalarsTest, IntTextRaw) {
  auto cls = DecodeField(Codec::kInt, P(" 42\n"), {});
  ASSERT_OK(cls.status());
  EXPECT_EQ(cls->kind, DecodedField::Kind::kInt);
  EXPECT_EQ(cls->int_value, 42);
  EXPECT_THAT(
      DecodeField(Codec::kInt, P("x1"), {}).status(),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("integer")));
  auto text = DecodeField(Codec::kText, P("{\"a\": \"é\"}"), {});
  ASSERT_OK(text.status());
  EXPECT_EQ(text->kind, DecodedField::Kind::kText);
  EXPECT_EQ(text->bytes.bytes, "{\"a\": \"é\"}");
  EXPECT_THAT(DecodeField(Codec::kText, P("\xff\xfe"), {}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("UTF-8")));
  auto raw = DecodeField(Codec::kRaw, P("\x00\x01"), {});
  ASSERT_OK(raw.status());
  EXPECT_EQ(raw->kind, DecodedField::Kind::kRaw);
}

}  // namespace
}  // namespace sluice::dataserver
