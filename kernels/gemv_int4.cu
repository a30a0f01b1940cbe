#include <cstdint>

#include "kernels/gemv_int4.cuh"

namespace quest {

namespace {

// Streaming 16-byte load of weights: read once per step, so keep them out of L1.
__device__ __forceinline__ uint4 load_stream(const uint4* p) {
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
    return r;
}

__device__ __forceinline__ __half2 u32_as_half2(uint32_t u) {
    __half2 h;
    *reinterpret_cast<uint32_t*>(&h) = u;
    return h;
}

__device__ __forceinline__ uint32_t half2_as_u32(__half2 h) { return *reinterpret_cast<uint32_t*>(&h); }

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Zero-point constants of a group, both halves equal: (1024 + z) and -(64 + z) in fp16 (exact: the ulp of 1024 is
// 1, that of 64 is 1/16, so z lands in the mantissa as z and z << 4).
__device__ __forceinline__ __half2 zero_lo(uint32_t z) { return u32_as_half2((0x6400u | z) * 0x00010001u); }
__device__ __forceinline__ __half2 zero_hi(uint32_t z) { return u32_as_half2((0xD400u | (z << 4)) * 0x00010001u); }

// One code word (columns 0..7 in slots 0, 4, 1, 5, 2, 6, 3, 7, kernels/quant.h) to the fp16 pairs (q - z) of
// columns (0, 1), (2, 3), (4, 5), (6, 7). (word & 0x000F000F) | 0x64006400 is the pair 1024 + q (one LOP3);
// (word & 0x00F000F0) | 0x64006400 is 1024 + 16 q, scaled by 1/16 in the FMA that subtracts 64 + z. All exact.
__device__ __forceinline__ void word_to_pairs(uint32_t q, __half2 zlo, __half2 zhi, __half2 (&d)[4]) {
    const __half2 sixteenth = u32_as_half2(0x2C002C00u);  // 1/16
    const uint32_t lo0 = (q & 0x000F000Fu) | 0x64006400u;
    const uint32_t hi0 = (q & 0x00F000F0u) | 0x64006400u;
    q >>= 8;
    const uint32_t lo1 = (q & 0x000F000Fu) | 0x64006400u;
    const uint32_t hi1 = (q & 0x00F000F0u) | 0x64006400u;
    d[0] = __hsub2(u32_as_half2(lo0), zlo);
    d[1] = __hfma2(u32_as_half2(hi0), sixteenth, zhi);
    d[2] = __hsub2(u32_as_half2(lo1), zlo);
    d[3] = __hfma2(u32_as_half2(hi1), sixteenth, zhi);
}

// A "chunk" is 32 columns of a row: one 16-byte load of codes, inside one group (group >= 32). A block of W warps
// covers (W / KS) * R rows: a row's chunks are split over KS warps (column segments, reduced through shared memory)
// and each warp carries R rows, so one load of x serves R rows. Lane l of a warp reads chunks l, l+32, ... of its
// segment, U per row in one batch (codes, scale and zero point); the next batch is issued before the current one is
// consumed. The first batch is issued before pdl_wait(): weights never change, so they stream in while the previous
// kernel in the graph finishes. Chunks past the segment's end load zeros (scale 0, x 0) and add nothing.
template <int R, int U, int W, int KS>
__global__ void __launch_bounds__(W * 32)
    gemv_int4_kernel(float* __restrict__ y, const uint32_t* __restrict__ qw, const __half* __restrict__ sc,
                     const uint8_t* __restrict__ zp, const __half* __restrict__ x, int rows, int cols, int cpg_shift) {
    static_assert(W % KS == 0, "warps must split evenly into column segments");
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int seg = warp % KS;
    const int row0 = (blockIdx.x * (W / KS) + warp / KS) * R;
    const int chunks = cols >> 5;
    const int groups = chunks >> cpg_shift;
    const int seg_len = (chunks + KS - 1) / KS;
    const int c_begin = seg * seg_len, c_end = min(chunks, c_begin + seg_len);
    const uint4* w[R];
    const unsigned short* s[R];
    const uint8_t* z[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {  // rows past the end re-read the last row; their sums are dropped
        const int64_t row = min(row0 + r, rows - 1);
        w[r] = reinterpret_cast<const uint4*>(qw) + row * chunks;
        s[r] = reinterpret_cast<const unsigned short*>(sc) + row * groups;
        z[r] = zp + row * groups;
    }
    const uint4* xv = reinterpret_cast<const uint4*>(x);
    const uint4 zero4 = make_uint4(0, 0, 0, 0);

    uint4 cw[U][R], nw[U][R];
    uint32_t cs[U][R], ns[U][R], cz[U][R], nz[U][R];
    int c = c_begin + lane;
#pragma unroll
    for (int u = 0; u < U; ++u) {
        const int cu = c + u * 32;
        const bool in = cu < c_end;
#pragma unroll
        for (int r = 0; r < R; ++r) {
            cw[u][r] = in ? load_stream(w[r] + cu) : zero4;
            cs[u][r] = in ? __ldg(s[r] + (cu >> cpg_shift)) : 0u;
            cz[u][r] = in ? __ldg(z[r] + (cu >> cpg_shift)) : 0u;
        }
    }
    pdl_trigger();
    pdl_wait();

    float acc[R] = {};
    for (; c < c_end; c += U * 32) {
        const int cn = c + U * 32;
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int cu = cn + u * 32;
            const bool in = cu < c_end;
#pragma unroll
            for (int r = 0; r < R; ++r) {
                nw[u][r] = in ? load_stream(w[r] + cu) : zero4;
                ns[u][r] = in ? __ldg(s[r] + (cu >> cpg_shift)) : 0u;
                nz[u][r] = in ? __ldg(z[r] + (cu >> cpg_shift)) : 0u;
            }
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int cu = c + u * 32;
            uint4 xr[4];
#pragma unroll
            for (int j = 0; j < 4; ++j) xr[j] = cu < c_end ? __ldg(xv + cu * 4 + j) : zero4;
#pragma unroll
            for (int r = 0; r < R; ++r) {
                const __half2 zlo = zero_lo(cz[u][r]), zhi = zero_hi(cz[u][r]);
                __half2 a0 = __float2half2_rn(0.0f), a1 = a0;
                const uint32_t* words = &cw[u][r].x;
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    __half2 d[4];
                    word_to_pairs(words[j], zlo, zhi, d);
                    const __half2* xh = reinterpret_cast<const __half2*>(&xr[j]);
                    __half2& a = (j & 1) ? a1 : a0;
                    a = __hfma2(d[0], xh[0], a);
                    a = __hfma2(d[1], xh[1], a);
                    a = __hfma2(d[2], xh[2], a);
                    a = __hfma2(d[3], xh[3], a);
                }
                const float2 f0 = __half22float2(a0), f1 = __half22float2(a1);
                const float scale = __half2float(__ushort_as_half(static_cast<unsigned short>(cs[u][r])));
                acc[r] = fmaf(scale, (f0.x + f0.y) + (f1.x + f1.y), acc[r]);
            }
        }
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
            for (int r = 0; r < R; ++r) {
                cw[u][r] = nw[u][r];
                cs[u][r] = ns[u][r];
                cz[u][r] = nz[u][r];
            }
    }
    if constexpr (KS == 1) {
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const float sum = warp_sum(acc[r]);
            if (lane == 0 && row0 + r < rows) y[row0 + r] = sum;
        }
    } else {
        __shared__ float part[W][R];
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const float sum = warp_sum(acc[r]);
            if (lane == 0) part[warp][r] = sum;
        }
        __syncthreads();
        if (seg == 0 && lane < R) {
            float sum = 0.0f;
#pragma unroll
            for (int k = 0; k < KS; ++k) sum += part[warp + k][lane];
            if (row0 + lane < rows) y[row0 + lane] = sum;
        }
    }
}

struct Int4Variant {
    const char* name;
    void (*kernel)(float*, const uint32_t*, const __half*, const uint8_t*, const __half*, int, int, int);
    int rows_per_block;
    int threads;
};

#define QUEST_GEMV_INT4_VARIANT(R, U, W, KS) \
    Int4Variant{"R" #R " U" #U " W" #W " KS" #KS, gemv_int4_kernel<R, U, W, KS>, (W / KS) * R, W * 32}
// Candidates for quest_kernel_bench; variant 0 is the one gemv_int4() uses. R2 U4 W8 KS1 moves the same bytes per
// block and per load batch as the FP16 GEMV's measured default (R2 U4 W8 KS4, docs/measurements.md): 4096 columns
// are 128 chunks, one batch of 4 per lane. Not yet measured on the H200: the lead's benchmark picks the default.
const Int4Variant kVariants[] = {
    QUEST_GEMV_INT4_VARIANT(2, 4, 8, 1), QUEST_GEMV_INT4_VARIANT(1, 4, 8, 1), QUEST_GEMV_INT4_VARIANT(4, 2, 8, 1),
    QUEST_GEMV_INT4_VARIANT(2, 2, 8, 2), QUEST_GEMV_INT4_VARIANT(1, 4, 8, 4), QUEST_GEMV_INT4_VARIANT(2, 4, 4, 1),
    QUEST_GEMV_INT4_VARIANT(4, 4, 4, 1), QUEST_GEMV_INT4_VARIANT(1, 8, 8, 2),
};
#undef QUEST_GEMV_INT4_VARIANT

// log2(group / 32): chunks per group as a shift.
int chunk_shift(int group) {
    int s = 0;
    while ((32 << s) < group) ++s;
    return s;
}

void check_view(const Int4View& W, const char* who) {
    QUEST_REQUIRE(W.qweight && W.scales && W.zeros && W.rows > 0 && W.cols > 0, std::string(who) + ": bad arguments");
    QUEST_REQUIRE(W.group >= 32 && (W.group & (W.group - 1)) == 0 && W.cols % W.group == 0,
                  std::string(who) + ": the group must be a power of two >= 32 dividing cols");
    QUEST_REQUIRE(is_aligned(W.qweight, 16), std::string(who) + ": qweight must be 16-byte aligned");
}

void launch_variant(const Int4Variant& v, float* y, const Int4View& W, const __half* x, cudaStream_t stream) {
    launch_pdl(v.kernel, dim3(ceil_div(W.rows, v.rows_per_block)), dim3(v.threads), 0, stream, y, W.qweight,
               W.scales, W.zeros, x, W.rows, W.cols, chunk_shift(W.group));
}

__global__ void dequantize_int4_kernel(__half* __restrict__ out, const uint32_t* __restrict__ qw,
                                       const __half* __restrict__ sc, const uint8_t* __restrict__ zp, int rows,
                                       int cols, int cpg_shift) {
    const int chunks = cols >> 5, groups = chunks >> cpg_shift;
    const int64_t total = static_cast<int64_t>(rows) * chunks;
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int64_t row = i / chunks;
        const int c = static_cast<int>(i - row * chunks);
        const uint4 q = reinterpret_cast<const uint4*>(qw)[i];
        const int64_t gi = row * groups + (c >> cpg_shift);
        const uint32_t z = zp[gi];
        const __half2 s2 = __half2half2(sc[gi]);
        const __half2 zlo = zero_lo(z), zhi = zero_hi(z);
        uint4* o = reinterpret_cast<uint4*>(out + row * cols + static_cast<int64_t>(c) * 32);
        const uint32_t* words = &q.x;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            __half2 d[4];
            word_to_pairs(words[j], zlo, zhi, d);
            uint4 v;
            v.x = half2_as_u32(__hmul2(d[0], s2));  // one rounding of the exact (q - z) * s
            v.y = half2_as_u32(__hmul2(d[1], s2));
            v.z = half2_as_u32(__hmul2(d[2], s2));
            v.w = half2_as_u32(__hmul2(d[3], s2));
            o[j] = v;
        }
    }
}

__device__ __forceinline__ uint64_t hash64(uint64_t seed, uint64_t i) {
    uint64_t z = seed + (i + 1) * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

__global__ void fill_random_int4_kernel(uint32_t* qw, __half* sc, uint8_t* zp, int64_t words, int64_t groups,
                                        uint64_t seed, float amplitude) {
    const int64_t n = words > groups ? words : groups;
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        if (i < words) qw[i] = static_cast<uint32_t>(hash64(seed, i));
        if (i < groups) {
            const uint64_t h = hash64(seed ^ 0x5bd1e9955bd1e995ull, i);
            const float u = static_cast<float>(h >> 40) * 0x1.0p-24f;  // [0, 1)
            sc[i] = __float2half_rn(amplitude / 7.5f * (0.75f + 0.5f * u));
            zp[i] = static_cast<uint8_t>(7 + (h & 1));
        }
    }
}

int grid_for(int64_t n, int threads) {
    const int64_t blocks = (n + threads - 1) / threads;
    return static_cast<int>(blocks < 65536 ? (blocks ? blocks : 1) : 65536);
}

}  // namespace

void gemv_int4(float* y, const Int4View& W, const __half* x, cudaStream_t stream) {
    check_view(W, "gemv_int4");
    QUEST_REQUIRE(y && x && is_aligned(x, 16), "gemv_int4: y and a 16-byte aligned x are required");
    launch_variant(kVariants[0], y, W, x, stream);
}

int gemv_int4_variant_count() { return static_cast<int>(sizeof(kVariants) / sizeof(kVariants[0])); }
const char* gemv_int4_variant_name(int v) { return kVariants[v].name; }

void gemv_int4_variant(int v, float* y, const Int4View& W, const __half* x, cudaStream_t stream) {
    QUEST_REQUIRE(v >= 0 && v < gemv_int4_variant_count(), "gemv_int4_variant: no such variant");
    check_view(W, "gemv_int4_variant");
    QUEST_REQUIRE(y && x && is_aligned(x, 16), "gemv_int4_variant: y and a 16-byte aligned x are required");
    launch_variant(kVariants[v], y, W, x, stream);
}

void dequantize_int4_to_half(__half* out, const Int4View& W, cudaStream_t stream) {
    check_view(W, "dequantize_int4_to_half");
    QUEST_REQUIRE(out && is_aligned(out, 16), "dequantize_int4_to_half: a 16-byte aligned output is required");
    const int64_t chunks = static_cast<int64_t>(W.rows) * (W.cols / 32);
    dequantize_int4_kernel<<<grid_for(chunks, 256), 256, 0, stream>>>(out, W.qweight, W.scales, W.zeros, W.rows,
                                                                       W.cols, chunk_shift(W.group));
    CUDA_CHECK_LAUNCH();
}

void fill_random_int4(uint32_t* qweight, __half* scales, uint8_t* zeros, int rows, int cols, int group, uint64_t seed,
                      float amplitude, cudaStream_t stream) {
    QUEST_REQUIRE(qweight && scales && zeros && rows > 0 && cols > 0 && group >= 32 && cols % group == 0,
                  "fill_random_int4: bad arguments");
    const int64_t words = static_cast<int64_t>(rows) * (cols / 8), groups = static_cast<int64_t>(rows) * (cols / group);
    fill_random_int4_kernel<<<grid_for(words, 256), 256, 0, stream>>>(qweight, scales, zeros, words, groups, seed,
                                                                      amplitude);
    CUDA_CHECK_LAUNCH();
}

}  // namespace quest
