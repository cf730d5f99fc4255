// Training checkpoints: model, optimizer, step and random-generator state in one
// safetensors file, so that training resumes exactly where it stopped (bit-identical on
// the CPU: same losses, same weights as a run that never stopped).
//
//   optim::save_checkpoint("run/ckpt.safetensors", model, opt, step);
//   ...
//   int64_t step = optim::load_checkpoint("run/ckpt.safetensors", model, opt);
//
// Layout (PyTorch can read it as a plain safetensors file):
//   model.<name>    model.state_dict() entries (parameters and buffers)
//   optim.<name>    opt.state_dict() entries (see optim/optimizer.h)
//   __metadata__    checkpoint_version "1", step, optimizer (its name, e.g. "AdamW"),
//                   rng_state (default_generator().state()), and the checksums of the
//                   header and of every tensor's bytes (tensor/safetensors.h);
//                   with extras, generator.<name> (a named generator's state) and
//                   value.<name> (a string of the caller's: an epoch, a data position)
// The write is atomic (temporary file + rename), as every save_safetensors is. On load a
// damaged file is refused (a flipped bit anywhere, by the checksums), and the step and
// generator state are parsed strictly and range-checked, as are the optimizer's scalars.
#pragma once
#include <cstdint>
#include <map>
#include <string>

#include "nn/module.h"
#include "optim/optimizer.h"
#include "tensor/random.h"

namespace mu::optim {

// The layout version written, and the only one read.
inline constexpr int kCheckpointVersion = 1;

// What a training program keeps beside model and optimizer so that a resumed run repeats
// the one that never stopped: the generators it owns (a data loader's, a prefetch
// thread's) and values of its own. Names are letters, digits, '_', '-' and '.'.
struct CheckpointExtras {
  std::map<std::string, Generator*> generators;  // not owned; saved and restored in place
  std::map<std::string, std::string> values;
};

void save_checkpoint(const std::string& path, const nn::Module& model, const Optimizer& opt, int64_t step,
                     const CheckpointExtras& extras = {});

// Restores the model (strict: every entry present, same shapes and dtypes), the
// optimizer's hyper-parameters and state, and the global random generator; returns the
// step saved. With extras: every generator named there must be in the file and is
// restored; values is filled with every value the file holds. Everything is checked
// before anything changes, so a refused checkpoint leaves model, optimizer and
// generators as they were. Errors name the file and the entry.
int64_t load_checkpoint(const std::string& path, nn::Module& model, Optimizer& opt,
                        CheckpointExtras* extras = nullptr);

}  // namespace mu::optim
