// GPT-2 small built in full (about 500 MB of float32 and ~250M random draws, some
// seconds on two cores): its parameter count equals the static count and nanoGPT's
// 124,439,808, and the tied head is counted once.
#include "helpers.h"
#include "models/gpt2.h"

using namespace mu;
using models::GPT2;
using models::GPT2Config;

TEST_CASE("gpt2_124m built has 124,439,808 parameters") {
  const int64_t V = 50257, d = 768;
  GPT2 model(GPT2Config::gpt2_124m());
  CHECK(model.num_parameters() == 124439808);
  CHECK(model.num_parameters() == GPT2::count_parameters(GPT2Config::gpt2_124m()));
  // The state dict lists the tied table twice (transformer.wte.weight and lm_head.weight).
  int64_t in_state_dict = 0;
  for (auto& [name, t] : model.state_dict()) in_state_dict += t.numel();
  CHECK(in_state_dict == 124439808 + V * d);
  // One forward pass at full width, for shape.
  Tensor logits = model.forward(zeros({1, 4}, kInt64));
  CHECK(logits.shape() == Shape{1, 4, V});
}
