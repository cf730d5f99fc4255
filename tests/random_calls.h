// The random calls of test_random_calls.cpp: a draw (the randomness of one call, its
// arguments from one stream and its tensors' values from another, so that the same seed
// gives the same call on any device) and the table of ops, each a function drawing one
// call of its op: random shapes (0-d, empty dims, size-1 dims), every dtype (compute and
// storage), transposed views, out-of-range dims and indices, operands that do not fit
// together, and for most ops a "fitting" twin whose operands mostly fit, so that the valid
// calls are reached often.
#pragma once
#include <algorithm>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "mumoe.h"
#include "nn/entmax.h"
#include "ops/tensor_algebra.h"

namespace mu::random_calls {

using namespace mu::tensor_algebra;

// One draw's randomness: a call's arguments come from rng, tensor values from gen, so the
// same seed gives the same call on any device. Inputs are made on the CPU and moved.
struct Draw {
  std::mt19937_64 rng;
  Generator gen;
  Device dev;
  std::vector<Tensor> leaves;  // inputs that require grad, in the order drawn

  // For the gradient check: every floating tensor is a float64 leaf, and leaf k is moved
  // by shift[k] (when defined) before it starts to require grad.
  bool f64 = false;
  std::vector<Tensor> shift;
  bool making_constant = false;  // inside constant(): no shift
  // For the float32 check: float32 tensors become float64, nothing else changes (the same
  // values, leaves and call).
  bool widen = false;

  Draw(uint64_t seed, Device d) : rng(seed), gen(seed), dev(d) {}

  int ri(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); }
  int64_t dim() { return ri(-4, 4); }  // in range or not
  DType dtype() {
    static const DType d[] = {kFloat32, kFloat32, kFloat32, kFloat64, kInt64,
                              kBool,    kBFloat16, DType::Float16, DType::Int32};
    return d[ri(0, 8)];
  }
  Shape shape(int max_rank = 3) {
    static const int64_t sizes[] = {0, 1, 2, 3, 5, 9};  // 9: rows wider than a vector
    Shape s;
    for (int r = ri(0, max_rank); r-- > 0;) s.push_back(sizes[ri(0, 5)]);
    return s;
  }
  Tensor tensor(const Shape& s, DType d) {
    if (f64 && is_floating(d)) d = kFloat64;
    if (widen && d == kFloat32) d = kFloat64;
    Tensor t;
    if (d == kInt64 || d == DType::Int32)
      t = randint(-2, 6, s, TensorOptions(kInt64), &gen).to(d);
    else if (d == kBool)
      t = gt(randn(s, {}, &gen), zeros({}));
    else
      t = (randn(s, {}, &gen) * 3.0).to(d);
    if (ri(0, 4) == 0 && t.dim() >= 2) t = t.transpose(0, 1).contiguous().transpose(0, 1);  // strided
    t = t.to(dev);
    // A 16-bit float is now and then the conversion of a float32 leaf (as autocast's
    // activations are), so that the gradients flow back through the op in 16 bits.
    if ((d == kBFloat16 || d == DType::Float16) && !f64 && ri(0, 1)) {
      Tensor leaf = t.to(kFloat32).detach().requires_grad_();
      leaves.push_back(leaf);
      return leaf.to(d);
    }
    // ri is called first: the draw is the same with f64 set or not.
    if ((d == kFloat32 || d == kFloat64) && (ri(0, 1) || f64)) {
      if (!making_constant && leaves.size() < shift.size() && shift[leaves.size()].defined())
        t.add_(shift[leaves.size()].to(dev));
      t = t.detach().requires_grad_();
      leaves.push_back(t);
    }
    return t;
  }
  Tensor tensor() {
    const Shape s = shape();
    return tensor(s, dtype());
  }
  // An input the op does not differentiate (batch norm's running statistics): drawn as
  // tensor() draws, never a leaf.
  Tensor constant(const Shape& s, DType d) {
    const size_t n = leaves.size();
    making_constant = true;
    Tensor t = tensor(s, d);
    making_constant = false;
    if (leaves.size() > n) leaves.pop_back();
    return t.detach();
  }
  int64_t size() { return std::vector<int64_t>{0, 1, 2, 3, 5}[size_t(ri(0, 4))]; }
  // A shape of rank lo..hi, mostly nonempty: sizes 1..5, now and then 0, and now and then
  // 17 or 35 (past the vector kernels' unrolled blocks, with a tail).
  Shape sizes(int lo, int hi) {
    Shape s;
    for (int r = ri(lo, hi); r-- > 0;) {
      const int k = ri(0, 19);
      s.push_back(k == 0 ? 0 : k == 1 ? 17 : k == 2 ? 35 : ri(1, 5));
    }
    return s;
  }
  DType float_dtype() { return ri(0, 1) ? kFloat32 : kFloat64; }
  // The operands of an op whose shapes must agree: mostly agreeing (a valid call), now and
  // then a dim off by one.
  int64_t near(int64_t n) { return ri(0, 7) == 0 ? n + 1 : n; }
  // Indices below hi, now and then one out of range on either side.
  Tensor index(const Shape& s, int64_t hi) {
    return randint(ri(0, 6) == 0 ? -1 : 0, hi + (ri(0, 6) == 0 ? 1 : 0), s, TensorOptions(kInt64), &gen).to(dev);
  }
};

struct Op {
  const char* name;
  std::function<Tensor(Draw&)> call;
  bool random_values = false;  // dropout: only the shape and dtype are compared across devices
};

inline const std::vector<Op>& ops() {
  static const std::vector<Op> table = {
      {"neg", [](Draw& d) { return neg(d.tensor()); }},
      {"exp", [](Draw& d) { return exp(d.tensor()); }},
      {"log", [](Draw& d) { return log(d.tensor()); }},
      {"sqrt", [](Draw& d) { return sqrt(d.tensor()); }},
      {"rsqrt", [](Draw& d) { return rsqrt(d.tensor()); }},
      {"abs", [](Draw& d) { return abs(d.tensor()); }},
      {"sign", [](Draw& d) { return sign(d.tensor()); }},
      {"tanh", [](Draw& d) { return tanh(d.tensor()); }},
      {"sigmoid", [](Draw& d) { return sigmoid(d.tensor()); }},
      {"relu", [](Draw& d) { return relu(d.tensor()); }},
      {"gelu", [](Draw& d) { return gelu(d.tensor(), d.ri(0, 1) ? "tanh" : "none"); }},
      {"square", [](Draw& d) { return square(d.tensor()); }},
      {"pow", [](Draw& d) { return pow(d.tensor(), double(d.ri(-2, 3)) / 2); }},
      {"clamp", [](Draw& d) { return clamp(d.tensor(), -1, d.ri(-2, 2)); }},
      {"clamp_min", [](Draw& d) { return clamp_min(d.tensor(), 0.5); }},
      {"add", [](Draw& d) { return add(d.tensor(), d.tensor()); }},
      {"sub", [](Draw& d) { return sub(d.tensor(), d.tensor()); }},
      {"mul", [](Draw& d) { return mul(d.tensor(), d.tensor()); }},
      {"div", [](Draw& d) { return div(d.tensor(), d.tensor()); }},
      {"div rounding", [](Draw& d) { return div(d.tensor(), d.tensor(), d.ri(0, 1) ? "trunc" : "floor"); }},
      {"pow tensor", [](Draw& d) { return pow(d.tensor(), d.tensor()); }},
      {"maximum", [](Draw& d) { return maximum(d.tensor(), d.tensor()); }},
      {"minimum", [](Draw& d) { return minimum(d.tensor(), d.tensor()); }},
      {"eq", [](Draw& d) { return eq(d.tensor(), d.tensor()); }},
      {"lt", [](Draw& d) { return lt(d.tensor(), d.tensor()); }},
      {"ge", [](Draw& d) { return ge(d.tensor(), d.tensor()); }},
      {"logical_and", [](Draw& d) { return logical_and(d.tensor(), d.tensor()); }},
      {"logical_or", [](Draw& d) { return logical_or(d.tensor(), d.tensor()); }},
      {"logical_not", [](Draw& d) { return logical_not(d.tensor()); }},
      {"where", [](Draw& d) { return where(d.tensor(), d.tensor(), d.tensor()); }},
      {"where scalar", [](Draw& d) { return where(d.tensor(), d.tensor(), Scalar(2.5)); }},
      {"masked_fill", [](Draw& d) { return masked_fill(d.tensor(), d.tensor(), 1.5); }},
      {"sum", [](Draw& d) { return sum(d.tensor(), Shape{d.dim()}); }},
      {"mean", [](Draw& d) { return mean(d.tensor(), Shape{d.dim(), d.dim()}); }},
      {"var", [](Draw& d) { return var(d.tensor(), Shape{d.dim()}); }},
      {"std", [](Draw& d) { return mu::std(d.tensor(), Shape{d.dim()}); }},
      {"amax", [](Draw& d) { return amax(d.tensor(), Shape{d.dim()}); }},
      {"amin", [](Draw& d) { return amin(d.tensor(), Shape{d.dim()}); }},
      {"max", [](Draw& d) { return max(d.tensor()); }},
      {"max dim", [](Draw& d) { return d.tensor().max(d.dim()).values; }},
      {"min dim", [](Draw& d) { return d.tensor().min(d.dim()).values; }},
      {"argmax", [](Draw& d) { return argmax(d.tensor(), d.dim()); }},
      {"argmin", [](Draw& d) { return argmin(d.tensor()); }},
      {"softmax", [](Draw& d) { return softmax(d.tensor(), d.dim()); }},
      {"log_softmax", [](Draw& d) { return log_softmax(d.tensor(), d.dim()); }},
      {"entmax15", [](Draw& d) { return nn::entmax15(d.tensor(), d.dim()); }},
      {"sparsemax", [](Draw& d) { return nn::sparsemax(d.tensor(), d.dim()); }},
      {"cumsum", [](Draw& d) { return cumsum(d.tensor(), d.dim()); }},
      {"sort", [](Draw& d) { return sort(d.tensor(), d.dim(), d.ri(0, 1)).values; }},
      {"topk", [](Draw& d) { return topk(d.tensor(), d.ri(-1, 4), d.dim(), d.ri(0, 1)).values; }},
      {"cat", [](Draw& d) { return cat({d.tensor(), d.tensor()}, d.dim()); }},
      {"cat fitting", [](Draw& d) {
         Shape s = d.sizes(1, 3), t = s;
         const int64_t dim = d.ri(0, int(s.size()) - 1);
         t[size_t(dim)] = d.size();
         if (d.ri(0, 7) == 0) t[size_t(d.ri(0, int(t.size()) - 1))] += 1;  // now and then one that does not fit
         const DType dt = d.float_dtype();
         return cat({d.tensor(s, dt), d.tensor(t, dt), d.tensor(s, dt)}, dim - (d.ri(0, 1) ? int64_t(s.size()) : 0));
       }},
      {"stack", [](Draw& d) { return stack({d.tensor(), d.tensor()}, d.dim()); }},
      {"stack fitting", [](Draw& d) {
         const Shape s = d.sizes(0, 3);
         const DType dt = d.float_dtype();
         return stack({d.tensor(s, dt), d.tensor(s, dt)}, d.ri(-int(s.size()) - 1, int(s.size())));
       }},
      {"permute fitting", [](Draw& d) {
         const Shape s = d.sizes(0, 4);
         Shape perm;
         for (int64_t i = 0; i < int64_t(s.size()); ++i) perm.push_back(i);
         std::shuffle(perm.begin(), perm.end(), d.rng);
         return d.tensor(s, d.float_dtype()).permute(perm) * 2.0;
       }},
      {"tril", [](Draw& d) { return tril(d.tensor(), d.ri(-2, 2)); }},
      {"triu", [](Draw& d) { return triu(d.tensor(), d.ri(-2, 2)); }},
      {"transpose", [](Draw& d) { return d.tensor().transpose(d.dim(), d.dim()); }},
      {"reshape", [](Draw& d) { return d.tensor().reshape(d.shape()); }},
      {"view", [](Draw& d) { return d.tensor().view(d.shape()); }},
      {"narrow", [](Draw& d) { return d.tensor().narrow(d.dim(), d.ri(-2, 3), d.ri(-1, 3)); }},
      {"slice", [](Draw& d) { return d.tensor().slice(d.dim(), d.ri(-3, 3), d.ri(-3, 5), d.ri(0, 2)); }},
      {"select", [](Draw& d) { return d.tensor().select(d.dim(), d.ri(-3, 3)); }},
      {"expand", [](Draw& d) { return d.tensor().expand(d.shape()); }},
      {"squeeze", [](Draw& d) { return d.tensor().squeeze(d.dim()); }},
      {"unsqueeze", [](Draw& d) { return d.tensor().unsqueeze(d.dim()); }},
      {"flatten", [](Draw& d) { return d.tensor().flatten(d.dim(), d.dim()); }},
      {"permute", [](Draw& d) { return d.tensor().permute(Shape{d.dim(), d.dim(), d.dim()}); }},
      {"to", [](Draw& d) { return d.tensor().to(d.dtype()); }},
      {"gather", [](Draw& d) { Tensor x = d.tensor(); return gather(x, d.dim(), d.index(d.shape(), 3)); }},
      {"gather fitting", [](Draw& d) {
         const Shape s = d.sizes(1, 3);
         const int64_t dim = d.ri(0, int(s.size()) - 1);
         Shape is = s;
         for (size_t i = 0; i < is.size(); ++i)
           if (int64_t(i) != dim) is[i] = d.ri(0, int(s[i]));
         is[size_t(dim)] = d.size();
         Tensor x = d.tensor(s, d.float_dtype());
         return gather(x, dim, d.index(is, s[size_t(dim)]));
       }},
      {"scatter_add", [](Draw& d) {
         const Shape s = {d.size() + 1, d.size()};
         const DType t = d.float_dtype();
         const int64_t dim = d.ri(0, 1);
         Tensor x = d.tensor(s, t);
         return scatter_add(x, dim, d.index({d.near(s[0]), s[1]}, s[size_t(dim)]), d.tensor(s, t));
       }},
      {"index_select", [](Draw& d) { Tensor x = d.tensor(); return index_select(x, d.dim(), d.index(d.shape(1), 3)); }},
      {"index_add", [](Draw& d) {
         const Shape s = {d.size() + 1, d.size()};
         const DType t = d.float_dtype();
         const int64_t n = d.size();
         Tensor x = d.tensor(s, t);
         return index_add(x, 0, d.index({n}, s[0]), d.tensor({d.near(n), s[1]}, t));
       }},
      {"embedding", [](Draw& d) { Tensor w = d.tensor(d.shape(2), kFloat32); return embedding(w, d.index(d.shape(2), 3)); }},
      {"matmul", [](Draw& d) { return matmul(d.tensor(), d.tensor()); }},
      {"matmul fitting", [](Draw& d) {
         // Ranks 1-4 each side, batch dims that broadcast (a 1 against any size).
         const int64_t m = d.size(), k = d.size(), n = d.size();
         const int ra = d.ri(1, 4), rb = d.ri(1, 4);
         Shape batch = d.sizes(std::max(ra, rb) - 2, std::max(ra, rb) - 2);
         auto side = [&](int rank, Shape last) {
           Shape s;
           for (int i = int(batch.size()) - (rank - 2); i < int(batch.size()); ++i)
             if (i >= 0) s.push_back(d.ri(0, 3) ? batch[size_t(i)] : 1);
           s.insert(s.end(), last.begin(), last.end());
           return s;
         };
         const DType dt = d.float_dtype();
         Tensor a = d.tensor(ra == 1 ? Shape{k} : side(ra, {m, k}), dt);
         return matmul(a, d.tensor(rb == 1 ? Shape{d.near(k)} : side(rb, {d.near(k), n}), dt));
       }},
      {"mm", [](Draw& d) {
         const int64_t m = d.size(), k = d.size(), n = d.size();
         const DType t = d.ri(0, 3) ? d.float_dtype() : d.dtype();
         return mm(d.tensor({m, k}, t), d.tensor({d.near(k), n}, t));
       }},
      {"bmm", [](Draw& d) {
         const int64_t b = d.size(), m = d.size(), k = d.size(), n = d.size();
         const DType t = d.ri(0, 3) ? d.float_dtype() : d.dtype();
         return bmm(d.tensor({b, m, k}, t), d.tensor({b, d.near(k), n}, t));
       }},
      {"linear", [](Draw& d) { Tensor x = d.tensor(), w = d.tensor(); return linear(x, w, d.ri(0, 1) ? d.tensor() : Tensor()); }},
      {"linear fitting", [](Draw& d) {
         Shape s = d.sizes(1, 3);
         const int64_t in = s.back(), out = d.size();
         const DType dt = d.float_dtype();
         Tensor x = d.tensor(s, dt), w = d.tensor({out, d.near(in)}, dt);
         return linear(x, w, d.ri(0, 1) ? d.tensor({d.near(out)}, dt) : Tensor());
       }},
      {"matmul_with_one", [](Draw& d) {  // random shapes almost never fit: mostly fitting ones
         const Shape s = d.sizes(1, 3);
         const DType dt = d.ri(0, 3) ? d.float_dtype() : d.dtype();
         return matmul_with_one(d.tensor(s, dt), d.tensor({d.near(s.back() + 1), d.size()}, dt));
       }},
      {"cross_entropy", [](Draw& d) { Tensor x = d.tensor(); return cross_entropy(x, d.ri(0, 1) ? d.index(d.shape(2), 3) : d.tensor()); }},
      {"cross_entropy options", [](Draw& d) {
         Tensor x = d.tensor();
         return cross_entropy(x, d.index(d.shape(2), 3),
                              CrossEntropyOptions().ignore_index(d.ri(-1, 2)).reduction(Reduction(d.ri(0, 2))));
       }},
      {"cross_entropy fitting", [](Draw& d) {
         // (N, C) or (N, C, d1): class indices (some ignored) or class probabilities.
         const int64_t n = d.size(), c = d.ri(1, 5);
         Shape s = {n, c};
         if (d.ri(0, 2) == 0) s.push_back(d.size());
         Shape ts = s;
         ts.erase(ts.begin() + 1);
         Tensor x = d.tensor(s, d.float_dtype());
         CrossEntropyOptions o = CrossEntropyOptions().reduction(Reduction(d.ri(0, 2))).label_smoothing(0.25 * d.ri(0, 1));
         const bool weighted = d.ri(0, 2) == 0;
         if (d.ri(0, 1)) {  // probabilities; a class weight here is differentiable
           if (weighted) o.weight(d.tensor({d.near(c)}, x.dtype()));
           return cross_entropy(x, softmax(d.tensor(s, x.dtype()), 1), o);
         }
         if (weighted) o.weight(abs(d.constant({d.near(c)}, x.dtype())));
         return cross_entropy(x, d.index(ts, c), o.ignore_index(d.ri(-1, 1)));
       }},
      {"nll_loss", [](Draw& d) { Tensor x = d.tensor(); return nll_loss(x, d.index(d.shape(2), 3)); }},
      {"mse_loss", [](Draw& d) { return mse_loss(d.tensor(), d.tensor()); }},
      {"bce_with_logits", [](Draw& d) { return binary_cross_entropy_with_logits(d.tensor(), d.tensor()); }},
      {"dropout", [](Draw& d) { Tensor x = d.tensor(); return dropout(x, double(d.ri(-1, 5)) / 4, true, &d.gen); }, true},
      {"layer_norm", [](Draw& d) {
         Tensor x = d.tensor();
         const Shape s = d.shape(2);
         Tensor w = d.ri(0, 1) ? d.tensor() : Tensor(), b = d.ri(0, 1) ? d.tensor() : Tensor();
         return layer_norm(x, s, w, b);
       }},
      {"layer_norm fitting", [](Draw& d) {
         const Shape s = d.sizes(1, 3);
         const Shape norm(s.end() - d.ri(1, int(s.size())), s.end());
         const DType dt = d.float_dtype();
         Tensor x = d.tensor(s, dt);
         Tensor w = d.ri(0, 1) ? d.tensor(norm, dt) : Tensor(), b = d.ri(0, 1) ? d.tensor(norm, dt) : Tensor();
         return layer_norm(x, norm, w, b);
       }},
      {"batch_norm", [](Draw& d) {
         const int64_t c = d.size();
         const DType t = d.float_dtype();
         Tensor x = d.tensor({d.size(), c, d.size()}, t);
         Tensor rm = d.constant({d.near(c)}, t), rv = abs(d.constant({c}, t));
         return batch_norm(x, rm, rv, d.ri(0, 1) ? d.tensor({c}, t) : Tensor(), Tensor(), d.ri(0, 1));
       }},
      {"einsum", [](Draw& d) {
         static const char* specs[] = {"ij,jk->ik", "ii->i", "...i,i", "bij,bjk->bik", "ij->",   "i,i",  "ab,bc,cd->ad",
                                       "ij,jk",     "i->ii", "b t n1, n1 r -> b t r", "ij,kl->ijkl", "->", "aa"};
         const std::string s = specs[d.ri(0, 12)];
         int n = 1;
         for (char c : s) n += c == ',';
         if (d.ri(0, 4) == 0) n += d.ri(-1, 1);  // now and then an operand too many or too few
         std::vector<Tensor> operands;
         for (int i = 0; i < n; ++i) operands.push_back(d.tensor());
         return einsum(s, operands);
       }},
      {"einsum fitting", [](Draw& d) {
         // Every letter one size, mostly: a valid contraction, now and then one that is not.
         static const char* specs[] = {"ij,jk->ik", "ii->i", "bij,bjk->bik", "ij->",     "i,i", "ab,bc,cd->ad",
                                       "ij,jk",     "i->ii", "btn,nr->btr",  "ij,kl->ijkl", "iij->j", "ab,ab,ab->b",
                                       "abc,cd,be->aed", "ijk->kji", "ij,j->i"};
         const std::string spec = specs[d.ri(0, 14)];
         int64_t size[26];
         for (int64_t& z : size) z = d.ri(0, 9) ? d.ri(1, 4) : 0;
         std::vector<Tensor> operands;
         const DType dt = d.float_dtype();
         Shape s;
         for (size_t i = 0; i <= spec.size(); ++i) {
           if (i == spec.size() || spec[i] == ',' || spec[i] == '-') {
             operands.push_back(d.tensor(s, dt));
             s.clear();
             if (i == spec.size() || spec[i] == '-') break;
           } else {
             s.push_back(d.near(size[spec[i] - 'a']));
           }
         }
         return einsum(spec, operands);
       }},
      {"scaled_dot_product_attention fitting", [](Draw& d) {
         // (B, H, T, D) queries; keys and values of their own length and values of their own width.
         const int64_t b = d.size(), h = d.ri(1, 3), tq = d.ri(1, 9), tk = d.ri(0, 4) ? tq : d.ri(1, 9);
         const int64_t dk = d.ri(1, 5), dv = d.ri(0, 1) ? dk : d.ri(1, 5);
         const DType dt = d.float_dtype();
         Tensor q = d.tensor({b, h, tq, dk}, dt), k = d.tensor({b, h, tk, d.near(dk)}, dt), v = d.tensor({b, h, tk, dv}, dt);
         const bool causal = d.ri(0, 1);
         const double p = d.ri(0, 2) ? 0.0 : 0.25;
         return scaled_dot_product_attention(q, k, v, causal, p, true, d.ri(0, 1) ? std::optional<double>(0.3) : std::nullopt,
                                             uint64_t(11));
       }},
      {"scaled_dot_product_attention", [](Draw& d) {
         const Shape s = d.shape(4);
         Tensor q = d.tensor(s, kFloat32), k = d.tensor(d.ri(0, 3) ? s : d.shape(4), kFloat32);
         Tensor v = d.tensor(d.ri(0, 3) ? s : d.shape(4), kFloat32);
         return scaled_dot_product_attention(q, k, v, d.ri(0, 1), double(d.ri(0, 2)) / 4, true, std::nullopt,
                                             uint64_t(7));
       }},
      {"khatri_rao", [](Draw& d) { return khatri_rao({d.tensor(), d.tensor()}); }},
      {"khatri_rao fitting", [](Draw& d) {
         const int64_t r = d.size();
         const DType dt = d.float_dtype();
         std::vector<Tensor> m;
         for (int i = d.ri(1, 3); i-- > 0;) m.push_back(d.tensor({d.size(), d.near(r)}, dt));
         return khatri_rao(m);
       }},
      {"tr_to_tensor fitting", [](Draw& d) {
         // Cores (R_k, I_k, R_{k+1}) around a ring.
         const int n = d.ri(1, 3);
         std::vector<int64_t> r;
         for (int i = 0; i < n; ++i) r.push_back(d.ri(1, 3));
         const DType dt = d.float_dtype();
         std::vector<Tensor> cores;
         for (int i = 0; i < n; ++i) cores.push_back(d.tensor({r[size_t(i)], d.size(), d.near(r[size_t(i + 1) % size_t(n)])}, dt));
         return tr_to_tensor(cores);
       }},
      {"kron", [](Draw& d) { return kron(d.tensor(), d.tensor()); }},
      {"unfold", [](Draw& d) { return unfold(d.tensor(), d.dim()); }},
      {"mode_n_product", [](Draw& d) {
         const Shape s = {d.size(), d.size(), d.size()};
         const DType t = d.float_dtype();
         const int64_t mode = d.ri(-1, 3);
         const int64_t in = mode >= 0 && mode < 3 ? s[size_t(mode)] : 2;
         return mode_n_product(d.tensor(s, t), d.tensor({d.size(), d.near(in)}, t), mode);
       }},
      {"cp_to_tensor", [](Draw& d) {
         const int64_t r = d.size();
         const DType t = d.float_dtype();
         return cp_to_tensor({d.tensor({d.size(), r}, t), d.tensor({d.size(), d.near(r)}, t)});
       }},
      {"tr_to_tensor", [](Draw& d) { return tr_to_tensor({d.tensor(), d.tensor()}); }},
      {"grouped_mm", [](Draw& d) {
         const int64_t m = d.size(), k = d.size(), n = d.size();
         const DType t = d.float_dtype();
         Tensor x = d.tensor({m, k}, t), w = d.tensor({2, d.near(k), n}, t);
         return grouped_mm(x, w, {0, int64_t(d.ri(-1, int(m))), d.ri(0, 7) ? m : m + 1});
       }},
      {"ring_gemm", [](Draw& d) {
         const int64_t m = d.size(), p = d.size(), r = d.size(), s = d.size(), n = d.size();
         const DType t = d.float_dtype();
         return ring_gemm(d.tensor({m, p, r}, t), d.tensor({m, d.near(r), s}, t), d.tensor({s * p, n}, t));
       }},
      {"hadamard_gemm", [](Draw& d) {
         const int64_t m = d.size(), k0 = d.size(), k1 = d.size(), r = d.size();
         const DType t = d.float_dtype();
         return hadamard_gemm({d.tensor({m, k0}, t), d.tensor({m, k1}, t)},
                              {d.tensor({k0, r}, t), d.tensor({d.near(k1), r}, t)},
                              d.ri(0, 1) ? d.tensor({m, r}, t) : Tensor());
       }},
      {"cp_hadamard", [](Draw& d) {
         const int64_t m = d.size(), i = d.size(), n = d.size(), r = d.size();
         const DType t = d.float_dtype();
         return cp_hadamard(d.tensor({m, i}, t), d.tensor({i, r}, t), {d.tensor({m, n}, t)},
                            {d.tensor({d.near(n), r}, t)});
       }},
  };
  return table;
}

}  // namespace mu::random_calls
