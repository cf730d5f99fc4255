// The CUDA kernels of ops/cuda/softmax.cu, loss.cu, norm.cu and reduce.cu (and the line
// schemes of lines.cuh they share), host side included, run under the host emulation of
// emu.h and compared with the library's CPU kernels on the same tensors. run.sh rewrites
// each file with extract.py (launches, static shared memory) and stands runtime_shim.cuh
// in for runtime.cuh; EMU_MAX_BLOCKS caps the grids (the GPU's cap is 132 * 32) so that
// the grid-stride loops take several turns on shapes small enough to emulate. The shapes
// take every scheme: a warp, a block or a column of a 2-d block per line; reductions by
// a thread, a block or a 32 x 8 tile per output, with and without split runs; one- and
// two-pass channel sums. Inputs hold NaN and -inf lines. Output buffers start as garbage,
// so an element the kernel leaves unwritten shows. Bounds: float64 to 1e-12 relative,
// float32 to a few ulps (both sides sum in double, in different orders), layer_norm's
// dx scaled by rstd (the rounding of g w, contracted into an FMA or not, is multiplied by
// it: up to 1 / sqrt(eps) for n == 1); max, min and their indices exactly.
// Usage (from run.sh): lines [softmax loss layer_norm batch_norm reduce]; EMU_VERBOSE=1
// prints every check.
#define EMU_MAX_BLOCKS 3
#include "emu.h"

#include "ops/cuda/loss.cu"
#include "ops/cuda/norm.cu"
#include "ops/cuda/reduce.cu"
#include "ops/cuda/softmax.cu"

#include <cmath>
#include <cstdio>
#include <random>
#include <string>

using namespace mu;
namespace ck = mu::cuda_kernels;

static const Device kCpu = Device::cpu();
static std::mt19937_64 rng(7);
static int failures = 0, checks = 0;

// Element-wise comparison of the emulated result with the CPU's: NaN where the CPU has
// NaN, the same infinity, otherwise |e - c| <= tol (1 + |c|).
static void compare(const std::string& what, const Tensor& emu, const Tensor& cpu, double tol) {
  ++checks;
  const auto e = emu.to(kFloat64).to_vector<double>(), c = cpu.to(kFloat64).to_vector<double>();
  double worst = 0;
  int64_t bad = -1;
  for (size_t i = 0; i < c.size(); ++i) {
    const bool ok = std::isnan(c[i])   ? std::isnan(e[i])
                    : std::isinf(c[i]) ? e[i] == c[i]
                                       : std::abs(e[i] - c[i]) <= tol * (1 + std::abs(c[i]));
    if (!std::isnan(c[i]) && !std::isinf(c[i]) && !std::isnan(e[i])) worst = std::max(worst, std::abs(e[i] - c[i]) / (1 + std::abs(c[i])));
    if (!ok && bad < 0) bad = int64_t(i);
  }
  if (e.size() != c.size() || bad >= 0) {
    ++failures;
    printf("FAIL %s: element %ld emulated %.9g cpu %.9g\n", what.c_str(), long(bad), bad >= 0 ? e[size_t(bad)] : 0.0,
           bad >= 0 ? c[size_t(bad)] : 0.0);
  } else if (getenv("EMU_VERBOSE")) {
    printf("ok   %s (worst %.2e)\n", what.c_str(), worst);
  }
}

static double tol_of(DType dt) { return dt == kFloat32 ? 2e-6 : 1e-12; }
static const char* dname(DType dt) { return dtype_name(dt); }
static Tensor garbage(const Shape& s, DType dt) { return full(s, 777.0, TensorOptions(dt)); }

// An (outer, n, inner) tensor of normal values whose lines (o, i), numbered o * inner + i,
// 1, 2 and 3 are special when there are enough: all -inf, one NaN, one -inf.
static Tensor lines_input(int64_t outer, int64_t n, int64_t inner, DType dt, bool specials = true) {
  std::normal_distribution<double> nd;
  std::vector<double> v(size_t(outer * n * inner));
  for (auto& x : v) x = nd(rng);
  auto at = [&](int64_t line, int64_t j) -> double& {
    return v[size_t(((line / inner) * n + j) * inner + line % inner)];
  };
  if (specials && outer * inner >= 4 && n >= 2) {
    for (int64_t j = 0; j < n; ++j) at(1, j) = -INFINITY;
    at(2, n / 2) = NAN;
    at(3, 0) = -INFINITY;
  }
  return from_vector(v, {outer, n, inner}).to(dt);
}

// ---------------------------------------------------------------- softmax

static void softmax_checks() {
  struct C { int64_t outer, n, inner; const char* path; };
  const C cs[] = {{20, 37, 1, "warp, grid-stride"}, {3, 1, 1, "warp, n 1"}, {2, 1024, 1, "warp, n 1024"},
                  {4, 1100, 1, "block, grid-stride"}, {2, 8192, 1, "block of 1024 (few long lines)"},
                  {2, 13, 5, "column 8 x 32"},
                  {3, 7, 40, "column 32 x 8, padded tile, grid-stride"}, {2, 300, 3, "column 4 x 64"},
                  {2, 0, 3, "empty"}};
  for (DType dt : {kFloat32, kFloat64})
    for (const C& c : cs)
      for (bool log : {false, true}) {
        const std::string tag = std::string(log ? "log_softmax " : "softmax ") + dname(dt) + " (" +
                                std::to_string(c.outer) + ", " + std::to_string(c.n) + ", " + std::to_string(c.inner) +
                                ") " + c.path;
        const Tensor x = lines_input(c.outer, c.n, c.inner, dt);
        const Tensor ye = garbage(x.shape(), dt), yc = empty(x.shape(), TensorOptions(dt));
        ck::softmax_forward(x, ye, c.outer, c.n, c.inner, log);
        kernels::softmax_forward(kCpu, x, yc, c.outer, c.n, c.inner, log);
        compare(tag + " forward", ye, yc, tol_of(dt));
        const Tensor g = lines_input(c.outer, c.n, c.inner, dt, false);
        const Tensor de = garbage(x.shape(), dt), dc = empty(x.shape(), TensorOptions(dt));
        ck::softmax_backward(g, yc, de, c.outer, c.n, c.inner, log);
        kernels::softmax_backward(kCpu, g, yc, dc, c.outer, c.n, c.inner, log);
        compare(tag + " backward", de, dc, tol_of(dt));
      }
}

// ---------------------------------------------------------------- cross_entropy

static void loss_checks() {
  struct C { int64_t outer, n, inner; const char* path; };
  // Contiguous lines are read 16 bytes at a time: lines of 37 and 1101 classes start at
  // every phase of a vector (head, vectors, tail), lines of 3 hold no whole vector.
  const C cs[] = {{13, 37, 1, "warp, grid-stride"}, {4, 1100, 1, "block, grid-stride"},
                  {5, 1101, 1, "block, lines at every 16-byte phase"}, {7, 3, 1, "warp, no whole vector"},
                  {2, 5, 7, "column 8 x 32"}, {3, 40, 33, "column 32 x 8, padded tiles, grid-stride"},
                  {6, 1, 1, "one class"}};
  struct O { bool weighted; double eps; bool per_line_grad; };
  const O os[] = {{false, 0, false}, {true, 0.1, true}, {true, 0, false}, {false, 0.2, true}};
  const int64_t ignore = -100;
  // Two of the option sets per dtype and shape, each set met by every shape (emulation is slow).
  for (DType dt : {kFloat32, kFloat64})
    for (const C& c : cs)
      for (int k = 0; k < 2; ++k) {
        const O& o = os[2 * k + (dt == kFloat64)];
        const std::string tag = std::string("cross_entropy ") + dname(dt) + " (" + std::to_string(c.outer) + ", " +
                                std::to_string(c.n) + ", " + std::to_string(c.inner) + ") " + c.path +
                                (o.weighted ? " weighted" : "") + " smoothing " + std::to_string(o.eps);
        const int64_t lines = c.outer * c.inner;
        const Tensor x = lines_input(c.outer, c.n, c.inner, dt);
        std::vector<int64_t> t(static_cast<size_t>(lines));
        std::uniform_int_distribution<int64_t> cls(0, c.n - 1);
        for (int64_t l = 0; l < lines; ++l) t[size_t(l)] = l % 5 == 4 ? ignore : cls(rng);  // some lines ignored
        const Tensor target = from_vector(t, {lines});
        std::uniform_real_distribution<double> ud(0.5, 1.5);
        std::vector<double> wv(size_t(c.n));
        for (auto& v : wv) v = ud(rng);
        const Tensor w = o.weighted ? from_vector(wv, {c.n}).to(dt) : Tensor();
        const kernels::CrossEntropyLines L{c.outer, c.n, c.inner, ignore, o.eps};
        const Tensor le = garbage({lines}, dt), lc = empty({lines}, TensorOptions(dt));
        const Tensor se = garbage({lines}, kFloat64), sc = empty({lines}, TensorOptions(kFloat64));
        ck::cross_entropy_forward(x, target, w, le, se, L);
        kernels::cross_entropy_forward(kCpu, x, target, w, lc, sc, L);
        compare(tag + " loss", le, lc, tol_of(dt));
        compare(tag + " lse", se, sc, tol_of(dt));  // float64, from sums in a different order
        const Tensor g = o.per_line_grad ? lines_input(1, lines, 1, dt, false).reshape({lines}) : full({1}, 1.0, TensorOptions(dt));
        const double scale = o.per_line_grad ? 1.0 : 1.0 / double(lines);
        const Tensor de = garbage(x.shape(), dt), dc = empty(x.shape(), TensorOptions(dt));
        ck::cross_entropy_backward(g, scale, x, target, w, sc, de, L);
        kernels::cross_entropy_backward(kCpu, g, scale, x, target, w, sc, dc, L);
        compare(tag + " dlogits", de, dc, tol_of(dt));
      }
  // bfloat16 logits (autocast's): read as they are, computed in float32 (the loss and
  // upstream gradient float32), the gradient rounded once into bfloat16; the CPU kernel
  // does the same, so both round the same float32 values (bounds: float32's sums in
  // different orders, and at most one bfloat16 step where a value sits on a rounding edge).
  for (const C& c : cs) {
    if (c.inner != 1) continue;  // the contiguous layouts, where the vectors are
    const std::string tag = "cross_entropy bfloat16 (" + std::to_string(c.outer) + ", " + std::to_string(c.n) + ", 1) " +
                            c.path;
    const int64_t lines = c.outer;
    const Tensor x = lines_input(c.outer, c.n, 1, kFloat32).to(kBFloat16);
    std::vector<int64_t> t(static_cast<size_t>(lines));
    std::uniform_int_distribution<int64_t> cls(0, c.n - 1);
    for (int64_t l = 0; l < lines; ++l) t[size_t(l)] = l % 5 == 4 ? ignore : cls(rng);
    const Tensor target = from_vector(t, {lines});
    const kernels::CrossEntropyLines L{c.outer, c.n, 1, ignore, 0.0};
    const Tensor le = garbage({lines}, kFloat32), lc = empty({lines}, TensorOptions(kFloat32));
    const Tensor se = garbage({lines}, kFloat64), sc = empty({lines}, TensorOptions(kFloat64));
    ck::cross_entropy_forward(x, target, Tensor(), le, se, L);
    kernels::cross_entropy_forward(kCpu, x, target, Tensor(), lc, sc, L);
    compare(tag + " loss", le, lc, 1e-5);
    compare(tag + " lse", se, sc, 1e-5);
    const Tensor g = full({1}, 1.0, TensorOptions(kFloat32));
    const Tensor de = garbage(x.shape(), kBFloat16), dc = empty(x.shape(), TensorOptions(kBFloat16));
    ck::cross_entropy_backward(g, 1.0 / double(lines), x, target, Tensor(), sc, de, L);
    kernels::cross_entropy_backward(kCpu, g, 1.0 / double(lines), x, target, Tensor(), sc, dc, L);
    // Relative: each gradient element within one bfloat16 step (2^-8 relative) of the CPU's.
    ++checks;
    const auto e = de.to(kFloat64).to_vector<double>(), cv = dc.to(kFloat64).to_vector<double>();
    int64_t bad = -1;
    for (size_t i = 0; i < cv.size() && bad < 0; ++i)
      if (!(std::abs(e[i] - cv[i]) <= std::abs(cv[i]) / 128 || (std::isnan(e[i]) && std::isnan(cv[i])))) bad = int64_t(i);
    if (bad >= 0) {
      ++failures;
      printf("FAIL %s dlogits: element %ld emulated %.9g cpu %.9g\n", tag.c_str(), long(bad), e[size_t(bad)],
             cv[size_t(bad)]);
    } else if (getenv("EMU_VERBOSE")) {
      printf("ok   %s dlogits (within one bfloat16 step)\n", tag.c_str());
    }
  }
}

// ---------------------------------------------------------------- layer_norm, batch_norm

static Tensor vec(int64_t n, DType dt) { return lines_input(1, n, 1, dt, false).reshape({n}); }

static void layer_norm_checks() {
  struct C { int64_t rows, n; bool specials; const char* path; };
  const C cs[] = {{20, 33, true, "warp, grid-stride"}, {4, 1100, true, "block, grid-stride"},
                  {100, 40, false, "two-pass column sums, 13 row chunks"}, {5, 1, false, "n 1"},
                  {3, 0, false, "n 0"}, {0, 5, false, "no rows"}};
  for (DType dt : {kFloat32, kFloat64})
    for (const C& c : cs)
      for (bool affine : {true, false}) {
        const std::string tag = std::string("layer_norm ") + dname(dt) + " (" + std::to_string(c.rows) + ", " +
                                std::to_string(c.n) + ") " + c.path + (affine ? " affine" : "");
        const Tensor x = lines_input(c.rows, c.n, 1, dt, c.specials).reshape({c.rows, c.n});
        const Tensor w = affine ? vec(c.n, dt) : Tensor(), b = affine ? vec(c.n, dt) : Tensor();
        const Tensor ye = garbage(x.shape(), dt), me = garbage({c.rows}, dt), re = garbage({c.rows}, dt);
        const Tensor yc = empty(x.shape(), TensorOptions(dt)), mc = empty({c.rows}, TensorOptions(dt)),
                     rc = empty({c.rows}, TensorOptions(dt));
        ck::layer_norm_forward(x, w, b, ye, me, re, c.rows, c.n, 1e-5);
        kernels::layer_norm_forward(kCpu, x, w, b, yc, mc, rc, c.rows, c.n, 1e-5);
        compare(tag + " y", ye, yc, tol_of(dt));
        compare(tag + " mean", me, mc, tol_of(dt));
        compare(tag + " rstd", re, rc, tol_of(dt));
        const Tensor g = lines_input(c.rows, c.n, 1, dt, false).reshape({c.rows, c.n});
        const Tensor de = garbage(x.shape(), dt), dc = empty(x.shape(), TensorOptions(dt));
        const Tensor dwe = affine ? garbage({c.n}, dt) : Tensor(), dbe = affine ? garbage({c.n}, dt) : Tensor();
        const Tensor dwc = affine ? empty({c.n}, TensorOptions(dt)) : Tensor(), dbc = affine ? empty({c.n}, TensorOptions(dt)) : Tensor();
        ck::layer_norm_backward(g, x, mc, rc, w, de, dwe, dbe, c.rows, c.n);
        kernels::layer_norm_backward(kCpu, g, x, mc, rc, w, dc, dwc, dbc, c.rows, c.n);
        // dx = rstd (g w - c1 - ...): the rounding of the float32 terms (an FMA or not)
        // is scaled by rstd, up to 1 / sqrt(eps) when n == 1.
        double rmax = 1;
        for (double r : rc.to(kFloat64).to_vector<double>())
          if (std::isfinite(r)) rmax = std::max(rmax, std::abs(r));
        compare(tag + " dx", de, dc, tol_of(dt) * rmax);
        // Sums over up to 100 rows in float32 on the CPU's side: a looser bound.
        if (affine) {
          compare(tag + " dweight", dwe, dwc, dt == kFloat32 ? 1e-5 : 1e-12);
          compare(tag + " dbias", dbe, dbc, dt == kFloat32 ? 1e-5 : 1e-12);
        }
      }
}

static void batch_norm_checks() {
  struct C { int64_t outer, c, inner; const char* path; };
  const C cs[] = {{50, 40, 1, "rows (inner 1): 32 x 8 tiles, 7 row chunks"}, {4, 3, 70, "channels-first, 2 chunks"},
                  {7, 300, 1, "rows, 10 column tiles"}, {3, 2, 5, "channels-first, one chunk"}};
  for (DType dt : {kFloat32, kFloat64})
    for (const C& c : cs)
      for (bool training : {true, false}) {
        // float32: affine when training, not in eval; float64 the other way round.
        const bool affine = training == (dt == kFloat32);
        const std::string tag = std::string("batch_norm ") + dname(dt) + " (" + std::to_string(c.outer) + ", " +
                                std::to_string(c.c) + ", " + std::to_string(c.inner) + ") " + c.path +
                                (training ? " training" : " eval") + (affine ? " affine" : "");
        const Tensor x = lines_input(c.outer, c.c, c.inner, dt, false);
        const Tensor w = affine ? vec(c.c, dt) : Tensor(), b = affine ? vec(c.c, dt) : Tensor();
        const Tensor rm = vec(c.c, dt), rv = vec(c.c, dt).abs().add_(0.5);
        const Tensor rme = rm.clone(), rve = rv.clone(), rmc = rm.clone(), rvc = rv.clone();
        const Tensor ye = garbage(x.shape(), dt), me = garbage({c.c}, dt), ie = garbage({c.c}, dt);
        const Tensor yc = empty(x.shape(), TensorOptions(dt)), mc = empty({c.c}, TensorOptions(dt)),
                     ic = empty({c.c}, TensorOptions(dt));
        ck::batch_norm_forward(x, w, b, rme, rve, ye, me, ie, c.outer, c.c, c.inner, training, 0.1, 1e-5);
        kernels::batch_norm_forward(kCpu, x, w, b, rmc, rvc, yc, mc, ic, c.outer, c.c, c.inner, training, 0.1, 1e-5);
        compare(tag + " y", ye, yc, tol_of(dt));
        compare(tag + " save_mean", me, mc, tol_of(dt));
        compare(tag + " save_invstd", ie, ic, tol_of(dt));
        compare(tag + " running_mean", rme, rmc, tol_of(dt));
        compare(tag + " running_var", rve, rvc, tol_of(dt));
        const Tensor g = lines_input(c.outer, c.c, c.inner, dt, false);
        const Tensor de = garbage(x.shape(), dt), dc = empty(x.shape(), TensorOptions(dt));
        const Tensor dwe = affine ? garbage({c.c}, dt) : Tensor(), dbe = affine ? garbage({c.c}, dt) : Tensor();
        const Tensor dwc = affine ? empty({c.c}, TensorOptions(dt)) : Tensor(), dbc = affine ? empty({c.c}, TensorOptions(dt)) : Tensor();
        ck::batch_norm_backward(g, x, mc, ic, w, de, dwe, dbe, c.outer, c.c, c.inner, training);
        kernels::batch_norm_backward(kCpu, g, x, mc, ic, w, dc, dwc, dbc, c.outer, c.c, c.inner, training);
        compare(tag + " dx", de, dc, dt == kFloat32 ? 1e-5 : 1e-11);
        if (affine) {
          compare(tag + " dweight", dwe, dwc, dt == kFloat32 ? 1e-5 : 1e-12);
          compare(tag + " dbias", dbe, dbc, dt == kFloat32 ? 1e-5 : 1e-12);
        }
      }
}

// ---------------------------------------------------------------- sum, amax/amin, argmax/argmin

// x of `shape` (values rounded to halves, so that equal values and ties are common, a
// few NaN for floats, 0/1 for bool), then viewed by `view`.
template <class V>
static void reduce_case(const Shape& shape, const Shape& dims, const char* path, std::vector<DType> dtypes, V view) {
  int64_t numel = 1;
  for (int64_t s : shape) numel *= s;
  std::normal_distribution<double> nd;
  std::vector<double> v(static_cast<size_t>(numel));
  for (auto& x : v) x = std::round(nd(rng) * 2) / 2;
  for (DType dt : dtypes) {
    std::vector<double> u = v;
    if (dt == kBool)
      for (auto& x : u) x = x > 0;
    if (dt == kInt64)
      for (auto& x : u) x *= 2;
    if (dt == kFloat32 || dt == kFloat64)
      for (size_t i = 7; i < u.size(); i += 97) u[i] = NAN;  // a few NaN: the max, min and arg of their runs
    const Tensor base = from_vector(u, shape).to(dt);
    const Tensor x = view(base);
    const ReducePlan p = plan_reduce(x, dims, false, "sum");
    const Tensor xc = x.contiguous();
    const std::string tag = std::string(dname(dt)) + " " + x.describe() + " strides [" +
                            [&] { std::string s; for (int64_t st : x.strides()) s += std::to_string(st) + " "; return s; }() +
                            "] " + path;
    {
      // A count for bool; float32 for the 16-bit floats (read as they are, summed in float32).
      const DType od = dt == kBool ? kInt64 : dt == kBFloat16 || dt == kFloat16 ? kFloat32 : dt;
      const Tensor oe = garbage(p.out_shape, od), oc = empty(p.out_shape, TensorOptions(od));
      ck::sum(oe, x, p);
      kernels::sum(kCpu, oc, xc, p);
      compare("sum " + tag, oe, oc, dt == kFloat32 ? 1e-6 : 1e-12);
    }
    // Max of nothing is refused by the op; the 16-bit floats reach max and argmax as float32.
    if (dt == kBool || dt == kBFloat16 || dt == kFloat16 || p.inner == 0) continue;
    for (bool mx : {true, false}) {
      const Tensor oe = garbage(p.out_shape, dt), oc = empty(p.out_shape, TensorOptions(dt));
      ck::extremum(oe, x, p, mx);
      kernels::extremum(kCpu, oc, xc, p, mx);
      compare(std::string(mx ? "amax " : "amin ") + tag, oe, oc, 0);
      const Tensor ae = garbage(p.out_shape, kInt64), ac = empty(p.out_shape, TensorOptions(kInt64));
      ck::arg_extremum(ae, x, p, mx);
      kernels::arg_extremum(kCpu, ac, xc, p, mx);
      compare(std::string(mx ? "argmax " : "argmin ") + tag, ae, ac, 0);
    }
  }
}

// Every dtype where the scheme is cheap to emulate (a thread or a 32 x 8 tile per
// output), one or two where it is not (a block per output, with shuffles).
static void reduce_checks() {
  auto same = [](const Tensor& t) { return t; };
  const std::vector<DType> all = {kFloat32, kFloat64, kInt64, kBool};
  reduce_case({50, 7}, {1}, "thread per output (run 7)", all, same);
  reduce_case({5, 0}, {1}, "thread per output, empty runs", {kFloat32, kInt64, kBool}, same);
  reduce_case({5, 300}, {1}, "block of 256, grid-stride", {kFloat32, kInt64, kBFloat16}, same);
  reduce_case({30, 7}, {1}, "thread per output, 16-bit floats", {kBFloat16, kFloat16}, same);
  reduce_case({40, 100}, {0}, "columns, 16-bit floats", {kBFloat16, kFloat16}, same);
  reduce_case({4, 40}, {1}, "block of 64, grid-stride", {kFloat64, kBool}, same);
  reduce_case({40, 100}, {0}, "columns (leading dim), 4 tiles, grid-stride", all, same);
  reduce_case({2, 2100}, {1}, "block, runs split in 2 chunks, grid-stride", {kFloat32}, same);
  reduce_case({2048, 20}, {0}, "columns, runs split in 2 chunks", {kFloat32, kInt64}, same);
  reduce_case({3, 700}, {}, "all dims, 2 chunks", {kFloat64}, same);
  reduce_case({40, 100}, {1}, "transposed: columns over strided runs", all, [](const Tensor& t) { return t.t(); });
  reduce_case({4, 300}, {0}, "transposed: block over unit runs, strided outputs", {kFloat32, kFloat64},
              [](const Tensor& t) { return t.t(); });
  reduce_case({4, 3, 50}, {0, 2}, "permuted: two-dim reduced walk", {kFloat32},
              [](const Tensor& t) { return t.permute({2, 0, 1}); });
  reduce_case({3, 40, 6}, {1}, "sliced: outputs 2 apart, runs 6 apart", {kFloat64},
              [](const Tensor& t) { return t.slice(2, 0, 6, 2); });
}

int main(int argc, char** argv) {
  auto want = [&](const char* f) {
    if (argc < 2) return true;
    for (int i = 1; i < argc; ++i)
      if (std::string(argv[i]) == f) return true;
    return false;
  };
  if (want("softmax")) softmax_checks();
  if (want("loss")) loss_checks();
  if (want("layer_norm")) layer_norm_checks();
  if (want("batch_norm")) batch_norm_checks();
  if (want("reduce")) reduce_checks();
  printf("lines: %d checks, %d failures\n%s\n", checks, failures, failures ? "FAIL" : "PASS");
  return failures ? 1 : 0;
}
