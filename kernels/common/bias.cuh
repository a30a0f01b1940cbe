#pragma once
// Bias add after a linear layer (Qwen2's q/k/v projections): y[t][i] += b[i] for t < rows, i < n, fp32. CPU
// reference: add_inplace_ref per row (kernels/common/basic_ops.h). A plain launch (no programmatic dependent launch):
// it runs after the GEMV before it has completed and before the kernel after it starts reading y.
#include "kernels/common/cuda_common.cuh"

namespace quest {

void add_bias_rows(float* y, const float* b, int rows, int n, cudaStream_t stream);

}  // namespace quest
