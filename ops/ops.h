// Every op of the library.
#pragma once
#include "ops/attention.h"
#include "ops/einsum.h"
#include "ops/elementwise.h"
#include "ops/type_promotion.h"
#include "ops/index.h"
#include "ops/linalg.h"
#include "ops/loss.h"
#include "ops/nn_functional.h"
#include "ops/normalization.h"
#include "ops/reduce.h"
#include "ops/shape.h"
#include "ops/tensor_algebra.h"
