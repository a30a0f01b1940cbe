#include "kernels/common/bias.cuh"

#include <algorithm>

namespace quest {

namespace {

__global__ void add_bias_rows_kernel(float* y, const float* b, int64_t total, int n) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x)
        y[i] += b[i % n];
}

}  // namespace

void add_bias_rows(float* y, const float* b, int rows, int n, cudaStream_t stream) {
    QUEST_REQUIRE(y && b && rows >= 0 && n > 0, "add_bias_rows: null pointer or bad shape");
    const int64_t total = int64_t(rows) * n;
    if (total == 0) return;
    const int threads = 256;
    const int blocks = static_cast<int>(std::min<int64_t>((total + threads - 1) / threads, 4096));
    add_bias_rows_kernel<<<blocks, threads, 0, stream>>>(y, b, total, n);
    CUDA_CHECK_LAUNCH();
}

}  // namespace quest
