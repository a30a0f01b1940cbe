#include <cstdint>

#include "kernels/linear/gemv.cuh"
#include "kernels/common/device_utils.cuh"

namespace quest {

namespace {

constexpr int kWarpsPerBlock = 4;  // for the scalar fall-back

__device__ __forceinline__ float dot8(uint4 w, uint4 x) {
    const __half2* wh = reinterpret_cast<const __half2*>(&w);
    const __half2* xh = reinterpret_cast<const __half2*>(&x);
    float acc = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float2 a = __half22float2(wh[i]);
        const float2 b = __half22float2(xh[i]);
        acc = fmaf(a.x, b.x, acc);
        acc = fmaf(a.y, b.y, acc);
    }
    return acc;
}

// cols % 8 == 0. A block of W warps covers (W / KS) * R rows: each row's 16-byte chunks are split over KS warps
// (column segments, reduced through shared memory) and each warp carries R rows, so one load of x serves R rows.
// Lane l of a warp reads chunks l, l+32, ... of its segment, U per row in one batch; the next batch is issued
// before the current one is consumed. The first batch is issued before pdl_wait(): weights never change, so they
// stream in while the previous kernel in the graph finishes. E: the epilogue (kernels/common/device_utils.cuh, GemvEpi e);
// Store writes y, the fused kinds run after the same sums (all their reads and writes of x, xg, ss, act come after
// pdl_wait()).
template <int R, int U, int W, int KS, GemvEpilogue E = GemvEpilogue::Store>
__global__ void __launch_bounds__(W * 32) gemv_vec_kernel(float* y, const __half* Wt, const __half* x, int rows,
                                                          int cols, GemvEpi e) {
    static_assert(W % KS == 0, "warps must split evenly into column segments");
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int seg = warp % KS;
    const int row0 = (blockIdx.x * (W / KS) + warp / KS) * R;
    const int chunks = cols / 8;
    const int seg_len = (chunks + KS - 1) / KS;
    const int c_begin = seg * seg_len, c_end = min(chunks, c_begin + seg_len);
    const uint4* w[R];
#pragma unroll
    for (int r = 0; r < R; ++r)  // rows past the end re-read the last row; their sums are dropped
        w[r] = reinterpret_cast<const uint4*>(Wt + static_cast<int64_t>(min(row0 + r, rows - 1)) * cols);
    const uint4* xv = reinterpret_cast<const uint4*>(x);
    const uint4 zero = make_uint4(0, 0, 0, 0);

    uint4 cur[U][R], nxt[U][R];
    int c = c_begin + lane;
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
        for (int r = 0; r < R; ++r) cur[u][r] = c + u * 32 < c_end ? load_stream(w[r] + c + u * 32) : zero;
    pdl_trigger();
    pdl_wait();
    constexpr bool kNorm = E == GemvEpilogue::Scale || E == GemvEpilogue::SwiGLU;
    // The producer's partial sums of x^2: loaded now, added in the epilogue (the loads complete behind the weights).
    [[maybe_unused]] PartialsShare ss_part{};
    if constexpr (kNorm) ss_part = epi_partials_load(e.norm);

    float acc[R] = {};
    for (; c < c_end; c += U * 32) {
        const int cn = c + U * 32;
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
            for (int r = 0; r < R; ++r) nxt[u][r] = cn + u * 32 < c_end ? load_stream(w[r] + cn + u * 32) : zero;
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const uint4 xr = c + u * 32 < c_end ? __ldg(xv + c + u * 32) : zero;
#pragma unroll
            for (int r = 0; r < R; ++r) acc[r] += dot8(cur[u][r], xr);
        }
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
            for (int r = 0; r < R; ++r) cur[u][r] = nxt[u][r];
    }
    if constexpr (E == GemvEpilogue::Store) {
        gemv_store_rows<R, W, KS>(y, acc, row0, rows, warp, seg, lane);
    } else {
        float inv = 1.0f;
        if constexpr (kNorm) inv = epi_inv_rms(e.norm, epi_partials_add(e.norm, ss_part));
        gemv_epilogue_rows<R, W, KS, E>(y, acc, row0, rows, warp, seg, lane, e, inv);
    }
}

// The tiling of the one FP16 GEMV kernel (plain and fused epilogues): 2 rows per warp, 4 loads of 16 bytes in flight
// per lane, 8 warps per block in 4 column segments. On the H200 at the 7B shapes it was the fastest or within 1% of
// the fastest of eight tilings (docs/measurements.md has the table).
constexpr int kVecR = 2, kVecU = 4, kVecW = 8, kVecKS = 4;
constexpr int kVecRowsPerBlock = (kVecW / kVecKS) * kVecR;

template <GemvEpilogue E>
void launch_vec(float* y, const __half* W, const __half* x, int rows, int cols, const GemvEpi& e, cudaStream_t stream) {
    launch_pdl(gemv_vec_kernel<kVecR, kVecU, kVecW, kVecKS, E>, dim3(ceil_div(rows, kVecRowsPerBlock)),
               dim3(kVecW * 32), 0, stream, y, W, x, rows, cols, e);
}

void check_fused(const __half* W, const __half* x, int rows, int cols, const NormScale* n, const char* who) {
    QUEST_REQUIRE(W && x && rows > 0 && cols > 0, std::string(who) + ": bad arguments");
    QUEST_REQUIRE(gemv_fused_supported(W, x, cols),
                  std::string(who) + ": needs cols % 8 == 0 and 16-byte aligned W and x (else rms_norm + gemv)");
    if (n) QUEST_REQUIRE(n->partials && n->count > 0 && n->n > 0, std::string(who) + ": bad NormScale");
}

// Any cols (tiny models such as stories260K, whose MLP width 172 is not a multiple of 8): scalar loads.
__global__ void __launch_bounds__(kWarpsPerBlock * 32) gemv_scalar_kernel(float* y, const __half* W, const __half* x,
                                                                            int rows, int cols) {
    pdl_wait();
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * kWarpsPerBlock + (threadIdx.x >> 5);
    if (row >= rows) return;
    const __half* w = W + static_cast<int64_t>(row) * cols;
    float acc = 0.0f;
    for (int c = lane; c < cols; c += 32) acc = fmaf(__half2float(w[c]), __half2float(x[c]), acc);
    acc = warp_sum(acc);
    if (lane == 0) y[row] = acc;
}

}  // namespace

void gemv(float* y, const __half* W, const __half* x, int rows, int cols, cudaStream_t stream) {
    QUEST_REQUIRE(y && W && x && rows > 0 && cols > 0, "gemv: bad arguments");
    if (cols % 8 == 0 && is_aligned(W, 16) && is_aligned(x, 16)) {
        launch_vec<GemvEpilogue::Store>(y, W, x, rows, cols, GemvEpi{}, stream);
    } else {
        launch_pdl(gemv_scalar_kernel, dim3(ceil_div(rows, kWarpsPerBlock)), dim3(kWarpsPerBlock * 32), 0, stream, y,
                   W, x, rows, cols);
    }
}

bool gemv_fused_supported(const __half* W, const __half* x, int cols) {
    return cols > 0 && cols % 8 == 0 && is_aligned(W, 16) && is_aligned(x, 16);
}

void gemv_scaled(float* y, const __half* W, const __half* xg, int rows, int cols, const NormScale& norm,
                 cudaStream_t stream) {
    check_fused(W, xg, rows, cols, &norm, "gemv_scaled");
    QUEST_REQUIRE(y, "gemv_scaled: bad arguments");
    GemvEpi e;
    e.norm = norm;
    launch_vec<GemvEpilogue::Scale>(y, W, xg, rows, cols, e, stream);
}

void gemv_swiglu(__half* act, const __half* W, const __half* xg, int rows, int cols, const NormScale& norm,
                 cudaStream_t stream) {
    check_fused(W, xg, rows, cols, &norm, "gemv_swiglu");
    QUEST_REQUIRE(act && rows % 2 == 0, "gemv_swiglu: act and an even number of (interleaved) rows are required");
    GemvEpi e;
    e.norm = norm;
    e.act = act;
    launch_vec<GemvEpilogue::SwiGLU>(nullptr, W, xg, rows, cols, e, stream);
}

int gemv_residual_partials(int rows) { return ceil_div(rows, kVecRowsPerBlock); }

void gemv_residual(const ResidualNorm& out, const __half* W, const __half* x, int rows, int cols,
                   cudaStream_t stream) {
    check_fused(W, x, rows, cols, nullptr, "gemv_residual");
    QUEST_REQUIRE(out.x && out.xg && out.g && out.partials && is_aligned(out.xg, 16),
                  "gemv_residual: bad ResidualNorm");
    QUEST_REQUIRE(out.partials_capacity >= gemv_residual_partials(rows),
                  "gemv_residual: partials_capacity < gemv_residual_partials(rows)");
    GemvEpi e;
    e.res = out;
    launch_vec<GemvEpilogue::Residual>(nullptr, W, x, rows, cols, e, stream);
}

void gemm_cublas(cublasHandle_t handle, float* Y, const __half* W, const __half* X, int T, int rows, int cols,
                 cudaStream_t stream) {
    QUEST_REQUIRE(handle && Y && W && X && T > 0 && rows > 0 && cols > 0, "gemm_cublas: bad arguments");
    // Column-major view: Y^T (rows x T) = W^T^T ... i.e. C = op(A) B with A = W stored col-major as cols x rows.
    const float alpha = 1.0f, beta = 0.0f;
    CUBLAS_CHECK(cublasSetStream(handle, stream));
    CUBLAS_CHECK(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, rows, T, cols, &alpha, W, CUDA_R_16F, cols, X,
                              CUDA_R_16F, cols, &beta, Y, CUDA_R_32F, rows, CUBLAS_COMPUTE_32F,
                              CUBLAS_GEMM_DEFAULT));
}

}  // namespace quest
