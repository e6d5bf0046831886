#include "server/dataserver/image_transforms.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

extern "C" {
#include <libswscale/swscale.h>
}
#include <Imath/half.h>
#include <libyuv/planar_functions.h>

#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "server/common/status_macros.h"
#include "server/dataserver/pil_resample.h"

namespace sluice::dataserver {
namespace {

// Largest output side a transform may ask for.
constexpr int kMaxSide = 16384;
constexpr int kMaxTransforms = SampleRandom::kMaxPositions;
constexpr int kAttempts = 10;  // torchvision's RandomResizedCrop

absl::Status Invalid(const std::string& field, absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat(field, " ", problem));
}

absl::Status CheckSide(const std::string& field, int value, bool zero_ok) {
  if (value < (zero_ok ? 0 : 1) || value > kMaxSide) {
    return Invalid(field, absl::StrCat("is ", value, "; it must be in [",
                                       zero_ok ? 0 : 1, ", ", kMaxSide, "]"));
  }
  return absl::OkStatus();
}

// Python's round(): halves to even (the default floating-point rounding).
int RoundHalfEven(double v) { return static_cast<int>(std::nearbyint(v)); }

// Floor division as Python's // for a possibly negative numerator.
int FloorDiv(int a, int b) {
  return static_cast<int>(std::floor(static_cast<double>(a) / b));
}

}  // namespace

ImageBuffer AllocateImage(int width, int height, int channels,
                          int sample_bytes) {
  ImageBuffer image;
  image.width = width;
  image.height = height;
  image.channels = channels;
  image.sample_bytes = sample_bytes;
  image.stride = static_cast<size_t>(width) * channels * sample_bytes;
  const size_t bytes = std::max<size_t>(image.stride * height, 1);
  image.owner = std::shared_ptr<uint8_t>(new uint8_t[bytes],
                                         std::default_delete<uint8_t[]>());
  image.data = image.owner.get();
  return image;
}

absl::StatusOr<ImageTransforms> ImageTransforms::FromSpec(
    const v1::DecodeSpec& spec) {
  ImageTransforms t;
  const bool legacy = spec.resize_shorter_side() != 0 ||
                      spec.crop_height() != 0 || spec.crop_width() != 0;
  if (legacy && spec.transforms_size() > 0) {
    return Invalid(
        "decode.transforms",
        "cannot be combined with decode.resize_shorter_side / crop_height / "
        "crop_width (put Resize and CenterCrop in the list)");
  }
  if (legacy) {
    if (absl::Status s = CheckSide("decode.resize_shorter_side",
                                   spec.resize_shorter_side(), true);
        !s.ok()) {
      return s;
    }
    if (absl::Status s =
            CheckSide("decode.crop_height", spec.crop_height(), true);
        !s.ok()) {
      return s;
    }
    if (absl::Status s =
            CheckSide("decode.crop_width", spec.crop_width(), true);
        !s.ok())
      return s;
    if ((spec.crop_height() == 0) != (spec.crop_width() == 0)) {
      return absl::InvalidArgumentError(
          "decode.crop_height and decode.crop_width must be set together");
    }
    if (spec.resize_shorter_side() > 0) {
      Op op{Op::Kind::kResize};
      op.shorter_side = spec.resize_shorter_side();
      t.ops_.push_back(op);
    }
    if (spec.crop_height() > 0) {
      Op op{Op::Kind::kCenterCrop};
      op.height = spec.crop_height();
      op.width = spec.crop_width();
      t.ops_.push_back(op);
    }
  }
  if (spec.transforms_size() > kMaxTransforms) {
    return Invalid("decode.transforms",
                   absl::StrCat("has ", spec.transforms_size(),
                                " entries; at most ", kMaxTransforms));
  }
  for (int i = 0; i < spec.transforms_size(); ++i) {
    const v1::Transform& tr = spec.transforms(i);
    const std::string field = absl::StrCat("decode.transforms[", i, "]");
    switch (tr.op_case()) {
      case v1::Transform::kResize: {
        const v1::Resize& r = tr.resize();
        Op op{Op::Kind::kResize};
        if (r.shorter_side() != 0) {
          if (r.height() != 0 || r.width() != 0) {
            return Invalid(field + ".resize",
                           "sets shorter_side and height/width; give one");
          }
          if (absl::Status s = CheckSide(field + ".resize.shorter_side",
                                         r.shorter_side(), false);
              !s.ok()) {
            return s;
          }
          op.shorter_side = r.shorter_side();
        } else {
          if (absl::Status s =
                  CheckSide(field + ".resize.height", r.height(), false);
              !s.ok()) {
            return s;
          }
          if (absl::Status s =
                  CheckSide(field + ".resize.width", r.width(), false);
              !s.ok()) {
            return s;
          }
          op.height = r.height();
          op.width = r.width();
        }
        t.ops_.push_back(op);
        break;
      }
      case v1::Transform::kCenterCrop: {
        const v1::CenterCrop& c = tr.center_crop();
        if (absl::Status s =
                CheckSide(field + ".center_crop.height", c.height(), false);
            !s.ok()) {
          return s;
        }
        if (absl::Status s =
                CheckSide(field + ".center_crop.width", c.width(), false);
            !s.ok()) {
          return s;
        }
        Op op{Op::Kind::kCenterCrop};
        op.height = c.height();
        op.width = c.width();
        t.ops_.push_back(op);
        break;
      }
      case v1::Transform::kRandomResizedCrop: {
        const v1::RandomResizedCrop& c = tr.random_resized_crop();
        const std::string f = field + ".random_resized_crop";
        if (absl::Status s = CheckSide(f + ".height", c.height(), false);
            !s.ok())
          return s;
        if (absl::Status s = CheckSide(f + ".width", c.width(), false); !s.ok())
          return s;
        Op op{Op::Kind::kRandomResizedCrop};
        op.height = c.height();
        op.width = c.width();
        op.scale_min = c.scale_min();
        op.scale_max = c.scale_max();
        if (op.scale_min == 0 && op.scale_max == 0) {
          op.scale_min = 0.08;
          op.scale_max = 1.0;
        }
        op.ratio_min = c.ratio_min();
        op.ratio_max = c.ratio_max();
        if (op.ratio_min == 0 && op.ratio_max == 0) {
          op.ratio_min = 3.0 / 4.0;
          op.ratio_max = 4.0 / 3.0;
        }
        if (!(op.scale_min > 0 && op.scale_min <= 1)) {
          return Invalid(
              f + ".scale_min",
              absl::StrCat("is ", op.scale_min, "; it must be in (0, 1]"));
        }
        if (!(op.scale_max > 0 && op.scale_max <= 1)) {
          return Invalid(
              f + ".scale_max",
              absl::StrCat("is ", op.scale_max, "; it must be in (0, 1]"));
        }
        if (op.scale_min > op.scale_max) {
          return Invalid(
              f + ".scale_min",
              absl::StrCat("(", op.scale_min, ") is greater than scale_max (",
                           op.scale_max, ")"));
        }
        if (!(op.ratio_min > 0 && std::isfinite(op.ratio_min))) {
          return Invalid(f + ".ratio_min",
                         absl::StrCat("is ", op.ratio_min, "; it must be > 0"));
        }
        if (!(op.ratio_max > 0 && std::isfinite(op.ratio_max))) {
          return Invalid(f + ".ratio_max",
                         absl::StrCat("is ", op.ratio_max, "; it must be > 0"));
        }
        if (op.ratio_min > op.ratio_max) {
          return Invalid(
              f + ".ratio_min",
              absl::StrCat("(", op.ratio_min, ") is greater than ratio_max (",
                           op.ratio_max, ")"));
        }
        t.ops_.push_back(op);
        t.random_ = true;
        break;
      }
      case v1::Transform::kHorizontalFlip:
      case v1::Transform::kVerticalFlip: {
        const bool horizontal = tr.op_case() == v1::Transform::kHorizontalFlip;
        const float p =
            horizontal ? tr.horizontal_flip().p() : tr.vertical_flip().p();
        if (!(p >= 0 && p <= 1)) {
          return Invalid(
              field + (horizontal ? ".horizontal_flip.p" : ".vertical_flip.p"),
              absl::StrCat("is ", p, "; it must be in [0, 1]"));
        }
        Op op{horizontal ? Op::Kind::kHorizontalFlip : Op::Kind::kVerticalFlip};
        op.p = p;
        t.ops_.push_back(op);
        t.random_ = true;
        break;
      }
      case v1::Transform::OP_NOT_SET:
        return Invalid(field, "sets no transform");
    }
  }
  if (!v1::ImageLayout_IsValid(spec.layout())) {
    return Invalid("decode.layout",
                   absl::StrCat("is ", spec.layout(), "; not a layout"));
  }
  t.chw_ = spec.layout() == v1::IMAGE_LAYOUT_CHW;
  const v1::ToFloat& f = spec.to_float();
  if (!f.enabled() && (f.mean_size() > 0 || f.std_size() > 0 || f.half())) {
    return Invalid("decode.to_float", "sets mean, std or half without enabled");
  }
  t.to_float_ = f.enabled();
  t.half_ = f.half();
  if (f.mean_size() != f.std_size()) {
    return Invalid(
        "decode.to_float.mean",
        absl::StrCat("has ", f.mean_size(), " values and std ", f.std_size(),
                     "; give one per channel in both"));
  }
  if (f.mean_size() > 4) {
    return Invalid("decode.to_float.mean",
                   absl::StrCat("has ", f.mean_size(),
                                " values; images have at most 4 channels"));
  }
  for (int c = 0; c < f.std_size(); ++c) {
    if (!(f.std(c) != 0 && std::isfinite(f.std(c)))) {
      return Invalid(
          absl::StrCat("decode.to_float.std[", c, "]"),
          absl::StrCat("is ", f.std(c), "; it must be finite and non-zero"));
    }
    if (!std::isfinite(f.mean(c))) {
      return Invalid(absl::StrCat("decode.to_float.mean[", c, "]"),
                     "must be finite");
    }
  }
  t.mean_.assign(f.mean().begin(), f.mean().end());
  t.std_.assign(f.std().begin(), f.std().end());
  for (const std::string& name : spec.nearest_fields()) {
    if (name.empty() || name.size() > 256) {
      return Invalid("decode.nearest_fields", "has an empty or over-long name");
    }
    t.nearest_.insert(name);
  }
  t.exact_pixels_ = spec.exact_pixels();
  return t;
}

bool ImageTransforms::identity() const {
  return ops_.empty() && !chw_ && !to_float_;
}

Interpolation ImageTransforms::InterpolationFor(absl::string_view field) const {
  return nearest_.contains(field) ? Interpolation::kNearest
                                  : Interpolation::kBilinear;
}

Geometry ImageTransforms::Plan(int width, int height,
                               const SampleRandom& random) const {
  Geometry g;
  int w = width, h = height;
  // Flips commute with crops and resizes once crop windows are mirrored:
  // they are applied last, to the output.
  auto crop = [&](int left, int top, int cw, int ch) {
    if (g.flip_horizontal) left = w - left - cw;
    if (g.flip_vertical) top = h - top - ch;
    g.steps.push_back({GeometryStep::Kind::kCrop, left, top, cw, ch});
    w = cw;
    h = ch;
  };
  auto resize = [&](int rw, int rh) {
    if (rw != w || rh != h)
      g.steps.push_back({GeometryStep::Kind::kResize, 0, 0, rw, rh});
    w = rw;
    h = rh;
  };
  for (size_t position = 0; position < ops_.size(); ++position) {
    const Op& op = ops_[position];
    switch (op.kind) {
      case Op::Kind::kResize:
        if (op.shorter_side > 0) {
          int rw = 0, rh = 0;
          ResizedSize(w, h, op.shorter_side, &rw, &rh);
          resize(rw, rh);
        } else {
          resize(op.width, op.height);
        }
        break;
      case Op::Kind::kCenterCrop: {
        // torchvision: pad (left/top by floor of half the shortfall), then
        // top = round((H - ch) / 2) on the padded image.
        const int left = op.width > w ? -FloorDiv(op.width - w, 2)
                                      : RoundHalfEven((w - op.width) / 2.0);
        const int top = op.height > h ? -FloorDiv(op.height - h, 2)
                                      : RoundHalfEven((h - op.height) / 2.0);
        crop(left, top, op.width, op.height);
        break;
      }
      case Op::Kind::kRandomResizedCrop: {
        const double area = static_cast<double>(w) * h;
        const double log_min = std::log(op.ratio_min),
                     log_max = std::log(op.ratio_max);
        bool found = false;
        int cl = 0, ct = 0, cw = 0, ch = 0;
        for (int attempt = 0; attempt < kAttempts && !found; ++attempt) {
          const auto words = random.Words(static_cast<int>(position), attempt);
          const double target =
              area * (op.scale_min + (op.scale_max - op.scale_min) *
                                         SampleRandom::Unit(words[0]));
          const double aspect = std::exp(
              log_min + (log_max - log_min) * SampleRandom::Unit(words[1]));
          const int tw = RoundHalfEven(std::sqrt(target * aspect));
          const int th = RoundHalfEven(std::sqrt(target / aspect));
          if (tw > 0 && tw <= w && th > 0 && th <= h) {
            ct = static_cast<int>(SampleRandom::Unit(words[2]) * (h - th + 1));
            cl = static_cast<int>(SampleRandom::Unit(words[3]) * (w - tw + 1));
            cw = tw;
            ch = th;
            found = true;
          }
        }
        if (!found) {  // the central fallback
          const double in_ratio = static_cast<double>(w) / h;
          if (in_ratio < op.ratio_min) {
            cw = w;
            ch = RoundHalfEven(cw / op.ratio_min);
          } else if (in_ratio > op.ratio_max) {
            ch = h;
            cw = RoundHalfEven(ch * op.ratio_max);
          } else {
            cw = w;
            ch = h;
          }
          ct = (h - ch) / 2;
          cl = (w - cw) / 2;
        }
        crop(cl, ct, cw, ch);
        resize(op.width, op.height);
        break;
      }
      case Op::Kind::kHorizontalFlip:
      case Op::Kind::kVerticalFlip: {
        const double u =
            SampleRandom::Unit(random.Words(static_cast<int>(position), 0)[0]);
        if (u < op.p) {
          bool& flag = op.kind == Op::Kind::kHorizontalFlip ? g.flip_horizontal
                                                            : g.flip_vertical;
          flag = !flag;
        }
        break;
      }
    }
  }
  return g;
}

Geometry ImageTransforms::ScaleTo(const Geometry& geometry, int width,
                                  int height, int other_width,
                                  int other_height) {
  if (width == other_width && height == other_height) return geometry;
  Geometry g = geometry;
  const double sx = static_cast<double>(other_width) / width;
  const double sy = static_cast<double>(other_height) / height;
  for (GeometryStep& s : g.steps) {
    if (s.kind == GeometryStep::Kind::kResize) break;
    const int right = static_cast<int>(std::lround((s.left + s.width) * sx));
    const int bottom = static_cast<int>(std::lround((s.top + s.height) * sy));
    s.left = static_cast<int>(std::lround(s.left * sx));
    s.top = static_cast<int>(std::lround(s.top * sy));
    s.width = std::max(1, right - s.left);
    s.height = std::max(1, bottom - s.top);
  }
  return g;
}

ImageBuffer CropImage(const ImageBuffer& image, int left, int top, int width,
                      int height) {
  const size_t pixel = static_cast<size_t>(image.channels) * image.sample_bytes;
  if (left >= 0 && top >= 0 && left + width <= image.width &&
      top + height <= image.height) {
    ImageBuffer view = image;
    view.data =
        image.data + static_cast<size_t>(top) * image.stride + left * pixel;
    view.width = width;
    view.height = height;
    return view;
  }
  ImageBuffer out =
      AllocateImage(width, height, image.channels, image.sample_bytes);
  uint8_t* dst = out.owner.get();
  std::memset(dst, 0, out.stride * height);
  const int x0 = std::max(0, -left), x1 = std::min(width, image.width - left);
  for (int y = 0; y < height && x1 > x0; ++y) {
    const int sy = y + top;
    if (sy < 0 || sy >= image.height) continue;
    std::memcpy(dst + y * out.stride + x0 * pixel,
                image.data + sy * image.stride + (x0 + left) * pixel,
                (x1 - x0) * pixel);
  }
  return out;
}

namespace {

// Nearest neighbour as PIL's NEAREST: source = floor((x + 0.5) * in / out).
ImageBuffer ResizeNearest(const ImageBuffer& image, int width, int height) {
  ImageBuffer out =
      AllocateImage(width, height, image.channels, image.sample_bytes);
  const size_t pixel = static_cast<size_t>(image.channels) * image.sample_bytes;
  std::vector<int> xs(width);
  for (int x = 0; x < width; ++x) {
    xs[x] = std::min(image.width - 1,
                     static_cast<int>((x + 0.5) * image.width / width));
  }
  uint8_t* dst = out.owner.get();
  for (int y = 0; y < height; ++y) {
    const int sy = std::min(
        image.height - 1, static_cast<int>((y + 0.5) * image.height / height));
    const uint8_t* row = image.data + sy * image.stride;
    uint8_t* d = dst + y * out.stride;
    for (int x = 0; x < width; ++x)
      std::memcpy(d + x * pixel, row + xs[x] * pixel, pixel);
  }
  return out;
}

struct SwsCache {
  SwsContext* context = nullptr;
  ~SwsCache() { sws_freeContext(context); }
};

// PIL's bilinear weights along one axis of `in` source samples resized to
// `out` (PilFilterWeights), as floats, for every output index.
struct AxisTaps {
  int max_taps = 0;
  std::vector<int> first;      // per index: the first source sample
  std::vector<int> count;      // per index: taps used
  std::vector<float> weights;  // per index: max_taps weights
};

// Fills `taps` (its vectors' capacity reused: no allocation per image once
// warm).
void PilBilinearTaps(int in, int out, AxisTaps* out_taps) {
  AxisTaps& taps = *out_taps;
  taps.max_taps = PilFilterSize(in, out);
  taps.first.resize(out);
  taps.count.resize(out);
  taps.weights.assign(static_cast<size_t>(out) * taps.max_taps, 0.0f);
  thread_local std::vector<double> w;
  w.resize(taps.max_taps);
  for (int k = 0; k < out; ++k) {
    PilFilterWeights(in, out, k, &taps.first[k], &taps.count[k], w.data());
    for (int i = 0; i < taps.count[k]; ++i) {
      taps.weights[static_cast<size_t>(k) * taps.max_taps + i] =
          static_cast<float>(w[i]);
    }
  }
}

// How many output indices at the start (`*low`) and at the end (`*high`)
// of an axis have a PIL filter cut off by the image's edge.
void TruncatedEnds(int in, int out, int* low, int* high) {
  const double scale = static_cast<double>(in) / out;
  const double support = std::max(scale, 1.0);
  *low = 0;
  while (*low < out && (*low + 0.5) * scale - support + 0.5 < 0) ++*low;
  *high = 0;
  while (*high < out - *low &&
         (out - 1 - *high + 0.5) * scale + support + 0.5 > in) {
    ++*high;
  }
}

// Whether `crop` lies inside a width x height image (no padding).
bool CropInside(const GeometryStep& crop, int width, int height) {
  return crop.kind == GeometryStep::Kind::kCrop && crop.left >= 0 &&
         crop.top >= 0 && crop.width > 0 && crop.height > 0 &&
         crop.left + crop.width <= width && crop.top + crop.height <= height;
}

// Whether resize step `i` of `geometry`, on `image`, needs PIL's exact
// edge pixels: not when a crop right after it drops every edge pixel
// (Resize + CenterCrop).
bool ExactEdgesNeeded(const ImageBuffer& image, const Geometry& geometry,
                      size_t i) {
  if (i + 1 >= geometry.steps.size() ||
      geometry.steps[i + 1].kind != GeometryStep::Kind::kCrop) {
    return true;
  }
  const GeometryStep& s = geometry.steps[i];
  const GeometryStep& crop = geometry.steps[i + 1];
  int x_low, x_high, y_low, y_high;
  TruncatedEnds(image.width, s.width, &x_low, &x_high);
  TruncatedEnds(image.height, s.height, &y_low, &y_high);
  return !(crop.left >= x_low && crop.top >= y_low &&
           crop.left + crop.width <= s.width - x_high &&
           crop.top + crop.height <= s.height - y_high);
}

uint16_t RoundClip16(float v, float max_value) {
  return static_cast<uint16_t>(std::min(max_value, std::max(0.0f, v + 0.5f)));
}

// PIL's taps for resizing an in_width x in_height image to out_width x
// out_height, and how many output rows and columns at each end an edge cuts
// off: computed once per size and shared by the image's planes.
struct EdgeTaps {
  int in_width = 0, in_height = 0, out_width = 0, out_height = 0;
  int x_low = 0, x_high = 0, y_low = 0, y_high = 0;
  AxisTaps xs, ys;

  bool any() const { return x_low + x_high + y_low + y_high != 0; }
};

// The taps for these sizes: `cache` itself when it already holds them
// (every image of an eval transform has the same sizes), else refilled.
const EdgeTaps& EdgeTapsFor(int in_width, int in_height, int out_width,
                            int out_height, EdgeTaps* cache) {
  EdgeTaps& t = *cache;
  if (t.in_width == in_width && t.in_height == in_height &&
      t.out_width == out_width && t.out_height == out_height) {
    return t;
  }
  t.in_width = in_width;
  t.in_height = in_height;
  t.out_width = out_width;
  t.out_height = out_height;
  TruncatedEnds(in_width, out_width, &t.x_low, &t.x_high);
  TruncatedEnds(in_height, out_height, &t.y_low, &t.y_high);
  if (t.any()) {
    PilBilinearTaps(in_width, out_width, &t.xs);
    PilBilinearTaps(in_height, out_height, &t.ys);
  }
  return t;
}

// Rewrites the output pixels whose filter an edge of `in` cuts off the way
// PIL (and torchvision's antialiased bilinear) computes them: the truncated
// filter renormalised over the pixels inside, a horizontal pass rounded to
// the sample type, then a vertical one. libswscale instead repeats the edge
// pixel, up to 16 levels away on the outermost rows and columns; the
// interior is libswscale's (within a level or two of PIL's). `taps`: from
// EdgeTapsFor for in's size and out's. `in` and `out` are 16-bit planes
// (8-bit ones are Pillow's everywhere already); `out_data`: the writable
// samples of `out_shape` (its shape and stride).
void MatchPilAtEdges(const ImageBuffer& in, uint8_t* out_data,
                     const ImageBuffer& out_shape, const EdgeTaps& taps) {
  const ImageBuffer* out = &out_shape;
  const int c = in.channels;
  const int w = out->width, h = out->height;
  constexpr float max_value = 65535.0f;
  const int x_low = taps.x_low, x_high = taps.x_high;
  const int y_low = taps.y_low, y_high = taps.y_high;
  if (!taps.any()) return;
  const AxisTaps& xs = taps.xs;
  const AxisTaps& ys = taps.ys;
  // Per-thread scratch: the data path allocates nothing here once warm.
  thread_local std::vector<float> band, column;
  auto in_row = [&](int y) {
    return reinterpret_cast<const uint16_t*>(in.data + y * in.stride);
  };
  auto out_row = [&](int y) {
    return reinterpret_cast<uint16_t*>(out_data + y * out->stride);
  };
  // The horizontal pass of source row `sy` at output column x, rounded.
  auto horizontal = [&](int sy, int x, int ch) {
    const uint16_t* row = in_row(sy);
    const float* wx = &xs.weights[static_cast<size_t>(x) * xs.max_taps];
    const int first = xs.first[x];
    float v = 0;
    for (int i = 0; i < xs.count[x]; ++i)
      v += wx[i] * row[(first + i) * c + ch];
    return static_cast<float>(RoundClip16(v, max_value));
  };
  // Edge rows: every column.
  for (int y = 0; y < h; ++y) {
    if (y >= y_low && y < h - y_high) continue;
    const int n = ys.count[y], first = ys.first[y];
    const float* wy = &ys.weights[static_cast<size_t>(y) * ys.max_taps];
    band.assign(static_cast<size_t>(n) * w * c, 0.0f);
    for (int j = 0; j < n; ++j) {
      for (int x = 0; x < w; ++x) {
        for (int ch = 0; ch < c; ++ch) {
          band[(static_cast<size_t>(j) * w + x) * c + ch] =
              horizontal(first + j, x, ch);
        }
      }
    }
    uint16_t* o = out_row(y);
    for (int x = 0; x < w; ++x) {
      for (int ch = 0; ch < c; ++ch) {
        float v = 0;
        for (int j = 0; j < n; ++j) {
          v += wy[j] * band[(static_cast<size_t>(j) * w + x) * c + ch];
        }
        o[x * c + ch] = RoundClip16(v, max_value);
      }
    }
  }
  // Edge columns of the other rows: each column's horizontal pass over
  // every source row once, then the vertical passes.
  column.resize(static_cast<size_t>(in.height) * c);
  for (int x = 0; x < w; ++x) {
    if (x >= x_low && x < w - x_high) continue;
    for (int sy = 0; sy < in.height; ++sy) {
      for (int ch = 0; ch < c; ++ch) {
        column[static_cast<size_t>(sy) * c + ch] = horizontal(sy, x, ch);
      }
    }
    for (int y = y_low; y < h - y_high; ++y) {
      const int n = ys.count[y], first = ys.first[y];
      const float* wy = &ys.weights[static_cast<size_t>(y) * ys.max_taps];
      for (int ch = 0; ch < c; ++ch) {
        float v = 0;
        for (int j = 0; j < n; ++j) {
          v += wy[j] * column[static_cast<size_t>(first + j) * c + ch];
        }
        out_row(y)[x * c + ch] = RoundClip16(v, max_value);
      }
    }
  }
}

// One buffer of `channels` planes of width x height samples, packed one
// after another (CHW), and a view of each plane.
struct Planes {
  std::shared_ptr<uint8_t> owner;
  std::vector<ImageBuffer> planes;
};

Planes AllocatePlanes(int width, int height, int channels, int sample_bytes) {
  ImageBuffer all = AllocateImage(width, height * channels, 1, sample_bytes);
  Planes out;
  out.owner = all.owner;
  const size_t plane = static_cast<size_t>(width) * height * sample_bytes;
  for (int ch = 0; ch < channels; ++ch) {
    ImageBuffer p = all;
    p.data = all.data + ch * plane;
    p.height = height;
    out.planes.push_back(p);
  }
  return out;
}

// `image`'s channels as planes (16-bit images: the 8-bit resize splits
// RGB as it transposes, pil_resample.h).
Planes SplitPlanes(const ImageBuffer& image) {
  const int c = image.channels, sb = image.sample_bytes;
  const int w = image.width, h = image.height;
  Planes out = AllocatePlanes(w, h, c, sb);
  for (int ch = 0; ch < c; ++ch) {
    uint8_t* plane = const_cast<uint8_t*>(out.planes[ch].data);  // out owns it
    for (int y = 0; y < h; ++y) {
      const uint8_t* row = image.data + y * image.stride + ch * sb;
      uint8_t* d = plane + static_cast<size_t>(y) * w * sb;
      for (int x = 0; x < w; ++x) std::memcpy(d + x * sb, row + x * c * sb, sb);
    }
  }
  return out;
}

// `image`'s channels as planes: the image itself when it has one channel.
Planes PlanesOf(const ImageBuffer& image) {
  if (image.channels > 1) return SplitPlanes(image);
  Planes one;
  one.planes.push_back(image);
  return one;
}

// The window (left, top, window_width x window_height; inside width x
// height) of an 8-bit `image` resized to width x height, as one plane per
// channel: only the pixels the window needs are computed
// (pil_resample.h), the bytes those of the whole resize cropped.
std::vector<ImageBuffer> ResizeWindowToPlanes(const ImageBuffer& image,
                                              int width, int height, int left,
                                              int top, int window_width,
                                              int window_height,
                                              bool mirror = false) {
  Planes out = AllocatePlanes(window_width, window_height, image.channels, 1);
  absl::InlinedVector<uint8_t*, 4> to;  // no allocation per image
  for (const ImageBuffer& plane : out.planes) {
    to.push_back(const_cast<uint8_t*>(plane.data));  // out owns them
  }
  PilResizeWindow(image.data, image.stride, image.channels, image.width,
                  image.height, to.data(), out.planes[0].stride, width, height,
                  left, top, window_width, window_height, mirror);
  return std::move(out.planes);
}

// Antialiased bilinear resize of `image` (at least 2x2) to width x height,
// written as one plane per channel, any channel count. 8-bit samples:
// Pillow's resize on each plane (pil_resample.h), every byte Pillow's.
// 16-bit: libswscale on each GRAY16LE plane, whose SWS_BILINEAR widens its
// filter by the downscaling factor as PIL's bilinear does; with
// `exact_edges`, the pixels whose filter an edge cuts off are then PIL's.
absl::StatusOr<std::vector<ImageBuffer>> ResizeToPlanes(
    const ImageBuffer& image, int width, int height, bool exact_edges) {
  if (image.sample_bytes == 1) {
    return ResizeWindowToPlanes(image, width, height, 0, 0, width, height);
  }
  const int c = image.channels;
  const Planes in = PlanesOf(image);
  Planes out = AllocatePlanes(width, height, c, image.sample_bytes);
  thread_local SwsCache cache;
  cache.context = sws_getCachedContext(
      cache.context, image.width, image.height, AV_PIX_FMT_GRAY16LE, width,
      height, AV_PIX_FMT_GRAY16LE, SWS_BILINEAR | SWS_ACCURATE_RND, nullptr,
      nullptr, nullptr);
  if (cache.context == nullptr) {
    return absl::InternalError(absl::StrCat("libswscale cannot resize ",
                                            image.width, "x", image.height,
                                            " to ", width, "x", height));
  }
  thread_local EdgeTaps edge_cache;
  const EdgeTaps* edges = exact_edges ? &EdgeTapsFor(image.width, image.height,
                                                     width, height, &edge_cache)
                                      : nullptr;
  for (int ch = 0; ch < c; ++ch) {
    const ImageBuffer& from = in.planes[ch];
    const ImageBuffer& to = out.planes[ch];
    uint8_t* to_data = const_cast<uint8_t*>(to.data);  // out owns it
    const uint8_t* src[1] = {from.data};
    const int src_stride[1] = {static_cast<int>(from.stride)};
    uint8_t* dst[1] = {to_data};
    const int dst_stride[1] = {static_cast<int>(to.stride)};
    sws_scale(cache.context, src, src_stride, 0, from.height, dst, dst_stride);
    if (edges != nullptr) MatchPilAtEdges(from, to_data, to, *edges);
  }
  return std::move(out.planes);
}

}  // namespace

void ResizedSize(int width, int height, int shorter, int* out_width,
                 int* out_height) {
  if (width <= height) {
    *out_width = shorter;
    *out_height =
        static_cast<int>(static_cast<int64_t>(shorter) * height / width);
  } else {
    *out_height = shorter;
    *out_width =
        static_cast<int>(static_cast<int64_t>(shorter) * width / height);
  }
  *out_width = std::max(1, *out_width);
  *out_height = std::max(1, *out_height);
}

absl::StatusOr<ImageBuffer> ResizeImage(const ImageBuffer& image, int width,
                                        int height, Interpolation interpolation,
                                        bool exact_edges) {
  if (width == image.width && height == image.height) return image;
  if (interpolation == Interpolation::kNearest || image.width < 2 ||
      image.height < 2) {
    return ResizeNearest(image, width, height);
  }
  ASSIGN_OR_RETURN(const std::vector<ImageBuffer> p,
                   ResizeToPlanes(image, width, height, exact_edges));
  const int c = image.channels;
  const int sb = image.sample_bytes;
  if (c == 1) return p[0];
  // Merged with libyuv (SIMD) for 8-bit RGB and RGBA.
  ImageBuffer out = AllocateImage(width, height, c, sb);
  uint8_t* o = out.owner.get();
  if (sb == 1 && c == 3) {
    libyuv::MergeRGBPlane(p[0].data, width, p[1].data, width, p[2].data, width,
                          o, static_cast<int>(out.stride), width, height);
  } else if (sb == 1 && c == 4) {
    // libyuv's ARGB is bytes B, G, R, A: its "R" plane is byte 2.
    libyuv::MergeARGBPlane(p[2].data, width, p[1].data, width, p[0].data, width,
                           p[3].data, width, o, static_cast<int>(out.stride),
                           width, height);
  } else {
    for (int ch = 0; ch < c; ++ch) {
      for (size_t i = 0, n = static_cast<size_t>(width) * height; i < n; ++i) {
        std::memcpy(o + (i * c + ch) * sb, p[ch].data + i * sb, sb);
      }
    }
  }
  return out;
}

namespace {

// IEEE 754 binary16 bits of `f`, rounded to nearest even (as numpy's and
// torch's float32 -> float16 conversions), by Imath (libimath-dev).
uint16_t FloatToHalf(float f) { return imath_float_to_half(f); }

// `image` mirrored left to right (8-bit samples).
ImageBuffer Mirror8(const ImageBuffer& image) {
  ImageBuffer out = AllocateImage(image.width, image.height, image.channels, 1);
  uint8_t* o = out.owner.get();
  const int stride = static_cast<int>(image.stride), w = image.width,
            h = image.height;
  const int c = image.channels;
  if (c == 3) {
    libyuv::RGB24Mirror(image.data, stride, o, static_cast<int>(out.stride), w,
                        h);
  } else if (c == 4) {
    libyuv::ARGBMirror(image.data, stride, o, static_cast<int>(out.stride), w,
                       h);
  } else if (c == 1) {
    libyuv::MirrorPlane(image.data, stride, o, static_cast<int>(out.stride), w,
                        h);
  } else {
    for (int y = 0; y < h; ++y) {
      const uint8_t* row = image.data + y * image.stride;
      uint8_t* d = o + y * out.stride;
      for (int x = 0; x < w; ++x)
        std::memcpy(d + x * c, row + (w - 1 - x) * c, c);
    }
  }
  return out;
}

}  // namespace

namespace {

// Where 8-bit output samples are written: the output itself, or, when they
// become floats, a buffer of their own.
struct EightBitStaging {
  EightBitStaging(size_t count, bool to_float, uint8_t* output)
      : owned(to_float ? new uint8_t[count] : nullptr),
        bytes(to_float ? owned.get() : output) {}
  std::unique_ptr<uint8_t[]> owned;
  uint8_t* bytes;
};

}  // namespace

void ImageTransforms::WriteFloats(const uint8_t* bytes, int c, size_t plane,
                                  uint8_t* out) const {
  // torchvision: ToTensor divides by 255, Normalize subtracts the mean and
  // divides by the std.
  for (int ch = 0; ch < c; ++ch) {
    const float m = mean_.empty() ? 0.0f : mean_[ch];
    const float sd = std_.empty() ? 1.0f : std_[ch];
    // CHW: channel ch is one plane; HWC: every c-th value from ch.
    const size_t begin = chw_ ? ch * plane : ch;
    const size_t step_size = chw_ ? 1 : c;
    if (half_) {
      auto* f = reinterpret_cast<uint16_t*>(out);
      for (size_t i = 0; i < plane; ++i) {
        const size_t at = begin + i * step_size;
        f[at] = FloatToHalf((bytes[at] / 255.0f - m) / sd);
      }
    } else {
      auto* f = reinterpret_cast<float*>(out);
      for (size_t i = 0; i < plane; ++i) {
        const size_t at = begin + i * step_size;
        f[at] = (bytes[at] / 255.0f - m) / sd;
      }
    }
  }
}

absl::StatusOr<DecodedField> ImageTransforms::OutputPlanes(
    const std::vector<ImageBuffer>& planes, bool flip_horizontal,
    bool flip_vertical) const {
  const int c = static_cast<int>(planes.size());
  const int w = planes[0].width, h = planes[0].height;
  const size_t plane = static_cast<size_t>(w) * h;
  const size_t count = plane * c;
  DecodedField field;
  field.kind = DecodedField::Kind::kTensor;
  field.shape = {c, h, w};
  if (!mean_.empty() && static_cast<int>(mean_.size()) != c) {
    return absl::InvalidArgumentError(
        absl::StrCat("decode.to_float.mean has ", mean_.size(),
                     " values for an image of ", c, " channels"));
  }
  // The resize's own planes, uncropped and unflipped: handed over as they
  // are.
  bool as_is = !to_float_ && !flip_horizontal && !flip_vertical;
  for (int ch = 0; ch < c && as_is; ++ch) {
    as_is = planes[ch].stride == static_cast<size_t>(w) &&
            planes[ch].data == planes[0].data + ch * plane;
  }
  if (as_is) {
    field.dtype = v1::DTYPE_UINT8;
    field.bytes.bytes =
        absl::string_view(reinterpret_cast<const char*>(planes[0].data), count);
    field.bytes.owner = planes[0].owner;
    return field;
  }
  const int out_bytes = to_float_ ? (half_ ? 2 : 4) : 1;
  field.dtype = to_float_ ? (half_ ? v1::DTYPE_FLOAT16 : v1::DTYPE_FLOAT32)
                          : v1::DTYPE_UINT8;
  std::shared_ptr<uint8_t> out(new uint8_t[count * out_bytes],
                               std::default_delete<uint8_t[]>());
  EightBitStaging staging(count, to_float_, out.get());
  uint8_t* bytes = staging.bytes;
  // libyuv: a negative height writes the rows bottom-up.
  const int signed_h = flip_vertical ? -h : h;
  for (int ch = 0; ch < c; ++ch) {
    const ImageBuffer& p = planes[ch];
    uint8_t* dst = bytes + ch * plane;
    if (flip_horizontal) {
      libyuv::MirrorPlane(p.data, static_cast<int>(p.stride), dst, w, w,
                          signed_h);
    } else {
      libyuv::CopyPlane(p.data, static_cast<int>(p.stride), dst, w, w,
                        signed_h);
    }
  }
  if (to_float_) WriteFloats(bytes, c, plane, out.get());
  field.bytes.bytes = absl::string_view(
      reinterpret_cast<const char*>(out.get()), count * out_bytes);
  field.bytes.owner = std::move(out);
  return field;
}

absl::StatusOr<DecodedField> ImageTransforms::Finish(
    ImageBuffer image, const Geometry& geometry, size_t first,
    Interpolation interpolation, TransformTimes* times) const {
  using Clock = std::chrono::steady_clock;
  auto since = [](Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
  };
  auto run_step = [&](size_t i) -> absl::Status {
    const GeometryStep& s = geometry.steps[i];
    const Clock::time_point started = Clock::now();
    if (s.kind == GeometryStep::Kind::kCrop) {
      image = CropImage(image, s.left, s.top, s.width, s.height);
      if (times != nullptr) times->crop += since(started);
      return absl::OkStatus();
    }
    ASSIGN_OR_RETURN(image, ResizeImage(image, s.width, s.height, interpolation,
                                        ExactEdgesNeeded(image, geometry, i)));
    if (times != nullptr) times->resize += since(started);
    return absl::OkStatus();
  };
  // 8-bit CHW output of an image whose last resize has only crops after
  // it: the resize writes one plane per channel, which is the layout
  // wanted, and the crops and the output work on planes (nothing is
  // interleaved after the resize and split again for the output).
  size_t last_resize = geometry.steps.size();
  for (size_t i = first; i < geometry.steps.size(); ++i) {
    if (geometry.steps[i].kind == GeometryStep::Kind::kResize) last_resize = i;
  }
  const bool planar = chw_ && image.sample_bytes == 1 && image.channels > 1 &&
                      interpolation == Interpolation::kBilinear &&
                      last_resize < geometry.steps.size();
  size_t next = first;
  for (; next < (planar ? last_resize : geometry.steps.size()); ++next) {
    RETURN_IF_ERROR(run_step(next));
  }
  if (planar && image.width >= 2 && image.height >= 2) {
    const GeometryStep& s = geometry.steps[last_resize];
    const Clock::time_point started = Clock::now();
    // A resize and one crop inside it (Resize + CenterCrop): only the
    // crop's pixels are computed.
    const bool window =
        last_resize + 2 == geometry.steps.size() &&
        CropInside(geometry.steps[last_resize + 1], s.width, s.height);
    // When nothing is cropped after the resize, it writes the horizontal
    // flip too (the flip comes last in the geometry).
    const bool whole = last_resize + 1 == geometry.steps.size();
    const bool mirror = geometry.flip_horizontal && (window || whole);
    std::vector<ImageBuffer> planes;
    if (window) {
      const GeometryStep& crop = geometry.steps[last_resize + 1];
      planes = ResizeWindowToPlanes(image, s.width, s.height, crop.left,
                                    crop.top, crop.width, crop.height, mirror);
    } else if (whole) {
      planes = ResizeWindowToPlanes(image, s.width, s.height, 0, 0, s.width,
                                    s.height, mirror);
    } else {
      ASSIGN_OR_RETURN(planes, ResizeToPlanes(image, s.width, s.height,
                                              ExactEdgesNeeded(image, geometry,
                                                               last_resize)));
    }
    if (times != nullptr) times->resize += since(started);
    for (size_t i = window ? geometry.steps.size() : last_resize + 1;
         i < geometry.steps.size(); ++i) {
      const GeometryStep& crop = geometry.steps[i];
      const Clock::time_point crop_started = Clock::now();
      for (ImageBuffer& plane : planes) {
        plane = CropImage(plane, crop.left, crop.top, crop.width, crop.height);
      }
      if (times != nullptr) times->crop += since(crop_started);
    }
    const Clock::time_point output_started = Clock::now();
    absl::StatusOr<DecodedField> field = OutputPlanes(
        planes, geometry.flip_horizontal && !mirror, geometry.flip_vertical);
    if (times != nullptr) times->output += since(output_started);
    return field;
  }
  for (; next < geometry.steps.size(); ++next) RETURN_IF_ERROR(run_step(next));
  const Clock::time_point output_started = Clock::now();
  struct OutputTimer {
    TransformTimes* times;
    Clock::time_point started;
    ~OutputTimer() {
      if (times != nullptr) {
        times->output +=
            std::chrono::duration<double>(Clock::now() - started).count();
      }
    }
  } output_timer{times, output_started};
  const int w = image.width, h = image.height, c = image.channels,
            sb = image.sample_bytes;
  const bool packed = image.stride == static_cast<size_t>(w) * c * sb;
  DecodedField field;
  field.kind = DecodedField::Kind::kTensor;
  field.shape =
      chw_ ? std::vector<int64_t>{c, h, w} : std::vector<int64_t>{h, w, c};
  const size_t count = static_cast<size_t>(w) * h * c;
  // Nothing to move: hand the buffer over as is.
  if (!to_float_ && !chw_ && !geometry.flip_horizontal &&
      !geometry.flip_vertical && packed) {
    field.dtype = sb == 2 ? v1::DTYPE_UINT16 : v1::DTYPE_UINT8;
    field.bytes.bytes = absl::string_view(
        reinterpret_cast<const char*>(image.data), count * sb);
    field.bytes.owner = image.owner;
    return field;
  }
  if (!mean_.empty() && static_cast<int>(mean_.size()) != c) {
    return absl::InvalidArgumentError(
        absl::StrCat("decode.to_float.mean has ", mean_.size(),
                     " values for an image of ", c, " channels"));
  }
  const int out_bytes = to_float_ ? (half_ ? 2 : 4) : sb;
  field.dtype = to_float_ ? (half_ ? v1::DTYPE_FLOAT16 : v1::DTYPE_FLOAT32)
                          : (sb == 2 ? v1::DTYPE_UINT16 : v1::DTYPE_UINT8);
  std::shared_ptr<uint8_t> out(
      new uint8_t[std::max<size_t>(count * out_bytes, 1)],
      std::default_delete<uint8_t[]>());
  const float max_value = sb == 2 ? 65535.0f : 255.0f;
  if (sb == 1) {
    // 8-bit: mirror (libyuv), then rows in order or reversed, into the
    // layout (planes split by libyuv), then floats per plane.
    if (geometry.flip_horizontal) image = Mirror8(image);
    const size_t plane = static_cast<size_t>(w) * h;
    EightBitStaging staging(count, to_float_, out.get());
    uint8_t* bytes = staging.bytes;
    // libyuv: a negative height writes the rows bottom-up.
    const int signed_h = geometry.flip_vertical ? -h : h;
    const int stride = static_cast<int>(image.stride);
    if (!chw_ || c == 1) {
      for (int y = 0; y < h; ++y) {
        const int sy = geometry.flip_vertical ? h - 1 - y : y;
        std::memcpy(bytes + static_cast<size_t>(y) * w * c,
                    image.data + sy * image.stride, static_cast<size_t>(w) * c);
      }
    } else if (c == 3) {
      libyuv::SplitRGBPlane(image.data, stride, bytes, w, bytes + plane, w,
                            bytes + 2 * plane, w, w, signed_h);
    } else if (c == 4) {
      // libyuv's ARGB is bytes B, G, R, A: its "R" plane is byte 2.
      libyuv::SplitARGBPlane(image.data, stride, bytes + 2 * plane, w,
                             bytes + plane, w, bytes, w, bytes + 3 * plane, w,
                             w, signed_h);
    } else {
      for (int y = 0; y < h; ++y) {
        const int sy = geometry.flip_vertical ? h - 1 - y : y;
        const uint8_t* row = image.data + sy * image.stride;
        for (int x = 0; x < w; ++x) {
          for (int ch = 0; ch < c; ++ch)
            bytes[ch * plane + static_cast<size_t>(y) * w + x] =
                row[x * c + ch];
        }
      }
    }
    if (to_float_) WriteFloats(bytes, c, plane, out.get());
    field.bytes.bytes = absl::string_view(
        reinterpret_cast<const char*>(out.get()), count * out_bytes);
    field.bytes.owner = std::move(out);
    return field;
  }
  uint8_t* o = out.get();
  for (int y = 0; y < h; ++y) {
    const int sy = geometry.flip_vertical ? h - 1 - y : y;
    const uint8_t* row = image.data + sy * image.stride;
    for (int x = 0; x < w; ++x) {
      const int sx = geometry.flip_horizontal ? w - 1 - x : x;
      const uint8_t* px = row + static_cast<size_t>(sx) * c * sb;
      for (int ch = 0; ch < c; ++ch) {
        const size_t at = chw_ ? (static_cast<size_t>(ch) * h + y) * w + x
                               : (static_cast<size_t>(y) * w + x) * c + ch;
        const uint32_t v =
            sb == 2 ? (px[2 * ch] | px[2 * ch + 1] << 8) : px[ch];
        if (!to_float_) {
          std::memcpy(o + at * sb, px + ch * sb, sb);
        } else {
          // torchvision: ToTensor divides by 255, Normalize subtracts and
          // divides; the same in one multiply-add up to float rounding.
          const float f =
              mean_.empty()
                  ? static_cast<float>(v) / max_value
                  : (static_cast<float>(v) / max_value - mean_[ch]) / std_[ch];
          if (half_) {
            const uint16_t hv = FloatToHalf(f);
            std::memcpy(o + at * 2, &hv, 2);
          } else {
            std::memcpy(o + at * 4, &f, 4);
          }
        }
      }
    }
  }
  field.bytes.bytes = absl::string_view(
      reinterpret_cast<const char*>(out.get()), count * out_bytes);
  field.bytes.owner = std::move(out);
  return field;
}

}  // namespace sluice::dataserver
