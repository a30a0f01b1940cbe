#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "kernels/linear/gemv_int4.cuh"
#include "kernels/common/device_utils.cuh"
#include "kernels/linear/int4_layout.h"

namespace quest {

namespace {

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

// The integer form of chunk_dot ("i16" variants of the stream kernel). x is held per chunk (32 columns) in block
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
    const int sshift = cpg_shift < 2 ? cpg_shift : 2;  // chunk c of a row is at slot int4_chunk_slot(c) (device layout)
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
        const int slot = in ? int4_chunk_slot(cu, chunks, sshift) : 0;
#pragma unroll
        for (int r = 0; r < R; ++r) {
            cw[u][r] = in ? load_stream(w[r] + slot) : zero4;
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
            const int slot = in ? int4_chunk_slot(cu, chunks, sshift) : 0;
#pragma unroll
            for (int r = 0; r < R; ++r) {
                nw[u][r] = in ? load_stream(w[r] + slot) : zero4;
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
            for (int r = 0; r < R; ++r) acc[r] = chunk_dot(cw[u][r], cs[u][r], cz[u][r], xr, acc[r]);
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
    gemv_store_rows<R, W, KS>(y, acc, row0, rows, warp, seg, lane);
}

// ---------------------------------------------------------------------------------------------------------------------
// "stream" variants: a persistent grid of warps that each stream many rows with loads always in flight.
//
// Why (the legacy kernel above, measured at 33-51% of 4.2 TB/s): a 4096-column int4 row is only 2 KB, so with
// U R 16-byte loads per lane a warp covers its whole share in ONE batch: it issues its loads, waits ~1 us, computes
// (~65 instructions per 16 bytes: the dequantize is 4x the work per byte of the FP16 GEMV) and exits, with nothing
// in flight while it computes; and each chunk's 64 bytes of x are read from global memory as four 16-byte pieces
// 64 bytes apart across the lanes (16 L1 wavefronts per LDG.128 instead of 4), shared by only R rows.
//
// Tiling: a tile is R consecutive rows. Warp g of the G warps of the grid takes tiles g, g + G, g + 2G, ... (G is
// chosen so that every warp gets the same number of tiles, give or take one). A tile is covered in `batches` =
// ceil(ceil(chunks / 32) / U) batches; in batch b lane l handles chunks l + 32 (b U + u), u < U, of each of the R
// rows: U R independent 16-byte code loads per lane (each with its scale and zero point), U R x 512 bytes per
// warp. The warp walks its (tile, batch) items in order with a rolling refill: right after a chunk has been
// multiplied, its registers are reloaded with the same slot of the NEXT item (next batch, or next tile), so U R
// loads per lane stay in flight while the warp computes, across rows and tiles, not only within one row. The first
// item's loads are issued before pdl_wait() (weights are immutable).
//
// x is copied once per block (after pdl_wait) into shared memory transposed: xs[j * chunks + c] = 16-byte piece j
// of chunk c (columns 32c + 8j .. 32c + 8j + 7). A chunk's 32 x values are then 4 LDS.128 at consecutive addresses
// across the lanes (conflict-free), shared by the R rows of the tile. Shared memory: cols * 2 bytes per block; above
// 48 KB (cols > 24576) the launcher falls back to the legacy kernel.
//
// Grid: at most WPS warps per SM (WPS / W blocks per SM). __launch_bounds__ asks for MINW resident warps per SM:
// MINW = 16 caps the registers at 128 per thread, so that with WPS = 8 half the register file stays free and the
// next kernel's blocks can become resident (and issue their weight loads) early under programmatic dependent launch.
// Arithmetic per chunk: chunk_dot, the same as the legacy kernel (numerics contract of kernels/linear/gemv_int4.cuh
// unchanged; only the fp32 summation order across chunks differs).
template <int R>
struct TileRows {  // the rows of the tile being loaded (rows past the end re-read the last row; never stored)
    const uint4* w[R];
    const unsigned short* s[R];
    const uint8_t* z[R];

    __device__ __forceinline__ void point(const uint32_t* qw, const __half* sc, const uint8_t* zp, int tile, int rows,
                                          int chunks, int groups) {
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const int64_t row = min(tile * R + r, rows - 1);
            w[r] = reinterpret_cast<const uint4*>(qw) + row * chunks;
            s[r] = reinterpret_cast<const unsigned short*>(sc) + row * groups;
            z[r] = zp + row * groups;
        }
    }

    // Chunk c of row r (codes at device slot `slot` = int4_chunk_slot(c)): codes, scale bits and zero point when
    // `in`; otherwise the registers keep their (stale) contents, which the kernel never uses (it multiplies a slot
    // only when the same `in` held at its load).
    __device__ __forceinline__ void load(int r, int c, int slot, int cpg_shift, bool in, uint4& q, uint32_t& sv,
                                         uint32_t& zv) const {
        if (in) {
            q = load_stream(w[r] + slot);
            sv = __ldg(s[r] + (c >> cpg_shift));
            zv = __ldg(z[r] + (c >> cpg_shift));
        }
    }
};

//
// Epilogue E (kernels/common/device_utils.cuh, GemvEpi e): Store writes y; the fused kinds (gemv_int4_scaled / _swiglu /
// _residual) take the same tile sums, applied by lane 0 when a tile completes (SwiGLU: R even, a tile's rows 2i,
// 2i + 1 are gate_i, up_i); Residual adds each warp's x^2 in lane 0 and the grid's sum is formed at the end by every
// thread (warps without a tile included). All their reads and writes of ss, x, xg, act come after pdl_wait().
//
// I16 (the "i16" variants): x in the integer form of x_to_i16 (the same shared bytes plus 8 per chunk), each chunk
// by chunk_dot_i16; the fused norm's factor goes into the chunk steps instead of the fp16 input.
template <int R, int U, int W, int WPS, int MINW, GemvEpilogue E = GemvEpilogue::Store, bool I16 = false>
__global__ void __launch_bounds__(W * 32, MINW / W)
    gemv_int4_stream_kernel(float* __restrict__ y, const uint32_t* __restrict__ qw, const __half* __restrict__ sc,
                            const uint8_t* __restrict__ zp, const __half* __restrict__ x, int rows, int cols,
                            int cpg_shift, GemvEpi e) {
    static_assert(WPS % W == 0 && MINW % W == 0, "whole blocks per SM");
    static_assert(E != GemvEpilogue::SwiGLU || R % 2 == 0, "SwiGLU needs the gate and up rows in one tile");
    extern __shared__ uint4 xs[];  // [4][chunks], see above; I16: then float2 xc[chunks]
    const int lane = threadIdx.x & 31;
    const int chunks = cols >> 5, groups = chunks >> cpg_shift;
    [[maybe_unused]] float2* xc = reinterpret_cast<float2*>(xs + 4 * chunks);
    const int sshift = cpg_shift < 2 ? cpg_shift : 2;  // device layout: int4_chunk_slot
    const int tiles = (rows + R - 1) / R;
    const int batches = (((chunks + 31) >> 5) + U - 1) / U;
    const int stride = gridDim.x * W;  // warps in the grid
    int t = blockIdx.x * W + (threadIdx.x >> 5), b = 0;
    const bool active = t < tiles;  // the last block may have warps without a tile

    TileRows<R> src;
    src.point(qw, sc, zp, t, rows, chunks, groups);
    uint4 q[U][R];
    uint32_t s[U][R], z[U][R];
#pragma unroll
    for (int u = 0; u < U; ++u) {
        const int c = lane + 32 * u;
        const bool in = active && c < chunks;
        const int slot = in ? int4_chunk_slot(c, chunks, sshift) : 0;
#pragma unroll
        for (int r = 0; r < R; ++r) q[u][r] = make_uint4(0, 0, 0, 0), s[u][r] = 0, z[u][r] = 0;
#pragma unroll
        for (int r = 0; r < R; ++r) src.load(r, c, slot, cpg_shift, in, q[u][r], s[u][r], z[u][r]);
    }
    pdl_trigger();
    pdl_wait();

    // Scale / SwiGLU: x is the fused norm input xg = fp16(x g), not normalised. It is normalised here, once per block,
    // as it is copied to shared memory (fp16(xg inv)), so that chunk_dot's fp16 partial sums see the range they see
    // after rms_norm: the residual stream's massive activations (|x| ~ 2.5K in Llama-2-7B) times 8 codes of up to 15
    // would overflow fp16. The row sums then need no factor.
    constexpr bool kNormIn = E == GemvEpilogue::Scale || E == GemvEpilogue::SwiGLU;
    [[maybe_unused]] uint4 xpre[kXPre];
    if constexpr (I16) x_i16_preload<W * 32>(x, chunks, xpre);  // in flight with the partial sums' loads
    [[maybe_unused]] float inv_in = 1.0f;
    if constexpr (kNormIn) inv_in = epi_inv_rms(e.norm, epi_partials_share(e.norm));  // every thread: barriers
    if constexpr (I16) {
        x_to_i16<W * 32>(x, chunks, inv_in, xs, xc, xpre);
    } else {
        const uint4* xv = reinterpret_cast<const uint4*>(x);
        for (int i = threadIdx.x; i < chunks * 4; i += W * 32) {
            uint4 v = xv[i];
            if constexpr (kNormIn) v = scale_half8(v, inv_in);
            xs[(i & 3) * chunks + (i >> 2)] = v;
        }
    }
    __syncthreads();
    if constexpr (E != GemvEpilogue::Residual) {
        if (!active) return;
    }
    constexpr float inv = 1.0f;  // the epilogue's factor: already applied to the input
    [[maybe_unused]] float sq = 0.0f;  // Residual: this warp's x^2 (lane 0)

    float acc[R];
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = 0.0f;
    while (active) {
        // The item whose loads replace the current one's as it is consumed.
        int tn = t, bn = b + 1;
        if (bn == batches) {
            bn = 0;
            tn += stride;
            src.point(qw, sc, zp, tn, rows, chunks, groups);
        }
        const bool more = tn < tiles;
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int c = lane + 32 * (b * U + u), cn = lane + 32 * (bn * U + u);
            const bool in = c < chunks, in_next = more && cn < chunks;
            // `in` is the `in_next` of the iteration (or prologue) that loaded this slot: same chunk formula, and
            // that iteration had more = true.
            if (in) {
                uint4 xr[4];
#pragma unroll
                for (int j = 0; j < 4; ++j) xr[j] = xs[j * chunks + c];
                if constexpr (I16) {
                    const float2 xcc = xc[c];
#pragma unroll
                    for (int r = 0; r < R; ++r) acc[r] = chunk_dot_i16(q[u][r], s[u][r], z[u][r], xr, xcc, acc[r]);
                } else {
#pragma unroll
                    for (int r = 0; r < R; ++r) acc[r] = chunk_dot(q[u][r], s[u][r], z[u][r], xr, acc[r]);
                }
            }
            const int slot_next = in_next ? int4_chunk_slot(cn, chunks, sshift) : 0;
#pragma unroll
            for (int r = 0; r < R; ++r) src.load(r, cn, slot_next, cpg_shift, in_next, q[u][r], s[u][r], z[u][r]);
            // I16: without a warp barrier here ptxas predicates the shorter integer chunks into one block and sinks
            // the item's eight refills behind its first chunks (SASS: first refill at 259 of 571 instructions,
            // measured no faster than the fp16 dot); with it each chunk's refill follows its dot (157, 284, 411,
            // 539 of 583), as in the fp16 kernel.
            if constexpr (I16) __syncwarp();
        }
        if (bn == 0) {  // tile t is complete (warp-uniform branch)
            if constexpr (E == GemvEpilogue::Store) {
#pragma unroll
                for (int r = 0; r < R; ++r) {
                    const float sum = warp_sum(acc[r]);
                    if (lane == 0 && t * R + r < rows) y[t * R + r] = sum;
                    acc[r] = 0.0f;
                }
            } else {
                float sum[R];
#pragma unroll
                for (int r = 0; r < R; ++r) {
                    sum[r] = warp_sum(acc[r]);
                    acc[r] = 0.0f;
                }
                if (lane == 0) {
                    if constexpr (E == GemvEpilogue::SwiGLU) {  // rows even: row t R + r + 1 exists with row t R + r
#pragma unroll
                        for (int r = 0; r < R; r += 2)
                            if (t * R + r < rows)
                                e.act[(t * R + r) >> 1] =
                                    __float2half_rn(epi_silu_mul(sum[r] * inv, sum[r + 1] * inv));
                    } else {
#pragma unroll
                        for (int r = 0; r < R; ++r) {
                            if (t * R + r >= rows) break;
                            if constexpr (E == GemvEpilogue::Scale) y[t * R + r] = sum[r] * inv;
                            else sq += epi_residual_row(e.res, t * R + r, sum[r]);
                        }
                    }
                }
            }
        }
        if (!more) break;
        t = tn;
        b = bn;
    }
    if constexpr (E == GemvEpilogue::Residual) epi_residual_finish(e.res, lane == 0 ? sq : 0.0f);
}

// ---------------------------------------------------------------------------------------------------------------------
// "async" variants: the stream kernel's tiling and (tile, batch) item order, but the codes travel by cp.async into a
// per-warp ring of P stages in shared memory instead of registers, so the bytes in flight no longer cost 4
// registers per 16 bytes: P - 1 items (U R 512 bytes each per warp) stay in flight while the warp multiplies the
// oldest. Stage st of warp w holds, for lane l, slot (u, r) at ring[w][st][u][r][l] (16 bytes): each lane writes and
// reads back only its own slots, so cp.async.wait_group (per thread) is the only synchronisation needed. A stage is
// refilled one iteration after it was read (the refill of item k + P - 1 goes to the stage of item k - 1), so the
// reads of a stage have completed (their values fed the previous iteration's multiplies) before it is overwritten.
// The scales and zero points of the P stages are ordinary loads into registers (P U R x 2 registers). Shared memory
// per block: cols * 2 (x, as in the stream kernel) + W P U R 512 bytes; the launcher opts in to more than 48 KB and
// falls back to the stream kernel beyond kAsyncMaxSmem.

template <int R, int U, int W, int P>
__global__ void __launch_bounds__(W * 32, 16 / W)
    gemv_int4_async_kernel(float* __restrict__ y, const uint32_t* __restrict__ qw, const __half* __restrict__ sc,
                           const uint8_t* __restrict__ zp, const __half* __restrict__ x, int rows, int cols,
                           int cpg_shift) {
    static_assert(P >= 2 && 16 % W == 0, "at least two stages; whole blocks per SM");
    extern __shared__ uint4 smem[];  // x: [4][chunks] (as the stream kernel), then the rings: [W][P][U][R][32]
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int chunks = cols >> 5, groups = chunks >> cpg_shift;
    const int sshift = cpg_shift < 2 ? cpg_shift : 2;  // device layout: int4_chunk_slot
    const int tiles = (rows + R - 1) / R;
    const int batches = (((chunks + 31) >> 5) + U - 1) / U;
    const int stride = gridDim.x * W;
    const int t0 = blockIdx.x * W + warp;
    const int my_items = t0 < tiles ? ((tiles - 1 - t0) / stride + 1) * batches : 0;
    uint4* xs = smem;
    uint4* ring = smem + 4 * chunks + static_cast<size_t>(warp) * P * U * R * 32;
    // Shared-space address of slot (st, u, r) of this lane.
    const uint32_t ring_addr = static_cast<uint32_t>(__cvta_generic_to_shared(ring + lane));
    auto slot_addr = [&](int st, int u, int r) {
        return ring_addr + static_cast<uint32_t>(((st * U + u) * R + r) * 512);
    };

    uint32_t s[P][U][R], z[P][U][R];
#pragma unroll
    for (int st = 0; st < P; ++st)
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
            for (int r = 0; r < R; ++r) s[st][u][r] = 0, z[st][u][r] = 0;

    // Issue cursor: the item (ti, bi) whose loads go out next, ki its index in this warp's sequence.
    int ti = t0, bi = 0, ki = 0;
    TileRows<R> src;
    src.point(qw, sc, zp, ti, rows, chunks, groups);
    // Issues item ki into stage st (nothing past the warp's last item), commits one group either way. Called only
    // from fully unrolled loops, so st is a constant and s[st], z[st] stay in registers.
    auto issue = [&](int st) {
        if (ki < my_items) {
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int c = lane + 32 * (bi * U + u);
                if (c < chunks) {
                    const int slot = int4_chunk_slot(c, chunks, sshift);
#pragma unroll
                    for (int r = 0; r < R; ++r) {
                        cp_async16(slot_addr(st, u, r), src.w[r] + slot);
                        s[st][u][r] = __ldg(src.s[r] + (c >> cpg_shift));
                        z[st][u][r] = __ldg(src.z[r] + (c >> cpg_shift));
                    }
                }
            }
            ++ki;
            if (++bi == batches) {
                bi = 0;
                ti += stride;
                src.point(qw, sc, zp, ti, rows, chunks, groups);
            }
        }
        cp_async_commit();
    };
#pragma unroll
    for (int st = 0; st < P - 1; ++st) issue(st);
    pdl_trigger();
    pdl_wait();

    const uint4* xv = reinterpret_cast<const uint4*>(x);
    for (int i = threadIdx.x; i < chunks * 4; i += W * 32) xs[(i & 3) * chunks + (i >> 2)] = xv[i];
    __syncthreads();

    // Consume cursor: item k = (t, b) sits in stage k % P.
    int t = t0, b = 0;
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = 0.0f;
    auto consume = [&](int st) {
        cp_async_wait<P - 2>();  // item k (committed P - 1 groups ago) has landed
        issue((st + P - 1) % P);  // item k + P - 1 into the stage of item k - 1
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int c = lane + 32 * (b * U + u);
            if (c < chunks) {
                uint4 xr[4];
#pragma unroll
                for (int j = 0; j < 4; ++j) xr[j] = xs[j * chunks + c];
#pragma unroll
                for (int r = 0; r < R; ++r) {
                    const uint4 q = ring[((st * U + u) * R + r) * 32 + lane];
                    acc[r] = chunk_dot(q, s[st][u][r], z[st][u][r], xr, acc[r]);
                }
            }
        }
        if (++b == batches) {  // tile t is complete (warp-uniform)
#pragma unroll
            for (int r = 0; r < R; ++r) {
                const float sum = warp_sum(acc[r]);
                if (lane == 0 && t * R + r < rows) y[t * R + r] = sum;
                acc[r] = 0.0f;
            }
            b = 0;
            t += stride;
        }
    };
    for (int k = 0; k < my_items; k += P) {
        // P items per pass so that every stage index is a compile-time constant (registers, not local memory).
#pragma unroll
        for (int st = 0; st < P; ++st)
            if (k + st < my_items) consume(st);
    }
    cp_async_wait<0>();  // no copy outstanding at exit (all were consumed; empty groups only)
}

// ---------------------------------------------------------------------------------------------------------------------
// "seg" variants: one lane = one segment of the device layout (kernels/linear/int4_layout.h; for group >= 128 a segment is
// 128 columns of one group, S = 4 chunks). Designed from Nsight Compute on the stream kernel inside a decode step
// (H200, 12288 x 4096, g128: 1.81 TB/s; 128 registers -> 16 warps/SM, 0.88 eligible warps per scheduler; 3.6 thread
// instructions per weight; 19-38% excess shared-memory wavefronts on the x reads):
//   - instructions per weight. The dequantize + multiply is 13 per code word (1 shift, 4 LOP3, 4 HSUB2/HFMA2,
//     4 HFMA2: 1.63 per weight); the rest is paid per segment and row, not per 16-byte chunk: one scale and one
//     zero-point load (v1 arrays, consecutive across the lanes), the zero-point constants (2 IMAD) and the scale's
//     conversion; per chunk and row only the fp32 fold (ACC 16: HADD2, 2 conversions, FADD, FFMA); per chunk 4
//     LDS.128 of x shared by the R rows of the tile; per 16-byte load one address IMAD. No branch inside an item:
//     lanes without a segment (a row's last batch of n_b < 32 segments) multiply zeros (the x padding), their code
//     loads predicated off. SASS (CUDA 13.0, group 128, R = 2): 628 instructions per item of 256 weights per lane,
//     2.45 per weight (1.93 of them the arithmetic and the loads above), against 3.6 for the stream kernel.
//   - coalescing: the j-th loads of the lanes' segments are 32 consecutive 16-byte slots of the device layout (one
//     512-byte run). x sits in shared memory permuted the same way: piece p (p = 4 j + w: chunk j, word w) of segment
//     32 b + l at xs[(4 S b + p) 32 + l], so the lanes' LDS.128 read consecutive 16-byte words (4 wavefronts, no
//     conflict). x is copied there by cp.async: no registers, all pieces in flight at once, one round trip; batches
//     are padded (zeros) up to the items' 4 / S batches each.
//   - registers and loads in flight: an item is R rows x 4 chunks per lane (R x 2 KB per warp, 16 R registers of
//     codes), refilled as in the stream kernel: a slot is reloaded with the same slot of the next item right after
//     it is multiplied. ptxas places those loads by register pressure: under the 80-register cap it sinks most of
//     them towards the end of the item (a warp then has about one item, R x 2 KB, in flight while it waits, less
//     while it computes: 24 warps x 4 KB = 96 KB per SM at most, at R = 2); with 128 registers more of them go out
//     early. (Little's law at 4.2 TB/s and ~1 us of loaded latency asks for ~32 KB per SM.) __launch_bounds__ caps
//     the registers for MINW resident warps per SM (65536 / (32 MINW): 80 for 24, 64 for 32).
// Work: tiles of R consecutive rows, warp g of the G warps of the grid taking tiles g, g + G, ... (persistent, as the
// stream kernel; rows past the end re-read the last row and are never stored). A row has nseg = chunks / S segments
// in nb = ceil(nseg / 32) batches; an item covers V = 4 / S consecutive batches (group >= 128: one segment per lane;
// group 64: two; group 32: four), so a lane holds 4 chunks per row of an item. The first item's loads go out before
// pdl_wait() (weights are immutable); x is read only after it.
// Arithmetic (kernels/linear/gemv_int4.cuh): per chunk and row two fp16x2 partial sums of 8 products each (even and odd
// words, as the other kernels); ACC = 8 converts each to fp32 (the other kernels' arithmetic), ACC = 16 first adds
// them in fp16 (one HADD2: a sum of 16 products); then one fp32 FMA with the group's scale.

// A group's fp16 scale and zero point in one register (scale bits | zero << 16), its fp32 scale, and its zero-point
// constants (1024 + z) and -(64 + z) in both halves (z <= 15: no carries).
__device__ __forceinline__ uint32_t load_scale_zero(const unsigned short* s, const uint8_t* z, int i) {
    return static_cast<uint32_t>(__ldg(s + i)) | static_cast<uint32_t>(__ldg(z + i)) << 16;
}
__device__ __forceinline__ float scale_of(uint32_t sz) {
    return __half2float(__ushort_as_half(static_cast<unsigned short>(sz & 0xFFFFu)));
}
__device__ __forceinline__ void zero_consts(uint32_t sz, __half2& zl, __half2& zh) {
    const uint32_t z = sz >> 16;
    zl = u32_as_half2(z * 0x00010001u + 0x64006400u);
    zh = u32_as_half2(z * 0x00100010u + 0xD400D400u);
}

template <int ACC>
__device__ __forceinline__ float fold_chunk(__half2 a0, __half2 a1, float scale, float acc) {
    if constexpr (ACC == 16) {
        const float2 f = __half22float2(__hadd2(a0, a1));
        return fmaf(scale, f.x + f.y, acc);
    } else {
        const float2 f0 = __half22float2(a0), f1 = __half22float2(a1);
        return fmaf(scale, (f0.x + f0.y) + (f1.x + f1.y), acc);
    }
}

// Stores the R row sums of tile t (lane partial sums in acc) and clears acc. R = 2: one butterfly level moves row
// 1's partials to lanes 16..31 and row 0's to lanes 0..15, then both rows are reduced over 16 lanes at once.
template <int R>
__device__ __forceinline__ void store_tile(float* y, float (&acc)[R], int t, int rows, int lane) {
    if constexpr (R == 2) {
        const bool upper = (lane & 16) != 0;
        float v = upper ? acc[1] : acc[0];
        v += __shfl_xor_sync(0xffffffffu, upper ? acc[0] : acc[1], 16);
#pragma unroll
        for (int o = 8; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        const int row = 2 * t + (upper ? 1 : 0);
        if ((lane & 15) == 0 && row < rows) y[row] = v;
    } else {
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const float sum = warp_sum(acc[r]);
            if (lane == 0 && t * R + r < rows) y[t * R + r] = sum;
        }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = 0.0f;
}

template <int R, int S, int ACC, int W, int MINW>
__global__ void __launch_bounds__(W * 32, MINW / W)
    gemv_int4_seg_kernel(float* __restrict__ y, const uint32_t* __restrict__ qw, const __half* __restrict__ sc,
                         const uint8_t* __restrict__ zp, const __half* __restrict__ x, int rows, int cols, int gshift) {
    static_assert(S == 1 || S == 2 || S == 4, "chunks per segment: 1, 2 or 4");
    static_assert(ACC == 8 || ACC == 16, "products per fp16 partial sum: 8 or 16");
    static_assert(MINW % W == 0, "whole blocks per SM");
    constexpr int V = 4 / S;                           // segments per lane and row in an item
    constexpr int SS = S == 4 ? 2 : (S == 2 ? 1 : 0);  // log2 S
    extern __shared__ uint4 xs[];                      // [items V][4 S][32] pieces of x, see above
    const int lane = threadIdx.x & 31;
    const int chunks = cols >> 5;
    const int nseg = chunks >> SS;                  // segments per row
    const int items = (((nseg + 31) >> 5) + V - 1) / V;  // items per tile
    const int groups = nseg >> gshift;              // gshift = log2(segments per group)
    const int tiles = (rows + R - 1) / R;
    const int stride = gridDim.x * W;                    // warps in the grid
    int t = blockIdx.x * W + (threadIdx.x >> 5), i = 0;  // current item: tile t, batches i V .. i V + V - 1
    const bool active = t < tiles;                       // the last block may have warps without a tile

    TileRows<R> src;  // the rows of the tile whose loads are being issued
    src.point(qw, sc, zp, t, rows, chunks, groups);
    uint4 q[R][4];
    uint32_t sz[R][V];  // scale bits | zero point << 16
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
        for (int u = 0; u < 4; ++u) q[r][u] = make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int v = 0; v < V; ++v) sz[r][v] = 0;
    }
#pragma unroll
    for (int v = 0; v < V; ++v) {  // item 0: batches 0 .. V - 1
        const int k = (v << 5) + lane;
        if (active && k < nseg) {
            const int n = min(32, nseg - (v << 5));
            const int base = (v << (5 + SS)) + lane;
#pragma unroll
            for (int r = 0; r < R; ++r) {
#pragma unroll
                for (int j = 0; j < S; ++j) q[r][v * S + j] = load_stream(src.w[r] + base + j * n);
                sz[r][v] = load_scale_zero(src.s[r], src.z[r], k >> gshift);
            }
        }
    }
    pdl_trigger();
    pdl_wait();

    {  // x into shared memory, permuted; the padding past the last segment is zero-filled
        const int pieces = items * V << (7 + SS);  // items V batches of 4 S x 32 pieces
        const uint4* xv = reinterpret_cast<const uint4*>(x);
        for (int d = threadIdx.x; d < pieces; d += W * 32) {
            const int bp = d >> 5;                             // 4 S b + p
            const int k = ((bp >> (2 + SS)) << 5) + (d & 31);  // segment 32 b + l
            const bool in = k < nseg;
            cp_async16(xs + d, in ? xv + (k << (2 + SS)) + (bp & ((4 << SS) - 1)) : xv, in ? 16 : 0);
        }
        cp_async_commit();
        cp_async_wait<0>();
    }
    __syncthreads();
    if (!active) return;

    float acc[R];
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = 0.0f;
    for (;;) {
        // The item whose loads replace the current one's as it is consumed.
        int tn = t, inext = i + 1;
        if (inext == items) {
            inext = 0;
            tn += stride;
            src.point(qw, sc, zp, tn, rows, chunks, groups);
        }
        const bool more = tn < tiles;
#pragma unroll
        for (int v = 0; v < V; ++v) {
            const int b = i * V + v, bn = inext * V + v;  // batch of this segment, now and next
            // Lanes without a segment now (k >= nseg) hold zeros or stale codes and read zeros from xs: they add
            // (q - z) * 0 = 0. Lanes without one next (or no next item) load no codes and the row's first scale and
            // zero point (a valid address; never used).
            const int kn = (bn << 5) + lane;
            const bool in_next = more && kn < nseg;
            const int off = (bn << (5 + SS)) + lane, step = min(32, nseg - (bn << 5));
            const int gi = in_next ? kn >> gshift : 0;
            // The segment's constants, then its scale / zero register takes the next item's.
            __half2 zl[R], zh[R];
            float scale[R];
#pragma unroll
            for (int r = 0; r < R; ++r) {
                zero_consts(sz[r][v], zl[r], zh[r]);
                scale[r] = scale_of(sz[r][v]);
                sz[r][v] = load_scale_zero(src.s[r], src.z[r], gi);
            }
#pragma unroll
            for (int j = 0; j < S; ++j) {
                const int u = v * S + j;
                const uint4* xp = xs + (((b << SS) + j) << 7) + lane;  // piece 4 j + w of the segment: xp[32 w]
                __half2 a0[R], a1[R];
#pragma unroll
                for (int r = 0; r < R; ++r) a0[r] = a1[r] = __float2half2_rn(0.0f);
#pragma unroll
                for (int w = 0; w < 4; ++w) {
                    const uint4 xw = xp[w * 32];
                    const __half2* xh = reinterpret_cast<const __half2*>(&xw);
#pragma unroll
                    for (int r = 0; r < R; ++r) {
                        __half2 d[4];
                        word_to_pairs((&q[r][u].x)[w], zl[r], zh[r], d);
                        __half2& a = (w & 1) ? a1[r] : a0[r];
                        a = __hfma2(d[0], xh[0], a);
                        a = __hfma2(d[1], xh[1], a);
                        a = __hfma2(d[2], xh[2], a);
                        a = __hfma2(d[3], xh[3], a);
                    }
                }
#pragma unroll
                for (int r = 0; r < R; ++r) acc[r] = fold_chunk<ACC>(a0[r], a1[r], scale[r], acc[r]);
                if (in_next) {  // (predicated: lanes without a segment next keep stale codes, multiplied by 0)
#pragma unroll
                    for (int r = 0; r < R; ++r) q[r][u] = load_stream(src.w[r] + off + j * step);
                }
            }
        }
        if (inext == 0) store_tile<R>(y, acc, t, rows, lane);  // tile t is complete (warp-uniform branch)
        if (!more) break;
        t = tn;
        i = inext;
    }
}

// ---------------------------------------------------------------------------------------------------------------------
// "mma" variants: the products on the tensor cores (mma.sync m16n8k16, fp16 inputs, fp32 accumulation), same device
// layout. Per code word the seg kernel spends 13 instructions on 8 weights, 4 of them HFMA2 products, plus the fp32
// folds of its fp16 partial sums; here one HMMA takes the products of 8 weights per lane and sums them in fp32, so a
// word costs 1 shift + 4 LOP3 + 4 HSUB2/HFMA2 (the exact (q - z) pairs) + 1 HMMA: 1.25 instructions per weight,
// and no fp16 partial sum exists (no overflow for any fp16 x). SASS (CUDA 13.0, group 128): 460 instructions per
// item of 256 weights per lane, 1.80 per weight (the rest: 0.14 loads and LDS, 0.4 issue addressing, folds, loop).
//
// A block streams tiles of 16 rows (the M of the MMA); lane (g, t) = (lane / 4, lane % 4) holds rows g and g + 8.
// An item is 4 consecutive segments x 16 rows: lane t takes segment 4 m + t (S = 4; for S < 4, V = 4 / S such
// blocks, segments 4 (V m + v) + t), i.e. its chunk j is at the same slot position in rows g and g + 8: per load
// instruction 8 rows x 64 consecutive bytes (4 lanes t), whole 32-byte sectors. A word of row g and the word of row
// g + 8 at the same columns c .. c + 7 give the A fragments of two k-tiles (m16n8k16 .row: lane (g, t) holds
// A[g][2t, 2t + 1], A[g + 8][2t, 2t + 1], A[g][2t + 8, 2t + 9], A[g + 8][2t + 8, 2t + 9]): columns (c, c + 1) at
// k = (2t, 2t + 1) and (c + 2, c + 3) at k = (2t + 8, 2t + 9) of the first, (c + 4, c + 5) and (c + 6, c + 7) of
// the second; the k order inside a tile is free as long as B follows it. The four lanes t of a row hold four
// different segments (groups, for group 32 / 64), so B separates them: B[k][n] = x at k's column when n = 2 t(k)
// (t(k): the lane owning slot k), else 0. Lane (g, t) supplies B[k][g] for its slots (b0 = B[2t, 2t+1][g], b1 =
// B[2t + 8, 2t + 9][g]), so only the 4 "owner" lanes g = 2t load x; the others read a zero piece. Then D[row][2t] is
// the sum over lane t's segment alone, which lane (g, t) holds in c0 (row g) and c2 (row g + 8) (c1, c3 = D[.][2t+1]
// = 0): each lane folds its own segment's sums with its own scales (fp32 FMA) after the segment's S chunks; the 4
// lanes of a row are added by two shuffles at the end of the tile, the warps of the block through shared memory.
//
// Codes travel by cp.async into a per-warp ring of P stages (one item each: 8 x 16 bytes per lane, each lane
// reading back only its own slots, as the async kernel; P - 1 items, 4 KB each, in flight per warp without
// registers), scales and zero points by ordinary loads at issue time into a queue of P registers. x sits in shared
// memory as in the seg kernel (piece p of segment 32 b + l in row 4 S b + p) with rows of 33 pieces: column 32 is
// zero, where the non-owner lanes read (the owners of a row's 4 lanes read 4 consecutive pieces). The warps of a
// block split the items of a tile (warp w: items w, w + W, ...), the blocks take tiles T, T + gridDim.x, ...; the
// ring runs across tiles. Segments past the row's end (k >= nseg) are zero-filled codes times zero x (padding).
// Rows past the end re-read the last row and are not stored.

// d += A B (m16n8k16, fp16 x fp16 -> fp32).
__device__ __forceinline__ void mma_16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                          uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Word wg of row g and wh of row g + 8 (columns c .. c + 7 of both, zero-point constants of each row) times the
// x piece of those columns (xw, 0 on non-owner lanes), into two k-tiles: da takes columns c .. c + 3, db c + 4 ..
// c + 7 (two accumulator chains).
__device__ __forceinline__ void mma_word_pair(uint32_t wg, uint32_t wh, __half2 zlg, __half2 zhg, __half2 zlh,
                                              __half2 zhh, uint4 xw, float (&da)[4], float (&db)[4]) {
    const __half2 sixteenth = u32_as_half2(0x2C002C00u);
    const uint32_t a0 = half2_as_u32(__hsub2(u32_as_half2(and_or<0x000F000Fu, 0x64006400u>(wg)), zlg));
    const uint32_t a1 = half2_as_u32(__hsub2(u32_as_half2(and_or<0x000F000Fu, 0x64006400u>(wh)), zlh));
    const uint32_t a2 = half2_as_u32(__hfma2(u32_as_half2(and_or<0x00F000F0u, 0x64006400u>(wg)), sixteenth, zhg));
    const uint32_t a3 = half2_as_u32(__hfma2(u32_as_half2(and_or<0x00F000F0u, 0x64006400u>(wh)), sixteenth, zhh));
    mma_16816(da, a0, a1, a2, a3, xw.x, xw.y);
    wg >>= 8;
    wh >>= 8;
    const uint32_t b0 = half2_as_u32(__hsub2(u32_as_half2(and_or<0x000F000Fu, 0x64006400u>(wg)), zlg));
    const uint32_t b1 = half2_as_u32(__hsub2(u32_as_half2(and_or<0x000F000Fu, 0x64006400u>(wh)), zlh));
    const uint32_t b2 = half2_as_u32(__hfma2(u32_as_half2(and_or<0x00F000F0u, 0x64006400u>(wg)), sixteenth, zhg));
    const uint32_t b3 = half2_as_u32(__hfma2(u32_as_half2(and_or<0x00F000F0u, 0x64006400u>(wh)), sixteenth, zhh));
    mma_16816(db, b0, b1, b2, b3, xw.z, xw.w);
}

constexpr int kMmaXStride = 33;  // pieces per x row in shared memory (32 segments + a zero piece)

template <int S, int W, int P, int MINW>
__global__ void __launch_bounds__(W * 32, MINW / W)
    gemv_int4_mma_kernel(float* __restrict__ y, const uint32_t* __restrict__ qw, const __half* __restrict__ sc,
                         const uint8_t* __restrict__ zp, const __half* __restrict__ x, int rows, int cols, int gshift) {
    static_assert(S == 1 || S == 2 || S == 4, "chunks per segment: 1, 2 or 4");
    static_assert(P >= 2 && MINW % W == 0, "at least two stages; whole blocks per SM");
    constexpr int V = 4 / S;                           // segments per lane in an item
    constexpr int SS = S == 4 ? 2 : (S == 2 ? 1 : 0);  // log2 S
    extern __shared__ uint4 smem[];  // x: [nb 4 S][33] pieces, then the rings: [W][P][8][32]
    __shared__ float red[2][W][16];  // per-warp row sums of a tile (double-buffered by tile parity)
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int chunks = cols >> 5;
    const int nseg = chunks >> SS;
    const int nb = (nseg + 31) >> 5;
    const int items = (nseg + 4 * V - 1) / (4 * V);  // per tile
    const int groups = nseg >> gshift;
    const int tiles = (rows + 15) >> 4;
    const int xpieces = (nb << (2 + SS)) * kMmaXStride;
    uint4* const xs = smem;
    const uint32_t ring = static_cast<uint32_t>(__cvta_generic_to_shared(smem + xpieces)) +
                          static_cast<uint32_t>((warp * P * 8 * 32 + lane) * 16);  // this lane's slot (0, 0)
    const uint4* const ring_g = smem + xpieces + warp * P * 8 * 32 + lane;       // the same, generic

    // This warp's items: in each of the block's tiles (T = blockIdx.x, + gridDim.x, ...), items warp, warp + W, ...
    const int block_tiles = static_cast<int>(blockIdx.x) < tiles ? (tiles - 1 - blockIdx.x) / gridDim.x + 1 : 0;
    const int per_tile = warp < items ? (items - 1 - warp) / W + 1 : 0;
    const int my_items = block_tiles * per_tile;

    // Issue cursor: item (ti, mi), ki its index in this warp's sequence; scale | zero << 16 of rows g and g + 8 of
    // its segments go to szq[P - 1] (a queue of the in-flight items' values, szq[0] the oldest).
    int ti = blockIdx.x, mi = warp, ki = 0;
    uint32_t szq[P][2][V];
#pragma unroll
    for (int e = 0; e < P; ++e)
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int v = 0; v < V; ++v) szq[e][h][v] = 0;
    // 32-bit offsets in 16-byte units (a matrix below 32 GB), one 64-bit IMAD.WIDE per load.
    const uint4* const q4 = reinterpret_cast<const uint4*>(qw);
    const unsigned short* const s16 = reinterpret_cast<const unsigned short*>(sc);
    auto issue = [&](int st, uint32_t (&sz)[2][V]) {
        if (ki < my_items) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int row = min(ti * 16 + g + 8 * h, rows - 1);
#pragma unroll
                for (int v = 0; v < V; ++v) {
                    const int k = 4 * (V * mi + v) + t;
                    const bool in = k < nseg;
                    const int kc = in ? k : nseg - 1;  // a valid address when not `in` (nothing is read)
                    const int gi = row * groups + (kc >> gshift);
                    sz[h][v] = static_cast<uint32_t>(__ldg(s16 + gi)) | static_cast<uint32_t>(__ldg(zp + gi)) << 16;
                    const int n = min(32, nseg - (kc & ~31));
                    const int off = row * chunks + ((kc >> 5) << (5 + SS)) + (kc & 31);
#pragma unroll
                    for (int j = 0; j < S; ++j)
                        cp_async16(ring + static_cast<uint32_t>(((st * 8 + h * 4 + v * S + j) * 32) * 16),
                                   q4 + (off + j * n), in ? 16 : 0);
                }
            }
            ++ki;
            mi += W;
            if (mi >= items) {
                mi = warp;
                ti += gridDim.x;
            }
        }
        cp_async_commit();
    };
#pragma unroll
    for (int e = 0; e < P - 1; ++e) issue(e, szq[e]);
    pdl_trigger();
    pdl_wait();

    {  // x into shared memory: row 4 S b + p, column l < 32: piece p of segment 32 b + l (zero past the end);
       // column 32: zero
        const uint4* xv = reinterpret_cast<const uint4*>(x);
        for (int d = threadIdx.x; d < xpieces; d += W * 32) {
            const int xr = d / kMmaXStride, l = d - xr * kMmaXStride;
            const int k = ((xr >> (2 + SS)) << 5) + l;
            const bool in = l < 32 && k < nseg;
            cp_async16(xs + d, in ? xv + (k << (2 + SS)) + (xr & ((4 << SS) - 1)) : xv, in ? 16 : 0);
        }
        cp_async_commit();
        cp_async_wait<0>();
    }
    __syncthreads();

    const bool owner = g == 2 * t;
    int st_i = P - 1, st_c = 0, par = 0;  // stage of the next issue, of the next item consumed; red buffer
    for (int T = blockIdx.x; T < tiles; T += gridDim.x) {
        float acc_g = 0.0f, acc_h = 0.0f;  // lane t's segments, rows g and g + 8
        for (int m = warp; m < items; m += W) {
            cp_async_wait<P - 2>();  // item (T, m), committed P - 1 groups ago, has landed
            issue(st_i, szq[P - 1]);  // the item P - 1 later, into the stage consumed last
            st_i = st_i + 1 == P ? 0 : st_i + 1;
#pragma unroll
            for (int v = 0; v < V; ++v) {
                const int k = 4 * (V * m + v) + t;
                // x pieces of segment k for the owner lanes, the zero column for the others
                const uint4* xk = xs + (((k >> 5) << (2 + SS)) * kMmaXStride + (owner ? (k & 31) : 32));
                __half2 zlg, zhg, zlh, zhh;
                zero_consts(szq[0][0][v], zlg, zhg);
                zero_consts(szq[0][1][v], zlh, zhh);
                float da[4] = {0.0f, 0.0f, 0.0f, 0.0f}, db[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
                for (int j = 0; j < S; ++j) {
                    const uint4 qg = ring_g[(st_c * 8 + v * S + j) * 32];
                    const uint4 qh = ring_g[(st_c * 8 + 4 + v * S + j) * 32];
#pragma unroll
                    for (int w = 0; w < 4; ++w)
                        mma_word_pair((&qg.x)[w], (&qh.x)[w], zlg, zhg, zlh, zhh, xk[(4 * j + w) * kMmaXStride],
                                      da, db);
                }
                acc_g = fmaf(scale_of(szq[0][0][v]), da[0] + db[0], acc_g);
                acc_h = fmaf(scale_of(szq[0][1][v]), da[2] + db[2], acc_h);
            }
            st_c = st_c + 1 == P ? 0 : st_c + 1;
#pragma unroll
            for (int e = 0; e + 1 < P; ++e)
#pragma unroll
                for (int h = 0; h < 2; ++h)
#pragma unroll
                    for (int v = 0; v < V; ++v) szq[e][h][v] = szq[e + 1][h][v];
        }
        // Tile T: the 4 lanes of a row, then the warps of the block.
        acc_g += __shfl_xor_sync(0xffffffffu, acc_g, 1);
        acc_h += __shfl_xor_sync(0xffffffffu, acc_h, 1);
        acc_g += __shfl_xor_sync(0xffffffffu, acc_g, 2);
        acc_h += __shfl_xor_sync(0xffffffffu, acc_h, 2);
        if (t == 0) {
            red[par][warp][g] = acc_g;
            red[par][warp][g + 8] = acc_h;
        }
        __syncthreads();  // (the other buffer's reads, a tile ago, were before this barrier's previous instance)
        if (threadIdx.x < 16) {
            float sum = 0.0f;
#pragma unroll
            for (int w = 0; w < W; ++w) sum += red[par][w][threadIdx.x];
            const int row = T * 16 + static_cast<int>(threadIdx.x);
            if (row < rows) y[row] = sum;
        }
        par ^= 1;
    }
    cp_async_wait<0>();  // no copy outstanding at exit (all were consumed; empty groups only)
}

// ---------------------------------------------------------------------------------------------------------------------
// Launchers and the variant table

// log2(group / 32): chunks per group as a shift.
int chunk_shift(int group) {
    int s = 0;
    while ((32 << s) < group) ++s;
    return s;
}


using Int4Launcher = void (*)(float*, const Int4View&, const __half*, cudaStream_t);

template <int R, int U, int W, int KS>
void launch_legacy(float* y, const Int4View& M, const __half* x, cudaStream_t stream) {
    launch_pdl(gemv_int4_kernel<R, U, W, KS>, dim3(ceil_div(M.rows, (W / KS) * R)), dim3(W * 32), 0, stream, y,
               M.qweight, M.scales, M.zeros, x, M.rows, M.cols, chunk_shift(M.group));
}

constexpr int kStreamMaxSmem = 48 * 1024;  // x in shared memory without opting in to more

// Blocks of W warps for `tiles` tiles with at most wps warps per SM, every warp getting the same number of tiles
// (give or take one): fewer warps when that does not add a round.
int persistent_blocks(int tiles, int W, int wps) {
    const int64_t max_warps = static_cast<int64_t>(sm_count()) * wps;
    int warps = static_cast<int>(tiles < max_warps ? tiles : max_warps);
    const int per_warp = ceil_div(tiles, warps);
    warps = ceil_div(tiles, per_warp);
    return ceil_div(warps, W);
}

// Shared memory of the stream kernel: x (fp16 or its i16 form: the same bytes) plus, for I16, 8 bytes per chunk.
size_t stream_smem(const Int4View& M, bool i16) {
    return static_cast<size_t>(M.cols) * sizeof(__half) + (i16 ? static_cast<size_t>(M.cols / 32) * 8 : 0);
}

template <int R, int U, int W, int WPS, int MINW = 16, bool I16 = false>
void launch_stream(float* y, const Int4View& M, const __half* x, cudaStream_t stream) {
    const size_t smem = stream_smem(M, I16);
    if (smem > kStreamMaxSmem) {  // very wide rows: the legacy kernel reads x from global memory
        launch_legacy<2, 4, 8, 1>(y, M, x, stream);
        return;
    }
    launch_pdl(gemv_int4_stream_kernel<R, U, W, WPS, MINW, GemvEpilogue::Store, I16>,
               dim3(persistent_blocks(ceil_div(M.rows, R), W, WPS)), dim3(W * 32), smem, stream, y, M.qweight,
               M.scales, M.zeros, x, M.rows, M.cols, chunk_shift(M.group), GemvEpi{});
}

// "auto" (variant 34, the default before 35): the i16 kernel where it pays, the fp16-dot kernel elsewhere. The i16
// kernel converts x once per block (cols / 8 pieces of ~90 instructions over the block's threads) and then spends ~25%
// fewer instructions per item (583 instead of 779 at R2 U4); the conversion is amortised when every warp of the
// persistent grid (at most WPS warps per SM) takes at least two tiles of R rows. With about one tile per warp (the
// 4096-row o and down projections of the 7B shape on 132 SMs) it costs more than it saves. H200, 16 launches back to
// back, % of 4.2 TB/s, i16 / fp16 dot: qkv 66.6 / 66.0, gate+up 74.5 / 70.0, o 41.0 / 42.1, down 54.6 / 59.5 (docs/
// measurements.md, ninth session).
bool i16_pays(const Int4View& M, int R, int WPS) {
    return static_cast<int64_t>(ceil_div(M.rows, R)) >= int64_t{2} * sm_count() * WPS;
}

// The kernels of the "auto" rules (8 warps per block, at most 16 per SM; the fused epilogues run the same shapes):
// the fp16 dot at R2 U4 (variant 5), the i16 dot at R2 U4 (30) or at R4 U2 (31: four rows share each piece of x read
// from shared memory, two chunks per row in flight). "auto" (34) takes the i16 dot where it pays (above); "auto R4"
// (35, the compiled default) first takes R4 U2 where every warp gets at least two tiles of 4 rows (the 22016-row
// gate+up of the 7B shape: 77.5-78.0% against 73.7-74.3% at R2 U4, 16 launches back to back, twelfth session). On the
// 12288-row qkv R4 U2 measured 61% against 66% (1.45 tiles of 4 rows per warp: the last round is half empty).
constexpr int kAutoW = 8, kAutoWPS = 16, kAutoMINW = 16;
enum class StreamKind { Fp16R2, I16R2, I16R4 };
StreamKind auto_kind(const Int4View& M, bool r4) {
    if (r4 && i16_pays(M, 4, kAutoWPS)) return StreamKind::I16R4;
    return i16_pays(M, 2, kAutoWPS) ? StreamKind::I16R2 : StreamKind::Fp16R2;
}
int kind_rows(StreamKind k) { return k == StreamKind::I16R4 ? 4 : 2; }

template <bool R4>
void launch_stream_auto(float* y, const Int4View& M, const __half* x, cudaStream_t stream) {
    constexpr int W = kAutoW, WPS = kAutoWPS, MINW = kAutoMINW;
    switch (auto_kind(M, R4)) {
        case StreamKind::I16R4: return launch_stream<4, 2, W, WPS, MINW, true>(y, M, x, stream);
        case StreamKind::I16R2: return launch_stream<2, 4, W, WPS, MINW, true>(y, M, x, stream);
        case StreamKind::Fp16R2: return launch_stream<2, 4, W, WPS, MINW>(y, M, x, stream);
    }
}

// The fused epilogues (gemv_int4_scaled / _swiglu / _residual) run the kernels above in the form of
// gemv_int4_fused_variant(): R2 U4 with the fp16 dot (variant 5) or the i16 dot (30), or per matrix the rule of
// "auto" (34) or "auto R4" (35, the compiled default). No legacy fall-back: the launchers require x in shared memory
// (gemv_int4_fused_available).
StreamKind fused_kind(const Int4View& M);  // the kernel of the fused launch on M (below)
size_t fused_smem(const Int4View& M, StreamKind k) { return stream_smem(M, k != StreamKind::Fp16R2); }
int fused_blocks(const Int4View& M, StreamKind k) {
    return persistent_blocks(ceil_div(M.rows, kind_rows(k)), kAutoW, kAutoWPS);
}
// x (dynamic) plus the epilogue's static shared memory (block_sum_fixed, the last-block flag) within 48 KB.
bool fused_fits(const Int4View& M) { return fused_smem(M, fused_kind(M)) + 256 <= kStreamMaxSmem; }

template <GemvEpilogue E>
void launch_fused(float* y, const Int4View& M, const __half* x, const GemvEpi& e, cudaStream_t stream) {
    constexpr int W = kAutoW, WPS = kAutoWPS, MINW = kAutoMINW;
    const StreamKind k = fused_kind(M);
    auto go = [&](auto kernel) {
        launch_pdl(kernel, dim3(fused_blocks(M, k)), dim3(W * 32), fused_smem(M, k), stream, y, M.qweight, M.scales,
                   M.zeros, x, M.rows, M.cols, chunk_shift(M.group), e);
    };
    switch (k) {
        case StreamKind::I16R4: return go(gemv_int4_stream_kernel<4, 2, W, WPS, MINW, E, true>);
        case StreamKind::I16R2: return go(gemv_int4_stream_kernel<2, 4, W, WPS, MINW, E, true>);
        case StreamKind::Fp16R2: return go(gemv_int4_stream_kernel<2, 4, W, WPS, MINW, E>);
    }
}

constexpr int kAsyncMaxSmem = 100 * 1024;  // per block: x + the warps' rings

// P pipeline stages (P - 1 items in flight per warp), at most WPS warps per SM.
template <int R, int U, int W, int P, int WPS>
void launch_async(float* y, const Int4View& M, const __half* x, cudaStream_t stream) {
    const size_t smem = static_cast<size_t>(M.cols) * sizeof(__half) + static_cast<size_t>(W) * P * U * R * 512;
    if (smem > kAsyncMaxSmem) {
        launch_stream<2, 4, 4, 16>(y, M, x, stream);
        return;
    }
    const auto kernel = gemv_int4_async_kernel<R, U, W, P>;
    if (smem > 48 * 1024) {
        // Opt in once per device and thread (a host-side attribute of the function: no stream work, capture-safe;
        // not per launch, whose host time would show between the benchmark's events).
        thread_local uint64_t opted_in = 0;  // bit d: done on device d
        int dev = 0;
        CUDA_CHECK(cudaGetDevice(&dev));
        if (dev >= 64 || !((opted_in >> dev) & 1u)) {
            CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kAsyncMaxSmem));
            if (dev < 64) opted_in |= uint64_t{1} << dev;
        }
    }
    launch_pdl(kernel, dim3(persistent_blocks(ceil_div(M.rows, R), W, WPS)), dim3(W * 32), smem, stream, y,
               M.qweight, M.scales, M.zeros, x, M.rows, M.cols, chunk_shift(M.group));
}

// R rows per tile, ACC products per fp16 partial sum, W warps per block, at most WPS warps per SM, registers capped
// for MINW resident warps per SM. S (chunks per segment) follows the group. x takes items 8 KB of shared memory per
// block (cols * 2 rounded up to whole items); beyond 48 KB (cols > 24576) the legacy kernel takes over.
template <int R, int ACC, int W, int WPS, int MINW = WPS>
void launch_seg(float* y, const Int4View& M, const __half* x, cudaStream_t stream) {
    const int cpg_shift = chunk_shift(M.group), sshift = int4_segment_shift(M.group);
    const int nseg = (M.cols / 32) >> sshift, items = ceil_div(ceil_div(nseg, 32), 4 >> sshift);
    const size_t smem = static_cast<size_t>(items) * 8192;
    if (smem > kStreamMaxSmem) {
        launch_legacy<2, 4, 8, 1>(y, M, x, stream);
        return;
    }
    const dim3 grid(persistent_blocks(ceil_div(M.rows, R), W, WPS)), block(W * 32);
    const int gshift = cpg_shift - sshift;  // log2(segments per group)
    if (sshift == 0)
        launch_pdl(gemv_int4_seg_kernel<R, 1, ACC, W, MINW>, grid, block, smem, stream, y, M.qweight, M.scales,
                   M.zeros, x, M.rows, M.cols, gshift);
    else if (sshift == 1)
        launch_pdl(gemv_int4_seg_kernel<R, 2, ACC, W, MINW>, grid, block, smem, stream, y, M.qweight, M.scales,
                   M.zeros, x, M.rows, M.cols, gshift);
    else
        launch_pdl(gemv_int4_seg_kernel<R, 4, ACC, W, MINW>, grid, block, smem, stream, y, M.qweight, M.scales,
                   M.zeros, x, M.rows, M.cols, gshift);
}

constexpr int kMmaMaxSmem = 224 * 1024;  // dynamic, per block (227 KB with the static part and some slack)
constexpr int kSmemPerSm = 228 * 1024;    // H100 / H200; each resident block also reserves 1 KB

// W warps per block, P ring stages per warp, at most WPS warps per SM (fewer when the shared memory does not fit
// them), registers capped for MINW warps per SM. Shared memory: x (nb 4 S rows of 33 pieces) + W P 4 KB of rings;
// beyond kMmaMaxSmem the legacy kernel takes over.
template <int W, int P, int WPS, int MINW = WPS>
void launch_mma(float* y, const Int4View& M, const __half* x, cudaStream_t stream) {
    const int cpg_shift = chunk_shift(M.group), sshift = int4_segment_shift(M.group);
    const int nseg = (M.cols / 32) >> sshift, nb = ceil_div(nseg, 32);
    const size_t smem = static_cast<size_t>(nb << (2 + sshift)) * kMmaXStride * 16 + static_cast<size_t>(W) * P * 4096;
    if (smem > static_cast<size_t>(kMmaMaxSmem) || static_cast<int64_t>(M.rows) * (M.cols / 32) >= (int64_t{1} << 31)) {
        launch_legacy<2, 4, 8, 1>(y, M, x, stream);  // very wide rows, or beyond the kernel's 32-bit offsets
        return;
    }
    const int fit = static_cast<int>(kSmemPerSm / (smem + 128 * W + 1024));  // + red[] + the reserved 1 KB
    const int per_sm = fit < WPS / W ? (fit > 0 ? fit : 1) : WPS / W;
    const int tiles = ceil_div(M.rows, 16);
    const int blocks = static_cast<int>(std::min<int64_t>(tiles, static_cast<int64_t>(sm_count()) * per_sm));
    const int gshift = cpg_shift - sshift;
    // Opt in to more than 48 KB, and ask for the largest shared-memory carveout (3 blocks of up to 75 KB per SM),
    // once per device, thread and kernel (host-side attributes: no stream work, capture-safe).
    thread_local uint64_t opted_in[3] = {0, 0, 0};
    auto go = [&](auto kernel) {
        int dev = 0;
        CUDA_CHECK(cudaGetDevice(&dev));
        if (dev >= 64 || !((opted_in[sshift] >> dev) & 1u)) {
            CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kMmaMaxSmem));
            CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                            cudaSharedmemCarveoutMaxShared));
            if (dev < 64) opted_in[sshift] |= uint64_t{1} << dev;
        }
        launch_pdl(kernel, dim3(blocks), dim3(W * 32), smem, stream, y, M.qweight, M.scales, M.zeros, x, M.rows,
                   M.cols, gshift);
    };
    if (sshift == 0)
        go(gemv_int4_mma_kernel<1, W, P, MINW>);
    else if (sshift == 1)
        go(gemv_int4_mma_kernel<2, W, P, MINW>);
    else
        go(gemv_int4_mma_kernel<4, W, P, MINW>);
}

struct Int4Variant {
    const char* name;
    Int4Launcher launch;
};

// Candidates for quest_kernel_bench; gemv_int4() runs kDefaultVariant unless QUEST_INT4_GEMV names another (see
// gemv_int4_default_variant). Names: "stream R U W S<WPS>" (above), "R U W KS" the legacy kernel (rows per warp,
// loads per row per batch, warps per block, warps per row), "seg R W S<WPS> A<ACC>" the seg kernel. Variant 1,
// legacy R2 U4 W8 KS1, was the default until the stream kernel (measured 33-51% of 4.2 TB/s; the stream kernel 33%
// isolated, 54% x16, Nsight Compute above the seg kernel). The seg (17..) and mma (25..) variants lost on the H200
// (docs/measurements.md, third session).
// Indices are what QUEST_INT4_GEMV takes: append, do not reorder.
const Int4Variant kVariants[] = {
    {"stream R2 U4 W4 S16", launch_stream<2, 4, 4, 16>},  // 4 KB per warp in flight, 16 warps/SM: 64 KB/SM
    {"R2 U4 W8 KS1", launch_legacy<2, 4, 8, 1>},           // the previous default
    {"stream R2 U4 W4 S8", launch_stream<2, 4, 4, 8>},     // half the SM left for the next kernel (PDL)
    {"stream R4 U2 W4 S16", launch_stream<4, 2, 4, 16>},   // half the x reads per code load
    {"stream R2 U8 W4 S8", launch_stream<2, 8, 4, 8, 8>},  // 8 KB per warp in flight, 8 warps/SM, ~200 registers
    {"stream R2 U4 W8 S16", launch_stream<2, 4, 8, 16>},   // x copied by 2 blocks per SM instead of 4
    {"stream R2 U4 W16 S16", launch_stream<2, 4, 16, 16>}, // one block per SM
    {"stream R2 U4 W8 S64", launch_stream<2, 4, 8, 64>},   // not persistent: ~one tile per warp (x in smem only)
    // "async R U W P<stages> S<warps per SM>": codes by cp.async into per-warp shared-memory rings.
    {"async R2 U2 W4 P5 S8", launch_async<2, 2, 4, 5, 8>},    // 4 x 2 KB in flight per warp, 8 warps/SM
    {"async R2 U2 W4 P4 S16", launch_async<2, 2, 4, 4, 16>},  // 3 x 2 KB in flight per warp, 16 warps/SM
    {"R1 U4 W8 KS1", launch_legacy<1, 4, 8, 1>},
    {"R4 U2 W8 KS1", launch_legacy<4, 2, 8, 1>},
    {"R2 U2 W8 KS2", launch_legacy<2, 2, 8, 2>},
    {"R1 U4 W8 KS4", launch_legacy<1, 4, 8, 4>},
    {"R2 U4 W4 KS1", launch_legacy<2, 4, 4, 1>},
    {"R4 U4 W4 KS1", launch_legacy<4, 4, 4, 1>},
    {"R1 U8 W8 KS2", launch_legacy<1, 8, 8, 2>},
    // 17..: the seg kernel, "seg R W S<warps per SM> A<products per fp16 sum> [M<register cap for M warps per SM>]"
    // (registers per thread at group 128, ptxas of CUDA 13.0 for sm_90; in flight: codes per SM, at most).
    {"seg R2 W8 S16 A16", launch_seg<2, 16, 8, 16>},         // 128 regs, 2 blocks/SM, 64 KB in flight
    {"seg R2 W8 S24 A16", launch_seg<2, 16, 8, 24>},         // 80 regs, 3 blocks/SM, 96 KB
    {"seg R2 W8 S16 A16 M24", launch_seg<2, 16, 8, 16, 24>}, // 80 regs at 16 warps/SM: a third of the RF free (PDL)
    {"seg R2 W8 S16 A8", launch_seg<2, 8, 8, 16>},           // 125 regs, the other kernels' fp16 sums of 8 products
    {"seg R1 W8 S32 A16", launch_seg<1, 16, 8, 32>},         // 64 regs, 32 warps/SM, x read per row
    {"seg R1 W8 S16 A16 M32", launch_seg<1, 16, 8, 16, 32>}, // 64 regs at 16 warps/SM: half the RF free (PDL)
    {"seg R2 W16 S16 A16", launch_seg<2, 16, 16, 16>},       // 128 regs, one block/SM: one copy of x per SM
    {"seg R2 W4 S24 A16", launch_seg<2, 16, 4, 24>},         // 80 regs, 6 blocks/SM: shorter block tails
    // 25..: the mma kernel, "mma W P<ring stages> S<warps per SM>" (P - 1 items of 4 KB in flight per warp; shared
    // memory per block W P 4 KB + x: 8.3 KB at 4096 columns, 24.8 KB at 11008).
    {"mma W4 P3 S12", launch_mma<4, 3, 12>},  // 86 regs, 3 blocks/SM, 96 KB in flight
    {"mma W8 P2 S16", launch_mma<8, 2, 16>},  // 78 regs, 2 blocks/SM, 64 KB
    {"mma W4 P4 S12", launch_mma<4, 4, 12>},  // 88 regs, 3 blocks/SM at 4096 columns (144 KB), 2 at 11008 (96 KB)
    {"mma W4 P2 S16", launch_mma<4, 2, 16>},  // 78 regs, 4 blocks/SM, 64 KB
    {"mma W8 P3 S16", launch_mma<8, 3, 16>},  // 80 regs, 2 blocks/SM at 4096 columns (128 KB), 1 at 11008 (64 KB)
    // 30..: the stream kernel with integer dot products (chunk_dot_i16: x as per-chunk int16, dp4a).
    {"stream R2 U4 W8 S16 i16", launch_stream<2, 4, 8, 16, 16, true>},
    {"stream R4 U2 W8 S16 i16", launch_stream<4, 2, 8, 16, 16, true>},
    {"stream R2 U4 W4 S16 i16", launch_stream<2, 4, 4, 16, 16, true>},
    {"stream R2 U4 W16 S16 i16", launch_stream<2, 4, 16, 16, 16, true>},
    // 34: variant 30 where each warp takes at least two tiles, variant 5 elsewhere (launch_stream_auto).
    {"stream R2 U4 W8 S16 auto", launch_stream_auto<false>},
    // 35: variant 31 where each warp takes at least two tiles of 4 rows, else as 34.
    {"stream R4 U2 / R2 U4 W8 S16 auto", launch_stream_auto<true>},
};

// The compiled default of gemv_int4() (an index into kVariants): "stream R4 U2 / R2 U4 W8 S16 auto"
// (launch_stream_auto<true>; twelfth session). Before it, 34 ("auto": i16 or fp16 at R2 U4; ninth session), and before
// that variant 5 ("stream R2 U4 W8 S16", the fp16 dot everywhere; H200, 7B shapes, third session: 16 launches back to
// back qkv 66.0%, o 41.2%, gate+up 68.5%, down 58.9% of 4.2 TB/s; variant 0: 65.5 / 39.7 / 67.8 / 54.6%, whole int4
// step 0.6-1.2% slower). The seg and mma kernels were slower (fewer instructions per weight, fewer bytes in flight).
constexpr int kDefaultVariant = 35;
// Variants whose kernels have the fused epilogues (launch_fused above: the same template arguments, per fused_kind).
constexpr int kFusedFp16 = 5, kFusedI16 = 30, kFusedAutoR2 = 34, kFusedAuto = 35;
static_assert(kAutoW == 8 && kAutoWPS == 16 && kAutoMINW == 16,
              "the auto rules and the fused epilogues run the kernels of variants 5 / 30 / 31 (W8 S16)");

void check_view(const Int4View& W, const char* who) {
    QUEST_REQUIRE(W.qweight && W.scales && W.zeros && W.rows > 0 && W.cols > 0, std::string(who) + ": bad arguments");
    QUEST_REQUIRE(W.group >= 32 && (W.group & (W.group - 1)) == 0 && W.cols % W.group == 0,
                  std::string(who) + ": the group must be a power of two >= 32 dividing cols");
    QUEST_REQUIRE(is_aligned(W.qweight, 16), std::string(who) + ": qweight must be 16-byte aligned");
}

__global__ void dequantize_int4_kernel(__half* __restrict__ out, const uint32_t* __restrict__ qw,
                                       const __half* __restrict__ sc, const uint8_t* __restrict__ zp, int rows,
                                       int cols, int cpg_shift) {
    const int chunks = cols >> 5, groups = chunks >> cpg_shift;
    const int sshift = cpg_shift < 2 ? cpg_shift : 2;
    const int64_t total = static_cast<int64_t>(rows) * chunks;
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int64_t row = i / chunks;
        const int c = static_cast<int>(i - row * chunks);
        // Logical chunk c of the row, at device slot int4_chunk_slot(c): 32 consecutive chunks of a row (from a
        // multiple of 32) are 32 / S segments of one batch, read as S runs of 32 / S consecutive slots (whole 128-byte
        // lines for S = 4); the output is written in order.
        const uint4 q = reinterpret_cast<const uint4*>(qw)[row * chunks + int4_chunk_slot(c, chunks, sshift)];
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

int gemv_int4_variant_count() { return static_cast<int>(sizeof(kVariants) / sizeof(kVariants[0])); }

int gemv_int4_parse_variant(const char* text) {
    if (!text || !*text) return -1;
    long v = 0;
    for (const char* p = text; *p; ++p) {
        if (*p < '0' || *p > '9' || v > 1000000) return -1;
        v = v * 10 + (*p - '0');
    }
    return v < gemv_int4_variant_count() ? static_cast<int>(v) : -1;
}

int gemv_int4_default_variant() {
    static const int chosen = [] {
        const char* env = std::getenv("QUEST_INT4_GEMV");
        const int v = gemv_int4_parse_variant(env);
        if (env && *env && v < 0)
            std::fprintf(stderr, "warning: QUEST_INT4_GEMV=%s is not a variant index (0..%d); using %d (%s)\n", env,
                         gemv_int4_variant_count() - 1, kDefaultVariant, kVariants[kDefaultVariant].name);
        return v >= 0 ? v : kDefaultVariant;
    }();
    return chosen;
}

void gemv_int4(float* y, const Int4View& W, const __half* x, cudaStream_t stream) {
    check_view(W, "gemv_int4");
    QUEST_REQUIRE(y && x && is_aligned(x, 16), "gemv_int4: y and a 16-byte aligned x are required");
    kVariants[gemv_int4_default_variant()].launch(y, W, x, stream);
}

const char* gemv_int4_variant_name(int v) { return kVariants[v].name; }

void gemv_int4_variant(int v, float* y, const Int4View& W, const __half* x, cudaStream_t stream) {
    QUEST_REQUIRE(v >= 0 && v < gemv_int4_variant_count(), "gemv_int4_variant: no such variant");
    check_view(W, "gemv_int4_variant");
    QUEST_REQUIRE(y && x && is_aligned(x, 16), "gemv_int4_variant: y and a 16-byte aligned x are required");
    kVariants[v].launch(y, W, x, stream);
}

// The fused kernels follow the default variant when it is one of theirs (so that QUEST_INT4_GEMV = 5 / 30 / 34 / 35
// compares whole fused steps), otherwise kFusedAuto (and the model does not use them: gemv_int4_fused_available).
int gemv_int4_fused_variant() {
    const int d = gemv_int4_default_variant();
    return d == kFusedFp16 || d == kFusedI16 || d == kFusedAutoR2 || d == kFusedAuto ? d : kFusedAuto;
}

namespace {
StreamKind fused_kind(const Int4View& M) {
    switch (gemv_int4_fused_variant()) {
        case kFusedFp16: return StreamKind::Fp16R2;
        case kFusedI16: return StreamKind::I16R2;
        case kFusedAutoR2: return auto_kind(M, false);
        default: return auto_kind(M, true);
    }
}
}  // namespace

bool gemv_int4_fused_available(const Int4View& W) {
    return gemv_int4_default_variant() == gemv_int4_fused_variant() && gemv_int4_fused_supported(W);
}

bool gemv_int4_fused_supported(const Int4View& W) {
    return W.valid() && W.group >= 32 && (W.group & (W.group - 1)) == 0 && W.cols > 0 && W.cols % W.group == 0 &&
           fused_fits(W);
}

namespace {
void check_fused(const Int4View& W, const __half* x, const NormScale* n, const char* who) {
    check_view(W, who);
    QUEST_REQUIRE(x && is_aligned(x, 16), std::string(who) + ": a 16-byte aligned input is required");
    QUEST_REQUIRE(fused_fits(W), std::string(who) + ": x does not fit in shared memory (cols too large)");
    if (n) QUEST_REQUIRE(n->partials && n->count > 0 && n->n > 0, std::string(who) + ": bad NormScale");
}
}  // namespace

void gemv_int4_scaled(float* y, const Int4View& W, const __half* xg, const NormScale& norm, cudaStream_t stream) {
    check_fused(W, xg, &norm, "gemv_int4_scaled");
    QUEST_REQUIRE(y, "gemv_int4_scaled: bad arguments");
    GemvEpi e;
    e.norm = norm;
    launch_fused<GemvEpilogue::Scale>(y, W, xg, e, stream);
}

void gemv_int4_swiglu(__half* act, const Int4View& W, const __half* xg, const NormScale& norm, cudaStream_t stream) {
    check_fused(W, xg, &norm, "gemv_int4_swiglu");
    QUEST_REQUIRE(act && W.rows % 2 == 0, "gemv_int4_swiglu: act and an even number of (interleaved) rows are required");
    GemvEpi e;
    e.norm = norm;
    e.act = act;
    launch_fused<GemvEpilogue::SwiGLU>(nullptr, W, xg, e, stream);
}

int gemv_int4_residual_partials(const Int4View& W) {
    QUEST_REQUIRE(W.rows > 0, "gemv_int4_residual_partials: bad arguments");
    return fused_blocks(W, fused_kind(W));
}

void gemv_int4_residual(const ResidualNorm& out, const Int4View& W, const __half* x, cudaStream_t stream) {
    check_fused(W, x, nullptr, "gemv_int4_residual");
    QUEST_REQUIRE(out.x && out.xg && out.g && out.partials,
                  "gemv_int4_residual: bad ResidualNorm");
    QUEST_REQUIRE(out.partials_capacity >= gemv_int4_residual_partials(W),
                  "gemv_int4_residual: partials_capacity < gemv_int4_residual_partials(W)");
    GemvEpi e;
    e.res = out;
    launch_fused<GemvEpilogue::Residual>(nullptr, W, x, e, stream);
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
