#pragma once
// Arguments of the fused epilogues of the batch-1 decode GEMVs (kernels/linear/gemv.cuh, kernels/linear/gemv_int4.cuh): the
// decode step's RMSNorms, residual adds and SwiGLU folded into the GEMVs around them, so that no small kernel runs
// between two GEMVs. Plain C++ (host code builds them; nvcc passes them to the kernels by value).
//
// The RMSNorm y = W (fp16(g * x * inv)) with inv = rsqrt(mean(x^2) + eps) is split in two:
//   - the GEMV that PRODUCES x (o and down projections, "residual" epilogue) adds its rows into the fp32 residual
//     stream, writes the un-normalised fp16 input of the next GEMV, xg = fp16(x * g) (g: the NEXT norm's weight),
//     and one partial sum of squares per block (the sum of x^2 over the block's rows): no atomics, no fence, no
//     last-block tail;
//   - the GEMV that CONSUMES it (qkv, gate+up, lm_head, "scaled" / "swiglu" epilogues) adds the producer's partials
//     in every block (loaded right after its dependent-launch wait, while its first weights are in flight; summed
//     in a fixed order, so every block and every run gets the same ss) and multiplies its fp32 row sums by
//     inv = rsqrtf(ss / n + eps) (int4: normalises its input instead, see gemv_int4.cu).
// Numerics against rms_norm + gemv: fp16(g x) instead of fp16(g (x inv)) in the input (one fp16 rounding either way,
// at a different point) and the inv factor applied to the fp32 sums; xg is not normalised, so its fp16 range is the
// residual stream's times g (|x g| < 65504), and the int4 kernels' fp16 partial sums see x g instead of x g inv.
#include <cuda_fp16.h>

namespace quest {

// Input of a "scaled" / "swiglu" GEMV: inv = rsqrtf(ss / n + eps) with ss = the sum of partials[0 .. count), read on
// the device after the GEMV's programmatic-dependent-launch wait (written by the previous residual epilogue, one
// per block of that launch, or by embedding_norm_prep, count 1).
struct NormScale {
    const float* partials = nullptr;  // device: [count] partial sums of x^2 over the residual stream's n elements
    int count = 0;                    // how many: the producer's gemv_residual_partials / gemv_int4_residual_partials
    int n = 0;                        // hidden size
    float eps = 0.0f;
};

// Output of a "residual" GEMV with rows = n outputs y (never stored): for every row r
//   x[r] += y[r];  xg[r] = fp16(x[r] * g[r]);  and partials[b] = sum of the updated x[r]^2 over block b's rows.
// partials: one float per block of the launch (gemv_residual_partials / gemv_int4_residual_partials say how many:
// the NormScale::count of the consumer). A consumer reads them after its dependent-launch wait; the next producer
// writes them only after its own wait, when every earlier kernel (the consumer included) has completed.
struct ResidualNorm {
    float* x = nullptr;         // [n] fp32 residual stream, updated in place
    __half* xg = nullptr;       // [n] fp16(x * g), the next GEMV's input (16-byte aligned)
    const float* g = nullptr;   // [n] the next RMSNorm's weight
    float* partials = nullptr;  // [partials_capacity] per-block sums of x^2 (the next NormScale's input)
    int partials_capacity = 0;
};

}  // namespace quest
