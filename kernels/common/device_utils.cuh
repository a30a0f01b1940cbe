#pragma once
// Device-side helpers shared by the kernel files (nvcc only): warp reductions, streaming loads, cp.async, and the
// row-sum epilogue of the batch-1 GEMV kernels (FP16 and int4).
#include <cmath>
#include <cstdint>

#include <cuda_fp16.h>

#include "kernels/common/cuda_common.cuh"
#include "kernels/linear/gemv_epilogue.h"

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

// fp16(h * f) for the 8 halves of a 16-byte piece (the product in fp32, rounded to nearest).
__device__ __forceinline__ uint4 scale_half8(const uint4& raw, float f) {
    uint4 out;
    const __half2* h = reinterpret_cast<const __half2*>(&raw);
    __half2* o = reinterpret_cast<__half2*>(&out);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const float2 x = __half22float2(h[j]);
        o[j] = __floats2half2_rn(x.x * f, x.y * f);
    }
    return out;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Folds the log-sum-exp state (mo, so) = (max, sum of exp(x - max)) into (m, s). Either side may be empty (-inf, 0).
__device__ __forceinline__ void lse_merge(float& m, float& s, float mo, float so) {
    const float mn = fmaxf(m, mo);
    if (mn == -INFINITY) return;  // both empty
    s = s * expf(m - mn) + so * expf(mo - mn);  // expf(-inf) = 0 for an empty side
    m = mn;
}

// lse_merge of the states of the warp's 32 lanes (xor shuffles: every lane gets the same result).
__device__ __forceinline__ void warp_lse_merge(float& m, float& s) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float mo = __shfl_xor_sync(0xffffffffu, m, o), so = __shfl_xor_sync(0xffffffffu, s, o);
        lse_merge(m, s, mo, so);
    }
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

// ---------------------------------------------------------------------------------------------------------------------
// Fused epilogues of the batch-1 GEMV kernels (kernels/linear/gemv_epilogue.h says what each computes and why). A kernel
// template takes the kind as a parameter and a GemvEpi by value; Store is the plain y[r] = sum.
enum class GemvEpilogue : int {
    Store = 0,     // y[r] = sum
    Scale = 1,     // y[r] = sum * inv (inv from NormScale)
    SwiGLU = 2,    // rows interleaved (2i gate_i, 2i + 1 up_i): act[i] = fp16(silu(gate * inv) * (up * inv))
    Residual = 3,  // ResidualNorm: x[r] += sum, xg[r] = fp16(x[r] g[r]), ss = sum of x^2 over the grid
};

struct GemvEpi {
    NormScale norm;     // Scale, SwiGLU
    __half* act = nullptr;  // SwiGLU: [rows / 2]
    ResidualNorm res;   // Residual
};

// Sum over the block, the same value in every thread, in a fixed order (deterministic for a given blockDim). Every
// thread of the block must call it; it may be called repeatedly.
__device__ __forceinline__ float block_sum_fixed(float v) {
    __shared__ float red[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
    v = warp_sum(v);
    __syncthreads();  // red may still be read by a previous call
    if (lane == 0) red[warp] = v;
    __syncthreads();
    v = lane < warps ? red[lane] : 0.0f;
    return warp_sum(v);
}

// This thread's share of ss = sum(n.partials[0 .. count)): entries tid, tid + blockDim, ... Call after pdl_wait()
// (the partials come from the previous kernel). In two parts so that a kernel can issue the loads early and add them
// only when it needs the sum (the loads then complete behind its weight stream): epi_partials_load issues the first
// four (registers), epi_partials_add adds them and any beyond 4 * blockDim (a plain loop).
struct PartialsShare {
    float v[4];
};
__device__ __forceinline__ PartialsShare epi_partials_load(const NormScale& n) {
    const int t = threadIdx.x, bd = blockDim.x;
    PartialsShare p;
#pragma unroll
    for (int k = 0; k < 4; ++k) p.v[k] = t + k * bd < n.count ? __ldcg(n.partials + t + k * bd) : 0.0f;
    return p;
}
__device__ __forceinline__ float epi_partials_add(const NormScale& n, const PartialsShare& p) {
    const int t = threadIdx.x, bd = blockDim.x;
    float s = (p.v[0] + p.v[1]) + (p.v[2] + p.v[3]);
    for (int i = t + 4 * bd; i < n.count; i += bd) s += __ldcg(n.partials + i);
    return s;
}
__device__ __forceinline__ float epi_partials_share(const NormScale& n) {
    return epi_partials_add(n, epi_partials_load(n));
}

// inv = rsqrtf(ss / n + eps) from every thread's epi_partials_share (block_sum_fixed: the same bits in every block
// of the same size). Every thread of the block must call it.
__device__ __forceinline__ float epi_inv_rms(const NormScale& n, float share) {
    return rsqrtf(block_sum_fixed(share) / static_cast<float>(n.n) + n.eps);
}

// silu(g) * u, as the swiglu kernel (kernels/common/elementwise.cu) computes it.
__device__ __forceinline__ float epi_silu_mul(float g, float u) { return g / (1.0f + expf(-g)) * u; }

// Residual row r with its GEMV sum: x[r] += sum, xg[r] = fp16(x[r] g[r]); returns the updated x[r]^2. x is read
// and written by this thread only (after pdl_wait: the previous kernels wrote and read it).
__device__ __forceinline__ float epi_residual_row(const ResidualNorm& e, int r, float sum) {
    const float v = e.x[r] + sum;
    e.x[r] = v;
    e.xg[r] = __float2half_rn(v * __ldg(e.g + r));
    return v * v;
}

// End of a Residual launch: v is this thread's share of the sum of squares (0 for threads without rows); the
// block's sum (fixed order) goes to partials[blockIdx.x], summed by the consumer (epi_partials_share). Every thread
// of every block must call it.
__device__ __forceinline__ void epi_residual_finish(const ResidualNorm& e, float v) {
    const float b = block_sum_fixed(v);
    if (threadIdx.x == 0) e.partials[blockIdx.x] = b;
}

// Fused epilogue of the block-per-rows GEMV (kernels/linear/gemv.cu): as gemv_store_rows (the same sums in the same order),
// then the epilogue E applied by lane 0 of the row group's first warp (seg 0), which holds all R sums. inv: the
// NormScale factor (Scale, SwiGLU). Every thread of the block must call it (barriers with KS > 1 or Residual).
template <int R, int W, int KS, GemvEpilogue E>
__device__ __forceinline__ void gemv_epilogue_rows(float* y, const float (&acc)[R], int row0, int rows, int warp,
                                                   int seg, int lane, const GemvEpi& e, float inv) {
    static_assert(E != GemvEpilogue::Store, "Store: gemv_store_rows");
    static_assert(E != GemvEpilogue::SwiGLU || R % 2 == 0, "SwiGLU needs the gate and up rows in one warp");
    float sum[R];
    bool owner;
    if constexpr (KS == 1) {
#pragma unroll
        for (int r = 0; r < R; ++r) sum[r] = warp_sum(acc[r]);
        owner = lane == 0;
    } else {
        __shared__ float part[W][R];
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const float s = warp_sum(acc[r]);
            if (lane == 0) part[warp][r] = s;
        }
        __syncthreads();
        owner = seg == 0 && lane == 0;
#pragma unroll
        for (int r = 0; r < R; ++r) {
            float s = 0.0f;
            if (owner) {
#pragma unroll
                for (int k = 0; k < KS; ++k) s += part[warp + k][r];
            }
            sum[r] = s;
        }
    }
    float sq = 0.0f;
    if (owner) {
        if constexpr (E == GemvEpilogue::SwiGLU) {  // rows even, row0 even: row r + 1 exists when row r does
#pragma unroll
            for (int r = 0; r < R; r += 2)
                if (row0 + r < rows)
                    e.act[(row0 + r) >> 1] = __float2half_rn(epi_silu_mul(sum[r] * inv, sum[r + 1] * inv));
        } else {
#pragma unroll
            for (int r = 0; r < R; ++r) {
                if (row0 + r >= rows) break;
                if constexpr (E == GemvEpilogue::Scale) y[row0 + r] = sum[r] * inv;
                else sq += epi_residual_row(e.res, row0 + r, sum[r]);
            }
        }
    }
    if constexpr (E == GemvEpilogue::Residual) epi_residual_finish(e.res, sq);
}

}  // namespace quest
