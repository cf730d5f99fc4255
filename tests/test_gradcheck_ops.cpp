// Finite-difference checks of the gradients of the reduction, indexing and nn ops.
// Each op is checked on several shapes, on non-contiguous views made inside the
// checked function, and (where composed with a broadcasting op) with broadcast operands;
// on every test device, with inputs and indices made on the CPU and moved there.
#include "helpers.h"

using namespace mu;
using autograd::TensorList;

namespace {

// An int64 index tensor of shape s holding v, on dev.
Tensor idx(const std::vector<int64_t>& v, const Shape& s, Device dev) { return on(from_vector(v, s), dev); }

// CHECK_GRAD as a function, on `inputs` moved to dev: input lists with commas need no
// extra parentheses.
void check_grad(Device dev, const autograd::GradcheckFn& fn, const TensorList& inputs) {
  TensorList moved;
  for (const Tensor& t : inputs) moved.push_back(on(t, dev));
  auto r = autograd::gradcheck(fn, moved);
  CHECK_MESSAGE(r.ok, r.message);
}

}  // namespace

// ---------------------------------------------------------------- reductions

TEST_CASE("gradcheck var and std") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    for (bool keep : {false, true}) {
      for (const Shape& dims : std::vector<Shape>{{1}, {0, 2}, {-1}, {}}) {
        INFO("dims " << shape_str(dims) << " keepdim " << keep);
        check_grad(dev, [&](const TensorList& in) { return var(in[0], dims, 1, keep); }, {rnd({3, 4, 5}, 1)});
        check_grad(dev, [&](const TensorList& in) { return var(in[0], dims, 0, keep); }, {rnd({2, 3, 4}, 2)});
        check_grad(dev, [&](const TensorList& in) { return mu::std(in[0], dims, 1, keep); }, {rnd({3, 4, 5}, 3)});
        // non-contiguous: transposed inside the checked function
        check_grad(dev, [&](const TensorList& in) { return var(in[0].transpose(0, 2), dims, 1, keep); },
                   {rnd({5, 4, 3}, 4)});
        check_grad(dev, [&](const TensorList& in) { return mu::std(in[0].slice(1, 0, 6, 2), dims, 1, keep); },
                   {rnd({3, 6, 4}, 5)});
      }
    }
    // broadcasting in front of the reduction
    check_grad(dev, [](const TensorList& in) { return var(in[0] * in[1], {0}); }, {rnd({4, 3}, 6), rnd({1, 3}, 7)});
    check_grad(dev, [](const TensorList& in) { return mu::std(in[0]); }, {rnd({7}, 8)});
  }
}

TEST_CASE("gradcheck amax and amin") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    for (bool keep : {false, true}) {
      for (const Shape& dims : std::vector<Shape>{{0}, {1, 2}, {-1}, {}}) {
        INFO("dims " << shape_str(dims) << " keepdim " << keep);
        check_grad(dev, [&](const TensorList& in) { return amax(in[0], dims, keep); }, {rnd({3, 4, 5}, 10)});
        check_grad(dev, [&](const TensorList& in) { return amin(in[0], dims, keep); }, {rnd({3, 4, 5}, 11)});
        check_grad(dev, [&](const TensorList& in) { return amax(in[0].permute({2, 0, 1}), dims, keep); },
                   {rnd({3, 4, 5}, 12)});
        check_grad(dev, [&](const TensorList& in) { return amin(in[0].transpose(0, 1), dims, keep); },
                   {rnd({4, 3, 2}, 13)});
      }
    }
    check_grad(dev, [](const TensorList& in) { return amax(in[0] + in[1], {1}); }, {rnd({3, 5}, 14), rnd({5}, 15)});
  }
}

TEST_CASE("gradcheck max/min values (along a dim and over everything)") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    for (int64_t dim : {0, 1, -1}) {
      for (bool keep : {false, true}) {
        INFO("dim " << dim << " keepdim " << keep);
        check_grad(dev, [&](const TensorList& in) { return mu::max(in[0], dim, keep).values; }, {rnd({3, 4, 5}, 20)});
        check_grad(dev, [&](const TensorList& in) { return mu::min(in[0], dim, keep).values; }, {rnd({4, 6}, 21)});
        check_grad(dev, [&](const TensorList& in) { return mu::max(in[0].t(), dim, keep).values; }, {rnd({6, 4}, 22)});
      }
    }
    check_grad(dev, [](const TensorList& in) { return mu::max(in[0]); }, {rnd({3, 4}, 23)});
    check_grad(dev, [](const TensorList& in) { return mu::min(in[0].t()); }, {rnd({3, 4}, 24)});
    check_grad(dev, [](const TensorList& in) { return mu::max(in[0] * in[1], 0).values; },
               {rnd({5, 3}, 25), rnd({1, 3}, 26)});
  }
}

// ---------------------------------------------------------------- indexing

// The views' gradients: a slice or select scatters g into zeros, except where the view
// is the whole input (a full slice, a select on a dim of size 1), whose gradient is g
// itself, reshaped. Both kinds, multiplied by a second input so the gradient is not 1.
TEST_CASE("gradcheck select and slice, partial and whole") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    check_grad(dev, [&](const TensorList& in) { return in[0].select(1, 2) * in[1]; }, {rnd({3, 4, 2}, 60), rnd({3, 2}, 61)});
    check_grad(dev, [&](const TensorList& in) { return in[0].select(0, 0) * in[1]; }, {rnd({1, 4, 2}, 62), rnd({4, 2}, 63)});
    check_grad(dev, [&](const TensorList& in) { return in[0].transpose(0, 1).select(1, -1) * in[1]; },
               {rnd({1, 3}, 64), rnd({3}, 65)});
    check_grad(dev, [&](const TensorList& in) { return in[0].slice(1, 1, 4, 2) * in[1]; }, {rnd({3, 5}, 66), rnd({3, 2}, 67)});
    check_grad(dev, [&](const TensorList& in) { return in[0].slice(1, 0, 5) * in[1]; }, {rnd({3, 5}, 68), rnd({3, 5}, 69)});
    check_grad(dev, [&](const TensorList& in) { return in[0].t().slice(0, 0, 9) * in[1]; }, {rnd({3, 5}, 70), rnd({5, 3}, 71)});
  }
}

TEST_CASE("gradcheck gather (repeated indices accumulate)") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    manual_seed(30);
    Tensor i1 = on(randint(0, 4, {3, 7, 2}), dev);
    check_grad(dev, [&](const TensorList& in) { return gather(in[0], 1, i1); }, {rnd({3, 4, 5}, 31)});
    Tensor i0 = on(randint(0, 3, {5, 2, 2}), dev);
    check_grad(dev, [&](const TensorList& in) { return gather(in[0], 0, i0); }, {rnd({3, 4, 5}, 32)});
    Tensor i2 = on(randint(0, 5, {2, 4, 6}), dev);
    check_grad(dev, [&](const TensorList& in) { return gather(in[0].transpose(0, 2), -1, i2); }, {rnd({5, 4, 3}, 33)});
    Tensor i3 = on(randint(0, 6, {4, 9}), dev);
    check_grad(dev, [&](const TensorList& in) { return gather(in[0] + in[1], 1, i3); },
               {rnd({4, 6}, 34), rnd({6}, 35)});
  }
}

TEST_CASE("gradcheck scatter_add in x and src") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    manual_seed(40);
    Tensor i1 = on(randint(0, 4, {3, 6, 5}), dev);
    check_grad(dev, [&](const TensorList& in) { return scatter_add(in[0], 1, i1, in[1]); },
               {rnd({3, 4, 5}, 41), rnd({3, 6, 5}, 42)});
    // src larger than index: the unused part gets a zero gradient
    Tensor i0 = on(randint(0, 3, {4, 2}), dev);
    check_grad(dev, [&](const TensorList& in) { return scatter_add(in[0], 0, i0, in[1]); },
               {rnd({3, 4}, 43), rnd({5, 3}, 44)});
    Tensor i2 = on(randint(0, 5, {2, 4}), dev);
    check_grad(dev, [&](const TensorList& in) { return scatter_add(in[0].t(), 1, i2, in[1].t()); },
               {rnd({5, 2}, 45), rnd({4, 2}, 46)});
    // a broadcast src (expanded inside the function)
    Tensor i4 = on(randint(0, 4, {3, 5}), dev);
    check_grad(dev, [&](const TensorList& in) { return scatter_add(in[0], 1, i4, in[1].expand({3, 5})); },
               {rnd({3, 4}, 47), rnd({1, 5}, 48)});
  }
}

TEST_CASE("gradcheck index_add (repeated indices, any dim, strided operands)") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    Tensor i = idx({2, 0, 2, 3, 1}, {5}, dev);
    check_grad(dev, [&](const TensorList& in) { return index_add(in[0], 0, i, in[1]); },
               {rnd({4, 3}, 60), rnd({5, 3}, 61)});
    check_grad(dev, [&](const TensorList& in) { return index_add(in[0], 1, i, in[1].transpose(1, 2)); },
               {rnd({2, 4, 3}, 62), rnd({2, 3, 5}, 63)});
  }
}

TEST_CASE("gradcheck index_select and embedding") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    Tensor i = idx({2, 0, 2, 3, 1}, {5}, dev);
    check_grad(dev, [&](const TensorList& in) { return index_select(in[0], 0, i); }, {rnd({4, 3}, 50)});
    check_grad(dev, [&](const TensorList& in) { return index_select(in[0], 1, i); }, {rnd({2, 4, 3}, 51)});
    check_grad(dev, [&](const TensorList& in) { return index_select(in[0].transpose(0, 2), -1, i); },
               {rnd({4, 3, 2}, 52)});
    check_grad(dev, [&](const TensorList& in) { return index_select(in[0] * in[1], 1, i); },
               {rnd({3, 4}, 53), rnd({3, 1}, 54)});
    Tensor ids = idx({6, 0, 3, 3, 1, 6}, {2, 3}, dev);
    check_grad(dev, [&](const TensorList& in) { return embedding(in[0], ids); }, {rnd({7, 4}, 55)});
    check_grad(dev, [&](const TensorList& in) { return embedding(in[0].t(), idx({1, 1, 0}, {3}, dev)); },
               {rnd({5, 2}, 56)});
    Tensor id0 = full({}, 2, TensorOptions(kInt64).device(dev));  // a 0-dim id
    check_grad(dev, [&](const TensorList& in) { return embedding(in[0], id0); }, {rnd({3, 5}, 57)});
  }
}

TEST_CASE("gradcheck cumsum") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    for (int64_t dim : {0, 1, 2, -1}) {
      INFO("dim " << dim);
      check_grad(dev, [&](const TensorList& in) { return cumsum(in[0], dim); }, {rnd({3, 4, 5}, 60)});
      check_grad(dev, [&](const TensorList& in) { return cumsum(in[0].permute({1, 2, 0}), dim); },
                 {rnd({3, 4, 5}, 61)});
    }
    check_grad(dev, [](const TensorList& in) { return cumsum(in[0] + in[1], 0); }, {rnd({4, 3}, 62), rnd({3}, 63)});
    check_grad(dev, [](const TensorList& in) { return cumsum(in[0], 0); }, {rnd({}, 64)});
  }
}

TEST_CASE("gradcheck sort and topk values") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    for (int64_t dim : {0, 1, -1}) {
      for (bool desc : {false, true}) {
        INFO("dim " << dim << " descending/largest " << desc);
        check_grad(dev, [&](const TensorList& in) { return sort(in[0], dim, desc).values; }, {rnd({3, 5, 4}, 70)});
        check_grad(dev, [&](const TensorList& in) { return sort(in[0].transpose(0, 1), dim, desc).values; },
                   {rnd({5, 3, 4}, 71)});
        check_grad(dev, [&](const TensorList& in) { return topk(in[0], 2, dim, desc).values; }, {rnd({3, 5, 4}, 72)});
        check_grad(dev, [&](const TensorList& in) { return topk(in[0].permute({2, 0, 1}), 3, dim, desc).values; },
                   {rnd({3, 5, 4}, 73)});
      }
    }
    check_grad(dev, [](const TensorList& in) { return topk(in[0] - in[1], 1).values; },
               {rnd({4, 6}, 74), rnd({6}, 75)});
  }
}

// ---------------------------------------------------------------- nn functional

TEST_CASE("gradcheck softmax and log_softmax") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    for (int64_t dim : {0, 1, 2, -1}) {
      INFO("dim " << dim);
      check_grad(dev, [&](const TensorList& in) { return softmax(in[0], dim); }, {rnd({3, 4, 5}, 80)});
      check_grad(dev, [&](const TensorList& in) { return log_softmax(in[0], dim); }, {rnd({3, 4, 5}, 81)});
      check_grad(dev, [&](const TensorList& in) { return softmax(in[0].transpose(0, 2), dim); }, {rnd({5, 4, 3}, 82)});
      check_grad(dev, [&](const TensorList& in) { return log_softmax(in[0].slice(1, 0, 8, 2), dim); },
                 {rnd({3, 8, 2}, 83)});
    }
    // attention-style: scores plus a broadcast bias
    check_grad(dev, [](const TensorList& in) { return softmax(in[0] + in[1], -1); },
               {rnd({2, 3, 4}, 84), rnd({1, 4}, 85)});
    check_grad(dev, [](const TensorList& in) { return log_softmax(in[0] * in[1], 0); },
               {rnd({4, 3}, 86), rnd({4, 1}, 87)});
  }
}

TEST_CASE("gradcheck cross_entropy: every reduction, with and without ignore_index") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    Tensor t = idx({1, 0, 3, 3, 2}, {5}, dev);
    Tensor ti = idx({1, -100, 3, -100, 2}, {5}, dev);
    Tensor t0 = full({}, 2, TensorOptions(kInt64).device(dev));  // a 0-dim target
    for (Reduction r : {Reduction::Mean, Reduction::Sum, Reduction::None}) {
      INFO("reduction " << int(r));
      check_grad(dev, [&](const TensorList& in) { return cross_entropy(in[0], t, r); }, {rnd({5, 4}, 90)});
      check_grad(dev, [&](const TensorList& in) { return cross_entropy(in[0], ti, r); }, {rnd({5, 4}, 91)});
      check_grad(dev, [&](const TensorList& in) { return cross_entropy(in[0], t, r, 3); }, {rnd({5, 4}, 92)});
      check_grad(dev, [&](const TensorList& in) { return cross_entropy(in[0].t(), t, r); }, {rnd({4, 5}, 93)});
      check_grad(dev, [&](const TensorList& in) { return cross_entropy(in[0], t0, r); }, {rnd({6}, 94)});
    }
    check_grad(dev, [&](const TensorList& in) { return cross_entropy(in[0] + in[1], t); },
               {rnd({5, 4}, 95), rnd({4}, 96)});
  }
}

TEST_CASE("gradcheck dropout with a fixed mask") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    // Reseeding inside the function gives every evaluation the same mask.
    for (double p : {0.2, 0.5}) {
      INFO("p " << p);
      check_grad(dev, [&](const TensorList& in) {
        manual_seed(7);
        return dropout(in[0], p);
      }, {rnd({6, 5}, 100)});
      check_grad(dev, [&](const TensorList& in) {
        manual_seed(8);
        return dropout(in[0].t(), p);
      }, {rnd({5, 6}, 101)});
    }
    check_grad(dev, [](const TensorList& in) {
      manual_seed(9);
      return dropout(in[0] * in[1], 0.3);
    }, {rnd({4, 5}, 102), rnd({5}, 103)});
    check_grad(dev, [](const TensorList& in) { return dropout(in[0], 1.0); }, {rnd({3, 3}, 104)});
  }
}
