// scaled_dot_product_attention against the same computation composed from the library's
// own ops (matmul, masked_fill, softmax): values and gradients, causal and not, shapes
// inside one block and across block edges, T = 1, Tq != Tk; the dropout mask's
// reproducibility and rate; and the error messages.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <utility>
#include <vector>

#include "helpers.h"
#include "ops/kernels/attention.h"

using namespace mu;

namespace {

const double kInf = std::numeric_limits<double>::infinity();

// softmax(q kᵀ · scale + mask) v, with the causal mask as -inf above the diagonal, and,
// when `keep` is given, the probabilities multiplied by keep / (1 - p) (keep: 0 or 1).
Tensor composed(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale,
                const Tensor& keep = Tensor(), double p = 0) {
  Tensor s = q.matmul(k.transpose(2, 3)) * scale;
  if (causal) {
    int64_t t = q.shape()[2];
    s = masked_fill(s, triu(ones({t, t}, TensorOptions(q.dtype()).device(q.device())), 1), -kInf);
  }
  Tensor probs = softmax(s, -1);
  if (keep.defined()) probs = probs * keep.to(q.dtype()) * (1 / (1 - p));
  return probs.matmul(v);
}

// max |a - b| / max |b|: the error relative to the reference's scale.
double rel_err(const Tensor& a, const Tensor& b) {
  double scale = max_abs_diff(b, zeros_like(b));
  return max_abs_diff(a, b) / (scale > 0 ? scale : 1);
}

struct Shapes {
  int64_t B, H, Tq, Tk, D;
};

// Random leaves q, k, v and an upstream gradient w, made on the CPU in double then cast,
// so every dtype and device sees the same numbers.
struct Inputs {
  Tensor q, k, v, w;
};
Inputs make_inputs(const Shapes& s, DType dt, Device dev, uint64_t seed) {
  manual_seed(seed);
  Tensor q = randn({s.B, s.H, s.Tq, s.D}, kFloat64), k = randn({s.B, s.H, s.Tk, s.D}, kFloat64);
  Tensor v = randn({s.B, s.H, s.Tk, s.D}, kFloat64), w = randn({s.B, s.H, s.Tq, s.D}, kFloat64);
  auto leaf = [&](const Tensor& t) { return on(t.to(dt), dev).requires_grad_(); };
  return {leaf(q), leaf(k), leaf(v), on(w.to(dt), dev)};
}

// Output and the gradients of sum(out * w) w.r.t. q, k and v, computed by `f`.
template <class F>
std::vector<Tensor> value_and_grads(const Inputs& in, F f) {
  for (const Tensor& t : {in.q, in.k, in.v}) t.zero_grad();
  Tensor out = f(in.q, in.k, in.v);
  (out * in.w).sum().backward();
  return {out.detach(), in.q.grad(), in.k.grad(), in.v.grad()};
}

// slack: a factor on the float32 bound, for calls whose scores the backward recomputes
// rounded otherwise than the forward computed them (see its one use).
void check_against_composed(const Shapes& s, bool causal, DType dt, Device dev, std::optional<double> scale = {},
                            double slack = 1) {
  double sc = scale ? *scale : 1 / std::sqrt(double(s.D));
  Inputs in = make_inputs(s, dt, dev, uint64_t(s.Tq * 131 + s.Tk * 7 + s.D));
  auto fused = value_and_grads(in, [&](auto& q, auto& k, auto& v) {
    return scaled_dot_product_attention(q, k, v, causal, 0.0, true, scale);
  });
  // The reference in float64 whatever dt is.
  Inputs ref64{in.q.detach().to(kFloat64).requires_grad_(), in.k.detach().to(kFloat64).requires_grad_(),
               in.v.detach().to(kFloat64).requires_grad_(), in.w.to(kFloat64)};
  auto want = value_and_grads(ref64, [&](auto& q, auto& k, auto& v) { return composed(q, k, v, causal, sc); });
  // float32: rounding of sums over Tk keys grows like sqrt(Tk) (2.3e-6 seen at Tk = 1024).
  double tol = dt == kFloat64 ? 1e-12 : 2e-6 * slack * std::max(1.0, std::sqrt(double(s.Tk) / 256));
  const char* what[] = {"out", "dq", "dk", "dv"};
  for (size_t i = 0; i < 4; ++i) {
    INFO(std::string(what[i]) << " shape " << shape_str(fused[i].shape()) << (causal ? " causal " : " ")
                              << dtype_name(dt) << " on " << dev.str());
    CHECK(fused[i].dtype() == dt);
    CHECK(fused[i].device() == dev);
    CHECK(rel_err(fused[i].cpu(), want[i]) <= tol);
  }
}

// The dropout mask the kernel used, recovered through v = the identity (Tk == D): then
// out = P ∘ M / (1 - p), so an entry is 0 exactly where it was dropped (or masked).
Tensor recover_mask(const Tensor& q, const Tensor& k, bool causal, double p, uint64_t seed) {
  const Shape& ks = k.shape();
  Tensor eye_v = eye(ks[2], ks[3], TensorOptions(q.dtype()).device(q.device())).reshape({1, 1, ks[2], ks[3]}).expand(ks).contiguous();
  Tensor out = scaled_dot_product_attention(q, k, eye_v, causal, p, true, std::nullopt, seed);
  return ne(out, zeros_like(out));
}

}  // namespace

// ---------------------------------------------------------------- values and gradients

TEST_CASE("attention equals the composed softmax(q k^T scale + mask) v, values and gradients") {
  std::vector<Shapes> shapes = {
      {2, 3, 5, 5, 8},     // inside one block, D not a whole vector
      {1, 2, 1, 1, 4},     // T = 1
      {2, 2, 70, 70, 16},  // T crosses one block edge
      {1, 2, 129, 129, 64},  // D = 64, T = 2 blocks + 1
      {1, 1, 200, 200, 5},   // several blocks, odd D
      {1, 1, 300, 300, 16},  // one head, large enough for two threads: backward splits its key blocks
      {3, 5, 33, 33, 64},    // many heads, T one past a 32-row tile
      {1, 2, 65, 65, 128},   // the largest head dim every backend takes, T one past 64
      {1, 1, 40, 40, 100},   // D between 64 and 128, not a multiple of 8
      {2, 1, 9, 9, 1},       // D = 1
  };
  for (Device dev : test_devices())
    for (DType dt : {kFloat64, kFloat32})
      for (const Shapes& s : shapes)
        for (bool causal : {false, true}) check_against_composed(s, causal, dt, dev);
}

TEST_CASE("attention with Tq != Tk (not causal), and an explicit scale") {
  for (Device dev : test_devices())
    for (DType dt : {kFloat64, kFloat32}) {
      check_against_composed({2, 2, 9, 67, 12}, false, dt, dev);
      check_against_composed({1, 3, 130, 3, 20}, false, dt, dev);
      check_against_composed({2, 1, 1, 100, 8}, false, dt, dev);
      check_against_composed({1, 2, 40, 70, 8}, false, dt, dev, 0.3);
      check_against_composed({1, 2, 70, 70, 8}, true, dt, dev, -0.7);  // a negative scale flips the scores
    }
}

// One to three queries take the CPU's query-by-query path, four the score tiles: both
// sides of the cut, against caches past a key block, with D in place (64), padded (12,
// 100) and 1, causal where Tq == Tk.
TEST_CASE("attention with a few queries (a decoding step) matches the composed version") {
  for (Device dev : test_devices())
    for (DType dt : {kFloat64, kFloat32}) {
      for (int64_t Tq : {int64_t(1), int64_t(2), int64_t(3), int64_t(4)}) {
        check_against_composed({1, 3, Tq, 130, 64}, false, dt, dev);
        check_against_composed({2, 2, Tq, 67, 12}, false, dt, dev);
        // An explicit scale, kept small: with scores of a few units, dk's float32 error (set
        // by the rounding of the saved L, then cancellation) reached 5e-6 at 0.3 over 300
        // seeds, on both paths alike; at 0.1 its worst was 1.7e-6.
        check_against_composed({1, 1, Tq, 9, 100}, false, dt, dev, 0.1);
        check_against_composed({2, 1, Tq, 5, 1}, false, dt, dev);
        check_against_composed({2, 3, Tq, Tq, 8}, true, dt, dev);
      }
      // Large scores (scale -0.7 at D = 64): an error in a recomputed score is one in its
      // probability, relative. Rounded otherwise in the backward than in the forward (lane
      // sums where the tiles chain multiply-adds) left dv at 2.7e-6 here, so the CPU and
      // the tiled kernels round alike; CUDA's float32 backward at D = 64 sums tf32 products
      // on the tensor cores, which no forward matches: 2.3e-6 (emulated), hence the slack.
      check_against_composed({1, 2, 3, 3, 64}, true, dt, dev, -0.7, dev.is_cuda() ? 2.0 : 1.0);
    }
}

TEST_CASE("attention at a 1024-token context matches the composed version (float32, causal)") {
  for (Device dev : test_devices()) check_against_composed({1, 2, 1024, 1024, 64}, true, kFloat32, dev);
}

// CUDA has three paths for float32 and float64 (ops/cuda/attention.cu's tiled kernels,
// cuBLAS products with row kernels between them for long sequences, and for float32 at
// D = 64 the tensor-core kernels of attention_flash.cu); MUMOE_ATTENTION forces each, so
// each is checked on every shape, short and long, with and without dropout (flash where
// it applies, the default choice elsewhere). The tiled backward runs twice: dQ from the
// dK/dV blocks (the default), and from its own blocks (MUMOE_ATTENTION_DQ=separate).
TEST_CASE("attention on CUDA: the tiled kernels, the cuBLAS path and the flash kernels each match the composed version") {
  const std::vector<Device>& devs = test_devices();
  if (std::none_of(devs.begin(), devs.end(), [](Device d) { return d.is_cuda(); })) return;
  const Device dev = Device::cuda();
  const std::pair<const char*, const char*> modes[] = {
      {"tiled", nullptr}, {"tiled", "separate"}, {"gemm", nullptr}, {"flash", nullptr}};
  for (const auto& [path, dq_mode] : modes) {
    INFO("MUMOE_ATTENTION=" << std::string(path) << " MUMOE_ATTENTION_DQ=" << (dq_mode ? dq_mode : "(unset)"));
    ::setenv("MUMOE_ATTENTION", path, 1);
    if (dq_mode != nullptr) ::setenv("MUMOE_ATTENTION_DQ", dq_mode, 1);
    else ::unsetenv("MUMOE_ATTENTION_DQ");
    for (const Shapes& s : std::vector<Shapes>{{2, 3, 5, 5, 8}, {1, 2, 129, 129, 64}, {2, 2, 300, 300, 16},
                                               {1, 1, 40, 40, 100}, {2, 2, 9, 67, 12}, {2, 1, 70, 150, 64},
                                               {1, 2, 200, 200, 64}})
      for (DType dt : {kFloat64, kFloat32})
        for (bool causal : {false, true})
          if (!causal || s.Tq == s.Tk) check_against_composed(s, causal, dt, dev);
    // Dropout: the same mask as the tiled kernel's (default dQ), so every mode gives one result.
    const Shapes s{2, 2, 160, 160, 32};
    Inputs in = make_inputs(s, kFloat32, dev, 77);
    ::setenv("MUMOE_ATTENTION", "tiled", 1);
    ::unsetenv("MUMOE_ATTENTION_DQ");
    auto tiled = value_and_grads(in, [&](auto& q, auto& k, auto& v) {
      return scaled_dot_product_attention(q, k, v, true, 0.2, true, std::nullopt, 99);
    });
    ::setenv("MUMOE_ATTENTION", path, 1);
    if (dq_mode != nullptr) ::setenv("MUMOE_ATTENTION_DQ", dq_mode, 1);
    auto other = value_and_grads(in, [&](auto& q, auto& k, auto& v) {
      return scaled_dot_product_attention(q, k, v, true, 0.2, true, std::nullopt, 99);
    });
    for (size_t i = 0; i < 4; ++i) CHECK(rel_err(other[i].cpu(), tiled[i].cpu()) <= 1e-5);
  }
  ::unsetenv("MUMOE_ATTENTION");
  ::unsetenv("MUMOE_ATTENTION_DQ");
}

// Every CUDA backward of the framework's own sums each gradient element in a fixed order
// (no atomics): the same call twice gives the same bits, on every path (with dropout,
// which bfloat16 takes past cuDNN).
TEST_CASE("attention's backward on CUDA gives the same gradients bit for bit on every run") {
  const std::vector<Device>& devs = test_devices();
  if (std::none_of(devs.begin(), devs.end(), [](Device d) { return d.is_cuda(); })) return;
  const std::pair<const char*, const char*> modes[] = {
      {"flash", nullptr}, {"tiled", nullptr}, {"tiled", "separate"}, {"gemm", nullptr}};
  for (DType dt : {kFloat32, kBFloat16}) {
    for (const auto& [path, dq_mode] : modes) {
      INFO(dtype_name(dt) << " MUMOE_ATTENTION=" << std::string(path)
                          << " MUMOE_ATTENTION_DQ=" << (dq_mode ? dq_mode : "(unset)"));
      Inputs in = make_inputs({2, 3, 300, 300, 64}, dt, Device::cuda(), 5);
      ::setenv("MUMOE_ATTENTION", path, 1);
      if (dq_mode != nullptr) ::setenv("MUMOE_ATTENTION_DQ", dq_mode, 1);
      else ::unsetenv("MUMOE_ATTENTION_DQ");
      auto f = [](auto& q, auto& k, auto& v) { return scaled_dot_product_attention(q, k, v, true, 0.1, true, {}, 7); };
      auto a = value_and_grads(in, f);
      auto b = value_and_grads(in, f);
      for (size_t i = 0; i < 4; ++i) CHECK(max_abs_diff(a[i].cpu(), b[i].cpu()) == 0);
    }
  }
  ::unsetenv("MUMOE_ATTENTION");
  ::unsetenv("MUMOE_ATTENTION_DQ");
}

TEST_CASE("attention reads non-contiguous inputs and gives the same result") {
  // q, k, v laid out (B, T, H, D) and viewed as (B, H, T, D), as a projection produces them.
  manual_seed(3);
  for (Device dev : test_devices()) {
    Tensor q = on(randn({2, 33, 3, 8}), dev), k = on(randn({2, 33, 3, 8}), dev), v = on(randn({2, 33, 3, 8}), dev);
    Tensor qt = q.transpose(1, 2), kt = k.transpose(1, 2), vt = v.transpose(1, 2);
    REQUIRE_FALSE(qt.is_contiguous());
    Tensor a = scaled_dot_product_attention(qt, kt, vt, true);
    Tensor b = scaled_dot_product_attention(qt.contiguous(), kt.contiguous(), vt.contiguous(), true);
    CHECK(max_abs_diff(a.cpu(), b.cpu()) == 0);
  }
}

TEST_CASE("attention on inputs starting one element into their storage gives the same result") {
  // float32 with D = 64 has a 16-byte vector path on CUDA; data at an odd offset take the
  // scalar one, with the same values and gradients. bfloat16 goes through cuDNN, whose
  // graph declares 16-byte aligned tensors: misaligned views take the framework's
  // kernels instead (cuDNN against them: within bfloat16 rounding of the output).
  manual_seed(4);
  for (Device dev : test_devices())
    for (DType dt : {kFloat32, kBFloat16}) {
      INFO(dev.str() << " " << dtype_name(dt));
      const double tol = dt == kFloat32 ? 1e-5 : 2e-2;
      const int64_t n = 2 * 70 * 64;
      auto shifted = [&] { return on(randn({n + 1}).to(dt), dev).narrow(0, 1, n).view({1, 2, 70, 64}); };
      Tensor q = shifted().requires_grad_(), k = shifted().requires_grad_(), v = shifted().requires_grad_();
      Tensor qa = q.detach().clone().requires_grad_(), ka = k.detach().clone().requires_grad_(),
             va = v.detach().clone().requires_grad_();
      Tensor w = on(randn({1, 2, 70, 64}).to(dt), dev);
      Tensor a = scaled_dot_product_attention(q, k, v, true);
      Tensor b = scaled_dot_product_attention(qa, ka, va, true);
      (a * w).sum().backward();
      (b * w).sum().backward();
      CHECK(rel_err(a.cpu(), b.cpu()) <= tol);
      CHECK(rel_err(q.grad().cpu(), qa.grad().cpu()) <= tol);
      CHECK(rel_err(k.grad().cpu(), ka.grad().cpu()) <= tol);
      CHECK(rel_err(v.grad().cpu(), va.grad().cpu()) <= tol);
    }
}

TEST_CASE("attention without a graph reads k and v as views of a longer buffer, as a key-value cache holds them") {
  // (B, H, L, D) buffers of which the first Tk rows per head are the keys and values: the
  // CPU forward reads them in place (rows past Tk included, where the buffer has them) or
  // copies what it needs; either way the result is that of dense copies, bit for bit.
  // bfloat16 (autocast's cache) as well, which the CPU reads without widened copies.
  manual_seed(7);
  for (Device dev : test_devices()) {
    for (int64_t D : {int64_t(64), int64_t(5)}) {
      for (int64_t Tk : {int64_t(1), int64_t(9), int64_t(12), int64_t(70)}) {
        for (int64_t L : {Tk, Tk + 1, int64_t(80)}) for (DType dt : {kFloat32, kBFloat16}) {
          INFO(dev.str(), " D ", D, " Tk ", Tk, " buffer rows ", L, " ", dtype_name(dt));
          const Tensor kbuf = on(randn({2, 3, L, D}).to(dt), dev), vbuf = on(randn({2, 3, L, D}).to(dt), dev);
          const Tensor k = kbuf.narrow(2, 0, Tk), v = vbuf.narrow(2, 0, Tk);
          for (int64_t Tq : {int64_t(1), int64_t(3)}) {
            const Tensor q = on(randn({2, 3, Tq, D}).to(dt), dev);
            NoGradGuard no_grad;
            const Tensor a = scaled_dot_product_attention(q, k, v, false, 0.0, false);
            const Tensor b = scaled_dot_product_attention(q, k.contiguous(), v.contiguous(), false, 0.0, false);
            CHECK(max_abs_diff(a.cpu(), b.cpu()) == 0.0);
          }
        }
      }
    }
    // Views whose heads are not evenly spaced (a transposed buffer) are read as dense copies.
    const Tensor kt = on(randn({3, 2, 9, 8}), dev).transpose(0, 1), vt = on(randn({3, 2, 9, 8}), dev).transpose(0, 1);
    const Tensor q = on(randn({2, 3, 2, 8}), dev);
    CHECK(kernels::attention_head_stride(kt) == -1);
    NoGradGuard no_grad;
    CHECK(max_abs_diff(scaled_dot_product_attention(q, kt, vt, false, 0.0, false).cpu(),
                       scaled_dot_product_attention(q, kt.contiguous(), vt.contiguous(), false, 0.0, false).cpu()) ==
          0.0);
  }
}

// The point of reading views: a sampling loop's step attends one new query to the whole
// cache, and copying the cache out every step would cost a kernel per k and v per layer
// and memory traffic growing with the context. No copy kernel may touch the cache's 17
// rows in such a step (the CPU, and CUDA's tiled kernels, which take decoding steps
// whatever the dtype); the CPU's bfloat16 widens the one query row and narrows the output.
TEST_CASE("a decoding step reads a key-value cache in place: no copy kernel touches the cache") {
  manual_seed(8);
  for (Device dev : test_devices())
    for (DType dt : {kFloat32, kBFloat16})
      for (int64_t D : {int64_t(64), int64_t(12)}) {
        INFO(dev.str(), " ", dtype_name(dt), " D ", D);
        const Tensor kbuf = on(randn({2, 3, 40, D}).to(dt), dev), vbuf = on(randn({2, 3, 40, D}).to(dt), dev);
        const Tensor q = on(randn({2, 3, 1, D}).to(dt), dev);
        const Tensor k = kbuf.narrow(2, 0, 17), v = vbuf.narrow(2, 0, 17);
        NoGradGuard no_grad;
        const Tensor want = scaled_dot_product_attention(q, k.contiguous(), v.contiguous(), false, 0.0, false).cpu();
        profile::enable(profile::Detail::Shapes);  // rows "copy  float32[2, 3, 17, 64], ..."
        const Tensor got = scaled_dot_product_attention(q, k, v, false, 0.0, false);
        const std::vector<profile::KernelTime> ran = profile::report();
        profile::disable();
        bool attended = false;
        for (const profile::KernelTime& kt : ran) {
          INFO("kernel ", kt.kernel, " on ", kt.device, ", ", kt.calls, " call(s)");
          attended = attended || kt.kernel.rfind("attention_forward", 0) == 0;
          if (kt.kernel.rfind("copy", 0) == 0) CHECK(kt.kernel.find("[2, 3, 17, ") == std::string::npos);
        }
        CHECK(attended);  // the report names shapes as read here
        CHECK(max_abs_diff(got.cpu(), want) == 0.0);
      }
}

TEST_CASE("attention with no keys gives zeros; with no queries an empty output") {
  for (Device dev : test_devices()) {
    Tensor q = on(randn({1, 2, 3, 4}), dev).requires_grad_(), k = on(zeros({1, 2, 0, 4}), dev).requires_grad_();
    Tensor v = on(zeros({1, 2, 0, 4}), dev).requires_grad_();
    Tensor out = scaled_dot_product_attention(q, k, v);
    CHECK(out.shape() == Shape{1, 2, 3, 4});
    CHECK(max_abs_diff(out.cpu(), zeros({1, 2, 3, 4})) == 0);
    out.sum().backward();
    CHECK(max_abs_diff(q.grad().cpu(), zeros({1, 2, 3, 4})) == 0);
    Tensor empty_q = on(zeros({1, 2, 0, 4}), dev);
    CHECK(scaled_dot_product_attention(empty_q, k.detach(), v.detach(), true).shape() == Shape{1, 2, 0, 4});
    // No queries but keys: nothing reaches k or v, whose gradients are zeros.
    Tensor k5 = on(randn({1, 2, 5, 4}), dev).requires_grad_(), v5 = on(randn({1, 2, 5, 4}), dev).requires_grad_();
    Tensor none = scaled_dot_product_attention(on(zeros({1, 2, 0, 4}), dev), k5, v5);
    CHECK(none.shape() == Shape{1, 2, 0, 4});
    none.sum().backward();
    CHECK(max_abs_diff(k5.grad().cpu(), zeros({1, 2, 5, 4})) == 0);
    CHECK(max_abs_diff(v5.grad().cpu(), zeros({1, 2, 5, 4})) == 0);
  }
}

TEST_CASE("attention with head dim 0 gives an empty output and empty gradients") {
  for (Device dev : test_devices()) {
    Tensor q = on(randn({1, 2, 3, 0}), dev).requires_grad_(), k = on(randn({1, 2, 5, 0}), dev).requires_grad_();
    Tensor v = on(randn({1, 2, 5, 0}), dev).requires_grad_();
    Tensor out = scaled_dot_product_attention(q, k, v);
    CHECK(out.shape() == Shape{1, 2, 3, 0});
    out.sum().backward();
    CHECK(q.grad().shape() == Shape{1, 2, 3, 0});
    CHECK(k.grad().shape() == Shape{1, 2, 5, 0});
  }
}

TEST_CASE("attention over an empty batch or no heads: empty output and gradients, with or without keys") {
  for (Device dev : test_devices()) {
    for (const Shape& qs : {Shape{0, 2, 3, 4}, Shape{2, 0, 3, 4}, Shape{0, 0, 1, 4}}) {
      for (int64_t Tk : {0, 1, 7}) {
        Shape ks = qs;
        ks[2] = Tk;
        for (bool causal : {false, true}) {
          if (causal && Tk != qs[2]) continue;  // causal needs Tq == Tk
          CAPTURE(qs);
          CAPTURE(Tk);
          CAPTURE(causal);
          Tensor q = on(randn(qs), dev).requires_grad_(), k = on(randn(ks), dev).requires_grad_();
          Tensor v = on(randn(ks), dev).requires_grad_();
          Tensor out = scaled_dot_product_attention(q, k, v, causal, 0.25);
          CHECK(out.shape() == qs);
          out.sum().backward();
          CHECK(q.grad().shape() == qs);
          CHECK(k.grad().shape() == ks);
          CHECK(v.grad().shape() == ks);
        }
      }
    }
  }
}

TEST_CASE("attention head dims past 128: computed on the CPU, refused by name on CUDA") {
  for (Device dev : test_devices()) {
    if (dev.is_cuda()) {
      Tensor q = on(randn({1, 1, 9, 160}), dev);
      CHECK_THROWS_MU(scaled_dot_product_attention(q, q, q), "head dim D = 160 is not supported (at most 128)");
    } else {
      check_against_composed({1, 1, 9, 9, 160}, true, kFloat64, dev);
    }
  }
}

TEST_CASE("attention in bfloat16: computed in float32 with a float32 lse, close to float64, on every device") {
  // On CUDA every bfloat16 path runs each case: by default cuDNN's fused graphs take the
  // calls without dropout (ops/cuda/attention_cudnn.cu) and the tensor-core kernels those
  // at D = 64 with dropout (ops/cuda/attention_flash.cu; the forward from 64 queries on);
  // MUMOE_ATTENTION=flash skips cuDNN, =tiled and =gemm force the others. Partial tiles, causal and not,
  // Tq != Tk, several heads, D of 16, 64 and 128, dropout.
  struct Case {
    int64_t B, H, Tq, Tk, D;
    bool causal;
    double p;
  };
  const Case cases[] = {{1, 2, 70, 70, 64, true, 0.0},   {2, 3, 45, 130, 64, false, 0.2},
                        {2, 3, 45, 130, 64, false, 0.0}, {1, 2, 200, 200, 64, true, 0.1},
                        {1, 1, 33, 33, 16, true, 0.0},   {2, 2, 256, 256, 64, true, 0.0},
                        {1, 2, 96, 96, 128, true, 0.0},
                        // Decoding steps (1 to 3 queries, no dropout), whose bfloat16 keys
                        // and values the CPU reads in place: D a whole number of vectors,
                        // and not (40, and 8 below one vector: copied padded).
                        {2, 3, 1, 130, 64, false, 0.0},  {1, 2, 3, 70, 40, false, 0.0},
                        {2, 2, 2, 33, 8, false, 0.0}};
  std::vector<std::pair<Device, const char*>> runs;  // (device, MUMOE_ATTENTION or nullptr)
  for (Device dev : test_devices()) {
    runs.emplace_back(dev, nullptr);
    if (dev.is_cuda())
      for (const char* path : {"flash", "tiled", "gemm"}) runs.emplace_back(dev, path);
  }
  for (const auto& [dev, path] : runs)
    for (const Case& c : cases) {
      if (path != nullptr) ::setenv("MUMOE_ATTENTION", path, 1);
      else ::unsetenv("MUMOE_ATTENTION");
      INFO(dev.str() << " MUMOE_ATTENTION=" << (path ? path : "(unset)") << ": B " << c.B << " H " << c.H << " T "
                     << c.Tq << " x " << c.Tk << " D " << c.D << (c.causal ? " causal" : "") << " p " << c.p);
      manual_seed(21);
      Tensor q = randn({c.B, c.H, c.Tq, c.D}, kFloat64), k = randn({c.B, c.H, c.Tk, c.D}, kFloat64),
             v = randn({c.B, c.H, c.Tk, c.D}, kFloat64);
      auto bf = [&](const Tensor& t) { return on(t.to(kBFloat16), dev).requires_grad_(); };
      Tensor qb = bf(q), kb = bf(k), vb = bf(v);
      Tensor w = randn({c.B, c.H, c.Tq, c.D}, kFloat64);
      const uint64_t seed = 55;
      Tensor out = scaled_dot_product_attention(qb, kb, vb, c.causal, c.p, true, std::nullopt, seed);
      CHECK(out.dtype() == kBFloat16);
      (out * on(w.to(kBFloat16), dev)).sum().backward();
      // The reference: float64 on the same (bf16-rounded) inputs and upstream gradient,
      // under the documented dropout mask built here from its counter.
      Tensor mask;
      if (c.p > 0) {
        const uint64_t key = kernels::attention_dropout_key(seed), threshold = kernels::attention_dropout_threshold(c.p);
        std::vector<double> keep(size_t(c.B * c.H * c.Tq * c.Tk));
        for (size_t n = 0; n < keep.size(); ++n) keep[n] = kernels::attention_dropout_bits(key, n) >= threshold ? 1.0 : 0.0;
        mask = from_vector<double>(keep, {c.B, c.H, c.Tq, c.Tk}, kFloat64);
      }
      auto leaf = [](const Tensor& t) { return t.to(kBFloat16).to(kFloat64).requires_grad_(); };
      Tensor q64 = leaf(q), k64 = leaf(k), v64 = leaf(v);
      Tensor want = composed(q64, k64, v64, c.causal, 1 / std::sqrt(double(c.D)), mask, c.p);
      (want * w.to(kBFloat16).to(kFloat64)).sum().backward();
      // bf16 keeps 8 bits: the output and the gradients are rounded once to 2^-9 relative,
      // and the backward's score gradients pass through bfloat16 on their way into the
      // products (lse stays float32, so P carries no extra rounding).
      CHECK(rel_err(out.cpu().to(kFloat64), want) <= 1e-2);
      CHECK(rel_err(qb.grad().cpu().to(kFloat64), q64.grad()) <= 1e-2);
      CHECK(rel_err(kb.grad().cpu().to(kFloat64), k64.grad()) <= 1e-2);
      CHECK(rel_err(vb.grad().cpu().to(kFloat64), v64.grad()) <= 1e-2);
    }
  ::unsetenv("MUMOE_ATTENTION");
}

// On the CPU a bfloat16 attention is the float32 attention of the same (widened) values,
// rounded once: its keys and values are widened straight into the rows the tiles read
// (or, for a decoding step, read in place), never copied whole to float32, and that must
// not change a bit. Many queries and few, causal and not, with dropout under one seed, D
// a whole number of vectors and not (40, 8, and 5 below one vector), key counts off the
// tiles, keys and values as dense tensors and as views of a longer cache buffer.
TEST_CASE("attention in bfloat16 on the CPU equals float32 attention of the same values, rounded once") {
  struct Case {
    int64_t B, H, Tq, Tk, D;
    bool causal;
    double p;
  };
  const Case cases[] = {{1, 2, 70, 70, 64, true, 0.0}, {2, 3, 45, 130, 64, false, 0.2}, {2, 2, 33, 33, 40, true, 0.0},
                        {1, 3, 17, 50, 8, false, 0.0}, {2, 1, 9, 9, 5, true, 0.1},      {2, 3, 2, 41, 64, false, 0.0},
                        {1, 2, 4, 70, 40, false, 0.0}, {1, 2, 4, 4, 40, true, 0.0}};
  for (const Case& c : cases)
    for (bool views : {false, true}) {
      INFO("B " << c.B << " H " << c.H << " T " << c.Tq << " x " << c.Tk << " D " << c.D << (c.causal ? " causal" : "")
                << " p " << c.p << (views ? " (k, v views of a longer buffer, no graph)" : ""));
      manual_seed(31);
      const Tensor q = randn({c.B, c.H, c.Tq, c.D}).to(kBFloat16);
      Tensor k = randn({c.B, c.H, c.Tk + 7, c.D}).to(kBFloat16), v = randn({c.B, c.H, c.Tk + 7, c.D}).to(kBFloat16);
      k = views ? k.narrow(2, 0, c.Tk) : k.narrow(2, 0, c.Tk).contiguous();
      v = views ? v.narrow(2, 0, c.Tk) : v.narrow(2, 0, c.Tk).contiguous();
      auto run = [&](const Tensor& qq, const Tensor& kk, const Tensor& vv) {
        std::optional<NoGradGuard> no_grad;
        if (views) no_grad.emplace();
        return scaled_dot_product_attention(qq, kk, vv, c.causal, c.p, true, std::nullopt, uint64_t(77));
      };
      const Tensor got = run(q, k, v);
      const Tensor want = run(q.to(kFloat32), k.to(kFloat32), v.to(kFloat32)).to(kBFloat16);
      REQUIRE(got.dtype() == kBFloat16);
      CHECK(max_abs_diff(got.to(kFloat32), want.to(kFloat32)) == 0.0);
    }
}

// ---------------------------------------------------------------- dropout

TEST_CASE("attention dropout: a seed fixes the mask; manual_seed fixes the drawn seed; eval mode has none") {
  manual_seed(11);
  for (Device dev : test_devices()) {
    Tensor q = on(randn({2, 2, 40, 16}), dev), k = on(randn({2, 2, 40, 16}), dev), v = on(randn({2, 2, 40, 16}), dev);
    auto run = [&](std::optional<uint64_t> seed, bool training = true) {
      return scaled_dot_product_attention(q, k, v, true, 0.3, training, std::nullopt, seed).cpu();
    };
    Tensor a = run(5), b = run(5), c = run(6);
    CHECK(max_abs_diff(a, b) == 0);
    CHECK(max_abs_diff(a, c) > 1e-3);
    manual_seed(99);
    Tensor d = run(std::nullopt);
    manual_seed(99);
    Tensor e = run(std::nullopt);
    Tensor f = run(std::nullopt);  // the stream moved on: a new seed
    CHECK(max_abs_diff(d, e) == 0);
    CHECK(max_abs_diff(d, f) > 1e-3);
    // Not training, or p = 0: exactly the undropped attention, and no draw from the stream.
    Tensor plain = scaled_dot_product_attention(q, k, v, true).cpu();
    CHECK(max_abs_diff(run(5, false), plain) == 0);
    CHECK(max_abs_diff(scaled_dot_product_attention(q, k, v, true, 0.0).cpu(), plain) == 0);
    // The mask is a function of the indices: the thread count does not change it.
    int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    Tensor one = run(5);
    omp_set_num_threads(threads);
    CHECK(max_abs_diff(one, a) == 0);
  }
}

TEST_CASE("attention dropout drops a fraction p of the probabilities and scales the rest by 1/(1-p)") {
  manual_seed(12);
  for (Device dev : test_devices())
    for (bool causal : {false, true})
      for (double p : {0.1, 0.5}) {
        INFO((causal ? "causal" : "full") << " p = " << p);
        const int64_t B = 2, H = 2, T = 96, D = 96;  // Tk == D: v can be the identity
        Tensor q = on(randn({B, H, T, D}, kFloat64), dev), k = on(randn({B, H, T, D}, kFloat64), dev);
        Tensor kept = recover_mask(q, k, causal, p, 1234).cpu();
        // Count kept entries among those each row can see (all, or j <= i).
        std::vector<double> m = kept.to_vector<double>();
        double seen = 0, dropped = 0;
        for (int64_t f = 0; f < B * H * T * T; ++f) {
          int64_t i = (f / T) % T, j = f % T;
          if (causal && j > i) {
            CHECK(m[size_t(f)] == 0);  // causal masking shows as zeros too
            continue;
          }
          seen += 1;
          dropped += m[size_t(f)] == 0 ? 1 : 0;
        }
        // Binomial: 5 standard deviations of the dropped fraction.
        double sd = std::sqrt(p * (1 - p) / seen);
        CHECK(std::fabs(dropped / seen - p) < 5 * sd);

        // With that mask reproduced, the composed attention gives the fused values and
        // gradients for any v (here random, float64).
        Tensor v = on(randn({B, H, T, D}, kFloat64), dev);
        Tensor w = on(randn({B, H, T, D}, kFloat64), dev);
        Tensor kd = on(kept, dev);
        std::vector<Tensor> leaves = {q.detach().requires_grad_(), k.detach().requires_grad_(), v.detach().requires_grad_()};
        std::vector<Tensor> ref = {q.detach().requires_grad_(), k.detach().requires_grad_(), v.detach().requires_grad_()};
        Tensor out = scaled_dot_product_attention(leaves[0], leaves[1], leaves[2], causal, p, true, std::nullopt, 1234);
        Tensor want = composed(ref[0], ref[1], ref[2], causal, 1 / std::sqrt(double(D)), kd, p);
        CHECK(rel_err(out.cpu(), want.cpu()) <= 1e-12);
        (out * w).sum().backward();
        (want * w).sum().backward();
        for (size_t i = 0; i < 3; ++i) {
          INFO("gradient of input " << i);
          CHECK(rel_err(leaves[i].grad().cpu(), ref[i].grad().cpu()) <= 1e-12);
        }
      }
}

TEST_CASE("attention dropout uses the mask of attention_dropout_bits on every device: values and gradients") {
  // The keep mask built here, element by element, from the documented counter; the fused
  // op on each device must equal the composed attention under it.
  struct Case {
    Shapes s;
    bool causal;
    double p;
  };
  const Case cases[] = {
      {{2, 2, 33, 33, 64}, true, 0.25},   // D = 64, T one past a tile
      {{1, 3, 70, 70, 5}, true, 0.5},     // odd D, several tiles
      {{2, 1, 45, 70, 12}, false, 0.3},   // Tq != Tk
      {{1, 1, 129, 129, 128}, true, 0.1}, // D = 128
  };
  for (Device dev : test_devices())
    for (DType dt : {kFloat64, kFloat32})
      for (const Case& c : cases) {
        const Shapes& s = c.s;
        INFO(dtype_name(dt) << " on " << dev.str() << ", T " << s.Tq << " x " << s.Tk << ", D " << s.D
                            << (c.causal ? " causal" : "") << ", p " << c.p);
        const uint64_t seed = 4321 + uint64_t(s.D);
        const uint64_t key = kernels::attention_dropout_key(seed), threshold = kernels::attention_dropout_threshold(c.p);
        std::vector<double> keep(size_t(s.B * s.H * s.Tq * s.Tk));
        for (size_t n = 0; n < keep.size(); ++n)  // n is the element's counter: row-major (b, h, i, j)
          keep[n] = kernels::attention_dropout_bits(key, n) >= threshold ? 1.0 : 0.0;
        Tensor mask = from_vector<double>(keep, {s.B, s.H, s.Tq, s.Tk}, kFloat64);

        Inputs in = make_inputs(s, dt, dev, seed);
        auto fused = value_and_grads(in, [&](auto& q, auto& k, auto& v) {
          return scaled_dot_product_attention(q, k, v, c.causal, c.p, true, std::nullopt, seed);
        });
        Inputs ref64{in.q.detach().cpu().to(kFloat64).requires_grad_(), in.k.detach().cpu().to(kFloat64).requires_grad_(),
                     in.v.detach().cpu().to(kFloat64).requires_grad_(), in.w.cpu().to(kFloat64)};
        auto want = value_and_grads(ref64, [&](auto& q, auto& k, auto& v) {
          return composed(q, k, v, c.causal, 1 / std::sqrt(double(s.D)), mask, c.p);
        });
        const double tol = dt == kFloat64 ? 1e-12 : 5e-6;
        const char* what[] = {"out", "dq", "dk", "dv"};
        for (size_t i = 0; i < 4; ++i) {
          INFO(what[i]);
          CHECK(rel_err(fused[i].cpu().to(kFloat64), want[i]) <= tol);
        }
      }
}

TEST_CASE("attention dropout with p = 1 gives zeros and zero gradients; p outside [0, 1] is an error") {
  for (Device dev : test_devices()) {
    Tensor q = on(randn({1, 2, 10, 4}), dev).requires_grad_(), k = on(randn({1, 2, 10, 4}), dev);
    Tensor v = on(randn({1, 2, 10, 4}), dev).requires_grad_();
    Tensor out = scaled_dot_product_attention(q, k, v, true, 1.0);
    CHECK(max_abs_diff(out.cpu(), zeros({1, 2, 10, 4})) == 0);
    (out * on(randn({1, 2, 10, 4}), dev)).sum().backward();
    CHECK(max_abs_diff(q.grad().cpu(), zeros({1, 2, 10, 4})) == 0);
    CHECK(max_abs_diff(v.grad().cpu(), zeros({1, 2, 10, 4})) == 0);
    CHECK_THROWS_MU(scaled_dot_product_attention(q, k, v, false, 1.5), "dropout_p has to be between 0 and 1, got 1.5");
    CHECK_THROWS_MU(scaled_dot_product_attention(q, k, v, false, -0.1), "got -0.1");
    CHECK_THROWS_MU(scaled_dot_product_attention(q, k, v, false, std::nan("")), "dropout_p has to be between 0 and 1");
  }
}

// ---------------------------------------------------------------- errors

TEST_CASE("attention rejects bad shapes, dtypes and masks with messages naming them") {
  Tensor q = randn({2, 3, 5, 8}), k = randn({2, 3, 6, 8}), v = randn({2, 3, 6, 8});
  CHECK_THROWS_MU(scaled_dot_product_attention(randn({3, 5, 8}), k, v),
                  "q must be 4-D (B, H, T, D), got shape [3, 5, 8]");
  CHECK_THROWS_MU(scaled_dot_product_attention(q, randn({2, 3, 6, 8, 1}), v), "k must be 4-D");
  CHECK_THROWS_MU(scaled_dot_product_attention(q, randn({1, 3, 6, 8}), v), "batch (dim 0) differs");
  CHECK_THROWS_MU(scaled_dot_product_attention(q, k, randn({2, 4, 6, 8})), "heads (dim 1) differs");
  CHECK_THROWS_MU(scaled_dot_product_attention(q, randn({2, 3, 6, 7}), v), "head size D (dim 3) differs: q [2, 3, 5, 8], k [2, 3, 6, 7]");
  CHECK_THROWS_MU(scaled_dot_product_attention(q, k, randn({2, 3, 7, 8})), "k and v must have the same length");
  CHECK_THROWS_MU(scaled_dot_product_attention(q, k, v, true), "causal masking needs as many queries as keys, got Tq = 5 and Tk = 6");
  CHECK_THROWS_MU(scaled_dot_product_attention(q, k.to(kFloat64), v), "dtype mismatch: q float32, k float64, v float32");
  CHECK_THROWS_MU(scaled_dot_product_attention(q.to(kInt64), k.to(kInt64), v.to(kInt64)), "needs float32 or float64");
  CHECK_THROWS_MU(scaled_dot_product_attention(q, k, v, false, 0.0, true, kInf), "scale must be finite");
  CHECK_THROWS_MU(scaled_dot_product_attention(Tensor(), k, v), "q is an undefined tensor");
  if (cuda::device_count() > 0)
    CHECK_THROWS_MU(scaled_dot_product_attention(q, k.to(Device::cuda(0)), v), "device mismatch: q on cpu");
}
