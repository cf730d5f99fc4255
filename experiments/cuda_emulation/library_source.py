#!/usr/bin/env python3
"""Rewrites a whole CUDA source of the library (ops/cuda/*.cu, dist/nccl.cu) into host C++
for the emulated CUDA device (CMake's MUMOE_CUDA_EMULATED; see emu_library.h): launches,
launch bounds and __shared__ declarations as extract_lines.py rewrites them, `extern __shared__` arrays
pointing at the block's dynamic shared memory, the includes of <mma.h> and cub dropped
(emu_library.h stands in for them); everything else, registrations included, as written.
runtime.cu has no kernels: it is compiled over emu_runtime.h instead.
The headers of ops/cuda that hold kernels (lines.cuh with its launches, attention_common.cuh
with its launch bounds) are rewritten the same way (each to emulated_headers/<name> under
the build's emulated/ directory), and the files that include one include that copy.
Usage: library_source.py SRC DST"""
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from extract_lines import SHARED, launch_bounds, launches, shared  # noqa: E402

src, dst = sys.argv[1], sys.argv[2]
cuda_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..', 'ops', 'cuda')


def holds_kernels(header):
    """Whether ops/cuda/<header> defines a kernel (CMakeLists.txt rewrites the same set)."""
    return re.search(r'^__global__ ', open(os.path.join(cuda_dir, header)).read(), flags=re.M) is not None


s = open(src).read()
if os.path.basename(src) == 'runtime.cu':
    head = '#include "emu_runtime.h"\n'
else:
    s = re.sub(r'^#include <(mma\.h|cub/[^>]*)>$', '', s, flags=re.M)  # the line kept, empty
    # A header of ops/cuda with kernels: its rewritten copy (made by this script as well).
    s = re.sub(r'^#include "ops/cuda/(\w+\.cuh)"$',
               lambda m: '#include "emulated_headers/%s"' % m.group(1) if holds_kernels(m.group(1)) else m.group(0),
               s, flags=re.M)
    s = launches(s, bind=True)  # arguments taken at the launch: it may run later (emu_queue.h)
    s = launch_bounds(s)
    s = SHARED.sub(shared, s)
    s = re.sub(r'extern __shared__ (?:__align__\(\d+\) )?([\w:]+(?: [\w:]+)*) (\w+)\[\];',
               r'\1* \2 = reinterpret_cast<\1*>(ctx->smem);', s)
    assert '__shared__' not in s, src + ': a __shared__ declaration was not rewritten'
    head = '#include "emu_library.h"\n'
    if os.path.basename(src) == 'nccl.cu':
        head += '#include "emu_nccl.h"\n'  # the NCCL library's stand-in, over MPI
os.makedirs(os.path.dirname(dst), exist_ok=True)
out = '// Generated from %s by experiments/cuda_emulation/library_source.py: do not edit.\n#line 1 "%s"\n' % (src, src)
# The prelude first, then the file from its first line (so that errors name its lines).
open(dst + '.tmp', 'w').write(head + out + s)
os.replace(dst + '.tmp', dst)
