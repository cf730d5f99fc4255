#!/bin/sh
# Host checks of the CUDA attention kernels and of matmul's cuBLAS operand mapping, for
# machines without a GPU (see emu.h). Usage: experiments/cuda_emulation/run.sh
set -e
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
# The kernels (everything before the host side of attention.cu), shared memory declared
# through the emulator instead of `extern __shared__`.
python3 - "$root/ops/cuda/attention.cu" "$out/kernels.h" <<'PY'
import sys
s = open(sys.argv[1]).read()
body = s[s.index('namespace mu::cuda_kernels {'):s.index('// ---------------------------------------------------------------- host side')]
body = body.replace('extern __shared__ __align__(16) unsigned char smem_raw[];', 'unsigned char* smem_raw = ctx->smem;')
head = ('#include "emu.h"\n#include <cmath>\n#include <cstdint>\n#include <type_traits>\n'
        '#include "ops/cuda/dtypes.cuh"\n#include "ops/kernels/attention.h"\n')
open(sys.argv[2], 'w').write(head + body + '\n}  // namespace\n}  // namespace mu::cuda_kernels\n')
PY
python3 - "$root/ops/cuda/matmul.cu" "$out/view.h" <<'PY'
import sys
s = open(sys.argv[1]).read()
view = s[s.index('bool cublas_view('):s.index('// dst[(bi * rows + r) * cols + c]')]
open(sys.argv[2], 'w').write('#include <cstdint>\nenum cublasOperation_t { CUBLAS_OP_N, CUBLAS_OP_T };\n' + view)
PY
cuda_inc=${CUDA_HOME:-/usr/local/cuda}/include
g++ -std=c++20 -O1 -w -I"$out" -I"$here" -I"$root" -I"$cuda_inc" "$here/attention_emulated.cpp" -o "$out/attention" -lpthread
g++ -std=c++20 -O1 -I"$out" "$here/matmul_views.cpp" -o "$out/matmul_views"
"$out/attention"
"$out/matmul_views"
