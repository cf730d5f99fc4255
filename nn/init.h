// Parameter initialisation, as torch.nn.init: each function overwrites `t` in place
// (under NoGradGuard, so it works on parameters that require grad), draws in row-major
// order from `gen` (the global generator, seeded by manual_seed, when null), and returns
// `t`. Bounds, means, deviations and gains must be finite; enums must name an enumerator.
//
//   nn::init::kaiming_uniform_(fc->weight, std::sqrt(5.0));
//   nn::init::trunc_normal_(pos_emb, 0.0, 0.02);
#pragma once
#include <cmath>
#include <string>
#include <utility>

#include "tensor/random.h"
#include "tensor/tensor.h"

namespace mu::nn::init {

// Which fan the kaiming functions scale by: fan_in keeps the forward variance,
// fan_out the backward one.
enum class FanMode { FanIn, FanOut };

// The nonlinearity that follows the layer, for the recommended gain.
enum class Nonlinearity { Linear, Sigmoid, Tanh, ReLU, LeakyReLU };

// torch.nn.init.calculate_gain: 1 for linear/sigmoid, 5/3 for tanh, sqrt(2) for relu,
// sqrt(2 / (1 + slope^2)) for leaky_relu (`param` is the slope, default 0.01).
double calculate_gain(Nonlinearity nonlinearity, double param = 0.01);

// (fan_in, fan_out) of a weight of rank >= 2: size(1) and size(0), each times the
// product of the remaining (receptive-field) dims.
std::pair<int64_t, int64_t> calculate_fan_in_and_fan_out(const Tensor& t);

Tensor uniform_(Tensor t, double a = 0.0, double b = 1.0, Generator* gen = nullptr);
Tensor normal_(Tensor t, double mean = 0.0, double std = 1.0, Generator* gen = nullptr);
Tensor constant_(Tensor t, double value);
Tensor zeros_(Tensor t);
Tensor ones_(Tensor t);

// U(-bound, bound), bound = gain * sqrt(3 / fan); `a` is the leaky_relu slope.
Tensor kaiming_uniform_(Tensor t, double a = 0.0, FanMode mode = FanMode::FanIn,
                        Nonlinearity nonlinearity = Nonlinearity::LeakyReLU, Generator* gen = nullptr);
// N(0, std^2), std = gain / sqrt(fan).
Tensor kaiming_normal_(Tensor t, double a = 0.0, FanMode mode = FanMode::FanIn,
                       Nonlinearity nonlinearity = Nonlinearity::LeakyReLU, Generator* gen = nullptr);
// U(-bound, bound), bound = gain * sqrt(6 / (fan_in + fan_out)).
Tensor xavier_uniform_(Tensor t, double gain = 1.0, Generator* gen = nullptr);
// N(0, std^2), std = gain * sqrt(2 / (fan_in + fan_out)).
Tensor xavier_normal_(Tensor t, double gain = 1.0, Generator* gen = nullptr);
// N(mean, std^2) conditioned on [a, b], by inverse-CDF sampling as torch does.
Tensor trunc_normal_(Tensor t, double mean = 0.0, double std = 1.0, double a = -2.0, double b = 2.0,
                     Generator* gen = nullptr);

}  // namespace mu::nn::init
