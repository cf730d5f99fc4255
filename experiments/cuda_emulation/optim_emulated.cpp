// The optimiser kernels of ops/cuda/optim.cu (host side and kernels, as written) run
// under the host emulation and compared with the CPU's loops of ops/cpu/optim.cpp (both
// extracted by run.sh; built with FMA, as the library's -march=native build is):
//  - for_tensor_chunks' packing, with stand-in pointers and sizes far beyond what the
//    kernels can be run on here (a parameter cut by a full launch of 320 blocks, more
//    than 24 parameters, empty ones): every chunk of every parameter reaches exactly one
//    block, with the right pointers and bounds;
//  - AdamW (amsgrad and maximize on and off) and SGD (decay, momentum, nesterov, first
//    step) over 30 parameters, one of several chunks, NaN/inf/-0 entries: bit for bit;
//  - norm_power_sum (p = 2, 1, 3, inf) over tensors of 0, 1, 100 and 3 chunks' elements:
//    up to the rounding of the sums' order (exact for the max), NaN for the max kept.
#include "optim_cuda.h"
#include "optim_cpu.h"
#include <cstdio>
#include <map>
#include <random>
using namespace mu;
namespace ck = mu::cuda_kernels;

static int failures = 0;
static void check(bool ok, const char* what) {
  if (!ok) printf("  FAIL: %s\n", what);
  failures += !ok;
}

// ------------------------------------------------------------------ packing
static void packing(const std::vector<int64_t>& numels, const char* what) {
  std::vector<std::array<void*, 3>> ptrs;
  // Stand-in pointers: parameter i's are 1000 i + k (never dereferenced).
  for (size_t i = 0; i < numels.size(); ++i)
    ptrs.push_back({reinterpret_cast<void*>(1000 * i + 1000), reinterpret_cast<void*>(1000 * i + 1001),
                    reinterpret_cast<void*>(1000 * i + 1002)});
  std::map<uintptr_t, std::vector<std::pair<int64_t, int64_t>>> seen;  // parameter -> ranges
  int launches = 0;
  bool ok = true;
  ck::for_tensor_chunks<3>(ptrs, numels, [&](const ck::TensorChunks<3>& c, int blocks) {
    ++launches;
    ok = ok && blocks > 0 && blocks <= ck::kListBlocks;
    for (int b = 0; b < blocks; ++b) {
      // chunk_range's arithmetic for block b.
      const int t = c.tensor[b];
      ok = ok && t < ck::kListTensors;
      const uintptr_t p0 = reinterpret_cast<uintptr_t>(c.ptr[0][t]);
      ok = ok && reinterpret_cast<uintptr_t>(c.ptr[1][t]) == p0 + 1 && reinterpret_cast<uintptr_t>(c.ptr[2][t]) == p0 + 2;
      const size_t i = p0 / 1000 - 1;
      ok = ok && i < numels.size() && c.numel[t] == numels[i];
      const int64_t begin = int64_t(c.chunk[b]) * ck::kListChunk;
      const int64_t end = std::min(begin + ck::kListChunk, c.numel[t]);
      seen[p0].push_back({begin, end});
    }
  });
  // Every non-empty parameter covered by disjoint chunks, in order, nothing else.
  for (size_t i = 0; i < numels.size(); ++i) {
    auto& r = seen[1000 * i + 1000];
    std::sort(r.begin(), r.end());
    int64_t at = 0;
    for (auto& [b, e] : r) {
      ok = ok && b == at && e > b;
      at = e;
    }
    ok = ok && at == numels[i];
  }
  printf("for_tensor_chunks %s: %zu parameters, %d launches: %s\n", what, numels.size(), launches, ok ? "ok" : "FAIL");
  failures += !ok;
}

// ------------------------------------------------------------------ updates
template <class T>
std::vector<std::vector<T>> make(const std::vector<int64_t>& sizes, std::mt19937_64& rng, double scale, bool specials) {
  std::normal_distribution<double> nd;
  std::vector<std::vector<T>> r;
  for (int64_t n : sizes) {
    std::vector<T> v(static_cast<size_t>(n));
    for (auto& x : v) x = T(nd(rng) * scale);
    if (specials && n > 4) v[1] = T(NAN), v[2] = T(INFINITY), v[3] = T(-0.0);
    r.push_back(v);
  }
  return r;
}

template <class T>
bool same_bits(const std::vector<std::vector<T>>& a, const std::vector<std::vector<T>>& b) {
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].size() && std::memcmp(a[i].data(), b[i].data(), a[i].size() * sizeof(T)) != 0) return false;
  return true;
}

template <class T>
std::vector<EmuTensor> views(std::vector<std::vector<T>>& v) {
  std::vector<EmuTensor> r;
  for (auto& x : v) r.push_back(emu_view(x, {int64_t(x.size())}));
  return r;
}

template <class T>
void adamw(const std::vector<int64_t>& sizes, bool amsgrad, bool maximize) {
  std::mt19937_64 rng(5);
  auto p = make<T>(sizes, rng, 1, true), g = make<T>(sizes, rng, 0.1, true), m = make<T>(sizes, rng, 0.01, false),
       v = make<T>(sizes, rng, 0.001, false), vm = make<T>(sizes, rng, 0.001, true);
  for (auto& x : v) for (auto& y : x) y = std::abs(y);
  for (auto& x : vm) for (auto& y : x) y = y == y ? std::abs(y) : y;
  auto p2 = p, m2 = m, v2 = v, vm2 = vm;
  kernels::AdamWStep k{1 - 1e-3 * 0.01, 0.9, 0.1, 0.999, 1e-3, std::sqrt(1 - std::pow(0.999, 3)), 1e-8,
                       -1e-3 / (1 - std::pow(0.9, 3)), amsgrad, maximize};
  for (int step = 0; step < 2; ++step) {
    EmuAdamWTensors t{views(p), views(g), views(m), views(v), views(vm)};
    ck::adamw_update(t, k);
    const cpu::AdamWScalars<T> s{T(k.decay), T(k.beta1),    T(k.one_minus_beta1), T(k.beta2), T(k.one_minus_beta2),
                                 T(k.bc2_sqrt), T(k.eps), T(k.neg_step),        amsgrad,    maximize};
    for (size_t i = 0; i < sizes.size(); ++i) cpu::adamw_loop<T>(p2[i].data(), g[i].data(), m2[i].data(), v2[i].data(),
                                                                  amsgrad ? vm2[i].data() : nullptr, sizes[i], s);
  }
  const bool ok = same_bits(p, p2) && same_bits(m, m2) && same_bits(v, v2) && (!amsgrad || same_bits(vm, vm2));
  printf("AdamW %s amsgrad %d maximize %d, 2 steps: %s\n", std::is_same_v<T, float> ? "f32" : "f64", amsgrad, maximize,
         ok ? "bit-equal" : "DIFFERENT  <-- FAIL");
  failures += !ok;
}

template <class T>
void sgd(const std::vector<int64_t>& sizes, bool decay, bool momentum, bool nesterov) {
  std::mt19937_64 rng(9);
  auto p = make<T>(sizes, rng, 1, true), g = make<T>(sizes, rng, 0.1, true), b = make<T>(sizes, rng, 5, false);
  auto p2 = p, b2 = b;
  for (int step = 0; step < 2; ++step) {
    kernels::SGDStep k{-0.01, decay ? 1e-2 : 0, momentum ? 0.9 : 0, 0.75, decay, momentum, nesterov, step == 0};
    EmuSGDTensors t{views(p), views(g), views(b)};
    ck::sgd_update(t, k);
    const cpu::SGDScalars<T> s{T(k.neg_lr), T(k.weight_decay), T(k.momentum), T(k.one_minus_damp),
                               k.has_decay, k.has_momentum,    k.nesterov,     k.first};
    for (size_t i = 0; i < sizes.size(); ++i)
      cpu::sgd_loop<T>(p2[i].data(), g[i].data(), momentum ? b2[i].data() : nullptr, sizes[i], s);
  }
  const bool ok = same_bits(p, p2) && (!momentum || same_bits(b, b2));
  printf("SGD %s decay %d momentum %d nesterov %d, 2 steps: %s\n", std::is_same_v<T, float> ? "f32" : "f64", decay,
         momentum, nesterov, ok ? "bit-equal" : "DIFFERENT  <-- FAIL");
  failures += !ok;
}

// ------------------------------------------------------------------ norms
template <class T>
void norms(double p, bool nan) {
  std::mt19937_64 rng(3);
  const std::vector<int64_t> sizes = {100, 0, 1, 2 * ck::kNormChunk + 7};
  auto x = make<T>(sizes, rng, 1, false);
  if (nan) x[3][40000] = T(NAN);
  const double gpu = ck::norm_power_sum(views(x), p);
  double cpu_total = 0;
  for (auto& v : x) cpu_total = kernels::combine_norm_parts(cpu_total, cpu::reduce_grad<T>(v.data(), int64_t(v.size()), p), std::isinf(p));
  const double e = std::abs(gpu - cpu_total) / std::abs(cpu_total);
  const bool ok = nan ? gpu != gpu && cpu_total != cpu_total : std::isinf(p) ? gpu == cpu_total : e <= 1e-12;
  printf("norm_power_sum %s p %g%s: %.17g vs CPU %.17g (rel %.1e): %s\n", std::is_same_v<T, float> ? "f32" : "f64", p,
         nan ? " with a NaN" : "", gpu, cpu_total, nan ? 0.0 : e, ok ? "ok" : "FAIL");
  failures += !ok;
}

int main() {
  // Packing: a parameter cut by a full launch (320 blocks), more than 24 parameters,
  // empties; exactly 24 parameters; one parameter of several launches.
  std::vector<int64_t> many = {0, 1, 65536, 65537, 3, 318 * 65536 + 5, 7, 0};
  for (int i = 0; i < 30; ++i) many.push_back(i * 1000 + 1);
  packing(many, "mixed");
  packing(std::vector<int64_t>(24, 5), "24 parameters");
  packing(std::vector<int64_t>(48, 65536 * 20), "48 x 20 chunks");
  packing({1000 * 65536 + 1}, "one of 1001 chunks");
  packing({}, "none");
  packing({0, 0}, "only empty");

  // The kernels: 30 parameters (more than one launch's 24), one of two chunks, empties.
  emu_sequential = true;  // no barriers in these kernels
  std::vector<int64_t> sizes = {5, 0, 70000, 1, 513};
  for (int i = 0; i < 25; ++i) sizes.push_back(3 + i);
  for (int a = 0; a < 2; ++a)
    for (int mx = 0; mx < 2; ++mx) adamw<float>(sizes, a, mx), adamw<double>(sizes, a, mx);
  for (int d = 0; d < 2; ++d)
    for (int mo = 0; mo < 3; ++mo) sgd<float>(sizes, d, mo > 0, mo == 2), sgd<double>(sizes, d, mo > 0, mo == 2);
  emu_sequential = false;

  for (double p : {2.0, 1.0, 3.0, double(INFINITY)}) norms<float>(p, false);
  norms<double>(2.0, false);
  norms<double>(INFINITY, false);
  norms<float>(INFINITY, true);
  norms<double>(2.0, true);
  printf("%s\n", failures ? "FAIL" : "PASS");
  return failures ? 1 : 0;
}
