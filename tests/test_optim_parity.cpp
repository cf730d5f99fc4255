// Parity of the optimisers with PyTorch (Debian's python3-torch via /usr/bin/python3):
// the same float32 initial parameters and the same 20 gradients per parameter go through
// our AdamW/SGD and torch.optim's, and the parameters after every step must agree to
// 1e-6 relative (max |ours − torch| / max |torch|). One parameter has no gradient on two
// of the steps (both sides skip it); one configuration also clips the gradients and
// follows a warm-up + cosine schedule with two groups at different learning rates.
#include <algorithm>
#include <iomanip>
#include <sstream>

#include "optim/optim.h"
#include "parity_io.h"

using namespace mu;
using namespace parity;
using optim::ParamGroup;
namespace fs = std::filesystem;

namespace {

constexpr int kSteps = 20;
constexpr size_t kSkipParam = 3;  // this parameter has no gradient on kSkipSteps
const std::vector<int> kSkipSteps = {4, 5};

struct Config {
  std::string name;
  std::string optimizer;  // "adamw" or "sgd"
  double lr = 0, weight_decay = 0;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;                 // adamw
  double momentum = 0, dampening = 0;                             // sgd
  bool nesterov = false;                                          // sgd
  bool amsgrad = false, maximize = false;                         // adamw
  std::vector<size_t> group0, group1;  // parameter indices; group 1 may be empty
  double group1_lr = -1, group1_wd = -1;  // < 0: the optimizer's default
  double clip = 0;                        // max_norm; 0: no clipping
  bool schedule = false;                  // warm-up + cosine lr per step
};

// The schedule of the scheduled configuration; its base lr is the config's lr.
optim::LRSchedule config_schedule(const Config& c) { return optim::warmup_cosine_lr(c.lr, c.lr / 10, 5, 15); }

std::string num(double v) {
  std::ostringstream os;
  os << std::setprecision(17) << v;
  return os.str();
}

std::string list(const std::vector<size_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s + "]";
}

bool skipped(size_t k, int step) {
  return k == kSkipParam && std::find(kSkipSteps.begin(), kSkipSteps.end(), step) != kSkipSteps.end();
}

// Runs one configuration here; returns the parameters after each step, [step][param].
std::vector<std::vector<Tensor>> run_ours(const Config& c, const std::vector<Tensor>& init,
                                          const std::vector<Tensor>& grads) {
  std::vector<Tensor> ps;
  for (const Tensor& p : init) ps.push_back(p.clone().requires_grad_());
  std::vector<ParamGroup> groups(1);
  for (size_t k : c.group0) groups[0].params.push_back(ps[k]);
  if (!c.group1.empty()) {
    groups.push_back(ParamGroup{});
    for (size_t k : c.group1) groups[1].params.push_back(ps[k]);
    if (c.group1_lr >= 0) groups[1].lr = c.group1_lr;
    if (c.group1_wd >= 0) groups[1].weight_decay = c.group1_wd;
  }
  std::unique_ptr<optim::Optimizer> opt;
  if (c.optimizer == "adamw")
    opt = std::make_unique<optim::AdamW>(
        groups, optim::AdamWOptions(c.lr)
                    .betas(c.beta1, c.beta2)
                    .eps(c.eps)
                    .weight_decay(c.weight_decay)
                    .amsgrad(c.amsgrad)
                    .maximize(c.maximize));
  else
    opt = std::make_unique<optim::SGD>(groups, optim::SGDOptions(c.lr)
                                                   .momentum(c.momentum)
                                                   .dampening(c.dampening)
                                                   .nesterov(c.nesterov)
                                                   .weight_decay(c.weight_decay));
  std::vector<std::vector<Tensor>> out;
  for (int s = 0; s < kSteps; ++s) {
    for (size_t k = 0; k < ps.size(); ++k) {
      if (skipped(k, s)) ps[k].zero_grad();
      else ps[k].set_grad(grads[k].select(0, s).clone());
    }
    if (c.clip > 0) optim::clip_grad_norm(ps, c.clip);
    if (c.schedule) optim::apply_lr(*opt, config_schedule(c), s);
    opt->step();
    std::vector<Tensor> snap;
    for (const Tensor& p : ps) snap.push_back(p.detach().clone());
    out.push_back(snap);
  }
  return out;
}

}  // namespace

TEST_CASE("AdamW and SGD match torch.optim over 20 steps") {
  manual_seed(2025);
  // A weight matrix, a bias, an embedding-like matrix and a norm gain.
  std::vector<Tensor> init = {randn({16, 8}) * 0.5, randn({8}) * 0.1, randn({10, 4}), ones({8}) + randn({8}) * 0.05};
  std::vector<Tensor> grads;
  // Gradient scales grow over the steps, so the clipped configuration clips some steps
  // and not others.
  Tensor scale = arange(0, kSteps, 1, kFloat32) * 0.15 + 0.1;
  for (const Tensor& p : init) {
    Shape s = p.shape();
    s.insert(s.begin(), kSteps);
    Shape per_step(s.size(), 1);  // [kSteps, 1, ...]: one scale per step, broadcast
    per_step[0] = kSteps;
    grads.push_back(randn(s) * scale.reshape(per_step));
  }

  std::vector<Config> configs;
  {
    Config c{.name = "adamw", .optimizer = "adamw", .lr = 1e-2, .weight_decay = 0.1, .beta1 = 0.9, .beta2 = 0.95};
    c.group0 = {0, 2};
    c.group1 = {1, 3};
    c.group1_wd = 0.0;
    configs.push_back(c);
    Config s = c;
    s.name = "adamw_clip_schedule";
    s.group1_lr = 5e-3;
    s.clip = 3.0;
    s.schedule = true;
    configs.push_back(s);
    Config a = c;
    a.name = "adamw_amsgrad";
    a.amsgrad = true;
    configs.push_back(a);
    Config x = c;
    x.name = "adamw_amsgrad_maximize";
    x.amsgrad = true;
    x.maximize = true;
    configs.push_back(x);
  }
  {
    Config c{.name = "sgd_momentum", .optimizer = "sgd", .lr = 0.05, .weight_decay = 1e-2, .momentum = 0.9};
    c.group0 = {0, 1, 2, 3};
    configs.push_back(c);
    Config n = c;
    n.name = "sgd_nesterov";
    n.nesterov = true;
    configs.push_back(n);
    Config d = c;
    d.name = "sgd_dampening";
    d.dampening = 0.3;
    d.weight_decay = 0.0;
    configs.push_back(d);
  }

  fs::path dir = make_temp_dir("optim_parity");
  // The manifest is JSON: the Python side reads it with the standard library.
  std::ofstream m(dir / "manifest.json");
  m << "{\"steps\": " << kSteps << ", \"params\": [";
  for (size_t k = 0; k < init.size(); ++k) {
    write_raw(dir / ("p" + std::to_string(k) + ".bin"), init[k]);
    write_raw(dir / ("g" + std::to_string(k) + ".bin"), grads[k]);
    std::vector<size_t> shape(init[k].shape().begin(), init[k].shape().end());
    std::vector<size_t> skip;
    for (int s = 0; s < kSteps; ++s)
      if (skipped(k, s)) skip.push_back(size_t(s));
    m << (k ? ", " : "") << "{\"shape\": " << list(shape) << ", \"skip\": " << list(skip) << "}";
  }
  m << "], \"configs\": [";
  for (size_t i = 0; i < configs.size(); ++i) {
    const Config& c = configs[i];
    std::string lrs = "null";
    if (c.schedule) {
      lrs = "[";
      auto sched = config_schedule(c);
      for (int s = 0; s < kSteps; ++s) lrs += (s ? "," : "") + num(sched(s));
      lrs += "]";
    }
    m << (i ? ", " : "") << "{\"name\": \"" << c.name << "\", \"optimizer\": \"" << c.optimizer
      << "\", \"lr\": " << num(c.lr) << ", \"weight_decay\": " << num(c.weight_decay)
      << ", \"betas\": [" << num(c.beta1) << ", " << num(c.beta2) << "], \"eps\": " << num(c.eps)
      << ", \"momentum\": " << num(c.momentum) << ", \"dampening\": " << num(c.dampening)
      << ", \"nesterov\": " << (c.nesterov ? "true" : "false") << ", \"amsgrad\": " << (c.amsgrad ? "true" : "false")
      << ", \"maximize\": " << (c.maximize ? "true" : "false") << ", \"group0\": " << list(c.group0)
      << ", \"group1\": " << list(c.group1) << ", \"group1_lr\": " << num(c.group1_lr)
      << ", \"group1_wd\": " << num(c.group1_wd) << ", \"clip\": " << num(c.clip) << ", \"lrs\": " << lrs << "}";
  }
  m << "]}\n";
  m.close();

  run_torch_script("torch_optim.py", dir);

  for (const Config& c : configs) {
    INFO("configuration " << c.name);
    auto ours = run_ours(c, init, grads);
    double worst = 0;
    for (size_t k = 0; k < init.size(); ++k) {
      Shape s = init[k].shape();
      s.insert(s.begin(), kSteps);
      Tensor ref = read_float(dir / (c.name + ".p" + std::to_string(k) + ".bin"), s);
      for (int step = 0; step < kSteps; ++step) {
        INFO("parameter " << k << " after step " << step + 1);
        double e = rel_error(ours[size_t(step)][k], ref.select(0, step));
        worst = std::max(worst, e);
        CHECK(e <= 1e-6);
      }
      // The parameter moved: a test that compares unchanged values would prove nothing.
      CHECK(rel_error(ours[kSteps - 1][k], init[k]) > 1e-3);
    }
    MESSAGE(c.name << ": worst relative error over 20 steps " << worst);
  }
  fs::remove_all(dir);
}
