// Activation checkpointing (autograd/activation_checkpoint.h): the first run of a region
// turns every tensor its ops save into a slot, recording what the tensor was; the first
// read of a slot runs the region again and refills the slots from what it saves, in the
// same order.
#include "autograd/activation_checkpoint.h"

#include <memory>
#include <vector>

#include "autograd/autocast.h"
#include "autograd/grad_mode.h"
#include "tensor/random.h"

namespace mu::autograd {

namespace {

// What the first run saved at one position: the recomputed tensor must match it.
struct SavedShape {
  Shape shape;
  DType dtype;
  Device device;
  uint64_t version;  // of the tensor's storage when saved
  std::weak_ptr<CheckpointSlot> slot;  // expired once the node that saved it is freed
};

// A generator the first run drew from, and its state before the region's first draw.
struct DrawnGenerator {
  Generator* gen;
  std::weak_ptr<const void> alive;
  Generator before;
};

}  // namespace

// One call of checkpoint(): the function, its inputs and how to run it again.
struct CheckpointFrame {
  CheckpointFn fn;
  TensorList inputs;
  std::vector<uint64_t> input_versions;  // at the call: an input changed in place since is refused
  bool autocast = false;
  DType autocast_dtype = kBFloat16;
  std::vector<DrawnGenerator> generators;
  std::vector<SavedShape> saved;
  size_t refilled = 0;  // during the second run: how many saves it has made

  void recompute();
};

struct CheckpointSlot {
  std::shared_ptr<CheckpointFrame> frame;  // kept alive by its slots
  size_t index = 0;
  bool filled = false;
  Tensor value;  // once filled: the recomputed tensor, detached
  uint64_t version = 0;
};

namespace {

// The region whose first run is in progress on this thread (its saves become slots), and
// the one being recomputed (its saves refill them). At most one of them is set.
thread_local std::shared_ptr<CheckpointFrame> t_first_run;
thread_local CheckpointFrame* t_second_run = nullptr;

// Generator::lock()'s observer while a first run is in progress: notes each generator
// once, with its state before the draw.
void note_draw(Generator& g) {
  CheckpointFrame& f = *t_first_run;
  for (const DrawnGenerator& d : f.generators)
    if (d.gen == &g) return;
  f.generators.push_back({&g, g.liveness(), Generator(g)});
}

// Sets the thread's region state for a scope and puts the previous one back on exit,
// exceptions included.
struct FirstRunScope {
  std::shared_ptr<CheckpointFrame> prev_frame = t_first_run;
  void (*prev_observer)(Generator&) = mu::detail::draw_observer;
  explicit FirstRunScope(std::shared_ptr<CheckpointFrame> f) {
    t_first_run = std::move(f);
    mu::detail::draw_observer = note_draw;
  }
  ~FirstRunScope() {
    t_first_run = std::move(prev_frame);
    mu::detail::draw_observer = prev_observer;
  }
};

struct SecondRunScope {
  CheckpointFrame* prev = t_second_run;
  explicit SecondRunScope(CheckpointFrame* f) { t_second_run = f; }
  ~SecondRunScope() { t_second_run = prev; }
};

// The generators set to their states before the first run's draws, and each put back
// to its state now on exit.
struct ReplayedGenerators {
  std::vector<std::pair<Generator*, Generator>> now;
  explicit ReplayedGenerators(const std::vector<DrawnGenerator>& drawn) {
    for (const DrawnGenerator& d : drawn) {
      MU_CHECK(!d.alive.expired(), "checkpoint: the region drew random numbers from a generator that has been "
               "destroyed since its forward; the backward pass replays the region's draws, so the generator must "
               "live until then");
    }
    now.reserve(drawn.size());
    for (const DrawnGenerator& d : drawn) {
      now.emplace_back(d.gen, Generator(*d.gen));
      *d.gen = d.before;
    }
  }
  ~ReplayedGenerators() {
    for (auto& [g, state] : now) *g = state;
  }
};

}  // namespace

void CheckpointFrame::recompute() {
  // An input changed in place would be read as it is now; one that some op of the region
  // saved is caught by the saves' version check, but not one only read (x * 2).
  for (size_t i = 0; i < inputs.size(); ++i)
    MU_CHECK(!inputs[i].defined() || inputs[i].version() == input_versions[i], "checkpoint: input ", i,
             " of the region (", inputs[i].describe(), ") was modified by an in-place operation between the forward "
             "and the backward (version ", input_versions[i], ", now ", inputs[i].version(),
             "); the backward pass recomputes the region from it. Use an out-of-place op or clone() it first");
  refilled = 0;
  SecondRunScope second(this);
  EnableGradGuard grad;  // the backward pass runs without; the region's ops must save as before
  AutocastGuard amp(autocast_dtype, autocast);
  ReplayedGenerators replay(generators);
  fn(inputs);  // its outputs and their graph are not needed: only what it saved
  MU_CHECK(refilled == saved.size(), "checkpoint: the recomputed region saved ", refilled,
           " tensors for backward, its forward saved ", saved.size(),
           "; the function must run the same ops when called again (is there control flow on a value that "
           "changed, or a draw from a generator on another thread?)");
}

bool checkpoint_save(const Tensor& t, std::shared_ptr<CheckpointSlot>& slot) {
  if (CheckpointFrame* f = t_second_run) {
    const size_t i = f->refilled++;
    MU_CHECK(i < f->saved.size(), "checkpoint: the recomputed region saved more tensors for backward than its "
             "forward did (", f->saved.size(), "); the function must run the same ops when called again");
    const SavedShape& s = f->saved[i];
    MU_CHECK(t.shape() == s.shape && t.dtype() == s.dtype && t.device() == s.device,
             "checkpoint: saved tensor ", i, " of the recomputed region is ", t.describe(), ", in the forward it was ",
             "Tensor[", dtype_name(s.dtype), ", ", shape_str(s.shape), ", ", s.device.str(),
             "]; the function must compute the same when called again");
    MU_CHECK(t.version() == s.version, "checkpoint: saved tensor ", i, " of the recomputed region (", t.describe(),
             ") is at version ", t.version(), ", in the forward it was at version ", s.version,
             ": it, or a tensor it was computed from, was modified by an in-place operation between the forward "
             "and the backward. Use an out-of-place op or clone() it first");
    if (std::shared_ptr<CheckpointSlot> live = s.slot.lock()) {
      live->value = t.detach();
      live->version = t.version();
      live->filled = true;
    }
    return false;
  }
  if (!t_first_run) return false;
  CheckpointFrame& f = *t_first_run;
  slot = std::make_shared<CheckpointSlot>();
  slot->frame = t_first_run;
  slot->index = f.saved.size();
  f.saved.push_back({t.shape(), t.dtype(), t.device(), t.version(), slot});
  return true;
}

Tensor checkpoint_get(CheckpointSlot& slot) {
  if (!slot.filled) slot.frame->recompute();
  MU_CHECK(slot.filled, "checkpoint: saved tensor ", slot.index, " was not refilled by the recomputed region");
  MU_CHECK(slot.value.version() == slot.version,
           "one of the tensors needed for gradient computation has been modified by an in-place operation: ",
           slot.value.describe(), " is at version ", slot.value.version(), "; expected version ", slot.version,
           " (the value it had when it was saved). Use an out-of-place op or clone() it first");
  return slot.value;
}

bool recomputing() { return t_second_run != nullptr; }

TensorList checkpoint(const CheckpointFn& fn, const TensorList& inputs) {
  MU_CHECK(fn != nullptr, "checkpoint: no function given");
  // Nothing to save without grad mode; inside another region this one is part of it.
  if (!is_grad_enabled() || t_first_run || t_second_run) return fn(inputs);
  auto frame = std::make_shared<CheckpointFrame>();
  frame->fn = fn;
  frame->inputs = inputs;
  for (const Tensor& t : inputs) frame->input_versions.push_back(t.defined() ? t.version() : 0);
  frame->autocast = is_autocast_enabled();
  frame->autocast_dtype = autocast_dtype();
  FirstRunScope first(frame);
  return fn(inputs);
}

Tensor checkpoint(const std::function<Tensor(const Tensor&)>& fn, const Tensor& input) {
  MU_CHECK(fn != nullptr, "checkpoint: no function given");
  TensorList out = checkpoint([fn](const TensorList& in) { return TensorList{fn(in[0])}; }, TensorList{input});
  return out[0];
}

}  // namespace mu::autograd
