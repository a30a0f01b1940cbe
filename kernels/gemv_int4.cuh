#pragma once
// 4-bit weights on the GPU, layout "quest-int4" v1 (kernels/quant.h): the fused dequantize + GEMV of the decode
// step, the dequantize-to-FP16 kernel of the prefill (whose GEMM then runs on FP16), and random int4 weights for
// benchmarks. CPU references: matvec_int4_ref and dequantize_int4 (kernels/quant.h).
//
// Arithmetic of the GEMV: a 16-byte load of a row gives 32 codes of one group; each 32-bit word is turned into four
// fp16 pairs (q - z) with one LOP3 (+ one shift per word) and one HSUB2/HFMA2 per pair (the 0x6400 "1024 + q"
// magic-number trick; (q - z) is an exact small integer in fp16), multiplied by x and summed in fp16 over 8
// products per lane half, then summed in fp32 and scaled by the group's fp16 scale in fp32. So the products are
// fp16-rounded and short fp16 partial sums (8 terms of |q - z| <= 15 times |x|) precede the fp32 accumulation:
// FP16 tolerance against the fp32 reference, no overflow unless |x| averages > ~500 over 8 neighbouring columns.
#include <cstdint>

#include "kernels/cuda_common.cuh"

namespace quest {

// A quantized matrix on the device (kernels/quant.h layout).
struct Int4View {
    const uint32_t* qweight = nullptr;  // [rows][cols / 8] codes
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

// The kernel variants gemv_int4() chooses from, for the micro-benchmark and the tests; gemv_int4() is variant 0.
// "stream R U W S<n>": a persistent grid of at most n warps per SM, each warp streaming tiles of R rows with U
// 16-byte loads per row per lane kept in flight across rows (W warps per block, x in shared memory).
// "async R U W P<p> S<n>": the same tiling, the codes copied by cp.async into a per-warp ring of p stages in shared
// memory (p - 1 items in flight without holding registers).
// "R U W KS" (legacy, the default before the stream kernel): R rows per warp, U loads in flight per row, W warps
// per block, KS warps splitting a row's columns. Same arithmetic for all (above); kernels/gemv_int4.cu has details.
int gemv_int4_variant_count();
const char* gemv_int4_variant_name(int v);
void gemv_int4_variant(int v, float* y, const Int4View& W, const __half* x, cudaStream_t stream);

// out [rows][cols] (fp16, 16-byte aligned) = dequant(W): each element is the fp16 rounding of the exact
// (q - z) * scale, i.e. bit for bit float_to_half(dequantize_int4(...)). The prefill runs this into a scratch
// buffer before its FP16 GEMM. Plain launch (not programmatic).
void dequantize_int4_to_half(__half* out, const Int4View& W, cudaStream_t stream);

// Random int4 weights for benchmarks of large shapes without a checkpoint: codes uniform in 0..15 from a hash of
// (seed, index), zero points 7 or 8, scales amplitude / 7.5 * (0.75 .. 1.25): values within about +-amplitude.
void fill_random_int4(uint32_t* qweight, __half* scales, uint8_t* zeros, int rows, int cols, int group, uint64_t seed,
                      float amplitude, cudaStream_t stream);

}  // namespace quest
