// Causal flash-attention (FlashAttention-2 style) for a prefill chunk over the paged fp16 KV cache.
//
// Tiling. A block of 4 warps (128 threads) owns BQ consecutive queries of one query head (grid: x = head, y = query
// tile, heaviest tiles first). Each warp owns 16 * MT query rows end to end (MT = 2 m16 tiles for D = 64 and 128,
// so BQ = 128; MT = 1 otherwise, BQ = 64): it computes S = Q K^T for its rows with tensor cores (mma.sync
// m16n8k16, fp16 inputs, fp32 accumulation), runs the online softmax on the accumulators in registers, re-packs P
// as fp16 A fragments (the C layout of two adjacent n8 tiles is exactly the A layout of one k16 step) and
// accumulates O += P V in fp32 registers. K/V tiles of BK keys (64; 32 for D = 256) stream through shared memory
// with cp.async, double buffered: the load of tile j+1 overlaps the compute of tile j. Fragments come from smem by
// ldmatrix (.trans for V); rows are padded by 16 bytes, so ldmatrix is bank-conflict free. Q lives in registers
// when it fits (D * MT <= 128), else it is re-read from smem for every tile. Scores are never materialised beyond
// one BK-wide register tile, so memory use does not depend on the context length.
//
// Causality. Key tiles are aligned to absolute positions (multiples of BK); a block visits only the tiles up to its
// last query's position, a warp skips the tiles that lie wholly past its own last row (and all tiles when its rows
// are past T), and only tiles that cross the warp's diagonal (or the end of the valid keys) pay for the mask. Keys
// past the block's last query (in particular the cache slack past pos0 + T) are never read: their smem rows are
// zero-filled, so garbage cannot leak, not even as 0 * NaN in P V. Since the tiles and their order do not depend on
// where a chunk starts, splitting a prompt into chunks gives bit-identical outputs.
//
// Numerics. Scores are scaled by scale * log2(e) so the softmax uses exp2 (ex2.approx.ftz, = exp2f under
// --use_fast_math). The running row max starts at -inf; the first tile always holds key 0, which every row sees,
// so the max is finite after it (the -inf guard is kept anyway). The row sums are kept per thread and reduced
// across the quad once at the end.
//
// head_dim D is a template constant (8, 16, 32, 64, 128, 256), dispatched once in the launcher. D = 8 is zero-padded
// to 16 along the QK^T reduction (the pad columns of the Q and K tiles are zeroed once and never written again).
//
// Resources (nvcc 13.0, sm_90, -Xptxas -v; no spills): registers D=8: 71, 16: 75, 32: 86, 64: 249, 128: 255,
// 256: 234 (the sliding-window instantiation, W = true, spills 92 bytes at D = 128); dynamic smem D=8/16: 12 KB, 32: 20 KB, 64: 54 KB, 128: 102 KB, 256: 99 KB (2 blocks/SM for D >= 64).
// H200, D = 128, 32 heads, T = 2048 at the end of a 32K context: ~3.0 ms, ~350 TFLOP/s.
#include "kernels/attention/attention_prefill.cuh"
#include "kernels/common/device_utils.cuh"

#include <cstdint>
#include <string>

namespace quest {

namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;

constexpr int ceil_div_c(int a, int b) { return (a + b - 1) / b; }

template <int D>
struct PrefillCfg {
    // m16 tiles per warp: two reuse every K/V fragment loaded from smem for 32 query rows (halves the ldmatrix
    // traffic per flop; +17% at D = 128 on an H200), at the price of twice the O accumulators. D = 256 keeps one:
    // its O accumulators alone would fill the register file.
    static constexpr int MT = (D == 64 || D == 128) ? 2 : 1;
    static constexpr int BQ = kWarps * 16 * MT;     // queries per block
    static constexpr int DP = D < 16 ? 16 : D;      // QK^T reduction width (D = 8 zero-padded to one k16 step)
    static constexpr int PITCH = DP + 8;            // halves per smem row: +16 B puts the 8 rows of an ldmatrix
                                                    // 8x8 matrix in 8 distinct 16-byte bank groups (no conflicts)
    static constexpr int BK = D >= 256 ? 32 : 64;   // keys per tile
    // Q fragments held in registers for the whole kernel (else re-read from smem for every key tile).
    static constexpr bool kQInRegs = D * MT <= 128;
    // Q in registers: its smem tile is only staging, aliased with K buffer 1 (free until the loop's first refill).
    static constexpr bool kQAlias = kQInRegs && BQ == BK;
    static constexpr int kSmemHalves = ((kQAlias ? 0 : BQ) + 4 * BK) * PITCH;  // [Q] + 2 x K + 2 x V
    static constexpr size_t kSmemBytes = size_t(kSmemHalves) * sizeof(__half);
};

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}


__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}
__device__ __forceinline__ void ldsm_x2_trans(uint32_t addr, uint32_t& r0, uint32_t& r1) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(r0), "=r"(r1)
                 : "r"(addr));
}

// c += a (16x16, row-major fragment) * b (16x8, column-major fragment); fp16 inputs, fp32 accumulation.
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// 2^x via ex2.approx.ftz (what exp2f becomes under --use_fast_math): one MUFU op, ~2 ulp, -inf -> +0. Results below
// 2^-126 flush to 0; they are far below fp16's smallest subnormal, so neither P nor the row sums can tell.
__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ uint32_t pack_half2(float lo, float hi) {
    const __half2 h = __floats2half2_rn(lo, hi);  // lo -> low 16 bits (the smaller column index)
    return *reinterpret_cast<const uint32_t*>(&h);
}

// Fragment ownership (PTX ISA, mma.m16n8k16): lane = 4 * g + c. Accumulator element e of an n8 tile sits at row
// g + 8 * (e >> 1), column 2 * c + (e & 1). Warp w owns block rows [w * 16 * MT, (w + 1) * 16 * MT); its m16 tile
// mt holds rows w * 16 * MT + mt * 16 + [0, 16).
// W: a sliding window (kv.window > 0) is applied; a separate instantiation, so that the full-attention kernel keeps
// its registers (the window's bounds cost spills at D = 128).
template <int D, bool W>
__global__ void __launch_bounds__(kThreads)
    attention_prefill_kernel(__half* __restrict__ out, const __half* __restrict__ q, const __half* __restrict__ kc,
                             const __half* __restrict__ vc, int T, int pos0, int num_heads, int group, int capacity,
                             float scale_log2, int window) {
    using C = PrefillCfg<D>;
    constexpr int MT = C::MT;
    constexpr int BQ = C::BQ;
    constexpr int DP = C::DP;
    constexpr int PITCH = C::PITCH;
    constexpr int BK = C::BK;
    constexpr int CHUNKS = D / 8;               // 16-byte chunks per row in global memory
    constexpr int LD_ROWS = kThreads / CHUNKS;  // rows copied per pass of the block
    static_assert(kThreads % CHUNKS == 0, "a pass must copy whole rows");
    constexpr int QK_STEPS = DP / 16;
    constexpr int S_TILES = BK / 8;  // n8 tiles of S per m16 tile
    constexpr int O_TILES = D / 8;   // n8 tiles of O per m16 tile

    extern __shared__ __align__(16) unsigned char smem_raw[];
    __half* sK = reinterpret_cast<__half*>(smem_raw) + (C::kQAlias ? 0 : BQ * PITCH);  // [2][BK][PITCH]
    __half* sV = sK + 2 * BK * PITCH;                                                 // [2][BK][PITCH]
    __half* sQ = C::kQAlias ? sK + BK * PITCH : reinterpret_cast<__half*>(smem_raw);  // [BQ][PITCH]

    const int h = blockIdx.x;
    const int q0 = (gridDim.y - 1 - blockIdx.y) * BQ;  // last (heaviest) query tiles are scheduled first
    const int q1 = min(q0 + BQ, T);
    const int kv_end = pos0 + q1;  // keys [0, kv_end) are visible to some query of this block
    const int n_tiles = (kv_end + BK - 1) / BK;
    // Sliding window: query p sees keys (p - window, p]; tiles below the block's first query's window are skipped
    // (for every row of the block they are wholly masked: skipping them is exact, and chunking stays bit-identical).
    const int j_first = W ? max(0, pos0 + q0 - window + 1) / BK : 0;
    const int kvh = h / group;

    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    const int g = lane >> 2;
    const int cq = lane & 3;
    const int warp_row0 = warp * 16 * MT;  // first block row of this warp

    const int64_t q_row_stride = int64_t(num_heads) * D;
    const __half* kbase = kc + int64_t(kvh) * capacity * D;
    const __half* vbase = vc + int64_t(kvh) * capacity * D;

    if constexpr (D < 16) {
        // Zero the pad columns [D, 16) of every Q and K row (the rows from the start of smem to the end of sK);
        // cp.async never writes them.
        __half* rows = reinterpret_cast<__half*>(smem_raw);
        for (int r = tid; r < (C::kQAlias ? 0 : BQ) + 2 * BK; r += kThreads)
            *reinterpret_cast<uint4*>(rows + r * PITCH + D) = make_uint4(0, 0, 0, 0);
    }

    // Global -> shared copies: thread tid moves 16-byte chunk (tid % CHUNKS) of rows tid / CHUNKS + i * LD_ROWS.
    const int ld_row = tid / CHUNKS;
    const int ld_col = (tid % CHUNKS) * 8;
    const uint32_t ld_dst = 2u * uint32_t(ld_row * PITCH + ld_col);  // byte offset inside a tile

    // Q tile: rows past T are zero-filled (never stored).
    {
        const __half* src = q + (int64_t(q0) + ld_row) * q_row_stride + int64_t(h) * D + ld_col;
        const uint32_t dst = smem_u32(sQ) + ld_dst;
#pragma unroll
        for (int i = 0; i < ceil_div_c(BQ, LD_ROWS); ++i) {
            if (BQ % LD_ROWS != 0 && ld_row + i * LD_ROWS >= BQ) break;
            const bool ok = q0 + ld_row + i * LD_ROWS < T;
            cp_async16(dst + 2u * (i * LD_ROWS * PITCH), ok ? src + int64_t(i) * LD_ROWS * q_row_stride : q,
                       ok ? 16 : 0);
        }
    }
    // K and V tile j into buffer buf: keys at or past kv_end (past the block's last query, e.g. the cache slack) are
    // zero-filled, never read.
    auto load_kv = [&](int j, int buf) {
        const int key0 = j * BK + ld_row;
        const int64_t off = int64_t(key0) * D + ld_col;
        const uint32_t dK = smem_u32(sK) + 2u * uint32_t(buf * BK * PITCH) + ld_dst;
        const uint32_t dV = smem_u32(sV) + 2u * uint32_t(buf * BK * PITCH) + ld_dst;
#pragma unroll
        for (int i = 0; i < ceil_div_c(BK, LD_ROWS); ++i) {
            if (BK % LD_ROWS != 0 && ld_row + i * LD_ROWS >= BK) break;
            const bool ok = key0 + i * LD_ROWS < kv_end;
            const int64_t o_i = ok ? off + int64_t(i) * LD_ROWS * D : 0;
            cp_async16(dK + 2u * (i * LD_ROWS * PITCH), kbase + o_i, ok ? 16 : 0);
            cp_async16(dV + 2u * (i * LD_ROWS * PITCH), vbase + o_i, ok ? 16 : 0);
        }
    };
    load_kv(j_first, 0);  // buffer 0: buffer 1 holds the aliased Q tile until the loop's first refill
    cp_async_commit();

    // Per-lane ldmatrix offsets (halves). Q (A operand, x4): matrices {rows 0-7, 8-15} x {cols 0-7, 8-15} in the
    // order a0..a3. K (B operand of S, x4): {keys 0-7: dims 0-7, 8-15}, {keys 8-15: dims 0-7, 8-15} = b0, b1 of two
    // n8 tiles. V (B operand of O, x4.trans): {dims 0-7: keys 0-7, 8-15}, {dims 8-15: keys 0-7, 8-15}.
    const int q_lane = (warp_row0 + (lane & 7) + ((lane >> 3) & 1) * 8) * PITCH + (lane >> 4) * 8;
    const int k_lane = ((lane & 7) + (lane >> 4) * 8) * PITCH + ((lane >> 3) & 1) * 8;
    const int v_lane = ((lane & 7) + ((lane >> 3) & 1) * 8) * PITCH + (D >= 16 ? (lane >> 4) * 8 : 0);
    const uint32_t sQ_u32 = smem_u32(sQ);
    const uint32_t sK_u32 = smem_u32(sK);
    const uint32_t sV_u32 = smem_u32(sV);

    // Causal limit of this thread's rows (g and g + 8 of each m16 tile) and of the warp's last row. Rows past T
    // get the limit kv_end - 1: they compute harmless finite values and are not stored.
    int lim[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int r = 0; r < 2; ++r) lim[mt][r] = min(pos0 + q0 + warp_row0 + mt * 16 + g + 8 * r, kv_end - 1);
    const int warp_lim = min(pos0 + q0 + warp_row0 + 16 * MT - 1, kv_end - 1);
    const int warp_diag = pos0 + q0 + warp_row0;     // tiles whose last key exceeds this need the mask
    // Window: row r sees keys > lim - window (no per-row array: registers are tight at D = 128); the warp's lowest
    // and highest such bounds decide which tiles are skipped and which are masked.
    const int warp_low_min = W ? warp_diag - window + 1 : 0;  // tiles wholly below it: skipped
    const int warp_low_max = W ? warp_lim - window + 1 : 0;   // tiles starting below it: masked
    const bool warp_active = q0 + warp_row0 < T;     // else all the warp's rows are padding

    float m[MT][2];  // running max of the scaled (log2-domain) scores
    float l[MT][2];  // this thread's share of the running sum of exp2
    float o[MT][O_TILES][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
        m[mt][0] = m[mt][1] = -INFINITY;
        l[mt][0] = l[mt][1] = 0.0f;
#pragma unroll
        for (int d = 0; d < O_TILES; ++d)
#pragma unroll
            for (int e = 0; e < 4; ++e) o[mt][d][e] = 0.0f;
    }
    uint32_t qf[C::kQInRegs ? MT : 1][C::kQInRegs ? QK_STEPS : 1][4];
    if constexpr (C::kQInRegs) {
        // Q (and K/V tile 0) landed: move the warp's Q rows to registers; when aliased, every warp must be done with
        // the staging tile before iteration 0 refills K buffer 1.
        cp_async_wait<0>();
        __syncthreads();
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int kd = 0; kd < QK_STEPS; ++kd)
                ldsm_x4(sQ_u32 + 2u * (q_lane + mt * 16 * PITCH + kd * 16), qf[mt][kd][0], qf[mt][kd][1],
                        qf[mt][kd][2], qf[mt][kd][3]);
        if constexpr (C::kQAlias) __syncthreads();
    }

    for (int j = j_first; j < n_tiles; ++j) {
        if (j + 1 < n_tiles) load_kv(j + 1, (j + 1 - j_first) & 1);
        cp_async_commit();   // possibly empty: keeps one group per iteration
        cp_async_wait<1>();  // everything but the newest group (tile j + 1) has landed
        __syncthreads();

        const int k0 = j * BK;
        // Warp-uniform: skip tiles wholly past the warp's last row (an exact no-op: P = 0, max unchanged).
        if (warp_active && k0 <= warp_lim && (!W || k0 + BK - 1 >= warp_low_min)) {
            const uint32_t tK = sK_u32 + 2u * (((j - j_first) & 1) * BK * PITCH + k_lane);
            const uint32_t tV = sV_u32 + 2u * (((j - j_first) & 1) * BK * PITCH + v_lane);

            // S = Q K^T (16 * MT x BK per warp); every K fragment feeds MT m16 tiles.
            float s[MT][S_TILES][4];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int n = 0; n < S_TILES; ++n)
#pragma unroll
                    for (int e = 0; e < 4; ++e) s[mt][n][e] = 0.0f;
#pragma unroll
            for (int kd = 0; kd < QK_STEPS; ++kd) {
                uint32_t a[MT][4];
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    if constexpr (C::kQInRegs) {
#pragma unroll
                        for (int i = 0; i < 4; ++i) a[mt][i] = qf[mt][kd][i];
                    } else {
                        ldsm_x4(sQ_u32 + 2u * (q_lane + mt * 16 * PITCH + kd * 16), a[mt][0], a[mt][1], a[mt][2],
                                a[mt][3]);
                    }
                }
#pragma unroll
                for (int np = 0; np < S_TILES / 2; ++np) {
                    uint32_t b0, b1, b2, b3;
                    ldsm_x4(tK + 2u * (np * 16 * PITCH + kd * 16), b0, b1, b2, b3);
#pragma unroll
                    for (int mt = 0; mt < MT; ++mt) {
                        mma_16816(s[mt][2 * np], a[mt], b0, b1);
                        mma_16816(s[mt][2 * np + 1], a[mt], b2, b3);
                    }
                }
            }

            // Scale into the log2 domain; mask keys past each row's causal limit (warp-uniform branch: only tiles
            // crossing the warp's diagonal or the end of the valid keys).
            const bool need_mask = k0 + BK - 1 > warp_diag || (W && k0 < warp_low_max);
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int n = 0; n < S_TILES; ++n)
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        s[mt][n][e] *= scale_log2;
                        const int key = k0 + n * 8 + 2 * cq + (e & 1);
                        if (need_mask && (key > lim[mt][e >> 1] || (W && key + window <= lim[mt][e >> 1])))
                            s[mt][n][e] = -INFINITY;
                    }

            // Online softmax: new row max (quad-reduced), rescale O and l, exponentiate in place.
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    float mx = -INFINITY;
#pragma unroll
                    for (int n = 0; n < S_TILES; ++n) mx = fmaxf(mx, fmaxf(s[mt][n][2 * r], s[mt][n][2 * r + 1]));
                    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                    const float m_new = fmaxf(m[mt][r], mx);
                    const float m_use = m_new == -INFINITY ? 0.0f : m_new;  // fully masked so far: avoid inf - inf
                    const float alpha = fast_exp2(m[mt][r] - m_use);
                    m[mt][r] = m_new;
                    l[mt][r] *= alpha;
#pragma unroll
                    for (int d = 0; d < O_TILES; ++d) {
                        o[mt][d][2 * r] *= alpha;
                        o[mt][d][2 * r + 1] *= alpha;
                    }
#pragma unroll
                    for (int n = 0; n < S_TILES; ++n) {
                        s[mt][n][2 * r] = fast_exp2(s[mt][n][2 * r] - m_use);
                        s[mt][n][2 * r + 1] = fast_exp2(s[mt][n][2 * r + 1] - m_use);
                        l[mt][r] += s[mt][n][2 * r] + s[mt][n][2 * r + 1];
                    }
                }

            // O += P V: P's accumulators of n8 tiles 2kk, 2kk+1 form the A fragment of the k16 step kk; every V
            // fragment feeds MT m16 tiles.
#pragma unroll
            for (int kk = 0; kk < BK / 16; ++kk) {
                uint32_t pa[MT][4];
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    pa[mt][0] = pack_half2(s[mt][2 * kk][0], s[mt][2 * kk][1]);
                    pa[mt][1] = pack_half2(s[mt][2 * kk][2], s[mt][2 * kk][3]);
                    pa[mt][2] = pack_half2(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
                    pa[mt][3] = pack_half2(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
                }
                if constexpr (D >= 16) {
#pragma unroll
                    for (int dp = 0; dp < D / 16; ++dp) {
                        uint32_t b0, b1, b2, b3;
                        ldsm_x4_trans(tV + 2u * (kk * 16 * PITCH + dp * 16), b0, b1, b2, b3);
#pragma unroll
                        for (int mt = 0; mt < MT; ++mt) {
                            mma_16816(o[mt][2 * dp], pa[mt], b0, b1);
                            mma_16816(o[mt][2 * dp + 1], pa[mt], b2, b3);
                        }
                    }
                } else {
                    uint32_t b0, b1;
                    ldsm_x2_trans(tV + 2u * (kk * 16 * PITCH), b0, b1);
#pragma unroll
                    for (int mt = 0; mt < MT; ++mt) mma_16816(o[mt][0], pa[mt], b0, b1);
                }
            }
        }
        __syncthreads();  // every warp is done with buffer j & 1 before iteration j + 1 refills it
    }

    // Epilogue: quad-reduce the row sums, normalise, store fp16 (rows past T are not stored).
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            float sum = l[mt][r];
            sum += __shfl_xor_sync(0xffffffffu, sum, 1);
            sum += __shfl_xor_sync(0xffffffffu, sum, 2);
            const int t = q0 + warp_row0 + mt * 16 + g + 8 * r;
            if (t < T) {
                const float inv = 1.0f / sum;  // sum >= 1: the row's max contributes exp2(0)
                __half* dst = out + int64_t(t) * q_row_stride + int64_t(h) * D + 2 * cq;
#pragma unroll
                for (int d = 0; d < O_TILES; ++d)
                    *reinterpret_cast<__half2*>(dst + d * 8) =
                        __floats2half2_rn(o[mt][d][2 * r] * inv, o[mt][d][2 * r + 1] * inv);
            }
        }
}

template <int D, bool W>
void launch_prefill(__half* out, const __half* q, const KvLayerView& kv, int T, int pos0, int num_heads, float scale,
                    cudaStream_t stream) {
    using C = PrefillCfg<D>;
    const auto kernel = attention_prefill_kernel<D, W>;
    constexpr size_t smem = C::kSmemBytes;
    if constexpr (smem > 48 * 1024) {
        CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    }
    if constexpr (smem > 32 * 1024) {
        // Let the driver give the L1/shared split to shared memory, for as many resident blocks as registers allow.
        CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                        int(cudaSharedmemCarveoutMaxShared)));
    }
    const float log2e = 1.4426950408889634f;
    const dim3 grid(unsigned(num_heads), unsigned(ceil_div(T, C::BQ)));
    kernel<<<grid, kThreads, smem, stream>>>(out, q, kv.k, kv.v, T, pos0, num_heads, num_heads / kv.num_kv_heads,
                                             kv.capacity, scale * log2e, kv.window);
    CUDA_CHECK_LAUNCH();
}

}  // namespace

void attention_prefill(__half* out, const __half* q, const KvLayerView& kv, int T, int pos0, int num_heads, float scale,
                       cudaStream_t stream) {
    QUEST_REQUIRE(out != nullptr && q != nullptr && kv.k != nullptr && kv.v != nullptr,
                  "attention_prefill: null pointer (out, q, kv.k or kv.v)");
    QUEST_REQUIRE(is_aligned(out, 16) && is_aligned(q, 16) && is_aligned(kv.k, 16) && is_aligned(kv.v, 16),
                  "attention_prefill: out, q, kv.k and kv.v must be 16-byte aligned (16-byte vector loads)");
    QUEST_REQUIRE(T >= 1, "attention_prefill: T = " + std::to_string(T) + ", need at least one query");
    QUEST_REQUIRE(T <= 65535 * 64, "attention_prefill: T = " + std::to_string(T) + " exceeds the grid limit");
    QUEST_REQUIRE(pos0 >= 0, "attention_prefill: pos0 = " + std::to_string(pos0) + " is negative");
    QUEST_REQUIRE(int64_t(pos0) + T <= kv.capacity, "attention_prefill: pos0 + T = " +
                                                        std::to_string(int64_t(pos0) + T) + " exceeds the capacity " +
                                                        std::to_string(kv.capacity));
    QUEST_REQUIRE(num_heads >= 1 && kv.num_kv_heads >= 1 && num_heads % kv.num_kv_heads == 0,
                  "attention_prefill: num_heads = " + std::to_string(num_heads) +
                      " must be a positive multiple of num_kv_heads = " + std::to_string(kv.num_kv_heads));
    with_head_dim(kv.head_dim, "attention_prefill", [&](auto d) {
        // A window no shorter than the sequence changes nothing: the full-attention kernel.
        if (kv.window > 0 && kv.window < pos0 + T)
            launch_prefill<decltype(d)::value, true>(out, q, kv, T, pos0, num_heads, scale, stream);
        else
            launch_prefill<decltype(d)::value, false>(out, q, kv, T, pos0, num_heads, scale, stream);
    });
}

}  // namespace quest
