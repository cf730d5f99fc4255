#include "nn/init.h"

#include <vector>

#include "autograd/grad_mode.h"
#include "tensor/checked.h"
#include "tensor/option_checks.h"
#include "tensor/random.h"

namespace mu::nn::init {

namespace {

void check_float(const Tensor& t, const char* op) {
  MU_CHECK(t.defined(), op, ": the tensor is undefined");
  MU_CHECK(t.is_floating_point(), op, ": needs a floating-point tensor, got ", t.describe());
}

// Overwrites t with draw(generator) for each element in row-major order. Values are drawn
// in double on the host (so a seed gives the same numbers on any device and dtype), then
// written in one conversion.
template <class Draw>
Tensor fill_from(Tensor t, const char* op, Generator* generator, Draw draw) {
  check_float(t, op);
  std::vector<double> v(size_t(t.numel()));
  {
    // One hold of the lock for the whole tensor: another thread's draws come before or after.
    Generator::Draws gen = (generator ? *generator : default_generator()).lock();
    for (double& x : v) x = draw(gen);
  }
  // Rounded to t's dtype on the host: a float64 staging tensor would be twice the size
  // of t and, in the caching allocator, held for a size nothing else asks for (GPT-2's
  // token table: 112 MB kept for the whole run).
  Tensor host = from_vector(v, t.shape(), t.dtype());
  v = std::vector<double>();
  NoGradGuard no_grad;  // an initialisation is not part of any graph
  if (t.device().is_cpu()) {
    t.copy_(host);
  } else {
    // copy_ has no device-to-device path yet: give the handle new device data instead,
    // which every holder of the handle sees.
    t.set_data(host.to(t.device()));
  }
  return t;
}

// The fan the kaiming functions scale by.
double fan_for(const Tensor& t, FanMode mode) {
  check_enum("init", "mode", mode, FanMode::FanOut, "FanMode", "FanIn, FanOut");
  auto [fan_in, fan_out] = calculate_fan_in_and_fan_out(t);
  return double(mode == FanMode::FanIn ? fan_in : fan_out);
}

// Inverse error function: Giles' single-precision approximation ("Approximating the
// erfinv function", GPU Computing Gems, 2011), then two Newton steps on erf(x) = y,
// which bring it to double precision.
double erfinv(double y) {
  if (y <= -1) return -INFINITY;
  if (y >= 1) return INFINITY;
  double w = -std::log((1 - y) * (1 + y)), p;
  if (w < 5) {
    w -= 2.5;
    p = 2.81022636e-08;
    p = 3.43273939e-07 + p * w;
    p = -3.5233877e-06 + p * w;
    p = -4.39150654e-06 + p * w;
    p = 0.00021858087 + p * w;
    p = -0.00125372503 + p * w;
    p = -0.00417768164 + p * w;
    p = 0.246640727 + p * w;
    p = 1.50140941 + p * w;
  } else {
    w = std::sqrt(w) - 3;
    p = -0.000200214257;
    p = 0.000100950558 + p * w;
    p = 0.00134934322 + p * w;
    p = -0.00367342844 + p * w;
    p = 0.00573950773 + p * w;
    p = -0.0076224613 + p * w;
    p = 0.00943887047 + p * w;
    p = 1.00167406 + p * w;
    p = 2.83297682 + p * w;
  }
  double x = p * y;
  for (int k = 0; k < 2; ++k) x -= (std::erf(x) - y) / (2 / std::sqrt(M_PI) * std::exp(-x * x));
  return x;
}

// Standard normal CDF.
double norm_cdf(double x) { return (1 + std::erf(x / std::sqrt(2.0))) / 2; }

}  // namespace

double calculate_gain(Nonlinearity nonlinearity, double param) {
  check_enum("calculate_gain", "nonlinearity", nonlinearity, Nonlinearity::LeakyReLU, "Nonlinearity",
             "Linear, Sigmoid, Tanh, ReLU, LeakyReLU");
  check_finite("calculate_gain", "param", param);
  switch (nonlinearity) {
    case Nonlinearity::Linear:
    case Nonlinearity::Sigmoid: return 1.0;
    case Nonlinearity::Tanh: return 5.0 / 3.0;
    case Nonlinearity::ReLU: return std::sqrt(2.0);
    case Nonlinearity::LeakyReLU: return std::sqrt(2.0 / (1 + param * param));
  }
  return 1.0;
}

std::pair<int64_t, int64_t> calculate_fan_in_and_fan_out(const Tensor& t) {
  MU_CHECK(t.defined() && t.dim() >= 2, "init: fan in and fan out need a tensor of at least 2 dimensions, got ",
           t.describe());
  // Dims past the first two (a convolution's kernel) multiply both fans.
  int64_t receptive = 1;
  // Checked: with a zero dim elsewhere, the fans of an empty tensor may exceed int64.
  for (int64_t d = 2; d < t.dim(); ++d) receptive = checked_mul(receptive, t.size(d), "init: fan of ", t.describe());
  return {checked_mul(t.size(1), receptive, "init: fan of ", t.describe()),
          checked_mul(t.size(0), receptive, "init: fan of ", t.describe())};
}

Tensor uniform_(Tensor t, double a, double b, Generator* gen) {
  check_finite("uniform_", "a", a);
  check_finite("uniform_", "b", b);
  MU_CHECK(a <= b, "uniform_: expects a <= b, got a = ", a, ", b = ", b);
  return fill_from(t, "uniform_", gen, [a, b](Generator::Draws& g) { return a + (b - a) * g.uniform(); });
}

Tensor normal_(Tensor t, double mean, double std, Generator* gen) {
  check_finite("normal_", "mean", mean);
  MU_CHECK(std >= 0 && std::isfinite(std), "normal_: std must be a finite non-negative number, got ", std);
  return fill_from(t, "normal_", gen, [mean, std](Generator::Draws& g) { return mean + std * g.normal(); });
}

Tensor constant_(Tensor t, double value) {
  check_float(t, "constant_");
  NoGradGuard no_grad;
  t.fill_(value);
  return t;
}

Tensor zeros_(Tensor t) { return constant_(t, 0.0); }
Tensor ones_(Tensor t) { return constant_(t, 1.0); }

Tensor kaiming_uniform_(Tensor t, double a, FanMode mode, Nonlinearity nonlinearity, Generator* gen) {
  check_float(t, "kaiming_uniform_");
  check_finite("kaiming_uniform_", "a", a);
  if (t.numel() == 0) return t;  // nothing to draw, and no fan to divide by
  double std = calculate_gain(nonlinearity, a) / std::sqrt(fan_for(t, mode));
  double bound = std::sqrt(3.0) * std;  // U(-b, b) has variance b^2 / 3
  return uniform_(t, -bound, bound, gen);
}

Tensor kaiming_normal_(Tensor t, double a, FanMode mode, Nonlinearity nonlinearity, Generator* gen) {
  check_float(t, "kaiming_normal_");
  check_finite("kaiming_normal_", "a", a);
  if (t.numel() == 0) return t;
  return normal_(t, 0.0, calculate_gain(nonlinearity, a) / std::sqrt(fan_for(t, mode)), gen);
}

Tensor xavier_uniform_(Tensor t, double gain, Generator* gen) {
  check_float(t, "xavier_uniform_");
  check_finite("xavier_uniform_", "gain", gain);
  auto [fan_in, fan_out] = calculate_fan_in_and_fan_out(t);
  // |gain|: a negative gain draws from the same symmetric interval.
  double bound = std::sqrt(3.0) * std::fabs(gain) * std::sqrt(2.0 / double(fan_in + fan_out));
  return uniform_(t, -bound, bound, gen);
}

Tensor xavier_normal_(Tensor t, double gain, Generator* gen) {
  check_float(t, "xavier_normal_");
  check_finite("xavier_normal_", "gain", gain);
  auto [fan_in, fan_out] = calculate_fan_in_and_fan_out(t);
  return normal_(t, 0.0, std::fabs(gain) * std::sqrt(2.0 / double(fan_in + fan_out)), gen);
}

Tensor trunc_normal_(Tensor t, double mean, double std, double a, double b, Generator* gen) {
  check_finite("trunc_normal_", "mean", mean);
  MU_CHECK(std > 0 && std::isfinite(std), "trunc_normal_: std must be a finite positive number, got ", std);
  MU_CHECK(a < b, "trunc_normal_: expects a < b, got a = ", a, ", b = ", b);
  // Uniform on the CDF values of the bounds, mapped back through the inverse CDF:
  // Phi^-1(p) = sqrt(2) * erfinv(2p - 1), so draw 2p - 1 directly.
  double lo = 2 * norm_cdf((a - mean) / std) - 1, hi = 2 * norm_cdf((b - mean) / std) - 1;
  return fill_from(t, "trunc_normal_", gen, [=](Generator::Draws& g) {
    double v = mean + std * std::sqrt(2.0) * erfinv(lo + (hi - lo) * g.uniform());
    // Rounding in the tails may step just outside: clamp as torch does.
    return std::min(std::max(v, a), b);
  });
}

}  // namespace mu::nn::init
