#!/bin/sh
# Host checks of the CUDA attention kernels and of matmul's cuBLAS operand mapping, for
# machines without a GPU (see emu.h), and of the entmax, optimiser, indexing, map, copy
# and dropout kernels (emu_extra.h, emu_host.h: their host functions run too).
# Usage: experiments/cuda_emulation/run.sh
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

# Entmax, optimisers, indexing and the elementwise kernels: each .cu file's namespace up
# to its registrations (kernels and host side, Tensor read as EmuTensor), and the CPU
# twins' pointer-level helpers where a test compares with them.
ex="python3 $here/extract.py"
ns='namespace mu::cuda_kernels {'
close='}  // namespace mu::cuda_kernels'
$ex "$root/ops/cuda/entmax.cu" "$ns" 'MU_REGISTER_KERNEL' "$out/entmax_cuda.h" \
  '#include "emu_host.h"\n#include "ops/cuda/bitonic.cuh"\n#include "ops/kernels/entmax.h"\nusing namespace mu;' "$close"
$ex "$root/ops/cpu/entmax.cpp" 'namespace {' '// A sort costs' "$out/entmax_cpu.h" \
  '#include <algorithm>\n#include <functional>\n#include "ops/cpu/lines.h"\nnamespace mu::cpu {' '}  // namespace\n}  // namespace mu::cpu'
$ex "$root/ops/cuda/optim.cu" "$ns" 'MU_REGISTER_KERNEL' "$out/optim_cuda.h" \
  '#include "emu_host.h"\n#include <array>\n#include "ops/kernels/optim.h"\nnamespace mu {\nstruct EmuAdamWTensors { std::vector<EmuTensor> params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs; };\nstruct EmuSGDTensors { std::vector<EmuTensor> params, grads, momentum_buffers; };\n}' "$close"
$ex "$root/ops/cpu/optim.cpp" 'namespace {' '}  // namespace\n\n// One parameter' "$out/optim_cpu.h" \
  '#include <algorithm>\n#include <omp.h>\n#include "ops/cpu/loops.h"\n#include "ops/kernels/optim.h"\nnamespace mu::cpu {' '}  // namespace\n}  // namespace mu::cpu'
$ex "$root/ops/cuda/index.cu" "$ns" 'MU_REGISTER_KERNEL' "$out/index_cuda.h" \
  '#include "emu_host.h"\n#include "emu_cub.h"\n#include "ops/cuda/bitonic.cuh"\n#include "ops/kernels/index.h"\nusing namespace mu;' "$close"
$ex "$root/ops/cuda/map.cu" "$ns" 'template <class... F>' "$out/map_cuda.h" \
  '#include "emu_host.h"\n#include <array>\n#include "ops/kernels/map.h"\n#include "ops/kernels/copy.h"\n#include "ops/kernels/dropout.h"\n#include "tensor/half.h"\nusing namespace mu;' "$close"
$ex "$root/ops/cuda/copy.cu" "$ns" 'MU_REGISTER_KERNEL' "$out/copy_cuda.h" '' "$close"
$ex "$root/ops/cuda/dropout.cu" "$ns" 'MU_REGISTER_KERNEL' "$out/dropout_cuda.h" '' "$close"
cat "$out/map_cuda.h" "$out/copy_cuda.h" "$out/dropout_cuda.h" > "$out/elementwise_cuda.h"
# -ffp-contract=off: every operation rounds once, as the _rn intrinsics do; the optimiser
# check is built for this CPU (-march=native, as the library) so that its fmadds are the
# CPU kernel's.
flags="-std=c++20 -O1 -ffp-contract=off -w -I$out -I$here -I$root -I$cuda_inc"
g++ $flags -fopenmp "$here/entmax_emulated.cpp" -o "$out/entmax" -lpthread
g++ $flags -fopenmp -march=native "$here/optim_emulated.cpp" -o "$out/optim" -lpthread
g++ $flags "$here/index_emulated.cpp" -o "$out/index" -lpthread
g++ $flags "$here/elementwise_emulated.cpp" -o "$out/elementwise" -lpthread
"$out/elementwise"
"$out/optim"
"$out/index"
"$out/entmax"
