#pragma once
// CPU reference implementations (fp32, straightforward loops) of the dense ops of a Llama layer. They are the
// oracle for the CUDA kernels and the arithmetic of the CPU backend. Row-major everywhere; a weight matrix W of a
// Hugging Face nn.Linear is [out_features][in_features], so y = W x.
#include <cstdint>

namespace quest {

// out[dim] = table[token][:]
void embedding_ref(float* out, const float* table, int token, int dim);

// out[n] = x / sqrt(mean(x^2) + eps) * w   (Hugging Face LlamaRMSNorm, in fp32)
void rms_norm_ref(float* out, const float* x, const float* w, int n, float eps);

// y[rows] = W[rows][cols] x[cols]
void matvec_ref(float* y, const float* W, const float* x, int rows, int cols);
// Y[t][rows] = W[rows][cols] X[t][cols] for t < tokens (prefill): each output bit for bit matvec_ref's. Splits rows
// over `threads` threads (0: all cores).
void matmul_ref(float* Y, const float* W, const float* X, int tokens, int rows, int cols, int threads = 0);

// out[n] = silu(gate) * up, silu(x) = x / (1 + exp(-x))
void swiglu_ref(float* out, const float* gate, const float* up, int n);

// Rotary embedding, Hugging Face rotate-half convention, in place on x[num_heads][head_dim]:
//   for i < head_dim/2, a = pos * inv_freq[i] (fp32), c = cos(a) * scaling, s = sin(a) * scaling:
//   x[i] <- x[i] c - x[i + head_dim/2] s;   x[i + head_dim/2] <- x[i + head_dim/2] c + x[i] s
void rope_ref(float* x, int num_heads, int head_dim, int pos, const float* inv_freq, float scaling);

// Adds b into a: a[n] += b[n] (the residual connection).
void add_inplace_ref(float* a, const float* b, int n);

}  // namespace quest
