// Sizes never wrap: every size, stride, offset and byte count that input can push past
// int64 (or past what any machine can allocate) is refused with a mu::Error naming the op
// and the sizes. Each case picks sizes whose true product or sum is known to exceed
// 2^63 - 1 (or 2^48 bytes), so a wrapped computation would have answered instead.
#include <algorithm>
#include <cmath>
#include <limits>

#include "data/loader.h"
#include "helpers.h"
#include "nn/mumoe_layer.h"
#include "tensor/allocator.h"

using namespace mu;

namespace {
constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
constexpr int64_t k2_32 = int64_t(1) << 32;
}  // namespace

TEST_CASE("shapes whose element count or largest stride exceeds int64 are refused") {
  CHECK_THROWS_MU(numel_of({k2_32, k2_32}, "test"), "test: shape [4294967296, 4294967296] has too many elements");
  // Zero elements, but the strides of a dense layout would still overflow.
  CHECK_THROWS_MU(numel_of({0, k2_32, k2_32}), "has too many elements");
  CHECK_THROWS_MU(numel_of({3, -2}), "negative dimension -2 in shape [3, -2]");
  CHECK(numel_of({k2_32, 0}) == 0);
  CHECK(numel_of({int64_t(1) << 31, int64_t(1) << 31}) == int64_t(1) << 62);
  CHECK_THROWS_MU(empty({k2_32, k2_32}), "empty: shape [4294967296, 4294967296] has too many elements");
  CHECK_THROWS_MU(empty({-1}), "empty: negative dimension -1");
}

TEST_CASE("a byte count beyond int64 or beyond any address space is refused before allocating") {
  // 2^62 float32 elements: 2^64 bytes, which int64 cannot hold.
  CHECK_THROWS_MU(empty({int64_t(1) << 62}), "needs too many bytes");
  // 2^47 float32 elements: 2^49 bytes, over the 2^48-byte cap.
  CHECK_THROWS_MU(empty({int64_t(1) << 47}), "needs 562949953421312 bytes, more than any machine can address");
  CHECK_THROWS_MU(zeros({int64_t(1) << 47}, kFloat64), "more than any machine can address");
  // The allocator itself: the rounding of a size near 2^64 used to loop forever.
  CHECK_THROWS_MU(cpu_allocator::allocate(std::numeric_limits<size_t>::max()), "cannot allocate");
}

TEST_CASE("view and reshape: -1 next to sizes whose product overflows") {
  Tensor x = zeros({0});
  CHECK_THROWS_MU(x.view({-1, k2_32, k2_32}), "view: shape [-1, 4294967296, 4294967296] has too many elements");
  CHECK_THROWS_MU(x.reshape({k2_32, k2_32, 0}), "has too many elements");
  CHECK(x.reshape({k2_32, 0}).shape() == Shape{k2_32, 0});
  CHECK_THROWS_MU(zeros({6}).view({-1, -4}), "invalid size -4");
}

TEST_CASE("slice, narrow, chunk and split near int64's end") {
  Tensor x = arange(5);
  // narrow's start + length would overflow; the range is out of bounds, not wrapped.
  CHECK_THROWS_MU(x.narrow(0, 2, kMax), "narrow: start 2 and length 9223372036854775807 are out of bounds");
  CHECK_THROWS_MU(x.narrow(0, 6, 0), "out of bounds");
  // A huge step: one element (ceil(5 / step)); on a stride of 5 its stride overflows.
  CHECK_THROWS_MU(arange(10).view({2, 5}).slice(0, 0, 2, kMax), "slice: stride of dimension 0 times step");
  CHECK(x.slice(0, 1, 5, kMax / 2).to_vector<int64_t>() == std::vector<int64_t>{1});
  // ceil(5 / chunks) for a chunk count near 2^63: five chunks of one.
  CHECK(chunk(x, kMax).size() == 5);
  CHECK_THROWS_MU(split(x, {kMax, 1}, 0), "split: section sizes: 9223372036854775807 + 1 does not fit in int64");
  CHECK_THROWS_MU(split(x, {kMax, -1}, 0), "negative section size -1");
}

TEST_CASE("expand and cat: results whose sizes overflow are refused") {
  Tensor one = ones({1});
  CHECK_THROWS_MU(one.expand({-5}), "expand: invalid size -5");
  CHECK_THROWS_MU(one.expand({k2_32, k2_32}), "expand: shape [4294967296, 4294967296] has too many elements");
  // Two stride-0 views of 2^62 elements each: their concatenation would have 2^63.
  Tensor big = one.expand({int64_t(1) << 62});
  CHECK_THROWS_MU(cat({big, big}, 0), "cat: sizes along dimension 0: 4611686018427387904 + 4611686018427387904");
}

TEST_CASE("arange refuses a count that is infinite, NaN or beyond int64") {
  CHECK_THROWS_MU(arange(0, 1e300, 1), "arange: [0, 1e+300) in steps of 1 has 1e+300 elements");
  CHECK_THROWS_MU(arange(0, INFINITY, 1), "arange");
  CHECK_THROWS_MU(arange(0, NAN, 1), "arange");
  CHECK(arange(0, 3, 1).numel() == 3);
}

TEST_CASE("einsum plans shapes whose combined size exceeds int64 without wrapping") {
  // "ab,cd->": the naive cost multiplies all four sizes, 2^128; the planner counts in double.
  EinsumPath p = einsum_path("ab,cd->", {{k2_32, k2_32}, {k2_32, k2_32}});
  CHECK(p.naive_flops == std::ldexp(1.0, 128));
  CHECK(std::isfinite(p.flops));
  CHECK(p.flops > 0);
}

TEST_CASE("layer counts are checked: parameter and FLOP counts beyond int64 are errors, bad ranks refused") {
  nn::MoEShape s{int64_t(1) << 40, int64_t(1) << 40, {int64_t(1) << 30}, true};
  CHECK_THROWS_MU(nn::CPMuMoE::count_parameters(s, int64_t(1) << 30), "CPMuMoE::count_parameters: the count overflows");
  CHECK_THROWS_MU(nn::DenseMoE::count_parameters(s), "DenseMoE::count_parameters: the count overflows");
  CHECK_THROWS_MU(nn::TRMuMoE::count_parameters(s, {k2_32, k2_32, k2_32}), "TRMuMoE::count_parameters: the count overflows");
  nn::MoEShape small{4, 3, {2}, true};
  // The exact count, by the formula R (sum N_e + I + 1 + O): 5 * (2 + 5 + 3) = 50.
  CHECK(nn::CPMuMoE::count_parameters(small, 5) == 50);
  CHECK_THROWS_MU(nn::CPMuMoE::count_parameters(small, -5), "rank must be positive, got -5");
  CHECK_THROWS_MU(nn::TuckerMuMoE::count_parameters(small, {2, 0, 3}), "ranks must be positive, got [2, 0, 3]");
  CHECK_THROWS_MU(nn::TRMuMoE::count_parameters(small, {2, 2}), "needs 3 ranks");
  nn::MoEShape bad{4, -3, {2}, true};
  CHECK_THROWS_MU(nn::HadamardMoE::count_parameters(bad), "output features must be positive");
  nn::CPMuMoE layer(small, 5);
  CHECK(layer.flops(10) == 10 * layer.flops_per_token());
  CHECK_THROWS_MU(layer.flops(kMax), "CPMuMoE.flops: 9223372036854775807 tokens");
  CHECK_THROWS_MU(layer.flops(-1), "negative token count");
}

TEST_CASE("the loader's batch count near int64's end, and int64 values exact above 2^53") {
  data::DataLoader loader(kMax, data::DataLoaderOptions(2));
  CHECK(loader.batches_per_epoch() == kMax / 2 + 1);
  const int64_t odd = (int64_t(1) << 53) + 1;  // not representable in double
  Tensor t = from_vector(std::vector<int64_t>{odd, -odd, kMax}, {3});
  CHECK(t.to_vector<int64_t>() == std::vector<int64_t>{odd, -odd, kMax});
}

TEST_CASE("randperm of a size no buffer can hold is a mu::Error, not a std:: exception") {
  CHECK_THROWS_MU(randperm(int64_t(1) << 62), "randperm: n = 4611686018427387904 needs more than 281474976710656 bytes");
  CHECK_THROWS_MU(randperm(-3), "randperm: negative n -3");
}

TEST_CASE("randperm refuses a dtype that cannot hold every value 0 to n - 1 exactly, and fills those that can") {
  CHECK_THROWS_MU(randperm(300, TensorOptions(kBFloat16)),
                  "randperm: n = 300 is too large for bfloat16, which holds the integers 0 to 256 exactly");
  CHECK_THROWS_MU(randperm(2050, TensorOptions(kFloat16)), "too large for float16");
  CHECK_THROWS_MU(randperm(129, TensorOptions(kInt8)), "too large for int8");
  CHECK_THROWS_MU(randperm(3, TensorOptions(kBool)), "too large for bool");
  // At the largest n of each: a permutation of 0 .. n - 1.
  for (auto [n, dt] : {std::pair{int64_t(257), kBFloat16}, {int64_t(2049), kFloat16}, {int64_t(128), kInt8},
                       {int64_t(256), kUInt8}, {int64_t(2), kBool}}) {
    INFO(dtype_name(dt));
    std::vector<double> v = randperm(n, TensorOptions(dt)).to_vector<double>();
    std::sort(v.begin(), v.end());
    bool perm = int64_t(v.size()) == n;
    for (int64_t i = 0; perm && i < n; ++i) perm = v[size_t(i)] == double(i);
    CHECK(perm);
  }
}
