// Optimizer base: parameter groups, per-parameter state, zero_grad, and state dicts that
// let a saved optimizer resume bit-identically. AdamW (optim/adamw.h) and SGD
// (optim/sgd.h) implement one virtual: the in-place update of one parameter.
//
//   auto groups = optim::decay_groups(model, 0.1);          // nanoGPT split
//   optim::AdamW opt(groups, optim::AdamWOptions(6e-4).betas(0.9, 0.95));
//   loss.backward(); opt.step(); opt.zero_grad();
//
// State dict layout (nn::StateDict; every scalar is a 0-dim tensor):
//   group.<g>.num_params     int64    how many parameters group g holds (checked on load)
//   group.<g>.lr             float64  the group's current learning rate
//   group.<g>.initial_lr     float64  the rate it was created with (schedules scale from it)
//   group.<g>.weight_decay   float64
//   group.<g>.<option>       float64  each optimizer option, e.g. beta1, beta2, eps, amsgrad, maximize (AdamW)
//                                     or momentum, dampening, nesterov (SGD; nesterov 0/1)
//   state.<g>.<i>.<buffer>            parameter i of group g, only once it has state:
//                                     AdamW: step (int64), exp_avg, exp_avg_sq;
//                                     SGD:   momentum_buffer (when momentum != 0)
// Buffers have their parameter's shape and dtype. state_dict() returns the live buffers
// (no copy): write them out before the next step(). load_state_dict() copies.
//
// Checkpoints: save state_dict() next to the model's (e.g. with an "optimizer." prefix);
// to resume, build the optimizer as before (same parameters, same groups, same order),
// then load_state_dict(). Hyper-parameters come from the dict, so a resumed run continues
// bit-identically; the iteration number (for schedules) is the training loop's to save.
#pragma once
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "nn/module.h"
#include "tensor/tensor.h"

namespace mu::optim {

// A set of parameters sharing hyper-parameters. Unset lr/weight_decay and options not
// named in `options` take the optimizer's defaults; after the optimizer is built every
// group has lr and weight_decay set and `options` holds every option of that optimizer.
//
//   optim::ParamGroup{.params = biases, .weight_decay = 0.0}
//   optim::ParamGroup{.params = head, .lr = 1e-3, .options = {{"momentum", 0.5}}}
// (Every member has a default initializer, so designated initialisers that name only some
// of them compile without -Wmissing-field-initializers warnings.)
struct ParamGroup {
  std::vector<Tensor> params{};
  std::optional<double> lr{};
  std::optional<double> weight_decay{};
  std::map<std::string, double> options{};  // optimizer-specific, by name ("beta1", "momentum")
  // Set by the optimizer when the group is added: the lr that schedules scale from.
  double initial_lr = 0.0;

  // The values every group has once it belongs to an optimizer.
  double get_lr() const;
  double get_weight_decay() const;
  double option(const std::string& name) const;  // throws naming the known options
};

// Per-parameter state: buffer name -> tensor (empty until the parameter's first update).
using ParamState = std::map<std::string, Tensor>;

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // Updates every parameter that has a gradient, in place and without recording a graph.
  // Parameters whose grad() is undefined are skipped and their state is left untouched.
  void step();
  // Resets every parameter's gradient to none.
  void zero_grad();

  // Mutable so that schedules and users can change lr (or any hyper-parameter) between steps.
  std::vector<ParamGroup>& param_groups() { return groups_; }
  const std::vector<ParamGroup>& param_groups() const { return groups_; }
  // Adds a group (defaults filled in, hyper-parameters checked). A parameter may belong
  // to one group only.
  void add_param_group(ParamGroup group);

  // State of parameter `index` of group `group`: empty until its first update.
  const ParamState& state(size_t group, size_t index) const;

  // See the layout at the top of this file.
  nn::StateDict state_dict() const;
  // Replaces hyper-parameters and state with those of `sd`. The group and parameter
  // structure must match this optimizer's; a missing, unexpected or mis-shaped entry is
  // refused with a mu::Error naming it, and then nothing is changed.
  void load_state_dict(const nn::StateDict& sd);

  const std::string& name() const { return name_; }

 protected:
  // `defaults` holds every option of the optimizer with its default value; `buffers` the
  // names of the per-parameter state it keeps (all present or none, per parameter).
  Optimizer(std::string name, double lr, double weight_decay, std::map<std::string, double> defaults,
            std::vector<std::string> buffers);
  // Adds the constructor's groups; called by each derived constructor once its own
  // members exist, since add_param_group calls check_group (a virtual).
  void init_groups(std::vector<ParamGroup> groups);

  // One parameter to update: `grad` has the parameter's shape, dtype and device.
  struct ParamUpdate {
    Tensor param, grad;
    ParamState* state;
  };
  // The update of every parameter of `group` that has a gradient, in the group's order:
  // all at once, so that a device can run one fused kernel over all of them.
  virtual void update(const ParamGroup& group, const std::vector<ParamUpdate>& items) = 0;
  // Refuses invalid hyper-parameters with an error naming the value (lr and weight_decay
  // are checked by the base).
  virtual void check_group(const ParamGroup& group) const = 0;

 private:
  std::string name_;
  double default_lr_;
  double default_weight_decay_;
  std::map<std::string, double> defaults_;
  std::vector<std::string> buffers_;
  std::vector<ParamGroup> groups_;
  std::vector<std::vector<ParamState>> state_;  // [group][index]
};

}  // namespace mu::optim
