// The nanoGPT split of a model's parameters into a weight-decayed group and one without
// decay: tensors with dim >= 2 (weight matrices, embeddings, factor tensors) decay;
// biases and norm gains (dim < 2) do not. Named modules can be kept out of decay
// altogether, e.g. the token and position embeddings as in the original GPT-2 recipe.
//
//   auto groups = optim::decay_groups(model, 0.1, {"wte", "wpe"});
//   optim::AdamW opt(groups, optim::AdamWOptions(6e-4).betas(0.9, 0.95));
#pragma once
#include <string>
#include <vector>

#include "nn/module.h"
#include "optim/optimizer.h"

namespace mu::optim {

// Returns two groups, always in this order: [0] the decayed parameters with
// weight_decay = `weight_decay`, [1] the rest with weight_decay = 0 (either may be empty).
// lr is left unset so that both take the optimizer's. Only parameters that require grad
// are included (as nanoGPT does). A parameter whose dotted name equals one of
// `no_decay`, or starts with one of them followed by '.', is never decayed. A tensor
// registered under several names (tied weights) appears once, placed by its first name.
std::vector<ParamGroup> decay_groups(const nn::Module& module, double weight_decay,
                                     const std::vector<std::string>& no_decay = {});

}  // namespace mu::optim
