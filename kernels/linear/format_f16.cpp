// The FP16 format: W [rows][cols] fp16, row-major. Decode: kernels/linear/gemv.cuh; prefill: cuBLAS on W itself.
#include <string>

#include "kernels/common/elementwise.cuh"
#include "kernels/common/error.h"
#include "kernels/linear/gemv.cuh"
#include "kernels/linear/linear.h"

namespace quest {

namespace {

const __half* f16(const LinearWeight& W) { return reinterpret_cast<const __half*>(W.data); }
size_t align256(size_t n) { return (n + 255) / 256 * 256; }

size_t upload_f16(const LinearWeight& W, const HostLinear& h, int64_t first, int64_t stride, const UploadStaging& st) {
    QUEST_REQUIRE(h.storage.is_f16() && h.cols == W.cols && first + (h.rows - 1) * stride < W.rows,
                  "upload fp16: the host rows do not fit the matrix");
    const size_t n = h.float_bytes();
    QUEST_REQUIRE(n <= st.capacity, "upload fp16: the staging buffer is smaller than the tensor");
    // Staged on the conversion's stream: a plain cudaMemcpy from pageable memory may return before its DMA has
    // landed, and a non-blocking stream does not wait for the legacy stream.
    CUDA_CHECK(cudaMemcpyAsync(st.bytes, h.data(), n, cudaMemcpyHostToDevice, st.stream));
    CUDA_CHECK(cudaMemsetAsync(st.overflow, 0, sizeof(unsigned long long), st.stream));
    __half* dst = reinterpret_cast<__half*>(W.data) + first * W.cols;
    if (stride == 1)
        convert_to_half(dst, st.bytes, h.dtype, static_cast<size_t>(h.rows * h.cols), st.overflow, st.stream);
    else
        convert_to_half_rows(dst, static_cast<size_t>(stride * W.cols), st.bytes, h.dtype, static_cast<size_t>(h.rows),
                             static_cast<size_t>(h.cols), st.overflow, st.stream);
    unsigned long long clamped = 0;
    CUDA_CHECK(cudaMemcpyAsync(&clamped, st.overflow, sizeof clamped, cudaMemcpyDeviceToHost, st.stream));
    CUDA_CHECK(cudaStreamSynchronize(st.stream));
    return static_cast<size_t>(clamped);
}

std::vector<float> f16_to_f32(const HostLinear& h) {
    if (h.dtype == DType::F32 && !h.owned.empty()) return h.owned;
    std::vector<float> w(static_cast<size_t>(h.rows * h.cols));
    convert_to_f32(h.dtype, h.data(), w.data(), w.size());
    return w;
}

std::string fused_gap_f16(const LinearWeight& W, const __half* x) {
    if (gemv_fused_supported(f16(W), x, W.cols)) return "";
    return std::to_string(W.cols) + " columns, not a multiple of 8 (scalar GEMV)";
}

}  // namespace

extern const LinearFormatOps kF16Format = {
    .tag = LinearFormat::F16,
    .holds = [](int64_t, int64_t, const LinearStorage&) { return true; },
    .device_bytes = [](int64_t rows, int64_t cols, const LinearStorage&) {
        return align256(static_cast<size_t>(rows * cols) * 2);
    },
    .from_f32 = [](std::vector<float> w, int64_t rows, int64_t cols, const LinearStorage&) {
        return HostLinear::floats(std::move(w), rows, cols);
    },
    .to_f32 = f16_to_f32,
    .upload = upload_f16,
    .randomize = [](const LinearWeight& W, uint64_t seed, float amplitude, cudaStream_t s) {
        fill_random_half(reinterpret_cast<__half*>(W.data), static_cast<size_t>(W.rows) * W.cols, seed, amplitude,
                         0.0f, s);
    },
    .gemv = [](float* y, const LinearWeight& W, const __half* x, cudaStream_t s) {
        gemv(y, f16(W), x, W.rows, W.cols, s);
    },
    .fused_gap = fused_gap_f16,
    .gemv_scaled = [](float* y, const LinearWeight& W, const __half* xg, const NormScale& n, cudaStream_t s) {
        gemv_scaled(y, f16(W), xg, W.rows, W.cols, n, s);
    },
    .gemv_swiglu = [](__half* act, const LinearWeight& W, const __half* xg, const NormScale& n, cudaStream_t s) {
        gemv_swiglu(act, f16(W), xg, W.rows, W.cols, n, s);
    },
    .gemv_residual = [](const ResidualNorm& r, const LinearWeight& W, const __half* x, cudaStream_t s) {
        gemv_residual(r, f16(W), x, W.rows, W.cols, s);
    },
    .residual_partials = [](const LinearWeight& W) { return gemv_residual_partials(W.rows); },
    .gemm_scratch = [](int64_t, int64_t, const LinearStorage&) { return size_t{0}; },
    .gemm = [](cublasHandle_t cublas, float* Y, const LinearWeight& W, const __half* X, int T, __half*,
               cudaStream_t s) { gemm_cublas(cublas, Y, f16(W), X, T, W.rows, W.cols, s); },
};

}  // namespace quest
