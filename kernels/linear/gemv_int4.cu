#include <algorithm>
#include <cstdint>

#include "kernels/linear/gemv_int4.cuh"
#include "kernels/linear/gemv_int4_kernels.cuh"
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

// The block-per-rows kernel, for rows too wide for x in shared memory (launch_wide). A "chunk" is 32 columns of a
// row: one 16-byte load of codes, inside one group (group >= 32). A block of W warps
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
// The stream kernel: a persistent grid of warps that each stream many rows with loads always in flight.
//
// Why (the block-per-rows kernel above is far slower, docs/performance.md): a 4096-column int4 row is only 2 KB, so with
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
// 48 KB (cols > 24576) the launcher falls back to the block-per-rows kernel.
//
// Grid: at most WPS warps per SM (WPS / W blocks per SM). __launch_bounds__ asks for MINW resident warps per SM:
// MINW = 16 caps the registers at 128 per thread.
// Arithmetic per chunk: chunk_dot, the same as the block-per-rows kernel (numerics contract of kernels/linear/gemv_int4.cuh
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
// I16 (the "i16" kernels): x in the integer form of x_to_i16 (the same shared bytes plus 8 per chunk), each chunk
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
// Launchers

// log2(group / 32): chunks per group as a shift.
int chunk_shift(int group) {
    int s = 0;
    while ((32 << s) < group) ++s;
    return s;
}

// Rows too wide for x in shared memory: the block-per-rows kernel above (2 rows per warp, 4 loads in flight per
// row, 8 warps per block, one warp per row), x from global memory.
void launch_wide(float* y, const Int4View& M, const __half* x, cudaStream_t stream) {
    constexpr int R = 2, U = 4, W = 8, KS = 1;
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

// The stream kernels of the auto rule, plain and fused: 8 warps per block, at most 16 warps per SM (registers capped
// for 16), the fp16 or the i16 dot on tiles of 2 rows with 4 chunks per row in flight, or the i16 dot on tiles of 4
// rows with 2 chunks per row in flight (four rows share each piece of x read from shared memory).
constexpr int kAutoW = 8, kAutoWPS = 16, kAutoMINW = 16;

// The i16 kernel converts x once per block (cols / 8 pieces of ~90 instructions over the block's threads) and then
// spends about a quarter fewer instructions per item than the fp16 dot; the conversion is paid back when every warp
// of the persistent grid (at most WPS warps per SM) takes at least two tiles of R rows. With about one tile per warp
// (the 4096-row o and down projections of the 7B shape on 132 SMs) it costs more than it saves (docs/performance.md).
bool i16_pays(const Int4View& M, int R, int WPS) {
    return static_cast<int64_t>(ceil_div(M.rows, R)) >= int64_t{2} * sm_count() * WPS;
}

// The auto rule: the i16 dot on 4-row tiles where every warp gets at least two of them (the 22016-row gate+up of the
// 7B shape), else on 2-row tiles where every warp gets at least two of those (the 12288-row qkv, where 4-row tiles
// leave the last round half empty), else the fp16 dot.
Int4Kernel auto_kind(const Int4View& M) {
    if (i16_pays(M, 4, kAutoWPS)) return Int4Kernel::I16R4;
    return i16_pays(M, 2, kAutoWPS) ? Int4Kernel::I16R2 : Int4Kernel::Fp16R2;
}
int kind_rows(Int4Kernel k) { return k == Int4Kernel::I16R4 ? 4 : 2; }

template <int R, int U, bool I16>
void launch_stream(float* y, const Int4View& M, const __half* x, cudaStream_t stream) {
    constexpr int W = kAutoW, WPS = kAutoWPS, MINW = kAutoMINW;
    const size_t smem = stream_smem(M, I16);
    if (smem > kStreamMaxSmem) {  // very wide rows: x from global memory
        launch_wide(y, M, x, stream);
        return;
    }
    launch_pdl(gemv_int4_stream_kernel<R, U, W, WPS, MINW, GemvEpilogue::Store, I16>,
               dim3(persistent_blocks(ceil_div(M.rows, R), W, WPS)), dim3(W * 32), smem, stream, y, M.qweight,
               M.scales, M.zeros, x, M.rows, M.cols, chunk_shift(M.group), GemvEpi{});
}

void launch_kernel(Int4Kernel k, float* y, const Int4View& M, const __half* x, cudaStream_t stream) {
    switch (k) {
        case Int4Kernel::I16R4: return launch_stream<4, 2, true>(y, M, x, stream);
        case Int4Kernel::I16R2: return launch_stream<2, 4, true>(y, M, x, stream);
        case Int4Kernel::Fp16R2: return launch_stream<2, 4, false>(y, M, x, stream);
        case Int4Kernel::Wide: return launch_wide(y, M, x, stream);
    }
}

// The fused epilogues (gemv_int4_scaled / _swiglu / _residual) run the kernel of the auto rule on M with their
// epilogue. No wide fall-back: they require x in shared memory (gemv_int4_fused_supported).
size_t fused_smem(const Int4View& M, Int4Kernel k) { return stream_smem(M, k != Int4Kernel::Fp16R2); }
int fused_blocks(const Int4View& M, Int4Kernel k) {
    return persistent_blocks(ceil_div(M.rows, kind_rows(k)), kAutoW, kAutoWPS);
}
// x (dynamic) plus the epilogue's static shared memory (block_sum_fixed, the last-block flag) within 48 KB.
bool fused_fits(const Int4View& M) { return fused_smem(M, auto_kind(M)) + 256 <= kStreamMaxSmem; }

template <GemvEpilogue E>
void launch_fused(float* y, const Int4View& M, const __half* x, const GemvEpi& e, cudaStream_t stream) {
    constexpr int W = kAutoW, WPS = kAutoWPS, MINW = kAutoMINW;
    const Int4Kernel k = auto_kind(M);
    auto go = [&](auto kernel) {
        launch_pdl(kernel, dim3(fused_blocks(M, k)), dim3(W * 32), fused_smem(M, k), stream, y, M.qweight, M.scales,
                   M.zeros, x, M.rows, M.cols, chunk_shift(M.group), e);
    };
    switch (k) {
        case Int4Kernel::I16R4: return go(gemv_int4_stream_kernel<4, 2, W, WPS, MINW, E, true>);
        case Int4Kernel::I16R2: return go(gemv_int4_stream_kernel<2, 4, W, WPS, MINW, E, true>);
        case Int4Kernel::Fp16R2: return go(gemv_int4_stream_kernel<2, 4, W, WPS, MINW, E>);
        case Int4Kernel::Wide: break;  // auto_kind never picks it
    }
}

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

void gemv_int4(float* y, const Int4View& W, const __half* x, cudaStream_t stream) {
    check_view(W, "gemv_int4");
    QUEST_REQUIRE(y && x && is_aligned(x, 16), "gemv_int4: y and a 16-byte aligned x are required");
    launch_kernel(auto_kind(W), y, W, x, stream);
}

const char* gemv_int4_kernel_name(Int4Kernel k) {
    switch (k) {
        case Int4Kernel::Fp16R2: return "stream R2 U4 W8 S16";
        case Int4Kernel::I16R2: return "stream R2 U4 W8 S16 i16";
        case Int4Kernel::I16R4: return "stream R4 U2 W8 S16 i16";
        case Int4Kernel::Wide: return "wide R2 U4 W8";
    }
    return "?";
}

Int4Kernel gemv_int4_kernel_for(const Int4View& W) {
    const Int4Kernel k = auto_kind(W);
    return stream_smem(W, k != Int4Kernel::Fp16R2) > kStreamMaxSmem ? Int4Kernel::Wide : k;
}

void gemv_int4_run(Int4Kernel k, float* y, const Int4View& W, const __half* x, cudaStream_t stream) {
    check_view(W, "gemv_int4_run");
    QUEST_REQUIRE(y && x && is_aligned(x, 16), "gemv_int4_run: y and a 16-byte aligned x are required");
    launch_kernel(k, y, W, x, stream);
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
    return fused_blocks(W, auto_kind(W));
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
