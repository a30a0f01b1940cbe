#pragma once
// Arguments of the fused epilogues of the batch-1 decode GEMVs (kernels/gemv.cuh, kernels/gemv_int4.cuh): the
// decode step's RMSNorms, residual adds and SwiGLU folded into the GEMVs around them, so that no small kernel runs
// between two GEMVs. Plain C++ (host code builds them; nvcc passes them to the kernels by value).
//
// The RMSNorm y = W (fp16(g * x * inv)) with inv = rsqrt(mean(x^2) + eps) is split in two:
//   - the GEMV that PRODUCES x (o and down projections, "residual" epilogue) adds its rows into the fp32 residual
//     stream, writes the un-normalised fp16 input of the next GEMV, xg = fp16(x * g) (g: the NEXT norm's weight),
//     and the sum of squares ss = sum x^2 over all rows (deterministic: per-block partial sums, then the last block
//     to finish adds them in block order);
//   - the GEMV that CONSUMES it (qkv, gate+up, lm_head, "scaled" / "swiglu" epilogues) multiplies its fp32 row sums
//     by inv = rsqrtf(ss / n + eps).
// Numerics against rms_norm + gemv: fp16(g x) instead of fp16(g (x inv)) in the input (one fp16 rounding either way,
// at a different point) and the inv factor applied to the fp32 sums; xg is not normalised, so its fp16 range is the
// residual stream's times g (|x g| < 65504), and the int4 kernels' fp16 partial sums see x g instead of x g inv.
#include <cuda_fp16.h>

namespace quest {

// Input of a "scaled" / "swiglu" GEMV: inv = rsqrtf(*ss / n + eps). ss is read on the device after the GEMV's
// programmatic-dependent-launch wait (written by the previous residual epilogue or by embedding_norm_prep).
struct NormScale {
    const float* ss = nullptr;  // device: sum of x^2 over the n elements of the residual stream
    int n = 0;                  // hidden size
    float eps = 0.0f;
};

// Output of a "residual" GEMV with rows = n outputs y (never stored): for every row r
//   x[r] += y[r];  xg[r] = fp16(x[r] * g[r]);  and *ss = sum over r of x[r]^2 (the updated x).
// partials: one float per block of the launch (gemv_residual_partials / gemv_int4_residual_partials say how many);
// counter: one unsigned, zero before the launch and left zero after it (graph replay). Launches sharing partials and
// counter must be stream-ordered (they are: each runs after the previous one has completed).
struct ResidualNorm {
    float* x = nullptr;         // [n] fp32 residual stream, updated in place
    __half* xg = nullptr;       // [n] fp16(x * g), the next GEMV's input (16-byte aligned)
    const float* g = nullptr;   // [n] the next RMSNorm's weight
    float* ss = nullptr;        // [1] sum of the updated x^2
    float* partials = nullptr;  // [partials_capacity] per-block sums (scratch)
    int partials_capacity = 0;
    unsigned* counter = nullptr;  // [1] blocks finished; zero between launches
};

}  // namespace quest
