#pragma once
// The int4 GEMV's per-chunk arithmetic (device functions, nvcc only): the fp16 dot (chunk_dot, word_to_pairs) and
// the integer dot (chunk_dot_i16, x in block floating point by x_to_i16) of kernels/linear/gemv_int4.cu, whose
// numerics kernels/linear/gemv_int4.cuh states. In a header so that a kernel outside gemv_int4.cu that must give the
// same row sums (the persistent layer prototype of quest_kernel_bench, tests/cuda/dev/persist_layer.cu) runs the same
// source, not a copy.
#include <cstdint>

#include <cuda_fp16.h>

#include "kernels/common/host_device.h"

namespace quest::int4_dot {

__device__ __forceinline__ __half2 u32_as_half2(uint32_t u) {
    __half2 h;
    *reinterpret_cast<uint32_t*>(&h) = u;
    return h;
}

__device__ __forceinline__ uint32_t half2_as_u32(__half2 h) { return *reinterpret_cast<uint32_t*>(&h); }

// Zero-point constants of a group, both halves equal: (1024 + z) and -(64 + z) in fp16 (exact: the ulp of 1024 is
// 1, that of 64 is 1/16, so z lands in the mantissa as z and z << 4). z <= 15: no carries, one IMAD each.
__device__ __forceinline__ __half2 zero_lo(uint32_t z) { return u32_as_half2(z * 0x00010001u + 0x64006400u); }
__device__ __forceinline__ __half2 zero_hi(uint32_t z) { return u32_as_half2(z * 0x00100010u + 0xD400D400u); }

// (a & MASK) | BITS in one LOP3. Written in C++, the two immediates make ptxas emit an AND and an OR (a LOP3 takes
// one immediate); the PTX lop3 lets it keep one constant in a register, hoisted out of the loops.
template <uint32_t MASK, uint32_t BITS>
__device__ __forceinline__ uint32_t and_or(uint32_t a) {
    uint32_t r;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(r) : "r"(a), "n"(MASK), "n"(BITS));  // 0xEA: (a & b) | c
    return r;
}

// One code word (columns 0..7 in slots 0, 4, 1, 5, 2, 6, 3, 7, kernels/linear/quant.h) to the fp16 pairs (q - z) of
// columns (0, 1), (2, 3), (4, 5), (6, 7). (word & 0x000F000F) | 0x64006400 is the pair 1024 + q (one LOP3);
// (word & 0x00F000F0) | 0x64006400 is 1024 + 16 q, scaled by 1/16 in the FMA that subtracts 64 + z. All exact.
__device__ __forceinline__ void word_to_pairs(uint32_t q, __half2 zlo, __half2 zhi, __half2 (&d)[4]) {
    const __half2 sixteenth = u32_as_half2(0x2C002C00u);  // 1/16
    const uint32_t lo0 = and_or<0x000F000Fu, 0x64006400u>(q);
    const uint32_t hi0 = and_or<0x00F000F0u, 0x64006400u>(q);
    q >>= 8;
    const uint32_t lo1 = and_or<0x000F000Fu, 0x64006400u>(q);
    const uint32_t hi1 = and_or<0x00F000F0u, 0x64006400u>(q);
    d[0] = __hsub2(u32_as_half2(lo0), zlo);
    d[1] = __hfma2(u32_as_half2(hi0), sixteenth, zhi);
    d[2] = __hsub2(u32_as_half2(lo1), zlo);
    d[3] = __hfma2(u32_as_half2(hi1), sixteenth, zhi);
}

// acc + scale * sum over the 32 columns of one chunk of (q - z) * x: the arithmetic of kernels/linear/gemv_int4.cuh. q is the
// chunk's 16-byte code load, scale_bits the group's fp16 scale (low 16 bits), z its zero point, xr the chunk's 32
// x values (4 x 8 halves). Two fp16x2 accumulators take the even and odd words: 8 products per lane half each.
__device__ __forceinline__ float chunk_dot(uint4 q, uint32_t scale_bits, uint32_t z, const uint4 (&xr)[4], float acc) {
    const __half2 zlo = zero_lo(z), zhi = zero_hi(z);
    __half2 a0 = __float2half2_rn(0.0f), a1 = a0;
    const uint32_t* words = &q.x;
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
    const float scale = __half2float(__ushort_as_half(static_cast<unsigned short>(scale_bits)));
    return fmaf(scale, (f0.x + f0.y) + (f1.x + f1.y), acc);
}

// The integer form of chunk_dot (the "i16" stream kernels). x is held per chunk (32 columns) in block
// floating point: xi = rint(x 2^k) with one power of two per chunk, k = 29 - E where E is the fp16 exponent field of
// the chunk's largest |x| (so |xi| < 2^15), and sx = 2^-k. An fp16 value's 11-bit significand then lands exactly in
// xi when its exponent is within 4 of the chunk's largest (|x| >= max / 16, roughly); smaller ones are rounded to
// 2^-k, i.e. at most 2^-16 of the chunk's largest |x|. xi is split into two byte planes, xi = 256 hi + lo (hi
// signed, lo unsigned: bytes 1 and 0 of the int32), packed in the code word's column order: piece j of the chunk
// (columns 8j .. 8j + 7) is {hi of columns 0 4 1 5, hi of 2 6 3 7, lo of 0 4 1 5, lo of 2 6 3 7} (byte b of
// word & 0x0F0F0F0F is the code of column 0, 4, 1, 5 for b = 0..3, of (word >> 4) & 0x0F0F0F0F of 2, 6, 3, 7: the
// slot order of word_to_pairs). Four dp4a per code word give the exact integer sums of q hi and q lo, and
// sum (q - z) xi = 256 sum(q hi) + sum(q lo) - z sum(xi) (xsum: sum(xi) over the chunk) is exact in int32
// (|.| < 15 * 2^15 * 32 = 2^23.9). The only roundings: x to xi (above) and the fp32 product scale * sx * t. A code
// word costs 3 logic ops + 4 dp4a instead of word_to_pairs' 9 + 4 HFMA2.
__device__ __forceinline__ int dp4a_us(uint32_t a, uint32_t b, int c) {  // unsigned bytes of a times signed of b
    int d;
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}
__device__ __forceinline__ uint32_t dp4a_uu(uint32_t a, uint32_t b, uint32_t c) {
    uint32_t d;
    asm("dp4a.u32.u32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

// acc + scale * sx * sum over the chunk of (q - z) xi; xc = {sx (times the fused norm's factor), sum(xi) as bits}.
__device__ __forceinline__ float chunk_dot_i16(uint4 q, uint32_t scale_bits, uint32_t z, const uint4 (&xr)[4],
                                               float2 xc, float acc) {
    int hs = 0;       // sum of q * hi
    uint32_t ls = 0;  // sum of q * lo
    const uint32_t* words = &q.x;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const uint32_t c0 = words[j] & 0x0F0F0F0Fu, c1 = (words[j] >> 4) & 0x0F0F0F0Fu;
        hs = dp4a_us(c0, xr[j].x, hs);
        hs = dp4a_us(c1, xr[j].y, hs);
        ls = dp4a_uu(c0, xr[j].z, ls);
        ls = dp4a_uu(c1, xr[j].w, ls);
    }
    const int t = hs * 256 + static_cast<int>(ls) - static_cast<int>(z) * __float_as_int(xc.y);
    const float scale = __half2float(__ushort_as_half(static_cast<unsigned short>(scale_bits)));
    return fmaf(scale * xc.x, static_cast<float>(t), acc);
}

// x (fp16, cols) into the form of chunk_dot_i16 in shared memory: xs[j * chunks + c] = piece j of chunk c (the fp16
// layout of the stream kernel, same size), xc[c] = {sx * factor, sum(xi) as int bits}. Thread i of the block takes
// 16-byte piece i & 3 of chunk i >> 2 (four neighbouring lanes: one chunk; max and sum by two shuffles each). A NaN
// or infinite x makes the chunk's sx NaN, so it reaches the output as in the fp16 kernels.
//
// In two parts, so that the loads of a thread's first kXPre pieces (x_i16_preload: pieces tid + k THREADS, all of x
// at 4096 columns and 256 threads) are in flight while the caller waits for something else (the fused norm's partial
// sums, whose factor only scales xc): one dependent round trip to L2 instead of two. x_to_i16 converts them and
// loads and converts any further pieces.
constexpr int kXPre = 2;
template <int THREADS>
__device__ __forceinline__ void x_i16_preload(const __half* __restrict__ x, int chunks, uint4 (&pre)[kXPre]) {
    const uint4* xv = reinterpret_cast<const uint4*>(x);
#pragma unroll
    for (int k = 0; k < kXPre; ++k) {
        const int i = k * THREADS + static_cast<int>(threadIdx.x);
        pre[k] = i < chunks * 4 ? xv[i] : make_uint4(0, 0, 0, 0);
    }
}
template <int THREADS>
__device__ __forceinline__ void x_to_i16(const __half* __restrict__ x, int chunks, float factor, uint4* xs,
                                         float2* xc, const uint4 (&pre)[kXPre]) {
    const uint4* xv = reinterpret_cast<const uint4*>(x);
    const int n4 = chunks * 4;
    for (int base = 0; base < n4; base += THREADS) {  // uniform trip count: whole warps shuffle
        const int i = base + static_cast<int>(threadIdx.x);
        const bool in = i < n4;
        uint4 v = pre[kXPre - 1];
#pragma unroll
        for (int k = 0; k < kXPre - 1; ++k)
            if (base == k * THREADS) v = pre[k];
        if (base >= kXPre * THREADS) v = in ? xv[i] : make_uint4(0, 0, 0, 0);
        const __half2* h = reinterpret_cast<const __half2*>(&v);
        __half2 m2 = __hmax2_nan(__hmax2_nan(__habs2(h[0]), __habs2(h[1])), __hmax2_nan(__habs2(h[2]), __habs2(h[3])));
        m2 = __hmax2_nan(m2, u32_as_half2(__shfl_xor_sync(0xffffffffu, half2_as_u32(m2), 1)));
        m2 = __hmax2_nan(m2, u32_as_half2(__shfl_xor_sync(0xffffffffu, half2_as_u32(m2), 2)));
        const uint32_t mb = half2_as_u32(__hmax2_nan(m2, __lowhigh2highlow(m2))) & 0x7FFFu;  // the chunk's max |x|
        const int E = static_cast<int>(mb >> 10);                            // 0 .. 31
        const float up = __int_as_float((127 + 29 - E) << 23);               // 2^k, k = 29 - E (2^-2 .. 2^29)
        const float sx = mb >= 0x7C00u ? __int_as_float(0x7FC00000) : __int_as_float((127 - 29 + E) << 23);
        int xi[8];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const float2 f = __half22float2(h[j]);
            xi[2 * j] = __float2int_rn(f.x * up);
            xi[2 * j + 1] = __float2int_rn(f.y * up);
        }
        int sum = ((xi[0] + xi[1]) + (xi[2] + xi[3])) + ((xi[4] + xi[5]) + (xi[6] + xi[7]));
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        // xi[2j], xi[2j + 1] are columns 2j, 2j + 1: {hi, hi, lo, lo} of columns (0, 4), (1, 5), (2, 6), (3, 7).
        const uint32_t a04 = byte_perm(xi[0], xi[4], 0x4051u), a15 = byte_perm(xi[1], xi[5], 0x4051u);
        const uint32_t a26 = byte_perm(xi[2], xi[6], 0x4051u), a37 = byte_perm(xi[3], xi[7], 0x4051u);
        uint4 o;
        o.x = byte_perm(a04, a15, 0x5410u);  // hi 0 4 1 5
        o.y = byte_perm(a26, a37, 0x5410u);  // hi 2 6 3 7
        o.z = byte_perm(a04, a15, 0x7632u);  // lo 0 4 1 5
        o.w = byte_perm(a26, a37, 0x7632u);  // lo 2 6 3 7
        if (in) {
            xs[(i & 3) * chunks + (i >> 2)] = o;
            if ((i & 3) == 0) xc[i >> 2] = make_float2(sx * factor, __int_as_float(sum));
        }
    }
}

// One thread's step of x_to_i16 on its own: the 16-byte piece v of x (8 fp16 columns of a chunk) into its integer
// form (returned), with the chunk's sx (NaN when the chunk holds a NaN or infinity) and sum(xi). The pieces 0..3 of a
// chunk must sit in lanes 4m .. 4m + 3 (max and sum by two shuffles each); every lane of the warp calls it. For a
// kernel that converts x piecewise per warp (tests/cuda/dev/persist_layer.cu's flow form). The same arithmetic as
// x_to_i16's loop body, kept beside it rather than called from it: x_to_i16 calling it changed gemv_int4.cu's PTX.
__device__ __forceinline__ uint4 x_piece_to_i16(uint4 v, float& sx, int& sum) {
    const __half2* h = reinterpret_cast<const __half2*>(&v);
    __half2 m2 = __hmax2_nan(__hmax2_nan(__habs2(h[0]), __habs2(h[1])), __hmax2_nan(__habs2(h[2]), __habs2(h[3])));
    m2 = __hmax2_nan(m2, u32_as_half2(__shfl_xor_sync(0xffffffffu, half2_as_u32(m2), 1)));
    m2 = __hmax2_nan(m2, u32_as_half2(__shfl_xor_sync(0xffffffffu, half2_as_u32(m2), 2)));
    const uint32_t mb = half2_as_u32(__hmax2_nan(m2, __lowhigh2highlow(m2))) & 0x7FFFu;  // the chunk's max |x|
    const int E = static_cast<int>(mb >> 10);                            // 0 .. 31
    const float up = __int_as_float((127 + 29 - E) << 23);               // 2^k, k = 29 - E (2^-2 .. 2^29)
    sx = mb >= 0x7C00u ? __int_as_float(0x7FC00000) : __int_as_float((127 - 29 + E) << 23);
    int xi[8];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const float2 f = __half22float2(h[j]);
        xi[2 * j] = __float2int_rn(f.x * up);
        xi[2 * j + 1] = __float2int_rn(f.y * up);
    }
    sum = ((xi[0] + xi[1]) + (xi[2] + xi[3])) + ((xi[4] + xi[5]) + (xi[6] + xi[7]));
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    // xi[2j], xi[2j + 1] are columns 2j, 2j + 1: {hi, hi, lo, lo} of columns (0, 4), (1, 5), (2, 6), (3, 7).
    const uint32_t a04 = byte_perm(xi[0], xi[4], 0x4051u), a15 = byte_perm(xi[1], xi[5], 0x4051u);
    const uint32_t a26 = byte_perm(xi[2], xi[6], 0x4051u), a37 = byte_perm(xi[3], xi[7], 0x4051u);
    uint4 o;
    o.x = byte_perm(a04, a15, 0x5410u);  // hi 0 4 1 5
    o.y = byte_perm(a26, a37, 0x5410u);  // hi 2 6 3 7
    o.z = byte_perm(a04, a15, 0x7632u);  // lo 0 4 1 5
    o.w = byte_perm(a26, a37, 0x7632u);  // lo 2 6 3 7
    return o;
}

}  // namespace quest::int4_dot
