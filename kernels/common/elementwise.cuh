#pragma once
// Small per-token CUDA kernels of a Llama layer. CPU references: kernels/common/basic_ops.h. Rows are tokens.
#include <cstdint>

#include "kernels/common/cuda_common.cuh"
#include "kernels/common/dtype.h"

namespace quest {

// out[t][:] = float(table[tokens[t]][:]) for t < T (tokens on the device; an id outside [0, vocab) gives NaNs).
void embedding(float* out, const __half* table, const int* tokens, int T, int dim, int vocab, cudaStream_t stream);
// A tensor-parallel rank's rows of the table (rows [first, first + rows) of the model's): out[t][:] =
// float(table[tokens[t] - first][:]) for an id among them, zeros for any other id (another rank's row; the ranks'
// outputs summed are the embedding).
void embedding_rows(float* out, const __half* table, const int* tokens, int T, int dim, int first, int rows,
                    cudaStream_t stream);

// The decode step's first norm folded into the next GEMV (kernels/linear/gemv_epilogue.h): for the one token *token,
// x[i] = float(table[token][i]), xg[i] = fp16(x[i] * g[i]) (g: layer 0's attn_norm), *ss = sum of x[i]^2 (one
// block, fixed summation order; the consumer's NormScale{ss, count 1}). An id outside [0, vocab) gives NaNs.
void embedding_norm_prep(float* x, __half* xg, float* ss, const __half* table, const int* token, const float* g,
                         int dim, int vocab, cudaStream_t stream);

// Residual add fused with RMSNorm, per row t < rows:
//   if residual: x[t] += residual[t]            (fp32, in place)
//   out[t] = x[t] / sqrt(mean(x[t]^2) + eps) * w  (fp16; w fp32)
void rms_norm(__half* out, float* x, const float* residual, const float* w, int rows, int n, float eps,
              cudaStream_t stream);

// out[t][i] = silu(gu[t][i]) * gu[t][F + i] for i < F (gate | up side by side, fp32 in, fp16 out).
void swiglu(__half* out, const float* gu, int T, int F, cudaStream_t stream);

// The same with gate and up interleaved (the CUDA backend's gate+up row order): out[t][i] = silu(gu[t][2i]) *
// gu[t][2i + 1] for i < F (gu 8-byte aligned).
void swiglu_interleaved(__half* out, const float* gu, int T, int F, cudaStream_t stream);

// x[i] += y[i] (fp32).
void add_inplace(float* x, const float* y, int n, cudaStream_t stream);

// *pos += n on the device (the decode step's position advances inside the captured graph).
void advance_position(int* pos, int n, cudaStream_t stream);

// Weight conversion at load time: dst = fp16(src) for src in F32/BF16/F16. Values beyond the fp16 range are
// clamped to +-65504 and counted in *overflow (device counter, accumulated); NaN stays NaN and is counted too.
void convert_to_half(__half* dst, const void* src, DType src_type, size_t n, unsigned long long* overflow,
                     cudaStream_t stream);
// The same for a [rows][cols] matrix written with a row pitch: dst[r * dst_pitch + c] (elements; dst_pitch >= cols),
// e.g. every second row of a matrix whose rows are interleaved with another's.
void convert_to_half_rows(__half* dst, size_t dst_pitch, const void* src, DType src_type, size_t rows, size_t cols,
                          unsigned long long* overflow, cudaStream_t stream);
// fp32 copy of fp16 values (tests, logits).
void half_to_float_device(float* dst, const __half* src, size_t n, cudaStream_t stream);

// Deterministic random fp16 weights generated on the device (benchmarks of 7B shapes without a file):
// dst[i] = offset + scale * u_i, u_i uniform in [-1, 1) from a counter-based hash of (seed, i).
void fill_random_half(__half* dst, size_t n, uint64_t seed, float scale, float offset, cudaStream_t stream);
void fill_random_float(float* dst, size_t n, uint64_t seed, float scale, float offset, cudaStream_t stream);

}  // namespace quest
