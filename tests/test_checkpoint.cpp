// Training checkpoints: a run stopped, saved, loaded into fresh objects and continued is
// bit-identical to a run that never stopped; damaged or mismatched checkpoints are refused
// with errors naming the file and the entry, and leave everything as it was.
#include <sys/stat.h>

#include <cmath>
#include <filesystem>
#include <sstream>

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
  variant(keep, with("step", "007"));
  CHECK_THROWS_MU(optim::load_checkpoint(bad, *model, *opt), "step \"007\" is not a whole number");
  variant(keep, with("step", "1000000000000000000"));
  CHECK_THROWS_MU(optim::load_checkpoint(bad, *model, *opt), "is not a whole number in [0, 10^18)");
  variant(keep, with("rng_state", "garbage"));
  CHECK_THROWS_MU(optim::load_checkpoint(bad, *model, *opt), "the rng_state in the metadata is malformed");
  unchanged();

  // The generator state, parsed strictly and range-checked: each variant below is read
  // without complaint by the stream extractors alone.
  const std::string rng = meta.at("rng_state");
  auto rng_tokens = [&] {
    std::vector<std::string> t;
    std::istringstream is(rng);
    for (std::string w; is >> w;) t.push_back(w);
    return t;
  };
  auto join = [](const std::vector<std::string>& t) {
    std::string out;
    for (const auto& w : t) out += (out.empty() ? "" : " ") + w;
    return out;
  };
  auto token_set = [&](size_t i, const std::string& v) {
    auto t = rng_tokens();
    t.at(i) = v;
    return join(t);
  };
  const size_t n_tokens = rng_tokens().size();
  REQUIRE(n_tokens == 3 + 312 + 1);  // seed, has_spare, spare, 312 engine words, position
  auto refused = [&](const std::string& state, const std::string& why) {
    INFO("rng_state variant: " << why);
    variant(keep, with("rng_state", state));
    CHECK_THROWS_MU(optim::load_checkpoint(bad, *model, *opt), "checkpoint " + bad + ": the rng_state in the metadata is malformed");
    CHECK_THROWS_MU(optim::load_checkpoint(bad, *model, *opt), why);
    unchanged();
  };
  refused(rng + " 5", "not in the exact form");
  refused(" " + rng, "not in the exact form");
  refused(token_set(0, "-1"), "not in the exact form");          // wraps to 2^64 - 1 when streamed
  refused(token_set(0, "0" + rng_tokens()[0]), "not in the exact form");
  refused(token_set(0, "18446744073709551616"), "not \"seed has_spare spare engine\"");  // 2^64
  refused(token_set(1, "2"), "not \"seed has_spare spare engine\"");
  refused(token_set(2, "100"), "the pending normal value 100 is not one the generator can produce");
  refused(token_set(n_tokens - 1, "313"), "the engine position 313 is past its 312 words");
  {
    auto t = rng_tokens();
    for (size_t i = 3; i < 3 + 312; ++i) t[i] = "0";
    refused(join(t), "the engine's words are all zero");
  }
  // The same state written back unchanged loads (the checks refuse only what is wrong).
  variant(keep, with("rng_state", join(rng_tokens())));
  CHECK_NOTHROW(load_safetensors(bad));

  // Optimizer scalars: a step counter that is not a whole number in range, a rate that is
  // not finite.
  auto set_optim = [&](const std::string& name, Tensor v) {
    variant([&](auto& e) {
      bool found = false;
      for (auto& [n, t] : e)
        if (n == name) t = v, found = true;
      REQUIRE(found);
    }, meta);
  };
  set_optim("optim.state.0.0.step", scalar_tensor(INFINITY, kFloat64));
  CHECK_THROWS_MU(optim::load_checkpoint(bad, *model, *opt), "entry \"state.0.0.step\" holds inf, not a finite number");
  unchanged();
  set_optim("optim.state.0.0.step", scalar_tensor(int64_t(1) << 60, kInt64));
  CHECK_THROWS_MU(optim::load_checkpoint(bad, *model, *opt), "a step count must be a whole number in [0, 2^53]");
  unchanged();
  set_optim("optim.state.0.0.step", scalar_tensor(-1, kInt64));
  CHECK_THROWS_MU(optim::load_checkpoint(bad, *model, *opt), "a step count must be a whole number");
  unchanged();
  set_optim("optim.group.0.lr", scalar_tensor(INFINITY, kFloat64));
  CHECK_THROWS_MU(optim::load_checkpoint(bad, *model, *opt), "entry \"group.0.lr\" holds inf, not a finite number");
  unchanged();
  set_optim("optim.group.0.initial_lr", scalar_tensor(-1e-3, kFloat64));
  CHECK_THROWS_MU(optim::load_checkpoint(bad, *model, *opt), "initial_lr -0.001");
  unchanged();

  // The good file still loads into these objects, and the generator follows it.
  CHECK(optim::load_checkpoint(path, *model, *opt) == 2);
  CHECK(weights(*model) == weights(*s.model));
  CHECK((default_generator().state() == good.metadata.at("rng_state")));
}

TEST_CASE("a damaged checkpoint is always caught, header or data") {
  TempDir dir("checkpoint");
  std::string path = dir.file("ckpt.safetensors");
  train_and_save(path, 1);
  std::string bytes = read_bytes(path);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | uint8_t(bytes[size_t(i)]);
  manual_seed(5);
  auto model = make_model();
  auto opt = make_adamw(*model);
  // Bit i % 8 of every fifth byte i of the whole file (the header is ~8 kB, most of it the
  // generator state, then ~2 kB of tensors; the stride cycles through all eight bit
  // positions), each file under a new name.
  REQUIRE(bytes.size() > 8 + n + 1000);
  int caught = 0, tried = 0, tried_data = 0, in_data = 0;
  for (size_t byte = 0; byte < bytes.size(); byte += 5, ++tried) {
    std::string b = bytes;
    b[byte] = char(uint8_t(b[byte]) ^ (1u << (byte % 8)));
    tried_data += byte >= 8 + n;
    std::string p = dir.file("flip_" + std::to_string(byte) + ".safetensors");
    write_bytes(p, b);
    try {
      optim::load_checkpoint(p, *model, *opt);
      FAIL("flip in byte " << byte << " was not caught");
    } catch (const Error& e) {
      ++caught;
      CHECK(std::string(e.what()).find(p) != std::string::npos);  // names the file
      if (byte >= 8 + n) in_data += std::string(e.what()).find("data checksum mismatch") != std::string::npos;
    }
    fs::remove(p);
  }
  CHECK(tried > 1000);
  CHECK(caught == tried);
  CHECK(tried_data > 200);
  CHECK(in_data == tried_data);  // every flip in the data, caught by its tensor's checksum
}

TEST_CASE("save_checkpoint refuses a negative step") {
  TempDir dir("checkpoint");
  auto model = make_model();
  auto opt = make_adamw(*model);
  CHECK_THROWS_MU(optim::save_checkpoint(dir.file("x.safetensors"), *model, *opt, -1), "step -1 is negative");
  CHECK(fs::is_empty(dir.path));
}

TEST_CASE("loading a checkpoint from a FIFO, a directory or a device fails at once") {
  TempDir dir("checkpoint");
  auto model = make_model();
  auto opt = make_adamw(*model);
  CHECK_THROWS_MU(optim::load_checkpoint(dir.path.string(), *model, *opt), "it is a directory, not a regular file");
  CHECK_THROWS_MU(optim::load_checkpoint("/dev/null", *model, *opt), "cannot read /dev/null: it is a character device");
  std::string fifo = dir.file("ckpt.safetensors");
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  Outcome o = outcome_within([&] { optim::load_checkpoint(fifo, *model, *opt); }, 2.0, fifo);
  CHECK(o.returned);  // an open that waited for a writer would not have
  CHECK(o.threw_mu);
  CHECK(o.message == "cannot read " + fifo + ": it is a FIFO (named pipe), not a regular file");
}

TEST_CASE("save_checkpoint removes a dead save's temporary") {
  TempDir dir("checkpoint");
  std::string path = dir.file("ckpt.safetensors");
  // pid_max on Linux is at most 2^22, so this pid names no process.
  std::string stale = path + ".tmp.999999999";
  write_bytes(stale, "half a checkpoint");
  train_and_save(path, 1);
  CHECK_FALSE(fs::exists(stale));
  CHECK(fs::exists(path));
}

TEST_CASE("extras: named generators and values are saved, restored in place and checked first") {
  TempDir dir("checkpoint_extras");
  std::string path = dir.file("ckpt.safetensors");
  manual_seed(0);
  auto model = make_model();
  auto opt = make_adamw(*model);
  Generator data(77);
  randn({13}, {}, &data);  // somewhere mid-stream
  const std::string saved_state = data.state();
  const std::vector<float> next_draws = randn({5}, {}, &data).to_vector<float>();
  data.set_state(saved_state);
  optim::CheckpointExtras extras{{{"data", &data}}, {{"epoch", "3"}, {"batch", "17"}}};
  optim::save_checkpoint(path, *model, *opt, 4, extras);

  // Restored into a generator elsewhere in its stream: the next draws repeat exactly.
  Generator other(5);
  optim::CheckpointExtras back{{{"data", &other}}, {}};
  CHECK(optim::load_checkpoint(path, *model, *opt, &back) == 4);
  CHECK(randn({5}, {}, &other).to_vector<float>() == next_draws);
  CHECK(back.values == std::map<std::string, std::string>{{"epoch", "3"}, {"batch", "17"}});

  // A generator the file does not hold is refused before anything changes.
  Generator g1(1), g2(2);
  const std::string g1_before = g1.state();
  const std::string global_before = default_generator().state();
  optim::CheckpointExtras missing{{{"data", &g1}, {"prefetch", &g2}}, {}};
  CHECK_THROWS_MU(optim::load_checkpoint(path, *model, *opt, &missing), "no state for generator \"prefetch\"");
  CHECK((g1.state() == g1_before));
  CHECK((default_generator().state() == global_before));

  // Names are checked on save.
  optim::CheckpointExtras bad{{}, {{"a b", "1"}}};
  CHECK_THROWS_MU(optim::save_checkpoint(path, *model, *opt, 4, bad), "value name \"a b\" must be 1 to 200 letters");
  optim::CheckpointExtras null_gen{{{"data", nullptr}}, {}};
  CHECK_THROWS_MU(optim::save_checkpoint(path, *model, *opt, 4, null_gen), "generator \"data\" is null");
}
