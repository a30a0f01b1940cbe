#pragma once
// The exact top-k select of one selection row on the device: topk_select_row (any row length, keys in shared memory
// or re-read from L2) and topk_select_row_reg (keys in registers, rows up to kTopkThreads * kTopkRegMaxKpt). The
// top-k kernel (topk.cu) runs them, and so does the tail of the fused scoring kernel (quest.cu).
#include <cstdint>

#include "kernels/select/quest_common.cuh"

namespace quest {

namespace {

// ---------------------------------------------------------------------------------------------------------------------
// Top-k
//
// One block (512 threads) per selection row; an exact radix select on the order-preserving uint32 image of the scores.
// A first pass loads the keys (into shared memory when the row has at most kTopkCacheMax candidates; beyond, later
// passes re-read them from global memory / L2) and reduces their min and max: the bits above the highest bit where min
// and max differ are common to every key, so the digit passes start there, 11 bits at a time, with a 2048-bin shared
// histogram of the keys that match the digits chosen so far (one atomic per key; a warp whose keys all fall in one bin,
// e.g. exact ties, adds once); one warp finds the bin holding the K-1-th largest key (find_threshold_bin). A pass stops
// the search early when that bin is taken whole. Then, with the threshold T (masked to the resolved bits) and `need` =
// how many keys equal to T to take, a stable compaction in index order writes every key > T and the first `need` keys
// == T (lowest page ids) at their ascending-order positions (an exclusive block scan of packed (greater, equal)
// counts). No page cap. That is topk_select_row: any row length (the fused kernel's select beyond 2,048 candidates).
// quest_top_k runs topk_select_row_reg (below) when the row stride is at most 8192 (128K tokens at S = 16): the same
// select with the keys in registers and fewer dependent steps (faster on the critical path of a graph of Quest
// layers: docs/performance.md); so does the fused kernel up to 2,048.
// ---------------------------------------------------------------------------------------------------------------------
constexpr int kTopkThreads = 512;
constexpr int kTopkWarps = kTopkThreads / 32;
constexpr int kTopkBins = 2048;
constexpr int kTopkCacheMax = 32768;  // keys cached in dynamic shared memory (128 KB)
constexpr int kTopkUnroll = 8;        // independent key loads in flight per thread
constexpr int kTopkPerThread = 4;     // compaction: contiguous keys per thread per round

__device__ __forceinline__ uint32_t float_key(float f) {
    uint32_t u = __float_as_uint(f);
    if (f == 0.0f) u = 0u;  // -0 ties with +0, as in the reference's comparisons
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// A score load through L2 (ld.global.cg), ordered by the compiler with the fences and barriers around it (volatile,
// memory clobber; the __ldcg intrinsic's asm is neither): the fused kernel reads scores other blocks wrote.
__device__ __forceinline__ float ld_score(const float* p) {
    float r;
    asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(r) : "l"(p) : "memory");
    return r;
}

// Inclusive prefix sum over the lanes of a warp (every lane calls it).
__device__ __forceinline__ int warp_inclusive_scan(int v) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, v, o);
        if (lane >= o) v += y;
    }
    return v;
}

// Exclusive prefix sum over the block (THREADS threads) in thread order; `total` gets the block sum.
template <int THREADS>
__device__ __forceinline__ int block_exclusive_scan(int v, int* s_warp, int& total) {
    constexpr int WARPS = THREADS / 32;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int x = warp_inclusive_scan(v);
    if (lane == 31) s_warp[warp] = x;
    __syncthreads();
    if (warp == 0) {
        const int w = warp_inclusive_scan(lane < WARPS ? s_warp[lane] : 0);
        if (lane < WARPS) s_warp[lane] = w;
    }
    __syncthreads();
    const int before = (warp ? s_warp[warp - 1] : 0) + x - v;
    total = s_warp[WARPS - 1];
    __syncthreads();  // s_warp is free for the next scan
    return before;
}

// The block's smallest and largest key (THREADS threads; every thread passes its own and gets the block's; one
// barrier). s_mn / s_mx: [THREADS / 32].
template <int THREADS>
__device__ __forceinline__ void block_key_range(uint32_t& kmn, uint32_t& kmx, uint32_t* s_mn, uint32_t* s_mx) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    kmn = __reduce_min_sync(0xffffffffu, kmn);
    kmx = __reduce_max_sync(0xffffffffu, kmx);
    if (lane == 0) {
        s_mn[warp] = kmn;
        s_mx[warp] = kmx;
    }
    __syncthreads();
#pragma unroll
    for (int w = 0; w < THREADS / 32; ++w) {
        kmn = min(kmn, s_mn[w]);
        kmx = max(kmx, s_mx[w]);
    }
}

// State of a radix select of the k largest keys. Invariant: they are the keys whose masked value (key & pmask) is
// > prefix, plus krem of those whose masked value == prefix; bits [lo, 32) are resolved. It starts below the bits
// common to every key (those above the highest bit where the smallest and largest key differ).
struct RadixSelect {
    uint32_t prefix, pmask;
    int krem, lo;

    __device__ __forceinline__ RadixSelect(uint32_t kmn, uint32_t kmx, int k) : krem(k) {
        const uint32_t diff = kmn ^ kmx;
        if (diff == 0u) {  // every key is equal
            prefix = kmx;
            pmask = 0xFFFFFFFFu;
            lo = 0;
        } else {
            const int hb = 31 - __clz(diff);
            pmask = hb == 31 ? 0u : ~((2u << hb) - 1u);
            prefix = kmx & pmask;
            lo = hb + 1;
        }
    }
    __device__ __forceinline__ bool matches(uint32_t key) const { return (key & pmask) == prefix; }
    // The next digit's width and shift for digits of at most `bits` bits.
    __device__ __forceinline__ int width(int bits) const { return min(bits, lo); }
    // Digit d (of `width` bits below lo) holds the krem-th largest matching key, `above` matching keys lie in higher
    // digits.
    __device__ __forceinline__ void take(int d, int width, int above) {
        lo -= width;
        prefix |= static_cast<uint32_t>(d) << lo;
        pmask |= ((1u << width) - 1u) << lo;
        krem -= above;
    }
};

// One histogram count per key of the warp; bin < 0: this lane has no key. Every lane of the warp calls it.
__device__ __forceinline__ void hist_add(int* hist, int bin) {
    // A warp whose keys all fall in one bin (ties) adds once; otherwise one atomic per key.
    const int bin0 = __shfl_sync(0xffffffffu, bin, 0);
    if (__all_sync(0xffffffffu, bin == bin0)) {
        if ((threadIdx.x & 31) == 0 && bin0 >= 0) atomicAdd(&hist[bin0], 32);
    } else if (bin >= 0) {
        atomicAdd(&hist[bin], 1);
    }
}

// The bin of a BINS-bin histogram (a higher bin = larger keys) that holds the krem-th largest counted key, found by
// the whole block (THREADS threads) without a block scan: warp w owns the J = BINS / THREADS rows of 32 bins below
// hi = BINS - 32 J w, lane l reads bins hi - 1 - 32 j - l (consecutive lanes, consecutive words: conflict-free); each
// warp's total goes to shared memory, every warp scans the totals, and only the warp holding the crossing resolves
// it (row sums by REDUX, then one shuffle scan). Every thread calls it after the barrier that ends the counting;
// after_reads() runs in every thread once all have read the histogram (e.g. clears it for the next pass). Ends with
// a barrier; then sel[0] = the bin, sel[1] = counted keys in higher bins, sel[2] = keys in the bin. s_wtot:
// [THREADS / 32]. Requires 1 <= krem <= the counted keys.
template <int THREADS, int BINS, class F>
__device__ __forceinline__ void find_threshold_bin(const int* hist, int krem, int* s_wtot, int* sel, F&& after_reads) {
    constexpr int WARPS = THREADS / 32, J = BINS / THREADS;
    static_assert(BINS % THREADS == 0 && WARPS <= 32, "histogram shape");
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int hi = BINS - warp * 32 * J;
    int c[J], lsum = 0;
#pragma unroll
    for (int j = 0; j < J; ++j) {
        c[j] = hist[hi - 1 - 32 * j - lane];
        lsum += c[j];
    }
    const int wt = __reduce_add_sync(0xffffffffu, lsum);
    if (lane == 0) s_wtot[warp] = wt;
    __syncthreads();
    after_reads();
    const int v = lane < WARPS ? s_wtot[lane] : 0;
    const int incl = warp_inclusive_scan(v);
    const int wstar = __ffs(__ballot_sync(0xffffffffu, lane < WARPS && incl >= krem)) - 1;
    if (warp == wstar) {
        int run = __shfl_sync(0xffffffffu, incl - v, wstar);  // counted keys in higher warps' bins
        int row[J];
#pragma unroll
        for (int j = 0; j < J; ++j) row[j] = __reduce_add_sync(0xffffffffu, c[j]);
        int x = 0, jstar = -1;  // the row of 32 bins holding the crossing (warp-uniform) and my bin in it
#pragma unroll
        for (int j = 0; j < J; ++j) {
            if (jstar < 0 && run + row[j] >= krem) {
                jstar = j;
                x = c[j];
            } else if (jstar < 0) {
                run += row[j];
            }
        }
        const int xi = warp_inclusive_scan(x);
        if (run + xi - x < krem && run + xi >= krem) {
            sel[0] = hi - 1 - 32 * jstar - lane;
            sel[1] = run + xi - x;
            sel[2] = x;
        }
    }
    __syncthreads();
}

// Shared memory of one block's radix select (see topk_select_row).
struct TopkSmem {
    uint32_t* cache;  // [n] keys, or nullptr: every pass re-reads the scores from global memory (L2)
    int* hist;        // [kTopkBins]
    int* warp;        // [32]: warp totals (find_threshold_bin), then the compaction's scan
    uint32_t* mn;     // [THREADS / 32]
    uint32_t* mx;     // [THREADS / 32]
    int* sel;         // [3]: find_threshold_bin's result
};

// One selection row, the whole block (THREADS threads) cooperating: writes out[0 .. k) = the indices of the k largest
// of in[0 .. n) (ties: lower index), ascending. Requires 1 <= k < n. The scores are read with ld.global.cg (L2, never
// the non-coherent read-only path), so they may have been written by other blocks of the same grid (after a fence).
// Ends with a block barrier: the shared memory may be reused at once. pre (optional): the scores of the first round,
// in[u * THREADS + tid] for u < kTopkUnroll, already loaded by the caller (any value where the index is >= n).
template <int THREADS>
__device__ void topk_select_row(int* __restrict__ out, const float* in, int n, int k, const TopkSmem& sm,
                                const float* pre = nullptr) {
    constexpr int WARPS = THREADS / 32;
    static_assert(kTopkBins % THREADS == 0 && WARPS <= 32, "block size");
    const int tid = threadIdx.x;
    uint32_t* const s_cache = sm.cache;
    int* const s_hist = sm.hist;

    // Keys (cached), and their min and max.
    uint32_t kmn = 0xFFFFFFFFu, kmx = 0u;
#pragma unroll 1
    for (int base = 0; base < n; base += THREADS * kTopkUnroll) {
        uint32_t key[kTopkUnroll];
#pragma unroll
        for (int u = 0; u < kTopkUnroll; ++u) {
            const int i = base + u * THREADS + tid;
            key[u] = i < n ? float_key(pre && base == 0 ? pre[u] : ld_score(in + i)) : 0u;
        }
#pragma unroll
        for (int u = 0; u < kTopkUnroll; ++u) {
            const int i = base + u * THREADS + tid;
            if (i < n) {
                if (s_cache) s_cache[i] = key[u];
                kmn = min(kmn, key[u]);
                kmx = max(kmx, key[u]);
            }
        }
    }
    auto clear_hist = [&] {
        for (int i = tid; i < kTopkBins; i += THREADS) s_hist[i] = 0;
    };
    clear_hist();  // before the barrier in block_key_range: the first pass counts into it
    block_key_range<THREADS>(kmn, kmx, sm.mn, sm.mx);

    // Radix select over the bits below the common prefix, 11 bits per pass.
    RadixSelect rs(kmn, kmx, k);
    if (rs.lo > 0) {
#pragma unroll 1
        while (true) {
            const int width = rs.width(11), shift = rs.lo - width;
            const uint32_t dmask = (1u << width) - 1u;
#pragma unroll 1
            for (int base = 0; base < n; base += THREADS * kTopkUnroll) {
                uint32_t key[kTopkUnroll];
#pragma unroll
                for (int u = 0; u < kTopkUnroll; ++u) {
                    const int i = base + u * THREADS + tid;
                    key[u] = i < n ? (s_cache ? s_cache[i] : float_key(ld_score(in + i))) : 0u;
                }
#pragma unroll
                for (int u = 0; u < kTopkUnroll; ++u) {
                    const int i = base + u * THREADS + tid;
                    hist_add(s_hist, i < n && rs.matches(key[u]) ? static_cast<int>((key[u] >> shift) & dmask) : -1);
                }
            }
            __syncthreads();
            find_threshold_bin<THREADS, kTopkBins>(s_hist, rs.krem, sm.warp, sm.sel, clear_hist);
            const int in_bin = sm.sel[2];
            rs.take(sm.sel[0], width, sm.sel[1]);
            if (in_bin == rs.krem || rs.lo == 0) break;  // the whole bin is taken, or every bit is resolved
        }
    }
    const uint32_t T = rs.prefix, pmask = rs.pmask;
    const int need = rs.krem;  // masked keys == T to take (the lowest indices); masked keys > T: k - need

    // Stable compaction in index order: position of a selected key = (#greater before) + min(#equal before, need).
    int gt_run = 0, eq_run = 0;
#pragma unroll 1
    for (int base = 0; base < n; base += THREADS * kTopkPerThread) {
        const int i0 = base + tid * kTopkPerThread;
        uint32_t key[kTopkPerThread];
#pragma unroll
        for (int e = 0; e < kTopkPerThread; ++e)
            key[e] = i0 + e < n ? (s_cache ? s_cache[i0 + e] : float_key(ld_score(in + i0 + e))) & pmask : 0u;
        int flag[kTopkPerThread];  // 2: greater, 1: equal, 0: neither
        int cgt = 0, ceq = 0;
#pragma unroll
        for (int e = 0; e < kTopkPerThread; ++e) {
            flag[e] = i0 + e < n ? (key[e] > T ? 2 : (key[e] == T ? 1 : 0)) : 0;
            cgt += flag[e] == 2;
            ceq += flag[e] == 1;
        }
        int total;
        // Each field <= THREADS * kTopkPerThread <= 2048.
        const int ex = block_exclusive_scan<THREADS>(cgt | (ceq << 16), sm.warp, total);
        int gt_before = gt_run + (ex & 0xffff);
        int eq_before = eq_run + (ex >> 16);
#pragma unroll
        for (int e = 0; e < kTopkPerThread; ++e) {
            if (flag[e] == 2) {
                out[gt_before + min(eq_before, need)] = i0 + e;
                ++gt_before;
            } else if (flag[e] == 1) {
                if (eq_before < need) out[gt_before + eq_before] = i0 + e;
                ++eq_before;
            }
        }
        gt_run += total & 0xffff;
        eq_run += total >> 16;
        if (gt_run + min(eq_run, need) >= k) break;  // uniform: every selected key is written
    }
    __syncthreads();  // the shared memory is free
}

// The select for rows whose candidates fit in registers (n <= kTopkThreads * KPT; the launcher picks KPT from the
// score stride): the same radix select and the same output as topk_select_row, with fewer dependent steps per warp.
//   - Thread t holds keys t + u * THREADS (u < KPT) in registers: no shared key cache, no re-reads.
//   - 12-bit digits (4096 bins, 16 KB; 13 bits were slower: docs/performance.md): at the row sizes
//     of a long context the first pass usually leaves few keys in the threshold bin.
//   - Three barriers per pass, as in topk_select_row (find_threshold_bin).
//   - When the threshold bin holds more keys than needed but at most 32, they are gathered and ranked by one warp
//     (rank = keys greater + equal keys gathered earlier), which gives the exact threshold key T and how many keys
//     equal to T to take: no further histogram pass.
//   - The compaction counts each warp's greater / equal keys per round by ballot; one exclusive scan of the
//     KPT x WARPS packed counts (every warp computes it) places every selected key: one barrier.
constexpr int kTopkRegBins = 4096;
constexpr int kTopkRegBits = 12;
constexpr int kTopkRegGather = 32;  // largest threshold bin resolved by ranking (one warp)
constexpr int kTopkRegMaxKpt = 16;

struct TopkRegSmem {
    int hist[kTopkRegBins];
    int wtot[kTopkWarps];                    // keys in each warp's bins
    uint32_t mn[kTopkWarps], mx[kTopkWarps];
    uint32_t cand[kTopkRegGather];           // the threshold bin's keys (gather)
    int comp[kTopkRegMaxKpt * kTopkWarps];   // compaction: (greater | equal << 16) per (round, warp)
    int cnt;                                 // gathered keys
    int sel[3];                              // a pass's threshold bin, keys in higher bins, keys in it
    uint32_t T;                              // gather: the threshold key
    int need;                                // gather: keys equal to T to take
};

// THREADS: the block (kTopkThreads in the top-k kernel, kScoreThreads in the fused scoring's tail); sm is sized for
// kTopkThreads, the largest.
template <int THREADS, int KPT>
__device__ void topk_select_row_reg(int* __restrict__ out, const float (&score)[KPT], int n, int k,
                                    TopkRegSmem& sm) {
    constexpr int WARPS = THREADS / 32, BINS = kTopkRegBins;
    static_assert(THREADS <= kTopkThreads, "TopkRegSmem is sized for kTopkThreads");
    constexpr int EPL = KPT * WARPS / 32;  // compaction entries per lane
    static_assert(KPT >= 2 && KPT <= kTopkRegMaxKpt && KPT * WARPS % 32 == 0 && BINS % (THREADS * 4) == 0, "shape");
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const uint32_t lanes_below = (1u << lane) - 1u;

    uint32_t key[KPT];
    uint32_t kmn = 0xFFFFFFFFu, kmx = 0u;
#pragma unroll
    for (int u = 0; u < KPT; ++u) {
        key[u] = float_key(score[u]);
        if (u * THREADS + tid < n) {
            kmn = min(kmn, key[u]);
            kmx = max(kmx, key[u]);
        }
    }
    auto clear_hist = [&] {
#pragma unroll
        for (int j = tid * 4; j < BINS; j += THREADS * 4) *reinterpret_cast<int4*>(&sm.hist[j]) = make_int4(0, 0, 0, 0);
    };
    clear_hist();  // before the barrier in block_key_range: the first pass counts into it
    block_key_range<THREADS>(kmn, kmx, sm.mn, sm.mx);

    RadixSelect rs(kmn, kmx, k);
#pragma unroll 1
    while (rs.lo > 0) {
        const int width = rs.width(kTopkRegBits), shift = rs.lo - width;
        const uint32_t dmask = (1u << width) - 1u;
#pragma unroll
        for (int u = 0; u < KPT; ++u)
            hist_add(sm.hist,
                     u * THREADS + tid < n && rs.matches(key[u]) ? static_cast<int>((key[u] >> shift) & dmask) : -1);
        __syncthreads();
        find_threshold_bin<THREADS, BINS>(sm.hist, rs.krem, sm.wtot, sm.sel, [&] {
            clear_hist();
            if (tid == 0) sm.cnt = 0;
        });
        const int in_bin = sm.sel[2];
        rs.take(sm.sel[0], width, sm.sel[1]);
        if (in_bin == rs.krem) break;  // the masked comparison decides every key
        if (in_bin <= kTopkRegGather && rs.lo > 0) {
#pragma unroll
            for (int u = 0; u < KPT; ++u)
                if (u * THREADS + tid < n && rs.matches(key[u])) sm.cand[atomicAdd(&sm.cnt, 1)] = key[u];
            __syncthreads();
            if (warp == 0) {
                const uint32_t mine = lane < in_bin ? sm.cand[lane] : 0u;
                int gt = 0, eq_before = 0;
#pragma unroll 1
                for (int i = 0; i < in_bin; ++i) {
                    const uint32_t o = __shfl_sync(0xffffffffu, mine, i);
                    gt += o > mine;
                    eq_before += o == mine && i < lane;
                }
                if (lane < in_bin && gt + eq_before == rs.krem - 1) {  // the krem-th largest of the bin
                    sm.T = mine;
                    sm.need = rs.krem - gt;
                }
            }
            __syncthreads();
            rs.prefix = sm.T;
            rs.pmask = 0xFFFFFFFFu;
            rs.krem = sm.need;
            break;
        }
    }
    const uint32_t T = rs.prefix, pmask = rs.pmask;
    const int need = rs.krem;

    // Compaction: round u holds indices u THREADS .. (u + 1) THREADS - 1, warp w the 32 from u THREADS + 32 w.
    uint32_t bgt[KPT], beq[KPT];
#pragma unroll
    for (int u = 0; u < KPT; ++u) {
        const bool in = u * THREADS + tid < n;
        const uint32_t m = key[u] & pmask;
        bgt[u] = __ballot_sync(0xffffffffu, in && m > T);
        beq[u] = __ballot_sync(0xffffffffu, in && m == T);
        if (lane == 0) sm.comp[u * WARPS + warp] = __popc(bgt[u]) | (__popc(beq[u]) << 16);  // fields <= n < 2^16
    }
    __syncthreads();
    // Exclusive scan of the KPT x WARPS entries (round-major = index order); lane l holds entries EPL l ..
    // EPL l + EPL - 1. This warp's round u is entry u WARPS + warp: element (u WARPS + warp) % EPL = warp % EPL of
    // lane (u WARPS + warp) / EPL, the same element in every round (EPL divides WARPS), so each lane forms the
    // exclusive prefix of its element warp % EPL once (predicated adds: no indexed register array, which ptxas would
    // place in local memory or expand into selects per round) and the rounds fetch it by shuffle.
    static_assert(WARPS % EPL == 0, "one element index per warp");
    int e[EPL], tot = 0;
#pragma unroll
    for (int j = 0; j < EPL; ++j) {
        e[j] = sm.comp[EPL * lane + j];
        tot += e[j];
    }
    int mine = warp_inclusive_scan(tot) - tot;  // the entries before this lane's first
#pragma unroll
    for (int j = 0; j < EPL; ++j)
        if (j < warp % EPL) mine += e[j];
#pragma unroll
    for (int u = 0; u < KPT; ++u) {
        const int base = __shfl_sync(0xffffffffu, mine, (u * WARPS + warp) / EPL);
        const int i = u * THREADS + tid;
        if (i < n) {
            const uint32_t m = key[u] & pmask;
            const int gt_before = (base & 0xffff) + __popc(bgt[u] & lanes_below);
            const int eq_before = (base >> 16) + __popc(beq[u] & lanes_below);
            if (m > T)
                out[gt_before + min(eq_before, need)] = i;
            else if (m == T && eq_before < need)
                out[gt_before + eq_before] = i;
        }
    }
}

// The selection of one row after the wait: `pre` holds the row's first round of scores (entries u * kTopkThreads +
// tid), loaded together with the position. first: the page holding a sliding window's first token (0 without a
// window): the row's entries i are pages first + i, and the step selects as if the sequence began at that page
// (len - first * S tokens), as select_blocks_ref does.
template <int KPT, int PRE>
__device__ __forceinline__ void top_k_row(int* __restrict__ out, const float* __restrict__ in, const float (&pre)[PRE],
                                          int len, int first, int score_stride, int page_size_log2, int page_budget,
                                          int cache, int select_stride, const MatchedBudget& match) {
    const int tid = threadIdx.x;
    if (len < 1) return;
    len -= first << page_size_log2;
    const int P = (len + (1 << page_size_log2) - 1) >> page_size_log2;
    if (P <= page_budget) {  // dense step: every page
        if (P > select_stride) return;
        for (int i = tid; i < P; i += kTopkThreads) out[i] = first + i;
        return;
    }
    const int n = P - 1;  // candidates
    // Pages to select among them: K - 1 (k < n), or with a matched budget the matched count (k <= n).
    const int k = codes::step_pages(len, 1 << page_size_log2, page_budget, match) - 1;
    if (n > score_stride || k + 1 > select_stride) return;  // outside the workspace's capacity: write nothing
    if (tid == 0) out[k] = first + P - 1;
    if (k == 0) return;
    if (k >= n) {  // every candidate
        for (int i = tid; i < n; i += kTopkThreads) out[i] = first + i;
        return;
    }
    if constexpr (KPT > 0) {
        __shared__ TopkRegSmem sm;
        topk_select_row_reg<kTopkThreads, KPT>(out, pre, n, k, sm);
    } else {
        extern __shared__ uint32_t s_cache[];  // [score_stride] when cache
        __shared__ int s_hist[kTopkBins];
        __shared__ int s_warp[32];
        __shared__ uint32_t s_min[kTopkWarps], s_max[kTopkWarps];
        __shared__ int s_sel[3];
        const TopkSmem sm{cache ? s_cache : nullptr, s_hist, s_warp, s_min, s_max, s_sel};
        topk_select_row<kTopkThreads>(out, in, n, k, sm, pre);
    }
    if (first > 0) {  // block-uniform: the selected entries back to page ids
        __syncthreads();
        for (int i = tid; i < k; i += kTopkThreads) out[i] += first;
    }
}

}  // namespace

}  // namespace quest
