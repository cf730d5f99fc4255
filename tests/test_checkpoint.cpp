// Training checkpoints: a run stopped, saved, loaded into fresh objects and continued is
// bit-identical to a run that never stopped; damaged or mismatched checkpoints are refused
// with errors naming the file and the entry, and leave everything as it was.
#include <filesystem>

#include "file_helpers.h"
#include "helpers.h"
#include "nn/nn.h"
#include "optim/adamw.h"
#include "optim/checkpoint.h"
#include "optim/sgd.h"
#include "tensor/safetensors.h"

using namespace mu;
namespace fs = std::filesystem;

namespace {

// Two linear layers with dropout between them: dropout and the data both draw from the
// global generator every step, so the resumed run matches only if its state is restored.
std::shared_ptr<nn::Sequential> make_model(int64_t hidden = 16) {
  auto m = std::make_shared<nn::Sequential>();
  m->push_back(std::make_shared<nn::Linear>(6, hidden));
  m->push_back(std::make_shared<nn::ReLU>());
  m->push_back(std::make_shared<nn::Dropout>(0.25));
  m->push_back(std::make_shared<nn::Linear>(hidden, 3));
  return m;
}

std::unique_ptr<optim::AdamW> make_adamw(const nn::Module& m) {
  return std::make_unique<optim::AdamW>(m.parameters(), optim::AdamWOptions(1e-2).weight_decay(0.1));
}

// One training step on fresh random data; returns the loss (mean squared error).
float train_step(nn::Sequential& model, optim::Optimizer& opt) {
  Tensor x = randn({8, 6});
  Tensor target = randn({8, 3});
  Tensor loss = square(model.forward(x) - target).mean();
  opt.zero_grad();
  loss.backward();
  opt.step();
  return loss.item<float>();
}

std::vector<std::vector<float>> weights(const nn::Module& m) {
  std::vector<std::vector<float>> out;
  for (const Tensor& p : m.parameters()) out.push_back(p.to_vector<float>());
  return out;
}

// A model + optimizer trained for `steps` steps from seed 0, and its checkpoint at `path`.
struct Saved {
  std::shared_ptr<nn::Sequential> model;
  std::unique_ptr<optim::AdamW> opt;
};
Saved train_and_save(const std::string& path, int steps) {
  manual_seed(0);
  Saved s{make_model(), nullptr};
  s.opt = make_adamw(*s.model);
  for (int i = 0; i < steps; ++i) train_step(*s.model, *s.opt);
  optim::save_checkpoint(path, *s.model, *s.opt, steps);
  return s;
}

}  // namespace

TEST_CASE("resuming from a checkpoint is bit-identical to never stopping") {
  TempDir dir("checkpoint");
  std::string path = dir.file("ckpt.safetensors");

  // Ten steps straight.
  manual_seed(0);
  auto model_a = make_model();
  auto opt_a = make_adamw(*model_a);
  std::vector<float> losses_a;
  for (int i = 0; i < 10; ++i) losses_a.push_back(train_step(*model_a, *opt_a));
  const std::string rng_after_a = default_generator().state();

  // Five steps, save, and drop those objects.
  std::vector<float> losses_b;
  {
    manual_seed(0);
    auto model = make_model();
    auto opt = make_adamw(*model);
    for (int i = 0; i < 5; ++i) losses_b.push_back(train_step(*model, *opt));
    optim::save_checkpoint(path, *model, *opt, 5);
  }
  // Fresh objects from another seed (different initial weights, another generator state,
  // no optimizer state), then load and continue for five steps.
  manual_seed(12345);
  auto model_b = make_model();
  auto opt_b = make_adamw(*model_b);
  randn({100});  // moves the generator further from the saved state
  CHECK(weights(*model_b) != weights(*model_a));
  CHECK(optim::load_checkpoint(path, *model_b, *opt_b) == 5);
  for (int i = 0; i < 5; ++i) losses_b.push_back(train_step(*model_b, *opt_b));

  REQUIRE(losses_b.size() == losses_a.size());
  for (size_t i = 0; i < losses_a.size(); ++i) {
    INFO("step " << i + 1);
    CHECK(losses_b[i] == losses_a[i]);  // exact
  }
  CHECK(weights(*model_b) == weights(*model_a));  // exact
  // The optimizer state matches too (AdamW step counts and moments).
  nn::StateDict sa = opt_a->state_dict(), sb = opt_b->state_dict();
  REQUIRE(sa.size() == sb.size());
  for (size_t i = 0; i < sa.size(); ++i) {
    INFO("optimizer entry " << sa[i].first);
    CHECK(sa[i].first == sb[i].first);
    CHECK(sa[i].second.to_vector<double>() == sb[i].second.to_vector<double>());
  }
  // And the generator is where the straight run left it.
  CHECK((default_generator().state() == rng_after_a));
}

TEST_CASE("the checkpoint is a safetensors file with the documented layout") {
  TempDir dir("checkpoint");
  std::string path = dir.file("ckpt.safetensors");
  Saved s = train_and_save(path, 3);
  SafetensorsFile f = load_safetensors(path);
  CHECK(f.metadata.at("checkpoint_version") == "1");
  CHECK(f.metadata.at("step") == "3");
  CHECK(f.metadata.at("optimizer") == "AdamW");
  CHECK((f.metadata.at("rng_state") == default_generator().state()));
  for (const auto& [n, t] : s.model->state_dict()) {
    INFO("model entry " << n);
    CHECK(f.get("model." + n).to_vector<float>() == t.to_vector<float>());
  }
  for (const auto& [n, t] : s.opt->state_dict()) {
    INFO("optimizer entry " << n);
    CHECK(f.get("optim." + n).to_vector<double>() == t.to_vector<double>());
  }
  CHECK(f.dtypes.at("model.0.weight") == "F32");
  CHECK(f.dtypes.at("optim.state.0.0.step") == "I64");
  CHECK(f.dtypes.at("optim.group.0.lr") == "F64");
}

TEST_CASE("refused checkpoints name what is wrong and change nothing") {
  TempDir dir("checkpoint");
  std::string path = dir.file("ckpt.safetensors");
  Saved s = train_and_save(path, 2);
  SafetensorsFile good = load_safetensors(path);

  manual_seed(99);
  auto model = make_model();
  auto opt = make_adamw(*model);
  train_step(*model, *opt);  // so the optimizer has state to lose
  const auto weights_before = weights(*model);
  const nn::StateDict opt_before = opt->state_dict();
  std::vector<std::vector<double>> opt_values;
  for (const auto& [n, t] : opt_before) opt_values.push_back(t.to_vector<double>());
  const std::string rng_before = default_generator().state();
  auto unchanged = [&] {
    CHECK(weights(*model) == weights_before);
    nn::StateDict now = opt->state_dict();
    REQUIRE(now.size() == opt_before.size());
    for (size_t i = 0; i < now.size(); ++i) CHECK(now[i].second.to_vector<double>() == opt_values[i]);
    CHECK((default_generator().state() == rng_before));  // parenthesised: no 5 kB state in the log
  };
  // Writes a variant of the good checkpoint: entries edited by `edit`, metadata replaced.
  std::string bad = dir.file("bad.safetensors");
  auto variant = [&](auto edit, std::map<std::string, std::string> meta) {
    std::vector<std::pair<std::string, Tensor>> entries = good.tensors;
    edit(entries);
    save_safetensors(bad, entries, meta);
  };
  auto keep = [](auto&) {};
  const std::map<std::string, std::string> meta = good.metadata;

  CHECK_THROWS_MU(optim::load_checkpoint(dir.file("absent.safetensors"), *model, *opt),
                  "cannot open " + dir.file("absent.safetensors") + ": No such file");
  unchanged();

  // No optimizer state.
  variant([](auto& e) { std::erase_if(e, [](const auto& kv) { return kv.first.rfind("optim.", 0) == 0; }); }, meta);
  CHECK_THROWS_MU(optim::load_checkpoint(bad, *model, *opt), "checkpoint " + bad + ": no optimizer state");
  unchanged();

  // An entry of the wrong dtype.
  variant([](auto& e) { e[0].second = e[0].second.to(kFloat64); }, meta);
  REQUIRE(good.tensors[0].first == "model.0.weight");
  CHECK_THROWS_MU(optim::load_checkpoint(bad, *model, *opt),
                  "checkpoint " + bad + ": entry model.0.weight has dtype F64 but the parameter is float32");
  unchanged();
  variant([](auto& e) {
    for (auto& [n, t] : e)
      if (n == "optim.state.0.1.exp_avg") t = t.to(kFloat64);
  }, meta);
  CHECK_THROWS_MU(optim::load_checkpoint(bad, *model, *opt),
                  "entry optim.state.0.1.exp_avg has dtype F64 but its parameter (group 0, index 1) is float32");
  unchanged();

  // Missing and unexpected model entries, and a model of another shape.
  variant([](auto& e) { e.erase(e.begin() + 1); }, meta);
  CHECK_THROWS_MU(optim::load_checkpoint(bad, *model, *opt), "missing entries: model.0.bias");
  unchanged();
  variant([](auto& e) { e.emplace_back("model.extra", ones({2})); }, meta);
  CHECK_THROWS_MU(optim::load_checkpoint(bad, *model, *opt), "unexpected entries: model.extra");
  unchanged();
  variant([](auto& e) { e.emplace_back("stray", ones({2})); }, meta);
  CHECK_THROWS_MU(optim::load_checkpoint(bad, *model, *opt), "entry \"stray\" is neither model.* nor optim.*");
  unchanged();
  {
    auto wide = make_model(32);  // its initialisation draws from the generator
    default_generator().set_state(rng_before);
    auto wide_opt = make_adamw(*wide);
    CHECK_THROWS_MU(optim::load_checkpoint(path, *wide, *wide_opt),
                    "entry model.0.weight has shape [16, 6] but the parameter has shape [32, 6]");
  }
  unchanged();

  // Optimizer state that does not fit: the model is not loaded either.
  variant([](auto& e) {
    for (auto& [n, t] : e)
      if (n == "optim.group.0.num_params") t = scalar_tensor(3, kInt64);
  }, meta);
  CHECK_THROWS_MU(optim::load_checkpoint(bad, *model, *opt), "checkpoint " + bad + ": optimizer state: AdamW");
  unchanged();
  {
    optim::SGD sgd(model->parameters(), optim::SGDOptions(0.1));
    CHECK_THROWS_MU(optim::load_checkpoint(path, *model, sgd), "holds AdamW state, but the optimizer is SGD");
  }
  unchanged();

  // Metadata: missing or malformed step, version, RNG state.
  auto without = [&](const std::string& key) {
    auto m = meta;
    m.erase(key);
    return m;
  };
  auto with = [&](const std::string& key, const std::string& value) {
    auto m = meta;
    m[key] = value;
    return m;
  };
  variant(keep, without("checkpoint_version"));
  CHECK_THROWS_MU(optim::load_checkpoint(bad, *model, *opt), "not a training checkpoint");
  variant(keep, with("checkpoint_version", "7"));
  CHECK_THROWS_MU(optim::load_checkpoint(bad, *model, *opt), "has layout version 7; this build reads version 1");
  variant(keep, without("step"));
  CHECK_THROWS_MU(optim::load_checkpoint(bad, *model, *opt), "no \"step\" in the metadata");
  variant(keep, with("step", "-3"));
  CHECK_THROWS_MU(optim::load_checkpoint(bad, *model, *opt), "step \"-3\" is not a whole number");
  variant(keep, with("rng_state", "garbage"));
  CHECK_THROWS_MU(optim::load_checkpoint(bad, *model, *opt), "the rng_state in the metadata is malformed");
  unchanged();

  // The good file still loads into these objects, and the generator follows it.
  CHECK(optim::load_checkpoint(path, *model, *opt) == 2);
  CHECK(weights(*model) == weights(*s.model));
  CHECK((default_generator().state() == good.metadata.at("rng_state")));
}

TEST_CASE("a damaged checkpoint header is always caught") {
  TempDir dir("checkpoint");
  std::string path = dir.file("ckpt.safetensors");
  train_and_save(path, 1);
  std::string bytes = read_bytes(path);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | uint8_t(bytes[size_t(i)]);
  manual_seed(5);
  auto model = make_model();
  auto opt = make_adamw(*model);
  // Bit i % 8 of every fifth byte i (the header is ~8 kB, most of it the generator state;
  // the stride cycles through all eight bit positions), each file under a new name.
  int caught = 0, tried = 0;
  for (size_t byte = 0; byte < 8 + n; byte += 5, ++tried) {
    std::string b = bytes;
    b[byte] = char(uint8_t(b[byte]) ^ (1u << (byte % 8)));
    std::string p = dir.file("flip_" + std::to_string(byte) + ".safetensors");
    write_bytes(p, b);
    try {
      optim::load_checkpoint(p, *model, *opt);
      FAIL("flip in byte " << byte << " was not caught");
    } catch (const Error& e) {
      ++caught;
    }
    fs::remove(p);
  }
  CHECK(tried > 1000);
  CHECK(caught == tried);
}

TEST_CASE("save_checkpoint refuses a negative step") {
  TempDir dir("checkpoint");
  auto model = make_model();
  auto opt = make_adamw(*model);
  CHECK_THROWS_MU(optim::save_checkpoint(dir.file("x.safetensors"), *model, *opt, -1), "step -1 is negative");
  CHECK(fs::is_empty(dir.path));
}
