// embedding's backward adds each output-gradient row into its id's row of a zero (V, D)
// gradient: nothing of size N x V (a one-hot matrix) is ever made, so a vocabulary of
// ten million rows costs one gradient table, not a one-hot of every id.
#include <chrono>

#include "helpers.h"

using namespace mu;

TEST_CASE("embedding backward is a scatter-add of rows: V = 10^7 needs no (N, V) one-hot") {
  manual_seed(41);
  const int64_t V = 10'000'000, D = 4, N = 3;
  for (Device dev : test_devices()) {
    INFO(dev.str());
    const bool on_cpu = dev.is_cpu();
    // What one (V, D) float table costs the CPU allocator (160 MB, rounded to its block size).
    const int64_t a0 = cpu_allocator::stats().allocated_bytes;
    Tensor w = zeros({V, D}).to(dev);
    const int64_t table_bytes = cpu_allocator::stats().allocated_bytes - a0;
    // Two rows with known values, so the forward can be checked too.
    Tensor r7 = randn({D}), rlast = randn({D});
    {
      NoGradGuard ng;
      w.select(0, 7).copy_(r7.to(dev));
      w.select(0, V - 1).copy_(rlast.to(dev));
    }
    w.requires_grad_();
    // Id 7 twice: its rows of the output gradient must add up.
    Tensor ids = from_vector(std::vector<int64_t>{7, V - 1, 7}, {N}).to(dev);
    Tensor g = randn({N, D});

    if (on_cpu) cpu_allocator::reset_peak();
    const int64_t before = on_cpu ? cpu_allocator::stats().allocated_bytes : 0;
    auto t0 = std::chrono::steady_clock::now();
    Tensor y = embedding(w, ids);
    y.backward(g.to(dev));
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();

    check_close(y.cpu(), {N, D}, [&] {
      std::vector<double> a = r7.to_vector<double>(), b = rlast.to_vector<double>(), v = a;
      v.insert(v.end(), b.begin(), b.end());
      v.insert(v.end(), a.begin(), a.end());
      return v;
    }(), 0.0);
    if (on_cpu) {
      // What backward may hold at once: the (V, D) gradient the rows are added into and
      // the leaf's own copy of it (AccumulateGrad keeps memory of its own), plus small
      // change. A (N, V) float one-hot alone would be 120 MB more.
      const int64_t extra = cpu_allocator::stats().peak_bytes - before;
      INFO("peak above the table: " << extra << " bytes");
      CHECK(extra <= 2 * table_bytes + (1 << 20));
    }
    {  // (a scope, so that the checks' copies are freed before the timing below)
      // The gradient: g's rows at their ids (id 7 gets rows 0 and 2), zero everywhere else.
      Tensor grad = w.grad().cpu();
      REQUIRE(grad.shape() == Shape{V, D});
      std::vector<double> gv = g.to_vector<double>(), want7(static_cast<size_t>(D)), want_last(static_cast<size_t>(D));
      for (int64_t j = 0; j < D; ++j) {
        want7[size_t(j)] = gv[size_t(j)] + gv[size_t(2 * D + j)];
        want_last[size_t(j)] = gv[size_t(D + j)];
      }
      check_close(grad.select(0, 7), want7, 1e-6);
      check_close(grad.select(0, V - 1), want_last, 1e-6);
      // Everything else is zero: the whole gradient's absolute sum is that of those two rows.
      double rows_abs = 0;
      for (double v : want7) rows_abs += std::fabs(v);
      for (double v : want_last) rows_abs += std::fabs(v);
      CHECK(grad.abs().sum().item() == doctest::Approx(rows_abs).epsilon(1e-5));
    }
    // Once more, with the allocator's blocks warm (the first pass pays the page faults
    // of 2 x 160 MB of fresh memory): the cost of zeroing one table and copying it.
    w.zero_grad();
    t0 = std::chrono::steady_clock::now();
    embedding(w, ids).backward(g.to(dev));
    double warm_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    MESSAGE("embedding forward + backward, V = 10^7, D = 4, N = 3: " << ms << " ms first, " << warm_ms
                                                                      << " ms with warm memory");
  }
}

TEST_CASE("embedding backward at GPT-2's shape with repeated ids equals a brute-force loop and the CPU bit for bit") {
  // GPT-2's vocabulary and a batch of B*T = 8192 ids, half of them from 300 ids so that
  // many rows are hit dozens of times; a narrow row width keeps the reference cheap.
  manual_seed(42);
  const int64_t V = 50257, D = 48, N = 8192;
  Tensor ids = cat({randint(0, 300, {N / 2}), randint(0, V, {N / 2})}, 0);
  Tensor g = randn({N, D});
  std::vector<double> gv = g.to_vector<double>(), want(size_t(V * D), 0.0);
  std::vector<int64_t> iv = ids.to_vector<int64_t>();
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < D; ++c) want[size_t(iv[size_t(n)] * D + c)] += gv[size_t(n * D + c)];
  // The CPU's gradient, for the bit-for-bit comparison.
  Tensor wc = zeros({V, D}).requires_grad_();
  embedding(wc, ids).backward(g);
  for (Device dev : test_devices()) {
    INFO(dev.str());
    Tensor w = zeros({V, D}).to(dev).requires_grad_();
    embedding(w, ids.to(dev)).backward(g.to(dev));
    Tensor grad = w.grad().cpu();
    check_close(grad, {V, D}, want, 1e-5);
    // Every row's additions run in the order of the ids on every device.
    CHECK(grad.to_vector<float>() == wc.grad().to_vector<float>());
  }
}
