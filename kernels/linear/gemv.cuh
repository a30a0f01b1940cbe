#pragma once
// Matrix products with fp16 weights. CPU references: matvec_ref / matmul_ref (kernels/common/basic_ops.h).
// W is a Hugging Face nn.Linear weight, row-major [rows = out_features][cols = in_features].
#include <cublas_v2.h>

#include "kernels/common/cuda_common.cuh"
#include "kernels/linear/gemv_epilogue.h"

namespace quest {

// Batch-1 decode: y[rows] = W x (fp16 W and x, fp32 accumulation and output). Memory-bound: streams W once with
// 16-byte loads. Requires cols % 8 == 0 and 16-byte aligned W and x.
void gemv(float* y, const __half* W, const __half* x, int rows, int cols, cudaStream_t stream);

// The decode step's fused epilogues (kernels/linear/gemv_epilogue.h) on gemv()'s kernel: the same row sums as gemv(),
// then
//   gemv_scaled:   y[r] = inv * (W xg)[r]                                    (qkv, lm_head)
//   gemv_swiglu:   W's rows interleaved (row 2i = gate_i, row 2i + 1 = up_i, rows = 2 F even):
//                  act[i] = fp16(silu(inv (W xg)[2i]) * inv (W xg)[2i + 1])    (gate+up; act [rows / 2])
//   gemv_residual: ResidualNorm with n = rows: x += W x_in, xg = fp16(x g), per-block partial sums of x^2
//                  (gemv_residual_partials of them)                           (o, down)
// with inv = rsqrtf(ss / norm.n + eps), ss = the sum of norm.partials[0 .. norm.count), added by every block. Each needs gemv_fused_supported (cols % 8 == 0, 16-byte aligned W and
// input; else the model keeps rms_norm / swiglu / gemv). No allocation or synchronisation (graph-safe).
bool gemv_fused_supported(const __half* W, const __half* x, int cols);
void gemv_scaled(float* y, const __half* W, const __half* xg, int rows, int cols, const NormScale& norm,
                 cudaStream_t stream);
void gemv_swiglu(__half* act, const __half* W, const __half* xg, int rows, int cols, const NormScale& norm,
                 cudaStream_t stream);
void gemv_residual(const ResidualNorm& out, const __half* W, const __half* x, int rows, int cols,
                   cudaStream_t stream);
// Blocks of a gemv_residual launch with `rows` rows: the ResidualNorm::partials it needs.
int gemv_residual_partials(int rows);

// cuBLAS: Y[T][rows] = X[T][cols] W^T (fp16 inputs, fp32 accumulation and output). Prefill, and the batch-1
// baseline the custom gemv is measured against.
void gemm_cublas(cublasHandle_t handle, float* Y, const __half* W, const __half* X, int T, int rows, int cols,
                 cudaStream_t stream);

#define CUBLAS_CHECK(expr)                                                                                 \
    do {                                                                                                   \
        const cublasStatus_t quest_st_ = (expr);                                                           \
        if (quest_st_ != CUBLAS_STATUS_SUCCESS)                                                            \
            throw ::quest::CudaError(std::string("cuBLAS error ") + std::to_string(int(quest_st_)) + " in " + \
                                     #expr + " at " + __FILE__ + ":" + std::to_string(__LINE__));          \
    } while (0)

}  // namespace quest
