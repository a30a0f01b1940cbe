#pragma once
// Shared by every CUDA translation unit and by the host code that calls the launchers. No spdlog/fmt/json here:
// this header is compiled by nvcc.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

namespace quest {

// A failed CUDA call: the message names the expression, the file and the line, and CUDA's error string.
struct CudaError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

[[noreturn]] void cuda_fail(cudaError_t err, const char* expr, const char* file, int line);
[[noreturn]] void precondition_fail(const char* cond, const std::string& msg, const char* file, int line);

}  // namespace quest

// CUDA_CHECK(cudaMalloc(...)): throws quest::CudaError naming the expression, file and line on failure.
#define CUDA_CHECK(expr)                                                              \
    do {                                                                              \
        const cudaError_t quest_err_ = (expr);                                        \
        if (quest_err_ != cudaSuccess) ::quest::cuda_fail(quest_err_, #expr, __FILE__, __LINE__); \
    } while (0)

// After a kernel launch: a bad configuration or an earlier asynchronous fault surfaces here.
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())

// Launcher preconditions (shapes, alignment): std::invalid_argument naming the condition, file and line.
#define QUEST_REQUIRE(cond, msg)                                                          \
    do {                                                                                  \
        if (!(cond)) ::quest::precondition_fail(#cond, (msg), __FILE__, __LINE__);      \
    } while (0)

namespace quest {

// Programmatic dependent launch (Hopper). A kernel launched with launch_pdl() may start while the kernel before it in
// the stream is finishing: it must call pdl_wait() before it reads anything an earlier kernel wrote and before it
// writes anything an earlier kernel may still read. Before the wait it may only read immutable data (weights, the
// KV cache below the current position). pdl_trigger() lets the next kernel's blocks be scheduled early.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

#ifdef __CUDACC__
// Launches `kernel` with programmatic stream serialisation allowed (see pdl_wait). Every kernel launched this way
// calls pdl_wait() before touching data produced by earlier kernels.
template <typename... KernelArgs, typename... Args>
void launch_pdl(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                Args&&... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}
#endif

inline bool is_aligned(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }
inline int ceil_div(int a, int b) { return (a + b - 1) / b; }

// The one place where a runtime head_dim becomes a compile-time constant for the attention-family launchers:
// f(std::integral_constant<int, D>{}) for D in {8, 16, 32, 64, 128, 256}; any other value throws
// std::invalid_argument naming `who` (use decltype(d)::value inside f).
template <class F>
void with_head_dim(int head_dim, const char* who, F&& f) {
    switch (head_dim) {
        case 8: return f(std::integral_constant<int, 8>{});
        case 16: return f(std::integral_constant<int, 16>{});
        case 32: return f(std::integral_constant<int, 32>{});
        case 64: return f(std::integral_constant<int, 64>{});
        case 128: return f(std::integral_constant<int, 128>{});
        case 256: return f(std::integral_constant<int, 256>{});
        default:
            precondition_fail("head_dim in {8, 16, 32, 64, 128, 256}",
                              std::string(who) + ": unsupported head_dim " + std::to_string(head_dim) +
                                  " (supported: 8, 16, 32, 64, 128, 256)",
                              __FILE__, __LINE__);
    }
}

// Query heads per KV head (group >= 1) as the head tile a kernel is compiled for: f(std::integral_constant<int, T>{})
// with T = 1, 2, 4 or 8, the smallest power of two >= group, and 8 for any larger group (the kernel then loops over
// tiles of 8).
template <class F>
void with_group_tile(int group, F&& f) {
    if (group <= 1) return f(std::integral_constant<int, 1>{});
    if (group <= 2) return f(std::integral_constant<int, 2>{});
    if (group <= 4) return f(std::integral_constant<int, 4>{});
    return f(std::integral_constant<int, 8>{});
}

// Number of CUDA devices, 0 when there is no driver or device (never throws).
int cuda_device_count();

}  // namespace quest
