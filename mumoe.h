// Everything an experiment author needs: #include "mumoe.h".
#pragma once
#include "autograd/function.h"
#include "autograd/grad_mode.h"
#include "autograd/gradcheck.h"
#include "ops/ops.h"
#include "tensor/allocator.h"
#include "tensor/random.h"
#include "tensor/tensor.h"
