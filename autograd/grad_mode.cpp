#include "autograd/grad_mode.h"

namespace mu::autograd {

// Per thread, as in PyTorch: a NoGradGuard on one thread does not affect another.
static thread_local bool grad_enabled = true;

bool is_grad_enabled() { return grad_enabled; }
void set_grad_enabled(bool enabled) { grad_enabled = enabled; }

}  // namespace mu::autograd
