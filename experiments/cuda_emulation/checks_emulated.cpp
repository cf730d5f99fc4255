// The emulator's own checks (emu.h), each shown to fire: every fault the emulated device
// is there to catch is made on purpose in a child process, which must then stop (by
// abort(), or UBSan's exit for a misaligned access: the harnesses are built with
// -fsanitize=alignment) with the message for it; beside each, the largest
// legal neighbour runs to its end. A check that stopped firing would let the suites
// that rely on it pass over the very bug it exists for.
#include "emu.h"
#include "emu_wmma.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <string>

static int failures = 0;

// Runs f in a child with its stderr captured; returns (exited with 0, stderr).
template <class F>
static std::pair<bool, std::string> in_child(F f) {
  int pipefd[2];
  if (pipe(pipefd) != 0) { perror("pipe"); std::exit(2); }
  fflush(stdout);
  fflush(stderr);
  const pid_t pid = fork();
  if (pid < 0) { perror("fork"); std::exit(2); }
  if (pid == 0) {
    close(pipefd[0]);
    dup2(pipefd[1], 2);
    f();
    fflush(stderr);
    _exit(0);
  }
  close(pipefd[1]);
  std::string err;
  char buf[4096];
  for (ssize_t n; (n = read(pipefd[0], buf, sizeof buf)) > 0;) err.append(buf, size_t(n));
  close(pipefd[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  return {WIFEXITED(status) && WEXITSTATUS(status) == 0, err};
}

// The fault must stop the child with a message containing `expect`.
template <class F>
static void must_stop(const char* what, const char* expect, F f) {
  auto [ok, err] = in_child(f);
  if (ok || err.find(expect) == std::string::npos) {
    ++failures;
    printf("FAIL %s: expected a stop saying \"%s\"; %s, stderr: %s\n", what, expect,
           ok ? "it ran to its end" : "it stopped", err.c_str());
  } else {
    printf("ok   %s: stopped (%s)\n", what, expect);
  }
}

// The legal neighbour must run to its end, silently.
template <class F>
static void must_run(const char* what, F f) {
  auto [ok, err] = in_child(f);
  if (!ok || !err.empty()) {
    ++failures;
    printf("FAIL %s: expected to run silently; %s, stderr: %s\n", what, ok ? "it wrote to stderr" : "it stopped",
           err.c_str());
  } else {
    printf("ok   %s: ran\n", what);
  }
}

// A launch as extract_lines.py rewrites `kernel<<<grid, block, smem>>>(args...)` for the
// library (the arguments bound at the launch).
#define LAUNCH(kernel, grid, block, smem, ...)                                              \
  do {                                                                                     \
    emu_next_kernel = #kernel;                                                             \
    emu_launch(grid, block, smem, emu_bind([=](auto&&... p) { kernel(p...); }, ##__VA_ARGS__)); \
    emu_stream_synchronize(nullptr); /* deferred mode: run it now, in the child */        \
  } while (0)

// Kernels, each with one job.
static void barrier_skipped(int skip_from) {
  if (int(threadIdx.x) >= skip_from) return;  // these threads never reach the barrier
  __syncthreads();
}
static void shuffle_skipped(int skip_from) {
  if (int(threadIdx.x) >= skip_from) return;
  (void)__shfl_down_sync(0xffffffffu, 1.0f, 1);
}
static void writes_dynamic(int n_floats) {
  float* s = reinterpret_cast<float*>(ctx->smem);
  if (threadIdx.x == 0)
    for (int i = 0; i < n_floats; ++i) s[i] = 1.0f;
}
static void nothing() {}
static void grant_me() {}  // a kernel of its own, so that its grant is its own
static void static_array() {
  // As extract_lines.py rewrites `__shared__ float big[10240];` (40 KiB).
  static char big_emu_key;
  using big_emu_t = float[10240];
  big_emu_t& big = ::emu_shared<big_emu_t>(&big_emu_key);
  big[threadIdx.x] = 0.0f;
}
// As the scripts rewrite `__global__ void __launch_bounds__(128) bounded() {}`.
static void bounded() { ::emu_launch_bounds(128); }
static void read_at(const float* p, int i, float* out) { *out = p[i]; }
static void vector_load(const float* p, float* out) {
  const float4 v = *reinterpret_cast<const float4*>(p);  // 16-byte access: p must be 16-aligned
  *out = v.x + v.y + v.z + v.w;
}

// A fragment of ones stored to shared memory, then every lane sums the whole 16 x 16
// matrix into out[lane]: with `sync` a __syncwarp between, as a lane may read what other
// lanes stored only after one; without, a lane reads some entries before their lanes
// have stored them (emu_wmma.h's stores write each lane's share).
static void wmma_store_then_read(int sync, float* out) {
  namespace wmma = nvcuda::wmma;
  float* s = reinterpret_cast<float*>(ctx->smem);
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> f;
  wmma::fill_fragment(f, 1.0f);
  wmma::store_matrix_sync(s, f, 16, wmma::mem_row_major);
  if (sync) __syncwarp();
  float sum = 0.0f;
  for (int e = 0; e < 256; ++e) sum += s[e];
  out[threadIdx.x] = sum;
}

int main() {
  // Barriers and shuffles that some threads never reach.
  must_stop("a barrier half the block skips", "is stuck", [] { LAUNCH(barrier_skipped, 1, 64, 0, 32); });
  must_run("a barrier the whole block reaches", [] { LAUNCH(barrier_skipped, 1, 64, 0, 64); });
  must_stop("a shuffle some lanes skip", "is stuck", [] { LAUNCH(shuffle_skipped, 1, 32, 0, 16); });
  must_run("a shuffle the whole warp makes", [] { LAUNCH(shuffle_skipped, 1, 32, 0, 32); });

  // Dynamic shared memory: written past its end; more than the default without a grant.
  must_stop("a write one float past dynamic shared memory", "wrote past",
            [] { LAUNCH(writes_dynamic, 1, 32, 1024, 257); });
  must_run("writes filling dynamic shared memory", [] { LAUNCH(writes_dynamic, 1, 32, 1024, 256); });
  must_stop("48 KiB + 16 of dynamic shared memory, no grant", "more needs cudaFuncSetAttribute",
            [] { LAUNCH(nothing, 1, 32, 48 * 1024 + 16); });
  must_run("48 KiB of dynamic shared memory, no grant", [] { LAUNCH(nothing, 1, 32, 48 * 1024); });
  must_run("96 KiB granted, 96 KiB asked", [] {
    if (cudaFuncSetAttribute(grant_me, cudaFuncAttributeMaxDynamicSharedMemorySize, 96 * 1024) != cudaSuccess) std::abort();
    LAUNCH(grant_me, 1, 32, 96 * 1024);
  });
  must_stop("96 KiB granted, 96 KiB + 4 asked", "granted by cudaFuncSetAttribute", [] {
    if (cudaFuncSetAttribute(grant_me, cudaFuncAttributeMaxDynamicSharedMemorySize, 96 * 1024) != cudaSuccess) std::abort();
    LAUNCH(grant_me, 1, 32, 96 * 1024 + 4);
  });
  must_stop("a grant for another kernel", "more needs cudaFuncSetAttribute", [] {
    if (cudaFuncSetAttribute(grant_me, cudaFuncAttributeMaxDynamicSharedMemorySize, 96 * 1024) != cudaSuccess) std::abort();
    LAUNCH(nothing, 1, 32, 64 * 1024);
  });
  if (cudaFuncSetAttribute(grant_me, cudaFuncAttributeMaxDynamicSharedMemorySize, kEmuSmemOptin + 1) !=
      cudaErrorInvalidValue) {
    ++failures;
    printf("FAIL a grant past the device's %d bytes was accepted\n", kEmuSmemOptin);
  } else {
    printf("ok   a grant past the device's %d bytes: cudaErrorInvalidValue\n", kEmuSmemOptin);
  }

  // Static shared memory shares the 48 KiB with the dynamic.
  must_run("40 KiB static + 8 KiB dynamic", [] { LAUNCH(static_array, 1, 32, 8 * 1024); });
  must_stop("40 KiB static + 8 KiB + 4 dynamic", "static shared memory", [] { LAUNCH(static_array, 1, 32, 8 * 1024 + 4); });

  // Launch configurations past the hardware's limits.
  must_stop("a grid 65536 blocks high", "invalid configuration", [] { LAUNCH(nothing, dim3(1, 65536, 1), 32, 0); });
  must_run("a grid 65535 blocks deep", [] { LAUNCH(nothing, dim3(1, 1, 65535), 1, 0); });
  must_stop("a block of 1025 threads", "invalid configuration", [] { LAUNCH(nothing, 1, 1025, 0); });
  must_stop("a block 65 threads deep", "invalid configuration", [] { LAUNCH(nothing, 1, dim3(1, 1, 65), 0); });
  must_run("a block of 1024 threads, 64 deep", [] { LAUNCH(nothing, 1, dim3(4, 4, 64), 0); });
  must_stop("an empty grid", "invalid configuration", [] { LAUNCH(nothing, dim3(0, 1, 1), 32, 0); });
  must_stop("256 threads for __launch_bounds__(128)", "__launch_bounds__(128)", [] { LAUNCH(bounded, 1, dim3(64, 4), 0); });
  must_run("128 threads for __launch_bounds__(128)", [] { LAUNCH(bounded, 2, 128, 0); });

  // A lane reading a WMMA store of other lanes with no __syncwarp between: some lane
  // must read an entry not yet stored (shown as a sum other than 256), in either order.
  for (int sync = 0; sync < 2; ++sync) {
    static float sums[32];
    std::fill(sums, sums + 32, 0.0f);
    LAUNCH(wmma_store_then_read, 1, 32, 1024, sync, static_cast<float*>(sums));
    const int short_lanes = int(std::count_if(sums, sums + 32, [](float x) { return x != 256.0f; }));
    const bool ok = sync ? short_lanes == 0 : short_lanes > 0;
    if (!ok) ++failures;
    printf("%s a WMMA store read by every lane %s: %d of 32 lanes read an entry before its lane stored it\n",
           ok ? "ok  " : "FAIL", sync ? "after __syncwarp" : "with no __syncwarp between", short_lanes);
  }

  // A 16-byte vector access at an address 4 bytes off (UBSan, -fsanitize=alignment).
  must_stop("a float4 load 4 bytes off its alignment", "misaligned address", [] {
    alignas(16) static float data[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    static float out;
    LAUNCH(vector_load, 1, 1, 0, static_cast<const float*>(data + 1), &out);
  });
  must_run("a float4 load on its alignment", [] {
    alignas(16) static float data[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    static float out;
    LAUNCH(vector_load, 1, 1, 0, static_cast<const float*>(data + 4), &out);
    if (out != 26.0f) std::abort();
  });

#if defined(__SANITIZE_ADDRESS__)
  // Under AddressSanitizer (run.sh builds this harness with and without it): device memory
  // read past its end or after its free, as a GPU faults on (or reads someone else's data).
  // The stack switches between fibers are announced to it (emu.h): without that, the legal
  // launches above print its warning about an unknown stack and fail here.
  must_stop("a read one float past a buffer", "heap-buffer-overflow", [] {
    float* buf = static_cast<float*>(std::malloc(64 * sizeof(float)));
    static float out;
    LAUNCH(read_at, 1, 1, 0, static_cast<const float*>(buf), 64, &out);
  });
  must_run("a read of a buffer's last float", [] {
    float* buf = static_cast<float*>(std::calloc(64, sizeof(float)));
    static float out;
    LAUNCH(read_at, 1, 1, 0, static_cast<const float*>(buf), 63, &out);
    std::free(buf);
  });
  must_stop("a read of a freed buffer", "heap-use-after-free", [] {
    float* buf = static_cast<float*>(std::calloc(64, sizeof(float)));
    std::free(buf);
    static float out;
    LAUNCH(read_at, 1, 1, 0, static_cast<const float*>(buf), 0, &out);
  });
#endif

  printf("%s: %d failure(s)\n", failures ? "FAILED" : "passed", failures);
  return failures ? 1 : 0;
}
