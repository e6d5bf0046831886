// sluicectl replay: one audited sample served again with the augmentation
// draws it got (sluice::Replay, sluice/audit.h), written as .npy or .png,
// with a JSON sidecar of where it came from and what its transforms drew.
#include <google/protobuf/text_format.h>
#include <png.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/cli/cli.h"
#include "nlohmann/json.hpp"
#include "sluice/audit.h"

ABSL_DECLARE_FLAG(std::string, coordinator);
ABSL_DECLARE_FLAG(absl::Duration, timeout);
ABSL_DECLARE_FLAG(int32_t, rank);
ABSL_DECLARE_FLAG(int32_t, worker);
ABSL_DECLARE_FLAG(int64_t, epoch);
ABSL_DECLARE_FLAG(std::string, decode_spec);
ABSL_DECLARE_FLAG(bool, decode);
ABSL_DECLARE_FLAG(std::string, data_server);
ABSL_FLAG(int64_t, position, -1,
          "replay: the sample's position in the reader's order (with --rank, "
          "--worker).");
ABSL_FLAG(std::string, key, "",
          "replay: the sample's key (looked for over every reader of the "
          "epoch).");
ABSL_FLAG(std::string, out, "",
          "replay: write the tensor here (.npy, or .png for a uint8 image) "
          "and the sidecar to OUT.json.");
ABSL_FLAG(std::string, field, "",
          "replay: the field --out writes (default: the first tensor).");

namespace sluice::cli {
namespace {

const char* NpyType(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_UINT8:
      return "|u1";
    case v1::DTYPE_INT8:
      return "|i1";
    case v1::DTYPE_INT16:
      return "<i2";
    case v1::DTYPE_UINT16:
      return "<u2";
    case v1::DTYPE_INT32:
      return "<i4";
    case v1::DTYPE_UINT32:
      return "<u4";
    case v1::DTYPE_INT64:
      return "<i8";
    case v1::DTYPE_UINT64:
      return "<u8";
    case v1::DTYPE_FLOAT16:
      return "<f2";
    case v1::DTYPE_FLOAT32:
      return "<f4";
    case v1::DTYPE_FLOAT64:
      return "<f8";
    case v1::DTYPE_BOOL:
      return "|b1";
    default:
      return nullptr;
  }
}

// NumPy's .npy format, version 1.0: magic, header length, a Python dict
// literal padded to a multiple of 64 bytes, then the data in C order.
absl::Status WriteNpy(const std::string& path, const v1::Tensor& t) {
  const char* type = NpyType(t.dtype());
  if (type == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("replay: tensor dtype ",
                                                   v1::DType_Name(t.dtype()),
                                                   " has no .npy type"));
  }
  std::string shape = absl::StrJoin(t.shape(), ", ");
  if (t.shape_size() == 1) shape += ",";
  std::string header =
      absl::StrCat("{'descr': '", type, "', 'fortran_order': False, 'shape': (",
                   shape, "), }");
  const size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header.push_back('\n');
  std::string out("\x93NUMPY\x01\x00", 8);
  out.push_back(static_cast<char>(header.size() & 0xff));
  out.push_back(static_cast<char>(header.size() >> 8));
  out += header;
  out += t.data();
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(out.data(), static_cast<std::streamsize>(out.size()));
  if (!f.good()) return absl::InternalError("replay: cannot write " + path);
  return absl::OkStatus();
}

// A uint8 image, [H, W, C] or [C, H, W] with C of 1, 3 or 4, as a PNG.
absl::Status WritePng(const std::string& path, const v1::Tensor& t) {
  auto channels_ok = [](int64_t c) { return c == 1 || c == 3 || c == 4; };
  if (t.dtype() != v1::DTYPE_UINT8 || t.shape_size() != 3) {
    return absl::InvalidArgumentError(
        "replay: only a uint8 image of 3 dimensions can be a .png; write "
        ".npy");
  }
  const bool hwc = channels_ok(t.shape(2));
  const bool chw = !hwc && channels_ok(t.shape(0));
  if (!hwc && !chw) {
    return absl::InvalidArgumentError(
        "replay: the tensor is not an image of 1, 3 or 4 channels; write "
        ".npy");
  }
  const int64_t c = hwc ? t.shape(2) : t.shape(0);
  const int64_t h = hwc ? t.shape(0) : t.shape(1);
  const int64_t w = hwc ? t.shape(1) : t.shape(2);
  if (static_cast<int64_t>(t.data().size()) != c * h * w) {
    return absl::DataLossError("replay: tensor shape does not fit its bytes");
  }
  std::vector<unsigned char> pixels(t.data().size());
  for (int64_t y = 0; y < h; ++y) {
    for (int64_t x = 0; x < w; ++x) {
      for (int64_t k = 0; k < c; ++k) {
        pixels[(y * w + x) * c + k] = static_cast<unsigned char>(
            t.data()[hwc ? (y * w + x) * c + k : (k * h + y) * w + x]);
      }
    }
  }
  png_image image{};
  image.version = PNG_IMAGE_VERSION;
  image.width = static_cast<png_uint_32>(w);
  image.height = static_cast<png_uint_32>(h);
  image.format = c == 1   ? PNG_FORMAT_GRAY
                 : c == 3 ? PNG_FORMAT_RGB
                          : PNG_FORMAT_RGBA;
  if (png_image_write_to_file(&image, path.c_str(), 0, pixels.data(), 0,
                              nullptr) == 0) {
    return absl::InternalError(
        absl::StrCat("replay: writing ", path, ": ", image.message));
  }
  return absl::OkStatus();
}

nlohmann::ordered_json Sidecar(const ReplayOptions& o, const ReplayResult& r) {
  nlohmann::ordered_json j;
  j["job"] = o.job;
  j["epoch"] = o.epoch;
  j["rank"] = r.rank;
  j["worker"] = r.worker;
  j["position"] = r.audited.position;
  j["key"] = r.audited.key;
  if (!r.audited.source.empty()) j["source"] = r.audited.source;
  j["shard"] = r.audited.shard_index;
  j["url"] = r.audited.shard_url;
  j["index"] = r.audited.index;
  j["unit"] = r.audited.unit;
  j["data_server"] = r.data_server;
  const v1::ReplayedSample& p = r.replayed;
  AddDrawsJson(p.draws(), j);
  nlohmann::ordered_json fields = nlohmann::ordered_json::object();
  for (const v1::Field& f : p.sample().fields()) {
    if (f.has_tensor()) {
      fields[f.name()] = {
          {"dtype", v1::DType_Name(f.tensor().dtype())},
          {"shape", std::vector<int64_t>(f.tensor().shape().begin(),
                                         f.tensor().shape().end())}};
    } else if (f.has_int_value()) {
      fields[f.name()] = f.int_value();
    } else if (f.has_text()) {
      fields[f.name()] = f.text();
    } else {
      fields[f.name()] = {{"bytes", f.raw().size()}};
    }
  }
  j["fields"] = std::move(fields);
  if (p.sample().skipped()) j["skip_reason"] = p.sample().skip_reason();
  return j;
}

}  // namespace

int ReplayCommand(const std::vector<std::string>& args) {
  if (args.size() != 1) {
    return Usage(
        "replay takes one job name (sluicectl replay JOB --epoch E --key K)");
  }
  ReplayOptions o;
  o.coordinator = absl::GetFlag(FLAGS_coordinator);
  o.tls = ClientTlsOrNone();
  o.timeout = absl::GetFlag(FLAGS_timeout);
  o.job = args[0];
  o.epoch = absl::GetFlag(FLAGS_epoch);
  if (o.epoch < 0) return Usage("replay: --epoch is required (0 or more)");
  o.rank = absl::GetFlag(FLAGS_rank);
  o.worker = absl::GetFlag(FLAGS_worker);
  o.position = absl::GetFlag(FLAGS_position);
  o.key = absl::GetFlag(FLAGS_key);
  if ((o.position < 0) == o.key.empty())
    return Usage("replay: give --key, or --position (with --rank, --worker)");
  o.data_server = absl::GetFlag(FLAGS_data_server);
  if (const std::string spec = absl::GetFlag(FLAGS_decode_spec);
      !spec.empty()) {
    google::protobuf::TextFormat::Parser parser;
    if (!parser.ParseFromString(spec, &o.decode))
      return Usage("replay: --decode_spec is not a sluice.v1.DecodeSpec");
    o.decode.set_decode(true);
  }
  if (absl::GetFlag(FLAGS_decode)) o.decode.set_decode(true);
  const std::string out = absl::GetFlag(FLAGS_out);
  const bool png = absl::EndsWith(out, ".png");
  if (!out.empty() && !png && !absl::EndsWith(out, ".npy"))
    return Usage("replay: --out must end in .npy or .png");

  absl::StatusOr<ReplayResult> r = Replay(o);
  if (!r.ok()) {
    return Fail(absl::Status(
        r.status().code(),
        "replay " + o.job + ": " + std::string(r.status().message())));
  }
  const nlohmann::ordered_json sidecar = Sidecar(o, *r);
  const std::string text =
      sidecar.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) +
      "\n";
  if (out.empty()) {
    std::fputs(text.c_str(), stdout);
    return kOk;
  }
  const std::string wanted = absl::GetFlag(FLAGS_field);
  const v1::Tensor* tensor = nullptr;
  for (const v1::Field& f : r->replayed.sample().fields()) {
    if (f.has_tensor() && (wanted.empty() || f.name() == wanted)) {
      tensor = &f.tensor();
      break;
    }
  }
  if (tensor == nullptr) {
    return Fail(absl::NotFoundError(
        absl::StrCat("replay: the sample has no tensor field",
                     wanted.empty() ? "" : " named " + wanted,
                     " (decode it: --decode or --decode_spec)")));
  }
  absl::Status written = png ? WritePng(out, *tensor) : WriteNpy(out, *tensor);
  if (!written.ok()) return Fail(written);
  std::ofstream side(out + ".json", std::ios::trunc);
  side << text;
  if (!side.good())
    return Fail(absl::InternalError("cannot write " + out + ".json"));
  std::fprintf(stderr, "sluicectl replay: wrote %s and %s.json\n", out.c_str(),
               out.c_str());
  return kOk;
}

}  // namespace sluice::cli
