#pragma once
// The weight-format seam on the device: one linear matrix (LinearWeight) and what its format does with it
// (LinearFormatOps), looked up by tag (linear_format). The CUDA backend calls these and never asks which format a
// matrix has; a format's file (kernels/linear/format_<name>.cpp) fills the table from its kernels.
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <string>
#include <vector>

#include "kernels/linear/format.h"
#include "kernels/linear/gemv_epilogue.h"

namespace quest {

// One matrix on the device, y = W x with W [rows = out_features][cols = in_features]: `device_bytes` bytes at `data`
// in its format's layout (carved from the weight arena).
struct LinearWeight {
    LinearStorage storage;
    int rows = 0, cols = 0;
    char* data = nullptr;
    explicit operator bool() const { return data != nullptr; }
};

// Device scratch for uploads: one tensor's raw bytes, and a counter of values clamped on conversion.
struct UploadStaging {
    char* bytes = nullptr;
    size_t capacity = 0;
    unsigned long long* overflow = nullptr;  // device counter
    cudaStream_t stream = nullptr;
};

struct LinearFormatOps {
    LinearFormat tag;
    // Storage: whether a rows x cols matrix can be held with `storage` (int4: the group divides cols), and its
    // device bytes (each part aligned to 256 bytes).
    bool (*holds)(int64_t rows, int64_t cols, const LinearStorage& storage);
    size_t (*device_bytes)(int64_t rows, int64_t cols, const LinearStorage& storage);
    // Host conversions through fp32: the format's host matrix from float values (int4: round-to-nearest with
    // storage.group, throws InputError when a value cannot be quantized), and its values as fp32.
    HostLinear (*from_f32)(std::vector<float> w, int64_t rows, int64_t cols, const LinearStorage& storage);
    std::vector<float> (*to_f32)(const HostLinear& h);
    // Writes h (h.storage == W.storage; h.cols == W.cols) into W's rows first, first + stride, ... (stride 2: every
    // second row, for gate|up interleaved row by row). Returns how many values were clamped to the FP16 range.
    // Synchronises the staging stream (the staging buffer is reused by the next call).
    size_t (*upload)(const LinearWeight& W, const HostLinear& h, int64_t first, int64_t stride,
                     const UploadStaging& staging);
    // Random weights within about +-amplitude (benchmarks without a checkpoint); stream-ordered.
    void (*randomize)(const LinearWeight& W, uint64_t seed, float amplitude, cudaStream_t stream);

    // Decode (batch 1, graph-safe: no allocation or synchronisation): y[rows] = W x, fp16 x, fp32 y.
    void (*gemv)(float* y, const LinearWeight& W, const __half* x, cudaStream_t stream);
    // The fused epilogues of kernels/linear/gemv_epilogue.h (their contracts: kernels/linear/gemv.cuh). `fused_gap`
    // says why W cannot run them with input x ("" when it can).
    std::string (*fused_gap)(const LinearWeight& W, const __half* x);
    void (*gemv_scaled)(float* y, const LinearWeight& W, const __half* xg, const NormScale& norm, cudaStream_t stream);
    void (*gemv_swiglu)(__half* act, const LinearWeight& W, const __half* xg, const NormScale& norm,
                        cudaStream_t stream);
    void (*gemv_residual)(const ResidualNorm& out, const LinearWeight& W, const __half* x, cudaStream_t stream);
    int (*residual_partials)(const LinearWeight& W);  // the ResidualNorm::partials a gemv_residual on W writes

    // Prefill: Y[T][rows] = X[T][cols] W^T (fp16 X, fp32 Y) through cuBLAS; formats other than FP16 first expand W
    // into `scratch` (gemm_scratch fp16 elements for a rows x cols matrix; stream-ordered: the previous GEMM is done
    // with it).
    size_t (*gemm_scratch)(int64_t rows, int64_t cols, const LinearStorage& storage);
    void (*gemm)(cublasHandle_t cublas, float* Y, const LinearWeight& W, const __half* X, int T, __half* scratch,
                 cudaStream_t stream);
};

// The registered formats (kernels/linear/linear.cpp): one entry per LinearFormat.
const LinearFormatOps& linear_format(LinearFormat f);
inline const LinearFormatOps& ops_of(const LinearWeight& W) { return linear_format(W.storage.format); }

// h converted to `to` (through fp32 unless it already has that storage).
HostLinear convert_host_linear(HostLinear h, const LinearStorage& to);

}  // namespace quest
