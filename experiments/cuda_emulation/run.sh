#!/bin/sh
# Host checks of the CUDA attention kernels, of matmul's cuBLAS operand mapping, of the
# line-wise and reduction kernels (softmax, cross_entropy, layer_norm, batch_norm, sum,
# max/min, argmax/argmin), and of the entmax, optimiser, indexing, map, copy and dropout
# kernels (emu_extra.h, emu_host.h: their host functions run too), for machines without
# a GPU (see emu.h).
# Usage: experiments/cuda_emulation/run.sh
# The line-wise checks compare with the library's CPU kernels, so they link a CPU build of
# the library: $MUMOE_EMU_BUILD (default build-emu/ at the root), configured without CUDA
# and brought up to date here (the first time, a full build of the library).
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
        '#include "ops/cuda/dtypes.cuh"\n#include "ops/kernels/attention.h"\n#include "ops/cuda/attention_common.cuh"\n')
open(sys.argv[2], 'w').write(head + body + '\n}  // namespace\n}  // namespace mu::cuda_kernels\n')
PY
python3 - "$root/ops/cuda/matmul.cu" "$out/view.h" <<'PY'
import sys
s = open(sys.argv[1]).read()
view = s[s.index('bool cublas_view('):s.index('// dst[(bi * rows + r) * cols + c]')]
open(sys.argv[2], 'w').write('#include <cstdint>\nenum cublasOperation_t { CUBLAS_OP_N, CUBLAS_OP_T };\n' + view)
PY
# ops/cuda/{lines.cuh,softmax.cu,loss.cu,norm.cu,reduce.cu} rewritten for the emulator
# (extract_lines.py) into $out/lines_src/ops/cuda/, found there before the real ones; runtime.cuh is
# replaced by runtime_shim.cuh plus the real grid_for, its block cap set to
# EMU_MAX_BLOCKS as extract_lines.py does for kMaxBlocks.
mkdir -p "$out/lines_src/ops/cuda"
for f in lines.cuh softmax.cu loss.cu norm.cu reduce.cu; do
  python3 "$here/extract_lines.py" "$root/ops/cuda/$f" "$out/lines_src/ops/cuda/$f"
done
python3 - "$root/ops/cuda/runtime.cuh" "$here/runtime_shim.cuh" "$out/lines_src/ops/cuda/runtime.cuh" <<'PY'
import re, sys
s = open(sys.argv[1]).read()
grid_for = s[s.index('inline unsigned grid_for('):s.index('// Device scratch memory')]
grid_for, k = re.subn(r'const int64_t cap = [^;]+;', 'const int64_t cap = EMU_MAX_BLOCKS;', grid_for)
assert k == 1, 'grid_for changed: update run.sh'
end = '}  // namespace mu::cuda'
shim = open(sys.argv[2]).read().rstrip()
assert shim.endswith(end)
open(sys.argv[3], 'w').write(shim[:-len(end)] + grid_for + end + '\n')
PY
lib=${MUMOE_EMU_BUILD:-$root/build-emu}
if [ ! -f "$lib/CMakeCache.txt" ]; then
  cmake -S "$root" -B "$lib" -DCMAKE_BUILD_TYPE=Release -DMUMOE_CUDA=OFF -DMUMOE_EXPERIMENTS=OFF >/dev/null
fi
cmake --build "$lib" -j2 --target mumoe >/dev/null
cuda_inc=${CUDA_HOME:-/usr/local/cuda}/include
g++ -std=c++20 -O1 -w -I"$out" -I"$here" -I"$root" -I"$cuda_inc" "$here/attention_emulated.cpp" -o "$out/attention" -lpthread
g++ -std=c++20 -O1 -I"$out" "$here/matmul_views.cpp" -o "$out/matmul_views"
g++ -std=c++20 -O1 -w -I"$out/lines_src" -I"$out" -I"$here" -I"$root" -I"$cuda_inc" "$here/lines_emulated.cpp" -o "$out/lines" \
  -L"$lib" -lmumoe -Wl,-rpath,"$lib" -lpthread
"$out/attention"
"$out/matmul_views"
# A shuffle or barrier that some thread never reaches hangs the emulation: bounded here.
timeout 600 "$out/lines"

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
