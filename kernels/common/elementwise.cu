#include <cstdint>
#include <limits>

#include "kernels/common/elementwise.cuh"

#include "kernels/common/device_utils.cuh"

namespace quest {

namespace {


// Row tokens[t] - first of the table when it is one of its `rows`, else `outside` (NaN: a bad id; 0: another
// rank's row).
__global__ void embedding_kernel(float* out, const __half* table, const int* tokens, int dim, int first, int rows,
                                 float outside) {
    pdl_wait();
    pdl_trigger();  // dependents may be scheduled now (they pdl_wait for this grid to complete)
    const int t = blockIdx.x;
    const int token = tokens[t] - first;
    float* o = out + static_cast<int64_t>(t) * dim;
    if (token < 0 || token >= rows) {
        for (int i = threadIdx.x; i < dim; i += blockDim.x) o[i] = outside;
        return;
    }
    const __half* row = table + static_cast<int64_t>(token) * dim;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) o[i] = __half2float(row[i]);
}

// One block: the decode step's token (T = 1). ss in a fixed order (block_sum_fixed).
__global__ void embedding_norm_prep_kernel(float* x, __half* xg, float* ss, const __half* table, const int* tokens,
                                           const float* g, int dim, int vocab) {
    pdl_wait();
    pdl_trigger();  // dependents may be scheduled now (they pdl_wait for this grid to complete)
    const int token = tokens[0];
    const bool bad = token < 0 || token >= vocab;
    const __half* row = table + static_cast<int64_t>(bad ? 0 : token) * dim;
    float sq = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        const float v = bad ? __int_as_float(0x7fffffff) : __half2float(row[i]);
        x[i] = v;
        xg[i] = __float2half_rn(v * g[i]);
        sq += v * v;
    }
    const float total = block_sum_fixed(sq);
    if (threadIdx.x == 0) *ss = total;
}

__global__ void rms_norm_kernel(__half* out, float* x, const float* residual, const float* w, int n, float eps) {
    pdl_wait();
    pdl_trigger();  // dependents may be scheduled now (they pdl_wait for this grid to complete)
    const int64_t row = blockIdx.x;
    float* xr = x + row * n;
    const float* rr = residual ? residual + row * n : nullptr;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float v = xr[i];
        if (rr) {
            v += rr[i];
            xr[i] = v;
        }
        ss += v * v;
    }
    const float inv = rsqrtf(block_sum_fixed(ss) / static_cast<float>(n) + eps);
    __half* o = out + row * n;
    for (int i = threadIdx.x; i < n; i += blockDim.x) o[i] = __float2half_rn(w[i] * (xr[i] * inv));
}

__global__ void swiglu_kernel(__half* out, const float* gu, int F) {
    pdl_wait();
    pdl_trigger();  // dependents may be scheduled now (they pdl_wait for this grid to complete)
    const int64_t t = blockIdx.y;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= F) return;
    const float g = gu[t * 2 * F + i];
    const float u = gu[t * 2 * F + F + i];
    out[t * F + i] = __float2half_rn(g / (1.0f + expf(-g)) * u);
}

__global__ void swiglu_interleaved_kernel(__half* out, const float* gu, int F) {
    pdl_wait();
    const int64_t t = blockIdx.y;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= F) return;
    const float2 v = reinterpret_cast<const float2*>(gu + t * 2 * F)[i];  // (gate_i, up_i)
    out[t * F + i] = __float2half_rn(epi_silu_mul(v.x, v.y));
}

__global__ void add_kernel(float* x, const float* y, int n) {
    pdl_wait();
    pdl_trigger();  // dependents may be scheduled now (they pdl_wait for this grid to complete)
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += y[i];
}

__global__ void advance_kernel(int* pos, int n) {
    pdl_wait();
    pdl_trigger();  // dependents may be scheduled now (they pdl_wait for this grid to complete)
    *pos += n;
}

__device__ __forceinline__ float load_as_float(const void* src, DType t, size_t i) {
    switch (t) {
        case DType::F32: return static_cast<const float*>(src)[i];
        case DType::F16: return __half2float(static_cast<const __half*>(src)[i]);
        default: {  // BF16: the top 16 bits of an fp32
            const uint16_t b = static_cast<const uint16_t*>(src)[i];
            return __uint_as_float(static_cast<uint32_t>(b) << 16);
        }
    }
}

// Element i of src (row i / cols, column i % cols) goes to dst[(i / cols) * pitch + i % cols].
__global__ void convert_kernel(__half* dst, const void* src, DType t, size_t n, size_t cols, size_t pitch,
                               unsigned long long* overflow) {
    unsigned long long local = 0;
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
        float v = load_as_float(src, t, i);
        if (isnan(v)) {
            ++local;
        } else if (fabsf(v) > 65504.0f) {
            ++local;
            v = copysignf(65504.0f, v);
        }
        dst[pitch == cols ? i : (i / cols) * pitch + i % cols] = __float2half_rn(v);
    }
    if (local) atomicAdd(overflow, local);
}

__global__ void half_to_float_kernel(float* dst, const __half* src, size_t n) {
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
        dst[i] = __half2float(src[i]);
}

// SplitMix64 of (seed, index): counter-based, so any element can be generated independently.
__device__ __forceinline__ float hash_uniform(uint64_t seed, uint64_t i) {
    uint64_t z = seed + (i + 1) * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return static_cast<float>(static_cast<double>(z >> 11) * 0x1.0p-53 * 2.0 - 1.0);
}

__global__ void fill_random_half_kernel(__half* dst, size_t n, uint64_t seed, float scale, float offset) {
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
        dst[i] = __float2half_rn(offset + scale * hash_uniform(seed, i));
}

__global__ void fill_random_float_kernel(float* dst, size_t n, uint64_t seed, float scale, float offset) {
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
        dst[i] = offset + scale * hash_uniform(seed, i);
}

int grid_for(size_t n, int threads) {
    const size_t blocks = (n + threads - 1) / threads;
    return static_cast<int>(blocks < 65536 ? (blocks ? blocks : 1) : 65536);
}

}  // namespace

void embedding(float* out, const __half* table, const int* tokens, int T, int dim, int vocab, cudaStream_t stream) {
    QUEST_REQUIRE(out && table && tokens && T > 0 && dim > 0, "embedding: bad arguments");
    launch_pdl(embedding_kernel, dim3(T), dim3(256), 0, stream, out, table, tokens, dim, 0, vocab,
               std::numeric_limits<float>::quiet_NaN());
}

void embedding_rows(float* out, const __half* table, const int* tokens, int T, int dim, int first, int rows,
                    cudaStream_t stream) {
    QUEST_REQUIRE(out && table && tokens && T > 0 && dim > 0 && first >= 0 && rows > 0, "embedding_rows: bad arguments");
    launch_pdl(embedding_kernel, dim3(T), dim3(256), 0, stream, out, table, tokens, dim, first, rows, 0.0f);
}

void rms_norm(__half* out, float* x, const float* residual, const float* w, int rows, int n, float eps,
              cudaStream_t stream) {
    QUEST_REQUIRE(out && x && w && rows > 0 && n > 0, "rms_norm: bad arguments");
    const int threads = n >= 1024 ? 1024 : ((n + 31) / 32) * 32;
    launch_pdl(rms_norm_kernel, dim3(rows), dim3(threads), 0, stream, out, x, residual, w, n, eps);
}

void swiglu(__half* out, const float* gu, int T, int F, cudaStream_t stream) {
    QUEST_REQUIRE(out && gu && T > 0 && F > 0, "swiglu: bad arguments");
    launch_pdl(swiglu_kernel, dim3(ceil_div(F, 256), T), dim3(256), 0, stream, out, gu, F);
}

void swiglu_interleaved(__half* out, const float* gu, int T, int F, cudaStream_t stream) {
    QUEST_REQUIRE(out && gu && T > 0 && F > 0 && is_aligned(gu, 8), "swiglu_interleaved: bad arguments");
    launch_pdl(swiglu_interleaved_kernel, dim3(ceil_div(F, 256), T), dim3(256), 0, stream, out, gu, F);
}

void embedding_norm_prep(float* x, __half* xg, float* ss, const __half* table, const int* token, const float* g,
                         int dim, int vocab, cudaStream_t stream) {
    QUEST_REQUIRE(x && xg && ss && table && token && g && dim > 0 && vocab > 0, "embedding_norm_prep: bad arguments");
    const int threads = dim >= 1024 ? 1024 : ((dim + 31) / 32) * 32;
    launch_pdl(embedding_norm_prep_kernel, dim3(1), dim3(threads), 0, stream, x, xg, ss, table, token, g, dim, vocab);
}

void add_inplace(float* x, const float* y, int n, cudaStream_t stream) {
    launch_pdl(add_kernel, dim3(ceil_div(n, 256)), dim3(256), 0, stream, x, y, n);
}

void advance_position(int* pos, int n, cudaStream_t stream) {
    launch_pdl(advance_kernel, dim3(1), dim3(1), 0, stream, pos, n);
}

void convert_to_half(__half* dst, const void* src, DType src_type, size_t n, unsigned long long* overflow,
                     cudaStream_t stream) {
    QUEST_REQUIRE(src_type == DType::F32 || src_type == DType::F16 || src_type == DType::BF16,
                  "convert_to_half: source must be F32, F16 or BF16");
    convert_kernel<<<grid_for(n, 256), 256, 0, stream>>>(dst, src, src_type, n, n, n, overflow);
    CUDA_CHECK_LAUNCH();
}

void convert_to_half_rows(__half* dst, size_t dst_pitch, const void* src, DType src_type, size_t rows, size_t cols,
                          unsigned long long* overflow, cudaStream_t stream) {
    QUEST_REQUIRE(src_type == DType::F32 || src_type == DType::F16 || src_type == DType::BF16,
                  "convert_to_half_rows: source must be F32, F16 or BF16");
    QUEST_REQUIRE(dst && src && overflow && rows > 0 && cols > 0 && dst_pitch >= cols,
                  "convert_to_half_rows: bad arguments");
    const size_t n = rows * cols;
    convert_kernel<<<grid_for(n, 256), 256, 0, stream>>>(dst, src, src_type, n, cols, dst_pitch, overflow);
    CUDA_CHECK_LAUNCH();
}

void half_to_float_device(float* dst, const __half* src, size_t n, cudaStream_t stream) {
    half_to_float_kernel<<<grid_for(n, 256), 256, 0, stream>>>(dst, src, n);
    CUDA_CHECK_LAUNCH();
}

void fill_random_half(__half* dst, size_t n, uint64_t seed, float scale, float offset, cudaStream_t stream) {
    fill_random_half_kernel<<<grid_for(n, 256), 256, 0, stream>>>(dst, n, seed, scale, offset);
    CUDA_CHECK_LAUNCH();
}

void fill_random_float(float* dst, size_t n, uint64_t seed, float scale, float offset, cudaStream_t stream) {
    fill_random_float_kernel<<<grid_for(n, 256), 256, 0, stream>>>(dst, n, seed, scale, offset);
    CUDA_CHECK_LAUNCH();
}

}  // namespace quest
