// The int4 format: quest-int4 v1 (kernels/linear/quant.h), the codes of each row permuted into the device layout
// (kernels/linear/int4_layout.h) at upload. Decode: the fused dequantize + GEMV of kernels/linear/gemv_int4.cuh;
// prefill: W dequantized to FP16 into the scratch, then cuBLAS.
#include "kernels/linear/format_int4.h"

#include <string>

#include "kernels/common/error.h"
#include "kernels/linear/gemv.cuh"

namespace quest {

namespace {

size_t align256(size_t n) { return (n + 255) / 256 * 256; }
size_t code_bytes(int64_t rows, int64_t cols) { return align256(static_cast<size_t>(rows * cols) / 2); }
size_t scale_count(int64_t rows, int64_t cols, int group) { return static_cast<size_t>(rows * (cols / group)); }

size_t upload_int4(const LinearWeight& W, const HostLinear& h, int64_t first, int64_t stride, const UploadStaging&) {
    QUEST_REQUIRE(h.storage == W.storage && h.cols == W.cols && first + (h.rows - 1) * stride < W.rows,
                  "upload int4: the host rows do not fit the matrix");
    const Int4View v = int4_view(W);
    const int rows = static_cast<int>(h.rows), cols = static_cast<int>(h.cols), group = W.storage.group;
    std::vector<uint32_t> codes = h.int4.qweight;
    int4_to_device_layout(codes, rows, cols, group);
    // Rows of row_bytes bytes from the host to device rows first, first + stride, ... of dst.
    auto copy_rows = [&](const void* dst, const void* src, size_t row_bytes) {
        CUDA_CHECK(cudaMemcpy2D(static_cast<char*>(const_cast<void*>(dst)) + first * row_bytes, stride * row_bytes,
                                src, row_bytes, row_bytes, static_cast<size_t>(rows), cudaMemcpyHostToDevice));
    };
    const size_t groups = static_cast<size_t>(cols / group);
    copy_rows(v.qweight, codes.data(), static_cast<size_t>(cols / 8) * 4);
    copy_rows(v.scales, h.int4.scales.data(), groups * 2);
    copy_rows(v.zeros, h.int4.zeros.data(), groups);
    return 0;
}

std::string fused_gap_int4(const LinearWeight& W, const __half*) {
    if (gemv_int4_fused_supported(int4_view(W))) return "";
    return std::to_string(W.cols) + " columns, too wide for the fused GEMV";
}

}  // namespace

Int4View int4_view(const LinearWeight& W) {
    Int4View v;
    const int64_t rows = W.rows, cols = W.cols;
    const int group = W.storage.group;
    v.qweight = reinterpret_cast<const uint32_t*>(W.data);
    v.scales = reinterpret_cast<const __half*>(W.data + code_bytes(rows, cols));
    v.zeros = reinterpret_cast<const uint8_t*>(W.data + code_bytes(rows, cols) +
                                               align256(scale_count(rows, cols, group) * 2));
    v.rows = W.rows;
    v.cols = W.cols;
    v.group = group;
    return v;
}

extern const LinearFormatOps kInt4Format = {
    .tag = LinearFormat::Int4,
    .holds = [](int64_t, int64_t cols, const LinearStorage& s) {
        return int4_quantizable(static_cast<int>(cols), s.group);
    },
    .device_bytes = [](int64_t rows, int64_t cols, const LinearStorage& s) {
        const size_t groups = scale_count(rows, cols, s.group);
        return code_bytes(rows, cols) + align256(groups * 2) + align256(groups);
    },
    .from_f32 = [](std::vector<float> w, int64_t rows, int64_t cols, const LinearStorage& s) {
        return HostLinear::quantized(quantize_int4(w.data(), static_cast<int>(rows), static_cast<int>(cols), s.group));
    },
    .to_f32 = [](const HostLinear& h) { return dequantize_int4(h.int4); },
    .upload = upload_int4,
    .randomize = [](const LinearWeight& W, uint64_t seed, float amplitude, cudaStream_t s) {
        const Int4View v = int4_view(W);
        fill_random_int4(const_cast<uint32_t*>(v.qweight), const_cast<__half*>(v.scales),
                         const_cast<uint8_t*>(v.zeros), v.rows, v.cols, v.group, seed, amplitude, s);
    },
    .gemv = [](float* y, const LinearWeight& W, const __half* x, cudaStream_t s) { gemv_int4(y, int4_view(W), x, s); },
    .fused_gap = fused_gap_int4,
    .gemv_scaled = [](float* y, const LinearWeight& W, const __half* xg, const NormScale& n, cudaStream_t s) {
        gemv_int4_scaled(y, int4_view(W), xg, n, s);
    },
    .gemv_swiglu = [](__half* act, const LinearWeight& W, const __half* xg, const NormScale& n, cudaStream_t s) {
        gemv_int4_swiglu(act, int4_view(W), xg, n, s);
    },
    .gemv_residual = [](const ResidualNorm& r, const LinearWeight& W, const __half* x, cudaStream_t s) {
        gemv_int4_residual(r, int4_view(W), x, s);
    },
    .residual_partials = [](const LinearWeight& W) { return gemv_int4_residual_partials(int4_view(W)); },
    .gemm_scratch = [](int64_t rows, int64_t cols, const LinearStorage&) { return static_cast<size_t>(rows * cols); },
    .gemm = [](cublasHandle_t cublas, float* Y, const LinearWeight& W, const __half* X, int T, __half* scratch,
               cudaStream_t s) {
        dequantize_int4_to_half(scratch, int4_view(W), s);
        gemm_cublas(cublas, Y, scratch, X, T, W.rows, W.cols, s);
    },
};

}  // namespace quest
