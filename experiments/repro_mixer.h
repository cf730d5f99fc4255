// What the reproduction programs that train Fashion-MNIST Mixers through train_mixer share
// (repro_table3_mixer, repro_table9_hier_mixer, repro_fig4_mixer_experts): the model of
// each scale and the trainer flags that build it.
//
//   smoke: patch 7, width 32, token 16 / channel 64, `smoke_depth` blocks, 20 steps
//   local: mixer-fmnist (patch 4, width 128, depth 4, token 64, channel 512), `epochs` epochs
#pragma once
#include <filesystem>
#include <string>
#include <vector>

#include "experiments/repro.h"
#include "models/mlp_mixer.h"

namespace mu::repro {

struct MixerRuns {
  models::MixerConfig config;      // the model the flags build (block kinds left to the caller)
  std::vector<std::string> flags;  // size and length flags for train_mixer
  std::string trainer;             // train_mixer beside the running program
};

// The Mixer and trainer flags of a scale; when `need_trainer`, a missing train_mixer is a
// mu::Error naming `program`.
inline MixerRuns mixer_runs(Scale scale, double epochs, const std::string& program, int64_t smoke_depth = 1,
                            bool need_trainer = true) {
  MixerRuns r;
  r.config = models::mixer_fmnist();
  if (scale == Scale::Smoke) {
    models::MixerConfig& c = r.config;
    c.patch_size = 7, c.width = 32, c.depth = smoke_depth, c.token_mlp = 16, c.channel_mlp = 64;
    r.flags = {"--patch", "7", "--width", "32", "--depth", std::to_string(smoke_depth), "--token-mlp", "16",
               "--channel-mlp", "64", "--max-steps", "20", "--warmup", "5"};
  } else {
    r.flags = {"--epochs", std::to_string(epochs)};
  }
  r.trainer = program_dir() + "/train_mixer";
  MU_CHECK(!need_trainer || std::filesystem::exists(r.trainer), program, ": ", r.trainer,
           " not found (build train_mixer)");
  return r;
}

}  // namespace mu::repro
