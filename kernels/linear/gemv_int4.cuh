#pragma once
// 4-bit weights on the GPU, layout "quest-int4" v1 (kernels/linear/quant.h) with the codes of each row permuted into the
// device layout of kernels/linear/int4_layout.h (int4_to_device_layout at upload; scales and zero points as in v1): the
// fused dequantize + GEMV of the decode step, the dequantize-to-FP16 kernel of the prefill (whose GEMM then runs on
// FP16), and random int4 weights for benchmarks. CPU references: matvec_int4_ref and dequantize_int4
// (kernels/linear/quant.h), on the v1 layout.
//
// Arithmetic of the GEMV: a 16-byte load of a row gives 32 codes of one group; each 32-bit word is turned into four
// fp16 pairs (q - z) with one LOP3 (+ one shift per word) and one HSUB2/HFMA2 per pair (the 0x6400 "1024 + q"
// magic-number trick; (q - z) is an exact small integer in fp16), multiplied by x and summed in fp16 over 8
// products per lane half, then summed in fp32 and scaled by the group's fp16 scale in fp32. So the products are
// fp16-rounded and short fp16 partial sums (8 terms of |q - z| <= 15 times |x|) precede the fp32 accumulation:
// FP16 tolerance against the fp32 reference, no overflow unless |x| averages > ~500 over 8 neighbouring columns.
// The "i16" kernels (the default on tall matrices, below) take x in block floating point
// per chunk of 32 columns (int16 values, one power-of-two step per chunk, in shared memory) and the codes as
// bytes: dp4a gives sum (q - z) xi exactly in int32, then one fp32 product with scale * step per chunk. x's fp16
// values are represented exactly when within 4 binades of the chunk's largest |x| (smaller ones rounded to 2^-16 of
// it, roughly); no fp16 product or partial sum, no overflow. A NaN or infinite x gives NaN / inf outputs as the
// fp16 kernels do. The trade-off (host emulation, tests/test_quant.cpp IntegerDotErrorAgainstTheFp16DotWithAnOutlier:
// 256 x 4096, x ~ N(0, 0.03) with one outlier channel): relative L2 error 1e-5 .. 1e-4 against the fp16 dot's
// 2e-4 .. 5e-4 when the outlier's weights are ordinary, about equal when they are the smallest nonzero, but 3e-3
// (outlier 64) .. 1.3e-2 (300) when they are exactly zero in every row, where its chunk neighbours carry the output
// with a few bits.
//
// Which kernel gemv_int4() runs, by the matrix's shape (the "auto" rule, kernels/linear/gemv_int4.cu): the i16 dot on
// tiles of 4 rows where every warp of the persistent grid takes at least two of them, else on tiles of 2 rows where
// every warp takes at least two of those, else the fp16 dot; rows too wide for x in shared memory run a kernel that
// reads x from global memory. The fused epilogues below run the same kernels. kernels/linear/gemv_int4_kernels.cuh
// names them for the tests and the kernel benchmark.
#include <cstdint>

#include "kernels/common/cuda_common.cuh"
#include "kernels/linear/gemv_epilogue.h"

namespace quest {

// A quantized matrix on the device (kernels/linear/quant.h layout, the codes of each row in the device layout).
struct Int4View {
    const uint32_t* qweight = nullptr;  // [rows][cols / 8] codes, kernels/linear/int4_layout.h
    const __half* scales = nullptr;     // [rows][cols / group]
    const uint8_t* zeros = nullptr;     // [rows][cols / group], 0..15
    int rows = 0, cols = 0;             // out_features, in_features
    int group = 0;                      // power of two >= 32 dividing cols
    bool valid() const { return qweight != nullptr; }
};

// Batch-1 decode: y[rows] = dequant(W) x (fp16 x, fp32 output). Streams the codes once with 16-byte loads; issues
// the first loads of its (immutable) weights before waiting on the previous kernel (programmatic dependent
// launch). Requires a valid group, 16-byte aligned qweight and x. No allocation or synchronisation (graph-safe);
// the default kernel copies x into cols * 2 bytes of (dynamic) shared memory per block.
void gemv_int4(float* y, const Int4View& W, const __half* x, cudaStream_t stream);

// The decode step's fused epilogues (kernels/linear/gemv_epilogue.h), on the kernel gemv_int4() runs (the auto rule
// above): the same tile sums, then
//   gemv_int4_scaled:   y[r] = (W fp16(xg inv))[r]: the input normalised in shared memory  (qkv)
//   gemv_int4_swiglu:   W's rows interleaved (row 2i = gate_i, row 2i + 1 = up_i; rows even; the device layout's
//                       permutation is per row, so the interleave is a row order):
//                       act[i] = fp16(silu(v[2i]) * v[2i + 1]), v = W fp16(xg inv)   (gate+up; act [rows / 2])
//   gemv_int4_residual: ResidualNorm with n = rows: x += W x_in, xg = fp16(x g), per-block partial sums of x^2
//                       (gemv_int4_residual_partials of them)                             (o, down)
// inv = rsqrtf(ss / norm.n + eps), ss = the sum of norm.partials[0 .. norm.count), added by every block. They require
// gemv_int4_fused_supported(W) (x in shared memory: cols up to about 24K) and a 16-byte aligned input. No allocation
// or synchronisation (graph-safe).
bool gemv_int4_fused_supported(const Int4View& W);
void gemv_int4_scaled(float* y, const Int4View& W, const __half* xg, const NormScale& norm, cudaStream_t stream);
void gemv_int4_swiglu(__half* act, const Int4View& W, const __half* xg, const NormScale& norm, cudaStream_t stream);
void gemv_int4_residual(const ResidualNorm& out, const Int4View& W, const __half* x, cudaStream_t stream);
// Blocks of a gemv_int4_residual launch on W (a persistent grid: depends on the device's SM count): the
// ResidualNorm::partials it needs.
int gemv_int4_residual_partials(const Int4View& W);

// out [rows][cols] (fp16, 16-byte aligned, row-major in column order) = dequant(W): each element is the fp16
// rounding of the exact (q - z) * scale, i.e. bit for bit float_to_half(dequantize_int4(...)) of the v1 matrix.
// The prefill runs this into a scratch buffer before its FP16 GEMM. Plain launch (not programmatic).
void dequantize_int4_to_half(__half* out, const Int4View& W, cudaStream_t stream);

// Random int4 weights for benchmarks of large shapes without a checkpoint: codes uniform in 0..15 from a hash of
// (seed, index in the device layout: uniform codes are uniform in any layout), zero points 7 or 8, scales
// amplitude / 7.5 * (0.75 .. 1.25): values within about +-amplitude.
void fill_random_int4(uint32_t* qweight, __half* scales, uint8_t* zeros, int rows, int cols, int group, uint64_t seed,
                      float amplitude, cudaStream_t stream);

}  // namespace quest
