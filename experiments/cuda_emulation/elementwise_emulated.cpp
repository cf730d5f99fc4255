// The elementwise kernels of ops/cuda/map.cu, copy.cu and dropout.cu (host side and
// kernels, as written) run under the host emulation and compared with the functors and
// conversions the CPU applies (ops/functors.h, tensor/half.h's convert_element,
// ops/cpu/dropout.cpp's mask), element for element, bit for bit (NaN payloads aside):
//  - map: the vectorised scheme (packs of 16 bytes: 4 floats, 2 doubles, 16 bools; a
//    tail of fewer than a pack), the dense scheme (a view 4 bytes off alignment), the
//    strided scheme (broadcast and transposed operands, a non-contiguous output), unary,
//    binary, bool-valued and where's select; grid-stride loops with a small grid;
//  - copy: every pair of the 10 dtypes, dense (converting) and strided (transposed and
//    broadcast source, non-contiguous destination; rows moved as 16-byte packs), the
//    same-dtype memcpy, bfloat16 and float16 rounding ties, -0, denormals, inf and NaN;
//    fill of every dtype, dense and strided;
//  - map's row packs (a bias repeated along the last dim) and strided() merging dims;
//  - dropout_mask for float32, float64 and bfloat16.
// No barriers in these kernels: they run one thread after another (emu_launch_seq).
#include "elementwise_cuda.h"
#include <cstdio>
#include <random>
#include <tuple>
using namespace mu;
namespace ck = mu::cuda_kernels;

static int failures = 0;
static void report(const std::string& what, bool ok) {
  if (!ok) printf("  FAIL: %s\n", what.c_str());
  failures += !ok;
}

// Bits equal, or both NaN.
template <class G>
bool same(G a, G b) {
  if (std::memcmp(&a, &b, sizeof(G)) == 0) return true;
  if constexpr (std::is_same_v<G, __nv_bfloat16> || std::is_same_v<G, __half>) return float(a) != float(a) && float(b) != float(b);
  else if constexpr (std::is_floating_point_v<G>) return a != a && b != b;
  else return false;
}

// Host storage of a G: bytes for bool (std::vector<bool> packs bits).
template <class G> using store_t = std::conditional_t<std::is_same_v<G, bool>, uint8_t, G>;
template <class G>
EmuTensor view(std::vector<store_t<G>>& v, Shape s, Shape st = {}, int64_t off = 0) {
  EmuTensor t = emu_view(v, s, st, off);
  t.dt = emu_dtype<G>();
  return t;
}

// The offset of element i (row-major over `shape`) of t broadcast to shape.
inline int64_t offset_of(const EmuTensor& t, const Shape& shape, int64_t i) {
  int64_t off = 0;
  for (int64_t d = int64_t(shape.size()) - 1; d >= 0; --d) {
    const int64_t c = i % shape[size_t(d)];
    i /= shape[size_t(d)];
    const int64_t td = d - (int64_t(shape.size()) - t.dim());
    if (td >= 0 && t.sh[size_t(td)] != 1) off += c * t.st[size_t(td)];
  }
  return off;
}
template <class G>
G at(const EmuTensor& t, const Shape& shape, int64_t i) { return static_cast<const G*>(t.p)[offset_of(t, shape, i)]; }
template <class G>
G& at_mut(const EmuTensor& t, int64_t i) { return static_cast<G*>(t.p)[offset_of(t, t.sh, i)]; }

// ------------------------------------------------------------------ map
template <class F, class TO, class T0, class T1, class T2>
void map_case(const std::string& what, const F& f, const EmuTensor& out, std::array<EmuTensor, 3> in) {
  for (int64_t i = 0; i < out.numel(); ++i) at_mut<TO>(out, i) = TO(0);
  ck::map<F>(out, in, f);
  bool ok = true;
  for (int64_t i = 0; i < out.numel(); ++i) {
    TO r;
    const T0 a = at<T0>(in[0], out.sh, i);
    if constexpr (F::arity == 1) r = f(a);
    else if constexpr (F::arity == 2) r = f(a, at<T1>(in[1], out.sh, i));
    else r = f(a, at<T1>(in[1], out.sh, i), at<T2>(in[2], out.sh, i));
    ok = ok && same(at<TO>(out, out.sh, i), r);
  }
  printf("map %s: %s\n", what.c_str(), ok ? "ok" : "FAIL");
  failures += !ok;
}

template <class T>
std::vector<T> values(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<T> v(n);
  for (auto& x : v) {
    x = T(double(int64_t(rng() % 2001) - 1000) / (std::is_integral_v<T> ? 1.0 : 97.0));
  }
  return v;
}

void map_tests() {
  const size_t n = 1027;  // 256 packs of 4 and a tail of 3
  auto a = values<float>(n + 1, 1), b = values<float>(n + 1, 2);
  std::vector<float> o(n + 1);
  auto a64 = values<double>(n, 3), b64 = values<double>(n, 4);
  std::vector<double> o64(n);
  auto cb = values<uint8_t>(n, 5), db = values<uint8_t>(n, 6);
  for (size_t i = 0; i < n; ++i) cb[i] = cb[i] % 3 == 0, db[i] = db[i] % 2 == 0;
  std::vector<uint8_t> ob(n + 1);
  auto viewb = [&](std::vector<uint8_t>& v, Shape s, Shape st = {}, int64_t off = 0) { return view<bool>(v, s, st, off); };
  auto i64 = values<int64_t>(n, 7);
  std::vector<int64_t> oi(n);
  const int64_t N = int64_t(n);
  map_case<fn::Add, float, float, float, float>("add f32 vectorised (packs of 4, tail 3)", fn::Add{}, emu_view(o, {N}), {emu_view(a, {N}), emu_view(b, {N}), {}});
  map_case<fn::Add, float, float, float, float>("add f32 dense, 4 bytes off alignment", fn::Add{}, emu_view(o, {N}, {}, 1), {emu_view(a, {N}, {}, 1), emu_view(b, {N}, {}, 1), {}});
  map_case<fn::Mul, double, double, double, double>("mul f64 vectorised (packs of 2, tail 1)", fn::Mul{}, emu_view(o64, {N}), {emu_view(a64, {N}), emu_view(b64, {N}), {}});
  map_case<fn::Exp, float, float, float, float>("exp f32 vectorised", fn::Exp{}, emu_view(o, {N}), {emu_view(a, {N}), {}, {}});
  map_case<fn::Neg, int64_t, int64_t, int64_t, int64_t>("neg i64 vectorised", fn::Neg{}, emu_view(oi, {N}), {emu_view(i64, {N}), {}, {}});
  map_case<fn::Lt, bool, float, float, float>("lt f32 -> bool vectorised", fn::Lt{}, viewb(ob, {N}), {emu_view(a, {N}), emu_view(b, {N}), {}});
  map_case<fn::LogicalAnd, bool, bool, bool, bool>("logical_and bool vectorised (packs of 16)", fn::LogicalAnd{}, viewb(ob, {N}), {viewb(cb, {N}), viewb(db, {N}), {}});
  map_case<fn::Where, double, bool, double, double>("where f64 vectorised", fn::Where{}, emu_view(o64, {N}), {viewb(cb, {N}), emu_view(a64, {N}), emu_view(b64, {N})});
  map_case<fn::Where, double, bool, double, double>("where f64 dense unaligned", fn::Where{}, emu_view(o64, {N - 1}, {}, 1), {viewb(cb, {N - 1}, {}, 1), emu_view(a64, {N - 1}, {}, 1), emu_view(b64, {N - 1}, {}, 1)});
  // Strided: (3, 1, 5) + (4, 5) -> (3, 4, 5); a transposed operand; an output with gaps.
  map_case<fn::Add, float, float, float, float>("add f32 strided, broadcast", fn::Add{}, emu_view(o, {3, 4, 5}), {emu_view(a, {3, 1, 5}), emu_view(b, {4, 5}), {}});
  map_case<fn::Sub, double, double, double, double>("sub f64 strided, transposed operand", fn::Sub{}, emu_view(o64, {6, 7}), {emu_view(a64, {6, 7}, {1, 6}), emu_view(b64, {6, 7}), {}});
  map_case<fn::Mul, float, float, float, float>("mul f32 strided, output with gaps", fn::Mul{}, emu_view(o, {5, 6}, {13, 2}), {emu_view(a, {5, 6}), emu_view(b, {6}), {}});
  map_case<fn::Where, double, bool, double, double>("where f64 strided, broadcast condition", fn::Where{}, emu_view(o64, {4, 6}), {viewb(cb, {4, 1}), emu_view(a64, {6}), emu_view(b64, {4, 6})});
  // A repeated row (a bias along the last dim, stride 0 elsewhere) keeps the vectorised
  // kernel: packs read modulo the row's length; a row whose length is no multiple of the
  // pack, or a column, goes strided.
  map_case<fn::Add, float, float, float, float>("add f32 row-broadcast bias (12 x 8 + 8)", fn::Add{}, emu_view(o, {12, 8}), {emu_view(a, {12, 8}), emu_view(b, {8}), {}});
  map_case<fn::Add, float, float, float, float>("add f32 row-broadcast bias first (8 + 3 x 4 x 8)", fn::Add{}, emu_view(o, {3, 4, 8}), {emu_view(b, {1, 1, 8}), emu_view(a, {3, 4, 8}), {}});
  map_case<fn::Mul, double, double, double, double>("mul f64 row-broadcast (5 x 6 * 6)", fn::Mul{}, emu_view(o64, {5, 6}), {emu_view(a64, {5, 6}), emu_view(b64, {6}), {}});
  map_case<fn::Where, double, bool, double, double>("where f64 row-broadcast condition and value", fn::Where{}, emu_view(o64, {7, 16}), {viewb(cb, {16}), emu_view(a64, {16}), emu_view(b64, {7, 16})});
  map_case<fn::Add, float, float, float, float>("add f32 row of 6 (no multiple of 4): strided", fn::Add{}, emu_view(o, {9, 6}), {emu_view(a, {9, 6}), emu_view(b, {6}), {}});
  map_case<fn::Add, float, float, float, float>("add f32 column broadcast (12 x 8 + 12 x 1): strided", fn::Add{}, emu_view(o, {12, 8}), {emu_view(a, {12, 8}), emu_view(b, {12, 1}), {}});
  // Dims merged by strided() (out dense, an operand transposed in its two outer dims) and
  // sizes that are no powers of two (the magic-number divisions).
  map_case<fn::Add, float, float, float, float>("add f32 strided, merged dims, odd sizes", fn::Add{}, emu_view(o, {7, 3, 2, 11}), {emu_view(a, {7, 3, 2, 11}, {66, 22, 11, 1}), emu_view(b, {7, 3, 2, 11}, {6, 2, 1, 21}), {}});
  // Grid-stride loops: the kernels launched with one block of 32 threads.
  std::fill(o.begin(), o.end(), 0.f);
  ck::Operands ops{{a.data(), b.data(), nullptr}};
  emu_launch_seq(1, 32, [&] { ck::map_vectorized<float, float, float, float, 2, 4, fn::Add>(o.data(), ops, ck::RowPacks{{0, 0, 0}}, N, fn::Add{}); });
  bool ok = true;
  for (size_t i = 0; i < n; ++i) ok = ok && o[i] == a[i] + b[i];
  std::fill(o.begin(), o.end(), 0.f);
  emu_launch_seq(1, 32, [&] { ck::map_dense<float, float, float, float, 2, fn::Add>(o.data(), ops, N, fn::Add{}); });
  for (size_t i = 0; i < n; ++i) ok = ok && o[i] == a[i] + b[i];
  std::fill(o.begin(), o.end(), 0.f);
  EmuTensor ot = emu_view(o, {3, 4, 5}), at_ = emu_view(a, {3, 1, 5}), bt = emu_view(b, {4, 5});
  const EmuTensor* ts[3] = {&ot, &at_, &bt};
  const auto g = cuda::strided<3>(ot.sh, ts, "add");
  emu_launch_seq(1, 32, [&] { ck::map_strided<float, float, float, float, 2, fn::Add>(o.data(), ops, g, 60, fn::Add{}); });
  for (int64_t i = 0; i < 60; ++i) ok = ok && o[size_t(i)] == at<float>(at_, ot.sh, i) + at<float>(bt, ot.sh, i);
  printf("map grid-stride loops (vectorised, dense, strided; 1 block of 32): %s\n", ok ? "ok" : "FAIL");
  failures += !ok;
}

// ------------------------------------------------------------------ copy, fill
// The GPU type of each dtype and the CPU's storage type (same bits).
using Pairs = std::tuple<std::pair<float, float>, std::pair<double, double>, std::pair<int64_t, int64_t>,
                         std::pair<bool, bool>, std::pair<__nv_bfloat16, bfloat16_t>, std::pair<__half, half_t>,
                         std::pair<int8_t, int8_t>, std::pair<int16_t, int16_t>, std::pair<int32_t, int32_t>,
                         std::pair<uint8_t, uint8_t>>;
template <class Body>
void for_types(Body body) {
  std::apply([&](auto... p) { (body(p), ...); }, Pairs{});
}

// Source values (as float) that a TO can hold: small non-negative numbers for integer
// destinations (out-of-range conversions are undefined in C++ on both sides); signed
// zeros, rounding ties of bfloat16 and float16, denormals, inf and NaN otherwise.
template <class CTO>
std::vector<double> sources(bool integral_from) {
  std::vector<double> v;
  if (std::is_integral_v<CTO> && !std::is_same_v<CTO, bool>) {
    for (int i = 0; i < 60; ++i) v.push_back(i * 1.75);
  } else {
    for (int i = 0; i < 40; ++i) v.push_back((i - 20) * 3.25);
    if (!integral_from) {
      const double more[] = {-0.0, 1.00390625, 1.01171875, 1 + 1.0 / 2048, 1 + 3.0 / 2048, 1e-40, -1e-39, 3.4e38,
                             65519.0, 65520.0, 1e300, INFINITY, -INFINITY, NAN, 0.1, 1.0 / 3};
      v.insert(v.end(), std::begin(more), std::end(more));
    }
  }
  return v;
}

void copy_tests() {
  int pairs = 0;
  const int failures_before = failures;
  for_types([&](auto to_pair) {
    using GTO = typename decltype(to_pair)::first_type;
    using CTO = typename decltype(to_pair)::second_type;
    for_types([&](auto from_pair) {
      using GF = typename decltype(from_pair)::first_type;
      using CF = typename decltype(from_pair)::second_type;
      constexpr bool int_from = std::is_integral_v<CF>;
      const std::vector<double> vals = sources<CTO>(int_from);
      // The source in the CPU's type, the same bits in the GPU's.
      const int64_t n = int64_t(vals.size());
      std::vector<store_t<CF>> src_c(static_cast<size_t>(n) * 2);
      for (size_t i = 0; i < src_c.size(); ++i) {
        const double v = vals[i % vals.size()];
        src_c[i] = convert_element<CF>(std::is_same_v<CF, uint8_t> ? std::abs(v) : v);  // uint8 holds no negatives
      }
      std::vector<store_t<GF>> src_g(src_c.size());
      std::memcpy(src_g.data(), src_c.data(), src_c.size() * sizeof(CF));
      std::vector<store_t<GTO>> dst(static_cast<size_t>(n) * 4);
      std::string name = std::string(dtype_name(emu_dtype<GTO>())) + " <- " + dtype_name(emu_dtype<GF>());
      auto check = [&](const EmuTensor& d, const EmuTensor& s, const char* how) {
        std::memset(dst.data(), 0x5A, dst.size() * sizeof(GTO));
        ck::copy(d, s);
        bool ok = true;
        for (int64_t i = 0; i < d.numel(); ++i) {
          const GF sv = at<GF>(s, d.sh, i);
          CF sc;
          std::memcpy(&sc, &sv, sizeof sc);
          const CTO rc = convert_element<CTO>(sc);
          GTO rg;
          std::memcpy(&rg, &rc, sizeof rg);
          ok = ok && same(at<GTO>(d, d.sh, i), rg);
        }
        report("copy " + name + " " + how, ok);
      };
      check(view<GTO>(dst, {n}), view<GF>(src_g, {n}), "dense");
      // (2, n) from the transposed (n, 2) source; (3, n) from a broadcast row into every
      // other element of the destination.
      check(view<GTO>(dst, {2, n}), view<GF>(src_g, {2, n}, {1, 2}), "strided, transposed source");
      check(view<GTO>(dst, {2, n}, {1, 2}), view<GF>(src_g, {n}), "strided, broadcast source, destination with gaps");
      // Dense innermost rows of 16 on both sides, outer dims permuted or broadcast: the
      // 16-byte pack path (copy_strided_vectorized), as a transposing copy of attention
      // heads (B, H, T, D) <-> (B, T, H, D) takes it.
      std::vector<store_t<GF>> heads_g(192);
      for (size_t i = 0; i < heads_g.size(); ++i) heads_g[i] = src_g[i % src_g.size()];
      std::vector<store_t<GTO>> heads_dst(192);
      dst.swap(heads_dst);
      check(view<GTO>(dst, {3, 4, 16}), view<GF>(heads_g, {3, 4, 16}, {16, 48, 1}), "strided packs, permuted rows");
      check(view<GTO>(dst, {3, 4, 16}), view<GF>(heads_g, {1, 4, 16}), "strided packs, broadcast rows");
      dst.swap(heads_dst);
      ++pairs;
    });
  });
  printf("copy: %d dtype pairs, dense / transposed / broadcast into gaps: %s\n", pairs,
         failures == failures_before ? "ok" : "FAIL");

  const int before = failures;
  for_types([&](auto pair) {
    using G = typename decltype(pair)::first_type;
    using C = typename decltype(pair)::second_type;
    for (double value : {2.7, -1.5, 1.00390625, 1e10, 0.0}) {
      if (std::is_integral_v<C> && !std::is_same_v<C, bool> && (value < 0 || value > 100)) continue;
      std::vector<store_t<G>> buf(40);
      std::memset(buf.data(), 0x5A, buf.size() * sizeof(G));
      ck::fill(view<G>(buf, {40}), value);
      const C rc = convert_element<C>(value);
      G rg;
      std::memcpy(&rg, &rc, sizeof rg);
      bool ok = true;
      // Bytes compared: no NaN is filled, and the garbage is no valid bool.
      for (auto& x : buf) ok = ok && std::memcmp(&x, &rg, sizeof rg) == 0;
      std::memset(buf.data(), 0x5A, buf.size() * sizeof(G));
      ck::fill(view<G>(buf, {4, 3}, {10, 3}), value);  // every third of the first 12 in each 10
      for (int r = 0; r < 4; ++r)
        for (int j = 0; j < 10; ++j) {
          const bool hit = j % 3 == 0 && j / 3 < 3;
          G z;
          std::memset(&z, 0x5A, sizeof z);
          ok = ok && std::memcmp(&buf[size_t(r * 10 + j)], hit ? &rg : &z, sizeof rg) == 0;
        }
      report(std::string("fill ") + dtype_name(emu_dtype<G>()), ok);
    }
  });
  printf("fill: every dtype, dense and strided: %s\n", failures == before ? "ok" : "FAIL");
}

// ------------------------------------------------------------------ dropout
template <class G, class C>
void dropout_case(double p) {
  const int64_t n = 3001;
  const uint64_t seed = 1234, threshold = kernels::attention_dropout_threshold(p);
  const double scale = 1 / (1 - p);
  std::vector<G> m(static_cast<size_t>(n));
  ck::dropout_mask(emu_view(m, {n}), seed, threshold, scale);
  const uint64_t key = kernels::attention_dropout_key(seed);
  bool ok = true;
  int64_t kept = 0;
  for (int64_t i = 0; i < n; ++i) {
    // The CPU's fill_mask: scalar_t(scale) where kept.
    const bool k = kernels::attention_dropout_bits(key, uint64_t(i)) >= threshold;
    const C rc = k ? convert_element<C>(scale) : C(0);
    G rg;
    std::memcpy(&rg, &rc, sizeof rg);
    ok = ok && same(m[size_t(i)], rg);
    kept += k;
  }
  printf("dropout_mask %s p %.2f (%ld of %ld kept): %s\n", dtype_name(emu_dtype<G>()), p, kept, n, ok ? "ok" : "FAIL");
  failures += !ok;
}

int main() {
  emu_sequential = true;
  map_tests();
  copy_tests();
  dropout_case<float, float>(0.3);
  dropout_case<double, double>(0.1);
  dropout_case<__nv_bfloat16, bfloat16_t>(0.3);
  printf("%s\n", failures ? "FAIL" : "PASS");
  return failures ? 1 : 0;
}
