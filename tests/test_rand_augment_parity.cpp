// Parity of RandAugment's operations (data/rand_augment.h) with Pillow, through
// tests/parity/pil_augment.py (Debian's python3-pil under /usr/bin/python3), which applies
// each op as torchvision's _apply_op applies it to a PIL image. Every op at several
// magnitudes, both signs for the signed ones, on RGB images of odd (17 x 23) and even
// square (32 x 32) size, a grayscale one, a 2-row one and a 3 x 33000 grayscale strip; chains of ops drawn by
// rand_augment_image; and the magnitude table against torchvision's (torch.linspace).
//
// Tolerances. Every op but the four blends must match exactly: the geometric ops follow
// PIL's own arithmetic (torchvision's matrix in double, then PIL's 16.16 fixed-point or
// per-step accumulation), so no pixel sits on a different side of a rounding boundary;
// the histogram and table ops are integer arithmetic or Python's double arithmetic, done
// here in the same order without fused multiply-adds. The blends (Brightness, Color,
// Contrast, Sharpness) compute in float; on x86-64 Pillow's C is built without fused
// multiply-add and must match exactly too, while elsewhere a Pillow compiled with fused
// multiply-adds may round an a + alpha·b once instead of twice and truncate to the next
// integer down: there the blends may differ by 1 in value. The magnitude table: the
// integer Posterize bits exactly; the linspace values (Solarize's thresholds among them)
// within 2^-22 of the row's largest value, two float32 roundings at the scale of the
// endpoints, which is how far torch's own CPU kernels stray from the exact values (see
// rand_augment_magnitude).
#include <cstdio>
#include <map>

#include "data/rand_augment.h"
#include "parity_io.h"

using namespace mu;
using namespace parity;
namespace fs = std::filesystem;

namespace {

using data::AugmentOp;

// A double written so that Python reads back the same value.
std::string exact(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

// A uint8 (H, W, C) image: per-channel ramps with noise, within [lo, hi] (a narrow range
// gives AutoContrast and Equalize something to stretch; the ramps give the geometric ops
// structure to move).
Tensor make_image(int64_t H, int64_t W, int64_t C, int lo, int hi, Generator& gen) {
  std::vector<uint8_t> v;
  auto draws = gen.lock();
  for (int64_t y = 0; y < H; ++y)
    for (int64_t x = 0; x < W; ++x)
      for (int64_t c = 0; c < C; ++c) {
        const double ramp = double((x * (c + 1) + y * (3 - c)) % 17) / 16.0;
        const double u = 0.6 * ramp + 0.4 * draws.uniform();
        v.push_back(uint8_t(lo + int(u * double(hi - lo) + 0.5)));
      }
  Tensor t = empty({H, W, C}, kUInt8);
  std::copy(v.begin(), v.end(), t.data_ptr<uint8_t>());
  return t;
}

Tensor apply(const Tensor& image, AugmentOp op, double m, uint8_t fill) {
  Tensor out = image.clone();
  data::apply_augment_op(op, m, out.data_ptr<uint8_t>(), image.size(0), image.size(1), image.size(2), fill);
  return out;
}

bool is_blend(AugmentOp op) {
  return op == AugmentOp::Brightness || op == AugmentOp::Color || op == AugmentOp::Contrast ||
         op == AugmentOp::Sharpness;
}

// The magnitudes each op is tried at.
std::vector<double> magnitudes(AugmentOp op, int64_t W) {
  switch (op) {
    case AugmentOp::ShearX:
    case AugmentOp::ShearY:
      // 5000 pushes the corners past PIL's fixed-point range: its floating-point path.
      return {0.3, -0.3, 0.15, -0.15, 0.02, -0.07, 0.0, 5000.0};
    case AugmentOp::TranslateX:
    case AugmentOp::TranslateY:
      return {150.0 / 331.0 * double(W), -150.0 / 331.0 * double(W), 3.7, -3.7, -0.9, 0.0, 100.0};
    case AugmentOp::Rotate:
      return {30.0, -30.0, 15.0, -15.0, 7.3, 90.0, -90.0, 180.0, 270.0, 400.0, 0.0, 1e-14};
    case AugmentOp::Brightness:
    case AugmentOp::Color:
    case AugmentOp::Contrast:
    case AugmentOp::Sharpness:
      // Factors 1 + m: both sides of 1, 0, and past [0, 2] (PIL's extrapolation clips).
      return {0.9, -0.9, 0.45, -0.45, 0.03, 0.0, -1.0, 1.5, -1.7};
    case AugmentOp::Posterize:
      return {8, 7, 6, 5, 4, 1, 0, 6.9};
    case AugmentOp::Solarize:
      return {255.0, 238.0, 127.5, 8.5, 0.0, 256.0, 300.0};
    default:
      return {0.0};
  }
}

}  // namespace

TEST_CASE("parity with Pillow: RandAugment's operations, chains of them, and the magnitude table") {
  Generator gen(2024);
  fs::path dir = make_temp_dir("rand_augment_parity");
  std::ofstream manifest(dir / "manifest.txt");
  std::vector<std::pair<std::string, Tensor>> expected;
  std::map<std::string, bool> blends;  // file stem -> compared as a blend
  auto writer = [&](const std::string& name) { return CaseWriter{dir, manifest, name, expected}; };

  struct Named {
    std::string name;
    Tensor image;
  };
  const std::vector<Named> images = {
      {"rgb17x23", make_image(17, 23, 3, 30, 200, gen)},
      {"rgb32", make_image(32, 32, 3, 0, 255, gen)},
      {"gray17x23", make_image(17, 23, 1, 50, 180, gen)},
      {"rgb2x9", make_image(2, 9, 3, 10, 250, gen)},  // under the 3x3 filter's size
  };

  int64_t op_cases = 0;
  for (const Named& im : images) {
    for (int64_t k = 0; k < 14; ++k) {
      const auto op = AugmentOp(k);
      const std::vector<double> ms = magnitudes(op, im.image.size(1));
      for (size_t i = 0; i < ms.size(); ++i) {
        // The geometric ops also with a grey fill.
        for (int fill : {0, 128}) {
          const bool geometric = k >= 1 && k <= 5;
          if (fill && (!geometric || i % 2)) continue;
          CaseWriter c = writer(im.name + "_" + data::augment_op_name(op) + std::to_string(i) + "_f" +
                                std::to_string(fill));
          c.begin("op", detail::str("op=", data::augment_op_name(op), " magnitude=", exact(ms[i]), " fill=", fill));
          c.input("image", im.image.to(kFloat32));
          c.end();
          c.expect("out", apply(im.image, op, ms[i], uint8_t(fill)).to(kFloat32));
          blends[c.name + ".out"] = is_blend(op);
          ++op_cases;
        }
      }
    }
  }

  // A strip wider than PIL's 16.16 fixed-point range (32768): its affine transforms take
  // the floating-point path, which steps from pixel to pixel by repeated addition.
  const Tensor strip = make_image(3, 33000, 1, 0, 255, gen);
  const std::vector<std::pair<AugmentOp, double>> strip_ops = {
      {AugmentOp::ShearX, 0.7}, {AugmentOp::ShearX, -0.9}, {AugmentOp::ShearY, 1e-4},
      {AugmentOp::ShearY, -3e-5}, {AugmentOp::Rotate, 0.001}, {AugmentOp::Rotate, -0.0023}};
  for (size_t i = 0; i < strip_ops.size(); ++i) {
    const auto [op, m] = strip_ops[i];
    CaseWriter c = writer("strip_" + std::string(data::augment_op_name(op)) + std::to_string(i));
    c.begin("op", detail::str("op=", data::augment_op_name(op), " magnitude=", exact(m), " fill=", 0));
    c.input("image", strip.to(kFloat32));
    c.end();
    c.expect("out", apply(strip, op, m, 0).to(kFloat32));
    blends[c.name + ".out"] = false;
    ++op_cases;
  }

  // Chains drawn by rand_augment_image, replayed by Pillow from the (op, magnitude) list.
  int64_t chains = 0;
  for (const Named& im : images) {
    for (int64_t magnitude : {9, 15, 30}) {
      for (uint64_t seed = 0; seed < 6; ++seed) {
        data::RandAugmentOptions o;
        o.num_ops = 3;
        o.magnitude = magnitude;
        Tensor out = im.image.clone();
        Generator g(seed * 977 + uint64_t(magnitude));
        std::vector<std::pair<AugmentOp, double>> applied;
        data::rand_augment_image(out.data_ptr<uint8_t>(), im.image.size(0), im.image.size(1), im.image.size(2), o, g,
                                 &applied);
        std::string ops;
        bool blend = false;
        for (const auto& [op, m] : applied) {
          ops += (ops.empty() ? "" : ",") + std::string(data::augment_op_name(op)) + ":" + exact(m);
          blend = blend || is_blend(op);
        }
        CaseWriter c = writer(im.name + "_chain_m" + std::to_string(magnitude) + "_s" + std::to_string(seed));
        c.begin("chain", "ops=" + ops + " fill=0");
        c.input("image", im.image.to(kFloat32));
        c.end();
        c.expect("out", out.to(kFloat32));
        blends[c.name + ".out"] = blend;
        ++chains;
      }
    }
  }

  // The magnitude tables: 14 ops x num_bins, as float32 (which every value is).
  struct Table {
    int64_t bins, H, W;
  };
  const std::vector<Table> tables = {{31, 224, 224}, {31, 17, 23}, {10, 32, 48}, {9, 5, 7}, {2, 224, 224}, {101, 331, 500}};
  std::vector<std::string> table_names;
  for (const Table& t : tables) {
    CaseWriter c = writer(detail::str("table_", t.bins, "_", t.H, "x", t.W));
    c.begin("table", detail::str("bins=", t.bins, " height=", t.H, " width=", t.W));
    c.end();
    std::vector<float> v;
    for (int64_t k = 0; k < 14; ++k)
      for (int64_t i = 0; i < t.bins; ++i)
        v.push_back(float(data::rand_augment_magnitude(AugmentOp(k), i, t.bins, t.H, t.W)));
    table_names.push_back(c.name + ".table");
    expected.emplace_back(c.name + ".table", from_vector(v, {14, t.bins}));
  }
  manifest.close();

  run_torch_script("pil_augment.py", dir);

#if defined(__x86_64__)
  const double blend_tolerance = 0;
#else
  const double blend_tolerance = 1;
#endif
  int64_t differing = 0, compared_images = 0;
  for (const auto& [what, ours] : expected) {
    INFO(what);
    Tensor ref = read_float(dir / (what + ".bin"), ours.shape());
    std::vector<double> a = ours.to_vector<double>(), b = ref.to_vector<double>();
    if (what.ends_with(".table")) {
      const size_t bins = size_t(ours.size(1));
      for (size_t i = 0; i < a.size(); ++i) {
        const size_t op = i / bins;
        // The row's scale: its largest endpoint, at which torch's products round.
        double scale = 0;
        for (size_t j = op * bins; j < (op + 1) * bins; ++j) scale = std::max(scale, std::abs(b[j]));
        const double tol = op == size_t(AugmentOp::Posterize) ? 0.0 : scale * 0x1p-22;
        INFO(data::augment_op_name(AugmentOp(op)) << " bin " << i % bins << ": ours " << exact(a[i])
                                                   << ", torchvision " << exact(b[i]));
        CHECK(std::abs(a[i] - b[i]) <= tol);
      }
      continue;
    }
    ++compared_images;
    const double tol = blends.at(what) ? blend_tolerance : 0.0;
    int64_t bad = 0;
    double worst = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      worst = std::max(worst, std::abs(a[i] - b[i]));
      bad += a[i] != b[i];
    }
    differing += bad;
    INFO(bad << " of " << a.size() << " values differ, by up to " << worst);
    CHECK(worst <= tol);
  }
  MESSAGE(op_cases << " single-op cases and " << chains << " chains on " << images.size() + 1 << " images; "
                   << differing << " values differ from Pillow");
  CHECK(compared_images == op_cases + chains);
  CHECK(table_names.size() == tables.size());
  fs::remove_all(dir);
}
