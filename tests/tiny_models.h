// The small model configurations the model tests share: a GPT-2 and an MLP-Mixer a few
// numbers wide, quick enough for any test to build and train.
#pragma once
#include <cstdint>

#include "models/gpt2.h"
#include "models/mlp_mixer.h"

// GPT-2 with `layers` blocks, 2 heads, width 8, context 8, vocabulary 11, the dense MLP.
inline mu::models::GPT2Config tiny_gpt2(int64_t layers = 2) {
  mu::models::GPT2Config c;
  c.n_layer = layers;
  c.n_head = 2;
  c.n_embd = 8;
  c.block_size = 8;
  c.vocab_size = 11;
  return c;
}

// A Mixer on 8×8×2 images, patch 2 (16 tokens), width 12, token MLP 10, channel MLP 20,
// depth 2, 5 classes, 6 experts in μMoE blocks; both mixing blocks of `kind`.
inline mu::models::MixerConfig tiny_mixer(mu::models::MixerMlp kind = mu::models::MixerMlp::MLP) {
  mu::models::MixerConfig c;
  c.image_size = 8;
  c.channels = 2;
  c.patch_size = 2;
  c.width = 12;
  c.token_mlp = 10;
  c.channel_mlp = 20;
  c.depth = 2;
  c.num_classes = 5;
  c.experts = 6;
  c.mlp(kind);
  return c;
}
