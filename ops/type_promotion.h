// PyTorch's type promotion: the dtype an op on operands of mixed dtypes computes in.
//
//   promote_types(a, b)  the smallest dtype both convert to without losing their kind:
//                        bool < the integers < the floats; among integers the wider (int8
//                        with uint8 gives int16); among floats the wider (float16 with
//                        bfloat16 gives float32); an integer with a float gives the float.
//   result_type(...)     as torch.result_type: operands are ranked by how much they say
//                        about the result. Tensors with dimensions decide among themselves;
//                        0-dim tensors count only where they are of a higher kind (a bool
//                        tensor meeting an integer, a non-float tensor meeting a float: an
//                        int64 tensor and a float64 0-dim tensor give float64, a float32
//                        tensor and a float64 0-dim tensor stay float32); a C++ number
//                        likewise, and then as the default dtype of its kind (float32 for
//                        a floating-point number, int64 for an integer): int32 + 2 is
//                        int32, int64 + 0.5 is float32, float16 + 0.5 is float16.
#pragma once
#include "tensor/scalar.h"
#include "tensor/tensor.h"

namespace mu {

DType promote_types(DType a, DType b);

DType result_type(const Tensor& a, const Tensor& b);
DType result_type(const Tensor& a, Scalar b);
DType result_type(const Tensor* first, const Tensor* last);  // over the tensors [first, last)

// Whether a result of dtype `from` may be written into a tensor of dtype `to` (torch's
// can_cast, used by in-place ops): not a float into an integer or a bool, not an
// integer into a bool.
bool can_cast(DType from, DType to);

}  // namespace mu
