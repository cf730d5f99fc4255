// load_hf_gpt2_safetensors (models/gpt2.h): GPT-2 weights in the Hugging Face layout.
#include <map>
#include <set>
#include <vector>

#include "autograd/grad_mode.h"
#include "models/gpt2.h"
#include "tensor/safetensors.h"

namespace mu::models {

namespace {

// One tensor the file must provide: its key (without prefix), the model's tensor, and
// whether the file stores it transposed (Conv1D weights are (in, out)).
struct Slot {
  std::string key;
  Tensor target;
  bool transposed = false;
};

bool starts_with(const std::string& s, const std::string& p) { return s.compare(0, p.size(), p) == 0; }

std::string join(const std::vector<std::string>& names) {
  std::string s;
  for (size_t i = 0; i < names.size() && i < 20; ++i) s += (i ? ", " : "") + names[i];
  if (names.size() > 20) s += detail::str(", ... (", names.size(), " in all)");
  return s;
}

// The attention mask buffers GPT2Model saves next to the weights: h.<i>.attn.bias and
// h.<i>.attn.masked_bias (<i> all digits).
bool is_mask_buffer(const std::string& key) {
  if (!starts_with(key, "h.")) return false;
  size_t dot = key.find('.', 2);
  if (dot == std::string::npos || dot == 2) return false;
  for (size_t i = 2; i < dot; ++i)
    if (key[i] < '0' || key[i] > '9') return false;
  const std::string rest = key.substr(dot + 1);
  return rest == "attn.bias" || rest == "attn.masked_bias";
}

}  // namespace

void load_hf_gpt2_safetensors(GPT2& model, const std::string& path) {
  const GPT2Config& c = model.config();
  SafetensorsFile file = load_safetensors(path);

  // Our state dict by name, to find each slot's tensor.
  std::map<std::string, Tensor> ours;
  for (auto& [name, t] : model.state_dict()) ours.emplace(name, t);
  std::vector<Slot> slots;
  auto add = [&](const std::string& key, const std::string& our_name, bool transposed) {
    auto it = ours.find(our_name);
    MU_CHECK(it != ours.end(), "load_hf_gpt2_safetensors: ", path, ": GPT-2 weights fit a model with GPT-2's ln_2 "
             "and dense MLP; this model (MLP \"", c.mlp.name, "\") has no tensor ", our_name);
    slots.push_back({key, it->second, transposed});
    ours.erase(it);
  };
  auto add_norm = [&](const std::string& key) {
    add(key + ".weight", "transformer." + key + ".weight", false);
    if (c.bias) add(key + ".bias", "transformer." + key + ".bias", false);
  };
  auto add_conv = [&](const std::string& key) {
    add(key + ".weight", "transformer." + key + ".weight", true);
    if (c.bias) add(key + ".bias", "transformer." + key + ".bias", false);
  };
  add("wte.weight", "transformer.wte.weight", false);
  add("wpe.weight", "transformer.wpe.weight", false);
  for (int64_t l = 0; l < c.n_layer; ++l) {
    const std::string h = "h." + std::to_string(l) + ".";
    add_norm(h + "ln_1");
    add_conv(h + "attn.c_attn");
    add_conv(h + "attn.c_proj");
    add_norm(h + "ln_2");
    add_conv(h + "mlp.c_fc");
    add_conv(h + "mlp.c_proj");
  }
  add_norm("ln_f");
  // What is left of the model must be the tied head alone: a tensor the file cannot fill
  // (a custom MLP's extra parameters) would keep its random values unnoticed.
  std::vector<std::string> unfilled;
  for (auto& [name, t] : ours)
    if (name != "lm_head.weight") unfilled.push_back(name);
  MU_CHECK(unfilled.empty(), "load_hf_gpt2_safetensors: ", path, ": the GPT-2 layout has no values for ",
           unfilled.size(), " of this model's tensors (MLP \"", c.mlp.name, "\"): ", join(unfilled));

  // The file's tensors by key with any "transformer." prefix removed.
  std::map<std::string, Tensor> found;
  Tensor lm_head;
  std::vector<std::string> extra;
  for (auto& [name, t] : file.tensors) {
    std::string key = starts_with(name, "transformer.") ? name.substr(12) : name;
    if (key == "lm_head.weight") {
      lm_head = t;
      continue;
    }
    if (is_mask_buffer(key)) continue;
    MU_CHECK(found.emplace(key, t).second, "load_hf_gpt2_safetensors: ", path, ": ", key,
             " appears twice (with and without the \"transformer.\" prefix)");
  }
  std::set<std::string> wanted;
  for (const Slot& s : slots) wanted.insert(s.key);
  for (auto& [key, t] : found)
    if (!wanted.count(key)) extra.push_back(key);
  std::vector<std::string> missing;
  for (const Slot& s : slots)
    if (!found.count(s.key)) missing.push_back(s.key);
  MU_CHECK(missing.empty(), "load_hf_gpt2_safetensors: ", path, ": missing ", missing.size(), " key",
           missing.size() == 1 ? "" : "s", " for a GPT-2 with n_layer = ", c.n_layer, ": ", join(missing));
  MU_CHECK(extra.empty(), "load_hf_gpt2_safetensors: ", path, ": unexpected ", extra.size(), " key",
           extra.size() == 1 ? "" : "s", " for a GPT-2 with n_layer = ", c.n_layer, ": ", join(extra));

  // Every shape checked before anything is copied, so a refused file leaves the model as it was.
  std::vector<Tensor> values;
  for (const Slot& s : slots) {
    Tensor t = found.at(s.key);
    Shape want = s.target.shape();
    if (s.transposed) want = {want[1], want[0]};
    MU_CHECK(t.shape() == want, "load_hf_gpt2_safetensors: ", path, ": ", s.key, " has shape ", shape_str(t.shape()),
             ", expected ", shape_str(want), s.transposed ? " (a Conv1D weight, stored (in, out))" : "");
    MU_CHECK(t.is_floating_point(), "load_hf_gpt2_safetensors: ", path, ": ", s.key, " holds ",
             dtype_name(t.dtype()), ", expected floating-point values");
    values.push_back(s.transposed ? t.t() : t);
  }
  if (lm_head.defined()) {
    Tensor wte = found.at("wte.weight");
    // The model ties lm_head to wte; a file with another head cannot be represented.
    MU_CHECK(lm_head.shape() == wte.shape(), "load_hf_gpt2_safetensors: ", path, ": lm_head.weight has shape ",
             shape_str(lm_head.shape()), ", expected ", shape_str(wte.shape()), " (tied to wte.weight)");
    MU_CHECK(lm_head.to(kFloat64).to_vector<double>() == wte.to(kFloat64).to_vector<double>(),
             "load_hf_gpt2_safetensors: ", path, ": lm_head.weight differs from wte.weight; this model ties them");
  }
  NoGradGuard no_grad;
  for (size_t i = 0; i < slots.size(); ++i) slots[i].target.copy_(values[i]);  // converts the dtype
}

}  // namespace mu::models
