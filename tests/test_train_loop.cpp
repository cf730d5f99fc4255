// The training loop (train/loop.h): a run stopped by Ctrl-C and resumed from its checkpoint
// is bit-identical to one that never stopped (losses, weights, the metrics log); gradient
// accumulation equals one large batch; bad options and a missing checkpoint are named.
#include <filesystem>
#include <fstream>

#include "file_helpers.h"
#include "helpers.h"
#include "nn/nn.h"
#include "optim/adamw.h"
#include "optim/sgd.h"
#include "train/interrupt.h"
#include "train/loop.h"
#include "train/metrics_log.h"
#include "train/progress.h"

using namespace mu;

namespace {

// Dropout draws from the global generator, the data from the loop's own generator: both
// must be restored for the resumed run to match.
std::shared_ptr<nn::Sequential> make_model() {
  auto m = std::make_shared<nn::Sequential>();
  m->push_back(std::make_shared<nn::Linear>(5, 12));
  m->push_back(std::make_shared<nn::GELU>());
  m->push_back(std::make_shared<nn::Dropout>(0.2));
  m->push_back(std::make_shared<nn::Linear>(12, 3));
  return m;
}

// A run of the loop on random regression data drawn from `data`; returns the result.
struct Run {
  std::shared_ptr<nn::Sequential> model;
  std::unique_ptr<optim::AdamW> opt;
  Generator data{0};
  train::LoopResult result;
};

void run(Run& r, train::LoopOptions o, int64_t interrupt_after = -1) {
  train::LoopHooks h;
  h.micro_batch_loss = [&](int64_t, int64_t) {
    Tensor x = randn({6, 5}, {}, &r.data), y = randn({6, 3}, {}, &r.data);
    return mse_loss(r.model->forward(x), y);
  };
  // Evaluation with a generator of its own, seeded the same each time.
  h.evaluate = [&] {
    Generator g(99);
    Tensor x = randn({16, 5}, {}, &g), y = randn({16, 3}, {}, &g);
    return train::Metrics{{"val_loss", mse_loss(r.model->forward(x), y).item()}};
  };
  h.after_step = [&](int64_t step, double) {
    if (step + 1 == interrupt_after) train::request_interrupt();
  };
  h.extras.generators["data"] = &r.data;
  r.result = train::run_training(*r.model, *r.opt, optim::warmup_cosine_lr(1e-2, 1e-3, 2, 10), o, h);
}

std::vector<std::vector<float>> weights(const nn::Module& m) {
  std::vector<std::vector<float>> out;
  for (const Tensor& p : m.parameters()) out.push_back(p.to_vector<float>());
  return out;
}

std::vector<std::string> lines(const std::string& path) {
  std::ifstream f(path);
  std::vector<std::string> v;
  for (std::string l; std::getline(f, l);) v.push_back(l);
  return v;
}

// The "step" of each line of a metrics log of the given kind.
std::vector<int64_t> steps_of(const std::string& path, const std::string& kind) {
  std::vector<int64_t> s;
  for (const std::string& l : lines(path)) {
    if (l.find("\"kind\":\"" + kind + "\"") == std::string::npos) continue;
    size_t at = l.find("\"step\":");
    s.push_back(std::stoll(l.substr(at + 7)));
  }
  return s;
}

}  // namespace

TEST_CASE("interrupted and resumed is bit-identical to never stopping, log included") {
  TempDir straight_dir("loop_straight"), stopped_dir("loop_stopped");
  train::LoopOptions o;
  o.max_steps = 10;
  o.grad_accum = 2;
  o.eval_every = 4;
  o.progress = false;

  manual_seed(0);
  Run a;
  a.model = make_model();
  a.opt = std::make_unique<optim::AdamW>(a.model->parameters(), optim::AdamWOptions(1e-2).weight_decay(0.1));
  o.out_dir = straight_dir.path.string();
  run(a, o);
  REQUIRE(a.result.losses.size() == 10);
  CHECK_FALSE(a.result.interrupted);

  // The same run, interrupted after step 6 (as Ctrl-C would).
  manual_seed(0);
  Run b;
  b.model = make_model();
  b.opt = std::make_unique<optim::AdamW>(b.model->parameters(), optim::AdamWOptions(1e-2).weight_decay(0.1));
  o.out_dir = stopped_dir.path.string();
  run(b, o, 6);
  CHECK(b.result.interrupted);
  CHECK(b.result.steps_done == 6);
  // A line from the stopped process after its checkpoint, and a torn one: a resumed log drops both.
  {
    std::ofstream f(stopped_dir.file("metrics.jsonl"), std::ios::app);
    f << "{\"kind\":\"train\",\"step\":7,\"loss\":1.0}\n{\"kind\":\"tra";
  }

  // Fresh objects from another seed, resumed.
  manual_seed(1234);
  Run c;
  c.model = make_model();
  c.opt = std::make_unique<optim::AdamW>(c.model->parameters(), optim::AdamWOptions(1e-2).weight_decay(0.1));
  c.data = Generator(555);
  o.resume = true;
  run(c, o);
  CHECK(c.result.start_step == 6);
  CHECK_FALSE(c.result.interrupted);

  std::vector<double> joined = b.result.losses;
  joined.insert(joined.end(), c.result.losses.begin(), c.result.losses.end());
  CHECK(joined == a.result.losses);  // exact
  CHECK(weights(*c.model) == weights(*a.model));
  CHECK(c.result.last_eval == a.result.last_eval);
  const std::vector<int64_t> want_train = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, want_eval = {4, 8, 10};
  CHECK(steps_of(stopped_dir.file("metrics.jsonl"), "train") == want_train);
  CHECK(steps_of(stopped_dir.file("metrics.jsonl"), "eval") == want_eval);
  CHECK(steps_of(straight_dir.file("metrics.jsonl"), "train") == want_train);
}

TEST_CASE("gradient accumulation over micro-batches equals one batch of their union") {
  auto train_with = [](int64_t accum) {
    manual_seed(3);
    auto model = std::make_shared<nn::Linear>(4, 2);
    optim::SGD opt(model->parameters(), optim::SGDOptions(0.1));
    Generator data(8);
    std::vector<Tensor> xs, ys;
    for (int i = 0; i < 3; ++i) xs.push_back(randn({8, 4}, {}, &data)), ys.push_back(randn({8, 2}, {}, &data));
    train::LoopOptions o;
    o.max_steps = 3;
    o.grad_accum = accum;
    o.clip_norm = 0;
    o.progress = false;
    train::LoopHooks h;
    const int64_t rows = 8 / accum;
    h.micro_batch_loss = [&](int64_t step, int64_t micro) {
      return mse_loss(model->forward(xs[size_t(step)].narrow(0, micro * rows, rows)),
                      ys[size_t(step)].narrow(0, micro * rows, rows));
    };
    train::run_training(*model, opt, optim::constant_lr(0.1), o, h);
    return model->weight.to_vector<double>();
  };
  std::vector<double> one = train_with(1), four = train_with(4);
  REQUIRE(one.size() == four.size());
  for (size_t i = 0; i < one.size(); ++i) CHECK(four[i] == doctest::Approx(one[i]).epsilon(1e-6));
}

TEST_CASE("bad loop options and a missing checkpoint are named") {
  auto model = std::make_shared<nn::Linear>(2, 2);
  optim::SGD opt(model->parameters(), optim::SGDOptions(0.1));
  train::LoopHooks h;
  h.micro_batch_loss = [&](int64_t, int64_t) { return model->forward(ones({1, 2})).sum(); };
  train::LoopOptions o;
  o.progress = false;
  o.grad_accum = 0;
  CHECK_THROWS_MU(train::run_training(*model, opt, optim::constant_lr(0.1), o, h), "grad_accum must be >= 1, got 0");
  o.grad_accum = 1;
  o.clip_norm = NAN;
  CHECK_THROWS_MU(train::run_training(*model, opt, optim::constant_lr(0.1), o, h), "clip_norm must be a finite number");
  o.clip_norm = 1;
  TempDir dir("loop_missing");
  o.out_dir = dir.path.string();
  o.resume = true;
  CHECK_THROWS_MU(train::run_training(*model, opt, optim::constant_lr(0.1), o, h),
                  "resume asked for, but there is no checkpoint at " + train::checkpoint_path(o.out_dir));
  o.resume = false;
  h.micro_batch_loss = [&](int64_t, int64_t) { return model->forward(ones({3, 2})); };
  CHECK_THROWS_MU(train::run_training(*model, opt, optim::constant_lr(0.1), o, h),
                  "micro_batch_loss must return a one-element loss");
}

TEST_CASE("progress figures read as people write them") {
  CHECK(train::Progress::duration(45) == "45s");
  CHECK(train::Progress::duration(192) == "3m12s");
  CHECK(train::Progress::duration(3720) == "1h02m");
  CHECK(train::Progress::duration(NAN) == "?");
  CHECK(train::Progress::rate(950) == "950");
  CHECK(train::Progress::rate(12345) == "12.3k");
  CHECK(train::Progress::rate(1.2e6) == "1.20M");
}
