// The prelude of every CUDA source of the library built for the emulated CUDA device
// (CMake's MUMOE_CUDA_EMULATED; library_source.py puts it first): the kernels run on the
// host as emu.h runs them (a fiber per CUDA thread), cuBLAS and cuBLASLt, cub's radix
// sort, the WMMA fragments and cuDNN's backend API through their stand-ins, and device
// memory, streams and events through runtime.cu compiled over emu_runtime.h. The framework above sees
// one CUDA device, cuda:0, and runs its CUDA code paths (and the `cuda` tests) unchanged.
// No kernel may be launched from two threads at once (the emulator keeps one block at a
// time); the library launches from the calling thread only.
#pragma once
#include "emu_extra.h"  // ops/cuda/runtime.cuh, emu.h, the intrinsics and launch shims
#include "emu_wmma.h"
#include "emu_cub.h"
#include "emu_cublas.h"
#include "emu_cublaslt.h"
#if __has_include(<cudnn.h>)
#include "emu_cudnn.h"
#endif
