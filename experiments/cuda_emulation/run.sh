#!/bin/sh
# Host checks of the CUDA kernels for machines without a GPU (see emu.h), by part:
#   checks       the emulator's own checks (a stuck barrier, shared memory overrun or past
#                its grant, a launch past the hardware's limits, a misaligned access):
#                each fault made on purpose must stop the run, its legal neighbour not
#   attention_gemm  the cuBLAS attention path's host side and row kernels
#   views        the cuBLAS operand mapping (ops/cuda/cublas_view.cuh)
#   lines        the line-wise and reduction kernels (softmax, cross_entropy, layer_norm,
#                batch_norm, sum, max/min, argmax/argmin) against the CPU kernels
#   elementwise  map, copy and dropout; optim: the fused AdamW and SGD steps; index: the
#   optim index  indexing kernels; entmax: sparsemax, entmax15, entmax_bisect (their host
#   entmax       functions run too, through emu_extra.h and emu_host.h)
#   matmul       matmul's host side and packing kernel, cuBLAS stood in for by emu_cublas.h
#   grouped      grouped_mm and its weight gradient (host side; cuBLAS as for matmul)
#   runtime      runtime.cu's caching allocator and staged copies over emu_runtime.h, then
#                the same with the work deferred (emu_queue.h), and that queue's ordering
#   hadamard     the fused Hadamard-of-GEMMs kernels (SIMT, and tensor cores through
#                emu_wmma.h)
#   flash        the tensor-core attention forward and backward (attention_flash.cu),
#                bfloat16 and float32, their fragments through emu_wmma.h
#   cudnn        the cuDNN attention graphs and their host side (attention_cudnn.cu) over
#                emu_cudnn.h, which checks the backend API's rules and interprets the graphs
#   attention_op the whole attention op (attention.cu's host side choosing among the
#                cuDNN, flash, cuBLAS and tiled paths, all of them emulated) against float64
#   nccl         the NCCL side of the process group (dist/nccl.cu) over emu_nccl.h's
#                stand-in for the NCCL library, two ranks under mpirun; then again with
#                the work deferred, where the order between its stream and the device's shows
# Usage: experiments/cuda_emulation/run.sh [part...]   (no part: all of them)
# Each part compiles its harness from the kernels' sources as they are now (extracted by
# the scripts here) and exits non-zero when a check fails. The harnesses link the
# library for its CPU kernels and its errors: the build in $MUMOE_EMU_BUILD as it is (ctest
# passes its own, with or without CUDA), else build-emu/ at the root, configured without
# CUDA the first time (a full build of the library) and brought up to date here.
set -e
parts=${*:-checks attention_gemm views lines elementwise optim index matmul grouped runtime hadamard flash cudnn attention_op entmax nccl}
for p in $parts; do
  case $p in checks|attention_gemm|views|lines|elementwise|optim|index|matmul|grouped|runtime|hadamard|flash|cudnn|attention_op|entmax|nccl) ;; *) echo "run.sh: unknown part '$p'" >&2; exit 2 ;; esac
done
wants() { case " $parts " in *" $1 "*) return 0 ;; esac; return 1; }
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
# Every access of the kernels checked against its type's alignment, a misaligned one the
# end of the run with its line: a GPU faults on a 16-byte vector access at an address
# that is not a multiple of 16, which the host would carry out without a word.
aligned="-fsanitize=alignment -fno-sanitize-recover=alignment"
if [ -n "$MUMOE_EMU_BUILD" ]; then
  lib=$MUMOE_EMU_BUILD  # its owner keeps it up to date (ctest passes its own build)
else
  lib=$root/build-emu
  if [ ! -f "$lib/CMakeCache.txt" ]; then
    cmake -S "$root" -B "$lib" -DCMAKE_BUILD_TYPE=Release -DMUMOE_CUDA=OFF -DMUMOE_EXPERIMENTS=OFF >/dev/null
  fi
  cmake --build "$lib" -j2 --target mumoe >/dev/null
fi
cuda_inc=${CUDA_HOME:-/usr/local/cuda}/include
# The host sides raise mu::Error (defined in the library).
link="-L$lib -lmumoe -Wl,-rpath,$lib -lpthread"

if wants checks; then
  # Alone: emu.h, no library. In both modes, the deferred one running each launch at
  # the harness's synchronisation; then again under AddressSanitizer, whose own faults
  # (a buffer read past its end or after its free) join the list.
  for asan in "" "-fsanitize=address"; do
    g++ -std=c++20 -O1 -w $aligned $asan -I"$here" -I"$root" -I"$cuda_inc" "$here/checks_emulated.cpp" -o "$out/checks" -lpthread
    timeout 300 "$out/checks"  # a check that hung instead of stopping ends here
    MUMOE_EMULATED_DEFERRED=1 timeout 300 "$out/checks"
  done
fi

if wants views; then
  python3 - "$root/ops/cuda/cublas_view.cuh" "$out/view.h" <<'PY'
import sys
s = open(sys.argv[1]).read()
view = s[s.index('inline bool cublas_view('):s.index('}  // namespace mu::cuda')]
open(sys.argv[2], 'w').write('#include <cstdint>\nenum cublasOperation_t { CUBLAS_OP_N, CUBLAS_OP_T };\n' + view)
PY
  g++ -std=c++20 -O1 -I"$out" "$here/matmul_views.cpp" -o "$out/matmul_views"
  "$out/matmul_views"
fi

if wants lines; then
  # ops/cuda/{lines.cuh,softmax.cu,loss.cu,norm.cu,reduce.cu} rewritten for the emulator
  # (extract_lines.py) into $out/lines_src/ops/cuda/, found there before the real ones;
  # runtime.cuh is replaced by runtime_shim.cuh plus the real grid_for, its block cap set
  # to EMU_MAX_BLOCKS as extract_lines.py does for kMaxBlocks.
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
  g++ -std=c++20 -O1 -w $aligned -I"$out/lines_src" -I"$out" -I"$here" -I"$root" -I"$cuda_inc" "$here/lines_emulated.cpp" -o "$out/lines" $link
  # A stuck barrier stops the emulation with a message; the timeout bounds anything else.
  timeout 600 "$out/lines"
fi

# Entmax, optimisers, indexing and the elementwise kernels: each .cu file's namespace up
# to its registrations (kernels and host side, Tensor read as EmuTensor), and the CPU
# twins' pointer-level helpers where a test compares with them.
# -ffp-contract=off: every operation rounds once, as the _rn intrinsics do; the optimiser
# and entmax checks are built for this CPU (-march=native, as the library) so that their
# CPU twins' fmadds and vector widths are the library's.
ex="python3 $here/extract.py"
ns='namespace mu::cuda_kernels {'
close='}  // namespace mu::cuda_kernels'
flags="-std=c++20 -O1 -ffp-contract=off -w $aligned -I$out -I$here -I$root -I$cuda_inc"
# harness NAME [FLAGS...]: compiles NAME_emulated.cpp with the extracted headers and runs it.
harness() {
  name=$1
  shift
  g++ $flags "$@" "$here/${name}_emulated.cpp" -o "$out/$name" $link
  "$out/$name"
}
# kernel_part NAME FILE INCLUDES [FLAGS...]: ops/cuda/FILE's namespace up to its
# registrations into NAME_cuda.h, after emu_host.h and INCLUDES; then harness NAME FLAGS.
kernel_part() {
  name=$1
  file=$2
  includes=$3
  shift 3
  $ex "$root/ops/cuda/$file" "$ns" 'MU_REGISTER_KERNEL' "$out/${name}_cuda.h" \
    "#include \"emu_host.h\"\\n$includes\\nusing namespace mu;" "$close"
  harness "$name" "$@"
}

if wants elementwise; then
  $ex "$root/ops/cuda/map.cu" "$ns" 'template <class... F>' "$out/map_cuda.h" \
    '#include "emu_host.h"\n#include <array>\n#include "ops/cuda/packs.cuh"\n#include "ops/kernels/map.h"\n#include "ops/kernels/copy.h"\n#include "ops/kernels/dropout.h"\n#include "tensor/half.h"\nusing namespace mu;' "$close"
  $ex "$root/ops/cuda/copy.cu" "$ns" 'MU_REGISTER_KERNEL' "$out/copy_cuda.h" '' "$close"
  $ex "$root/ops/cuda/dropout.cu" "$ns" 'MU_REGISTER_KERNEL' "$out/dropout_cuda.h" '' "$close"
  cat "$out/map_cuda.h" "$out/copy_cuda.h" "$out/dropout_cuda.h" > "$out/elementwise_cuda.h"
  # -O0: its hundreds of kernel instances take minutes to optimise and a second to run.
  harness elementwise -O0
fi

if wants optim; then
  $ex "$root/ops/cpu/optim.cpp" 'namespace {' '}  // namespace\n\n// One parameter' "$out/optim_cpu.h" \
    '#include <algorithm>\n#include <omp.h>\n#include "ops/cpu/loops.h"\n#include "ops/kernels/optim.h"\nnamespace mu::cpu {' '}  // namespace\n}  // namespace mu::cpu'
  kernel_part optim optim.cu \
    '#include <array>\n#include "ops/kernels/optim.h"\nnamespace mu {\nstruct EmuAdamWTensors { std::vector<EmuTensor> params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs; };\nstruct EmuSGDTensors { std::vector<EmuTensor> params, grads, momentum_buffers; };\n}' \
    -fopenmp -march=native
fi

if wants index; then
  kernel_part index index.cu '#include "emu_cub.h"\n#include "ops/cuda/bitonic.cuh"\n#include "ops/functors.h"\n#include "ops/kernels/index.h"'
fi

if wants matmul; then
  kernel_part matmul matmul.cu \
    '#include "emu_cublas.h"\n#include <climits>\n#include "ops/cuda/cublas_view.cuh"\n#include "ops/cuda/packs.cuh"\n#include "ops/kernels/linalg.h"'
fi

if wants grouped; then
  kernel_part grouped grouped_mm.cu \
    '#include "emu_cublas.h"\n#include <climits>\n#include "ops/cuda/cublas_view.cuh"\n#include "ops/kernels/grouped_mm.h"'
fi

# The three paths attention.cu hands calls to, each extracted whole into $out/NAME_cuda.h
# (their entry points are plain functions): for their own parts, and together with
# attention.cu for the part attention_op.
# The cuBLAS path, with lines.cuh (its block reductions) rewritten beside it so that its
# #include finds that one before the real one.
extract_attention_gemm() {
  mkdir -p "$out/ops/cuda"
  python3 "$here/extract_lines.py" "$root/ops/cuda/lines.cuh" "$out/ops/cuda/lines.cuh"
  $ex "$root/ops/cuda/attention_gemm.cu" "$ns" "$close" "$out/attention_gemm_cuda.h" \
    '#define EMU_MAX_BLOCKS 3\n#include "emu_host.h"\n#include "emu_cublas.h"\n#include <climits>\n#include "ops/cuda/attention_common.cuh"\n#include "ops/cuda/lines.cuh"\nusing namespace mu;' "$close"
}
# The tensor-core kernels (bfloat16 and float32).
extract_flash() {
  $ex "$root/ops/cuda/attention_flash.cu" "$ns" "$close" "$out/flash_cuda.h" \
    '#include "emu_host.h"\n#include "emu_wmma.h"\n#include "ops/cuda/attention_common.cuh"\nusing namespace mu;' "$close"
}
# The cuDNN path (graphs and host side), against the real cudnn.h with the library's
# functions from emu_cudnn.h.
extract_cudnn() {
  $ex "$root/ops/cuda/attention_cudnn.cu" "$ns" "$close" "$out/cudnn_cuda.h" \
    '#include "emu_host.h"\n#include "emu_cudnn.h"\n#include <iterator>\n#include <map>\n#include <mutex>\n#include <tuple>\n#include "ops/cuda/attention_common.cuh"\nusing namespace mu;' "$close"
}

if wants attention_gemm; then
  extract_attention_gemm
  harness attention_gemm
fi

if wants runtime; then
  harness runtime
  # Again with the device's work deferred to each synchronisation (emu_queue.h).
  MUMOE_EMULATED_DEFERRED=1 "$out/runtime"
fi

if wants flash; then
  extract_flash
  harness flash
fi

if wants cudnn; then
  extract_cudnn
  harness cudnn
fi

if wants attention_op; then
  # The whole op: attention.cu (kernels and host side: tile sizes, shared memory, the
  # vector variant's choice, empty calls, the order of the paths) as the library builds
  # it, with the other three paths as their own translation units. The paths' entry
  # points are declared to attention.cu on EmuTensor (their headers, renamed).
  extract_attention_gemm
  extract_flash
  extract_cudnn
  for h in attention_gemm attention_flash; do
    $ex "$root/ops/cuda/$h.cuh" "$ns" "$close" "$out/${h}_decl.h" '' "$close"
  done
  $ex "$root/ops/cuda/attention.cu" "$ns" 'MU_REGISTER_KERNEL' "$out/attention_op_cuda.h" \
    '#define MUMOE_CUDNN\n#include "emu_host.h"\n#include "emu_cudnn.h"\n#include "emu_cublas.h"\n#include <climits>\n#include "ops/cuda/attention_common.cuh"\n#include "attention_gemm_decl.h"\n#include "attention_flash_decl.h"\nusing namespace mu;' "$close"
  for tu in attention_gemm flash cudnn; do
    g++ $flags -x c++ -c "$out/${tu}_cuda.h" -o "$out/op_$tu.o"
  done
  harness attention_op "$out/op_attention_gemm.o" "$out/op_flash.o" "$out/op_cudnn.o"
fi

if wants nccl; then
  # dist/nccl.cu's namespace whole, on mu::Tensor (CPU tensors as device memory), against
  # the real nccl.h with the library's functions from emu_nccl.h, run under mpirun -np 2
  # ($MUMOE_MPIRUN, else mpirun; as root, OpenMPI wants OMPI_ALLOW_RUN_AS_ROOT=1 and
  # OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1, which ctest sets).
  command -v mpicxx >/dev/null || { echo "run.sh nccl: mpicxx not found (install libopenmpi-dev)" >&2; exit 1; }
  python3 $here/extract.py --keep-tensor "$root/dist/nccl.cu" 'namespace mu::dist::detail {' '}  // namespace mu::dist::detail' \
    "$out/nccl_cuda.h" '#include "emu_host.h"\n#include "emu_nccl.h"\n#include "dist/nccl.h"\n#include "tensor/error.h"' \
    '}  // namespace mu::dist::detail'
  g++ $flags $(mpicxx --showme:compile) "$here/nccl_emulated.cpp" -o "$out/nccl" $link $(mpicxx --showme:link)
  OMP_NUM_THREADS=1 timeout 300 ${MUMOE_MPIRUN:-mpirun} -np 2 --oversubscribe "$out/nccl"
  MUMOE_EMULATED_DEFERRED=1 OMP_NUM_THREADS=1 timeout 300 ${MUMOE_MPIRUN:-mpirun} -np 2 --oversubscribe "$out/nccl"
fi

if wants hadamard; then
  kernel_part hadamard hadamard_gemm.cu '#include "emu_wmma.h"\n#include "ops/cuda/tile_gemm.cuh"\n#include "ops/kernels/hadamard_gemm.h"'
fi

if wants entmax; then
  $ex "$root/ops/cpu/entmax.cpp" 'namespace {' '// A sort costs' "$out/entmax_cpu.h" \
    '#include <algorithm>\n#include <functional>\n#include "ops/cpu/lines.h"\n#include "ops/cpu/simd.h"\nnamespace mu::cpu {' '}  // namespace\n}  // namespace mu::cpu'
  kernel_part entmax entmax.cu '#include "ops/cuda/bitonic.cuh"\n#include "ops/kernels/entmax.h"' -fopenmp -march=native
fi
