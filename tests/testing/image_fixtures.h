// Test images and arrays: deterministic pixels, JPEG via TurboJPEG, PNG via
// libpng's simplified writer, .npy bytes.
#ifndef SLUICE_TESTS_TESTING_IMAGE_FIXTURES_H_
#define SLUICE_TESTS_TESTING_IMAGE_FIXTURES_H_

#include <cstdint>
#include <string>
#include <vector>

namespace sluice::testing {

// width x height x channels bytes of a smooth gradient with some texture.
std::string TestPixels(int width, int height, int channels, int seed = 0);
std::string EncodeJpeg(const std::string& rgb, int width, int height,
                       int quality = 90);
// channels: 1 gray, 2 gray+alpha, 3 RGB, 4 RGBA.
std::string EncodePng(const std::string& pixels, int width, int height,
                      int channels);
// A PNG with 16 bits per sample written with libpng's low-level writer:
// `pixels` are HWC values; `gamma` > 0 adds a gAMA chunk (a reader that
// applied it would change the values).
std::string EncodePng16(const std::vector<uint16_t>& pixels, int width,
                        int height, int channels, double gamma = 0);
// A progressive JPEG whose first scan sets every DC coefficient to 0 and
// whose `ac_scans` further scans each repeat the same (valid) first AC scan
// of the first component, every block's coefficients zero (end-of-band
// runs): a few bytes per scan, a pass over every block per scan to decode.
// Grey with `components` 1; CMYK as Adobe writes it (an APP14 marker, no
// colour transform) with `components` 4.
std::string ScanBombJpeg(int width, int height, int ac_scans,
                         int components = 1);
// A .npy file (format 1.0) with the given descr ("<f4"), shape and raw data.
std::string MakeNpy(const std::string& descr, const std::vector<int64_t>& shape,
                    const std::string& data, bool fortran_order = false);

}  // namespace sluice::testing

#endif  // SLUICE_TESTS_TESTING_IMAGE_FIXTURES_H_
