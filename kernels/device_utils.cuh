#pragma once
// Device-side helpers shared by the kernel files (nvcc only): warp reductions, streaming loads, cp.async, and the
// row-sum epilogue of the batch-1 GEMV kernels (FP16 and int4).
#include <cstdint>

#include <cuda_fp16.h>

#include "kernels/cuda_common.cuh"

namespace quest {

// log2 of a power of two (the smallest l with 2^l >= x).
inline int log2_exact(int x) {
    int l = 0;
    while ((1 << l) < x) ++l;
    return l;
}

// Streaming multiprocessors of the current device (cached per thread; no synchronisation, capture-safe).
inline int sm_count() {
    thread_local int dev = -1, sms = 0;
    int d = 0;
    CUDA_CHECK(cudaGetDevice(&d));
    if (d != dev) {
        CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, d));
        dev = d;
    }
    return sms > 0 ? sms : 1;
}

// Eight packed fp16 values (one 16-byte load) to fp32.
__device__ __forceinline__ void half8_to_float(const uint4& raw, float (&f)[8]) {
    const __half2* h = reinterpret_cast<const __half2*>(&raw);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const float2 x = __half22float2(h[j]);
        f[2 * j] = x.x;
        f[2 * j + 1] = x.y;
    }
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Streaming 16-byte load of weights: read once per step, so keep them out of L1.
__device__ __forceinline__ uint4 load_stream(const uint4* p) {
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
    return r;
}

// 16-byte asynchronous copy global -> shared (shared address as from __cvta_generic_to_shared); src_bytes < 16
// zero-fills the rest (0: nothing is read).
__device__ __forceinline__ void cp_async16(uint32_t smem_addr, const void* src, int src_bytes = 16) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr), "l"(src), "r"(src_bytes)
                 : "memory");
}
__device__ __forceinline__ void cp_async16(void* smem, const void* src, int src_bytes = 16) {
    cp_async16(static_cast<uint32_t>(__cvta_generic_to_shared(smem)), src, src_bytes);
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Epilogue of the batch-1 GEMV kernels: lane sums of R rows per warp; with KS > 1 the KS warps of a row group
// (consecutive warps, `seg` = 0 first) hold column segments of the same rows and are reduced through shared memory.
// Writes y[row0 + r] for the rows < rows. Every thread of the block must call it (barrier when KS > 1).
template <int R, int W, int KS>
__device__ __forceinline__ void gemv_store_rows(float* y, const float (&acc)[R], int row0, int rows, int warp,
                                                int seg, int lane) {
    if constexpr (KS == 1) {
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const float sum = warp_sum(acc[r]);
            if (lane == 0 && row0 + r < rows) y[row0 + r] = sum;
        }
    } else {
        __shared__ float part[W][R];
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const float sum = warp_sum(acc[r]);
            if (lane == 0) part[warp][r] = sum;
        }
        __syncthreads();
        if (seg == 0 && lane < R) {
            float sum = 0.0f;
#pragma unroll
            for (int k = 0; k < KS; ++k) sum += part[warp + k][lane];
            if (row0 + lane < rows) y[row0 + lane] = sum;
        }
    }
}

}  // namespace quest
