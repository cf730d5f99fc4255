#include "optim/checkpoint.h"

#include <algorithm>
#include <map>

#include "tensor/random.h"
#include "tensor/safetensors.h"

namespace mu::optim {

namespace {

const std::string kModelPrefix = "model.";
const std::string kOptimPrefix = "optim.";

bool is_digit(char c) { return c >= '0' && c <= '9'; }

bool starts_with(const std::string& s, const std::string& prefix) { return s.compare(0, prefix.size(), prefix) == 0; }

// The metadata value `key`; a checkpoint without it is refused.
const std::string& meta(const SafetensorsFile& f, const std::string& key) {
  auto it = f.metadata.find(key);
  MU_CHECK(it != f.metadata.end(), "checkpoint ", f.path, ": no \"", key, "\" in the metadata");
  return it->second;
}

int64_t parse_step(const SafetensorsFile& f) {
  const std::string& s = meta(f, "step");
  // Digits only (stoll alone would take " 12" or "12abc"), as std::to_string writes them
  // (no leading zero); 18 of them cannot overflow.
  bool ok = !s.empty() && s.size() <= 18 && std::all_of(s.begin(), s.end(), is_digit) && (s[0] != '0' || s == "0");
  MU_CHECK(ok, "checkpoint ", f.path, ": step \"", s, "\" is not a whole number in [0, 10^18) as save_checkpoint "
           "writes it");
  return std::stoll(s);
}

// The checks Module::load_state_dict makes (names, shapes) plus dtypes, made up front so
// that a refused model is refused before the optimizer has been touched. load_state_dict
// would convert a float64 entry into a float32 parameter silently; a checkpoint that does
// not match the model's dtypes is refused instead.
void check_model(const SafetensorsFile& f, const nn::StateDict& entries, const nn::Module& model) {
  std::map<std::string, Tensor> given(entries.begin(), entries.end());
  nn::StateDict mine = model.state_dict();
  std::map<std::string, Tensor> expected(mine.begin(), mine.end());
  std::string missing, unexpected;
  for (const auto& [n, t] : mine)
    if (!given.count(n)) missing += (missing.empty() ? "" : ", ") + kModelPrefix + n;
  for (const auto& [n, t] : entries)
    if (!expected.count(n)) unexpected += (unexpected.empty() ? "" : ", ") + kModelPrefix + n;
  MU_CHECK(missing.empty() && unexpected.empty(), "checkpoint ", f.path, " does not fit this ", model.type_name(), ": ",
           missing.empty() ? "" : "missing entries: " + missing, !missing.empty() && !unexpected.empty() ? "; " : "",
           unexpected.empty() ? "" : "unexpected entries: " + unexpected);

  std::map<std::string, Tensor> params;
  for (const auto& [n, t] : model.named_parameters()) params[n] = t;
  for (const auto& [n, t] : mine) {
    const Tensor& src = given.at(n);
    const char* kind = params.count(n) ? "parameter" : "buffer";
    MU_CHECK(src.shape() == t.shape(), "checkpoint ", f.path, ": entry ", kModelPrefix, n, " has shape ",
             shape_str(src.shape()), " but the ", kind, " has shape ", shape_str(t.shape()));
    const std::string& stored = f.dtypes.at(kModelPrefix + n);
    MU_CHECK(stored == safetensors_dtype(t.dtype()), "checkpoint ", f.path, ": entry ", kModelPrefix, n,
             " has dtype ", stored, " but the ", kind, " is ", dtype_name(t.dtype()));
  }
}

// Optimizer buffers, "state.<g>.<i>.<buffer>" (optim/optimizer.h), must have their
// parameter's dtype, for the same reason; step counters are exempt (integers).
// Entries this does not recognise are left to Optimizer::load_state_dict to refuse.
void check_optimizer_dtypes(const SafetensorsFile& f, const nn::StateDict& entries, const Optimizer& opt) {
  for (const auto& [n, t] : entries) {
    if (!starts_with(n, "state.")) continue;
    size_t a = n.find('.', 6), b = a == std::string::npos ? a : n.find('.', a + 1);
    if (b == std::string::npos) continue;
    std::string gs = n.substr(6, a - 6), is = n.substr(a + 1, b - a - 1), buffer = n.substr(b + 1);
    auto digits = [](const std::string& s) {
      return !s.empty() && s.size() < 10 && std::all_of(s.begin(), s.end(), is_digit);
    };
    if (!digits(gs) || !digits(is) || buffer == "step") continue;
    size_t g = std::stoul(gs), i = std::stoul(is);
    if (g >= opt.param_groups().size() || i >= opt.param_groups()[g].params.size()) continue;
    const Tensor& p = opt.param_groups()[g].params[i];
    const std::string& stored = f.dtypes.at(kOptimPrefix + n);
    MU_CHECK(stored == safetensors_dtype(p.dtype()), "checkpoint ", f.path, ": entry ", kOptimPrefix, n,
             " has dtype ", stored, " but its parameter (group ", g, ", index ", i, ") is ", dtype_name(p.dtype()));
  }
}

const std::string kGeneratorPrefix = "generator.";
const std::string kValuePrefix = "value.";

// A name of an extra: non-empty, letters, digits, '_', '-', '.'.
void check_extra_name(const std::string& path, const std::string& name, const char* what) {
  bool ok = !name.empty() && name.size() <= 200;
  for (char c : name)
    ok = ok && ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || is_digit(c) || c == '_' || c == '-' || c == '.');
  MU_CHECK(ok, "checkpoint ", path, ": ", what, " name \"", name,
           "\" must be 1 to 200 letters, digits, '_', '-' or '.'");
}

}  // namespace

void save_checkpoint(const std::string& path, const nn::Module& model, const Optimizer& opt, int64_t step,
                     const CheckpointExtras& extras) {
  MU_CHECK(step >= 0, "save_checkpoint ", path, ": step ", step, " is negative");
  std::vector<std::pair<std::string, Tensor>> entries;
  for (const auto& [n, t] : model.state_dict()) entries.emplace_back(kModelPrefix + n, t);
  for (const auto& [n, t] : opt.state_dict()) entries.emplace_back(kOptimPrefix + n, t);
  std::map<std::string, std::string> metadata = {{"checkpoint_version", std::to_string(kCheckpointVersion)},
                                                 {"step", std::to_string(step)},
                                                 {"optimizer", opt.name()},
                                                 {"rng_state", default_generator().state()}};
  for (const auto& [name, g] : extras.generators) {
    check_extra_name(path, name, "generator");
    MU_CHECK(g != nullptr, "save_checkpoint ", path, ": generator \"", name, "\" is null");
    metadata[kGeneratorPrefix + name] = g->state();
  }
  for (const auto& [name, v] : extras.values) {
    check_extra_name(path, name, "value");
    metadata[kValuePrefix + name] = v;
  }
  save_safetensors(path, entries, metadata);
}

int64_t load_checkpoint(const std::string& path, nn::Module& model, Optimizer& opt, CheckpointExtras* extras) {
  SafetensorsFile f = load_safetensors(path);
  auto version = f.metadata.find("checkpoint_version");
  MU_CHECK(version != f.metadata.end(), "checkpoint ", path,
           ": not a training checkpoint (no checkpoint_version in its metadata; plain tensor files are read with "
           "load_safetensors)");
  MU_CHECK(version->second == std::to_string(kCheckpointVersion), "checkpoint ", path, " has layout version ",
           version->second, "; this build reads version ", kCheckpointVersion);
  // save_checkpoint always writes the checksum; without it a damaged step or RNG state
  // in the metadata would go unnoticed.
  MU_CHECK(f.checksummed, "checkpoint ", path,
           ": the header has no checksum (save_checkpoint writes one; was the file rewritten by another tool?)");
  const int64_t step = parse_step(f);
  const std::string& saved_opt = meta(f, "optimizer");
  MU_CHECK(saved_opt == opt.name(), "checkpoint ", path, " holds ", saved_opt, " state, but the optimizer is ",
           opt.name());
  // Parsed into a spare generator first, so a malformed state changes nothing.
  Generator rng;
  try {
    rng.set_state(meta(f, "rng_state"));
  } catch (const Error& e) {
    MU_FAIL("checkpoint ", path, ": the rng_state in the metadata is malformed (", e.what(), ")");
  }
  // The caller's generators, likewise parsed into spares first.
  std::map<std::string, Generator> named;
  if (extras) {
    for (const auto& [name, g] : extras->generators) {
      MU_CHECK(g != nullptr, "load_checkpoint ", path, ": generator \"", name, "\" is null");
      auto it = f.metadata.find(kGeneratorPrefix + name);
      MU_CHECK(it != f.metadata.end(), "checkpoint ", path, ": no state for generator \"", name,
               "\" (was it saved with that name?)");
      try {
        named[name].set_state(it->second);
      } catch (const Error& e) {
        MU_FAIL("checkpoint ", path, ": the state of generator \"", name, "\" is malformed (", e.what(), ")");
      }
    }
  }

  nn::StateDict model_sd, optim_sd;
  for (const auto& [n, t] : f.tensors) {
    if (starts_with(n, kModelPrefix))
      model_sd.emplace_back(n.substr(kModelPrefix.size()), t);
    else if (starts_with(n, kOptimPrefix))
      optim_sd.emplace_back(n.substr(kOptimPrefix.size()), t);
    else
      MU_FAIL("checkpoint ", path, ": entry \"", n, "\" is neither model.* nor optim.*");
  }
  MU_CHECK(!optim_sd.empty(), "checkpoint ", path, ": no optimizer state (no optim.* entries)");
  check_model(f, model_sd, model);
  check_optimizer_dtypes(f, optim_sd, opt);

  // The optimizer checks everything before it changes anything; the model was checked
  // above, so once the optimizer has accepted its state nothing below can be refused.
  try {
    opt.load_state_dict(optim_sd);
  } catch (const Error& e) {
    MU_FAIL("checkpoint ", path, ": optimizer state: ", e.what());
  }
  model.load_state_dict(model_sd);
  default_generator() = rng;
  if (extras) {
    for (auto& [name, g] : extras->generators) *g = named.at(name);
    extras->values.clear();
    for (const auto& [key, v] : f.metadata)
      if (starts_with(key, kValuePrefix)) extras->values[key.substr(kValuePrefix.size())] = v;
  }
  return step;
}

}  // namespace mu::optim
