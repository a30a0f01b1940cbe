// GPU Quest decode path: page scores, top-k page selection, sparse attention over the selected pages, merge.
// API and semantics: kernels/select/quest.cuh. Design notes per kernel below.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>

#include "kernels/select/quest.cuh"
#include "kernels/common/device_utils.cuh"
#include "kernels/common/rope_device.cuh"

namespace quest {

namespace {

// ---------------------------------------------------------------------------------------------------------------------
// Small device helpers
// ---------------------------------------------------------------------------------------------------------------------

// 16-byte asynchronous copy global -> shared; src_bytes = 0 zero-fills the destination without reading the source.

// Swizzled position of 16-byte piece c of row r in a shared tile whose rows hold CPR pieces (CPR = row bytes / 16).
// Eight consecutive rows reading the same logical piece, or eight consecutive pieces of one row (or of a few rows
// when CPR < 8), land in eight distinct 16-byte bank groups: conflict-free 128-bit shared loads and stores.
template <int CPR>
__device__ __forceinline__ int swz(int r, int c) {
    if constexpr (CPR >= 8)
        return c ^ (r & 7);
    else
        return c ^ ((r / (8 / CPR)) & (CPR - 1));
}

// Sequence length on the device and the derived page count; false when the length is outside the cache.
__device__ __forceinline__ bool device_len(const int* d_pos, int page_size_log2, int max_pages, int& len, int& P) {
    len = *d_pos + 1;
    P = (len + (1 << page_size_log2) - 1) >> page_size_log2;
    return len >= 1 && P <= max_pages;
}

// The decode token's RoPE + KV append folded into the Quest scoring launch (QuestRopeAppend, kernels/select/quest.cuh): each
// scoring block rotates its heads' q from qkv for its scores, and the grid also does rope_append_kv's work (T = 1,
// the same code: kernels/common/rope_device.cuh), spread over its threads: the loads issued right after the wait, the stores
// after the block's scoring items, off the scoring's critical path (the top-k between this grid and the attention
// needs none of it).
struct RopeArgs {
    const float* qkv = nullptr;  // [q_dim | kv_dim | kv_dim] fp32, or null: off
    __half* q_out = nullptr;     // [num_heads][D]
    KvLayerView kv;              // the cache written by the append
    RopeDeviceParams rope;
    int num_heads = 0;
};

// The kernels' RopeArgs for a QuestRopeAppend (null: off).
RopeArgs rope_args(const QuestRopeAppend* r, const KvLayerView& kv, int num_heads) {
    RopeArgs a;
    if (!r) return a;
    require_rope_append("Quest RoPE append", r->q_out, kv, r->qkv, 1, num_heads, r->rope);
    a.qkv = r->qkv;
    a.q_out = r->q_out;
    a.kv = kv;
    a.rope = r->rope;
    a.num_heads = num_heads;
    return a;
}

bool head_dim_supported(int d) { return d == 8 || d == 16 || d == 32 || d == 64 || d == 128 || d == 256; }

void require_kv(const KvLayerView& kv, int num_heads, int page_budget) {
    QUEST_REQUIRE(kv.num_kv_heads >= 1 && num_heads >= 1 && num_heads % kv.num_kv_heads == 0,
                  "num_heads must be a positive multiple of num_kv_heads");
    QUEST_REQUIRE(head_dim_supported(kv.head_dim), "head_dim must be one of 8, 16, 32, 64, 128, 256");
    QUEST_REQUIRE(kv.page_size >= 1 && kv.page_size <= 256 && (kv.page_size & (kv.page_size - 1)) == 0,
                  "page_size must be a power of two in [1, 256]");
    QUEST_REQUIRE(kv.max_pages >= 1 && page_budget >= 1, "max_pages and page_budget must be >= 1");
    QUEST_REQUIRE(static_cast<long long>(kv.max_pages) * kv.page_size <= kv.capacity,
                  "max_pages * page_size must fit in capacity");
}

// ---------------------------------------------------------------------------------------------------------------------
// 2. Top-k (defined first: the fused scoring kernel of section 1 runs the same select in its tail)
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
// tid), loaded together with the position.
template <int KPT, int PRE>
__device__ __forceinline__ void top_k_row(int* __restrict__ out, const float* __restrict__ in, const float (&pre)[PRE],
                                          int len, int score_stride, int page_size_log2, int page_budget, int cache,
                                          int select_stride, const MatchedBudget& match) {
    const int tid = threadIdx.x;
    if (len < 1) return;
    const int P = (len + (1 << page_size_log2) - 1) >> page_size_log2;
    if (P <= page_budget) {  // dense step: every page
        if (P > select_stride) return;
        for (int i = tid; i < P; i += kTopkThreads) out[i] = i;
        return;
    }
    const int n = P - 1;  // candidates
    // Pages to select among them: K - 1 (k < n), or with a matched budget the matched count (k <= n).
    const int k = codes::step_pages(len, 1 << page_size_log2, page_budget, match) - 1;
    if (n > score_stride || k + 1 > select_stride) return;  // outside the workspace's capacity: write nothing
    if (tid == 0) out[k] = P - 1;
    if (k == 0) return;
    if (k >= n) {  // every candidate
        for (int i = tid; i < n; i += kTopkThreads) out[i] = i;
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
}

// One block per selection row. KPT > 0: the row's score_stride <= kTopkThreads * KPT, every candidate in registers
// (topk_select_row_reg); KPT = 0: any stride (topk_select_row, keys cached in dynamic shared memory when `cache`,
// else re-read from L2).
template <int KPT>
__global__ void __launch_bounds__(kTopkThreads) top_k_kernel(int* __restrict__ selected,
                                                             const float* __restrict__ scores, int score_stride,
                                                             const int* __restrict__ d_pos, int page_size_log2,
                                                             int page_budget, int cache, int select_stride,
                                                             MatchedBudget match) {
    constexpr int PRE = KPT > 0 ? KPT : kTopkUnroll;
    pdl_wait();
    pdl_trigger();  // dependents may be scheduled now (they pdl_wait for this grid to complete)
    const int tid = threadIdx.x;
    int* out = selected + static_cast<size_t>(blockIdx.x) * select_stride;
    const float* in = scores + static_cast<size_t>(blockIdx.x) * score_stride;
    // The first round of scores is loaded together with the position (one dependent round trip less): entries
    // u * kTopkThreads + tid < score_stride of the row (those past this step's candidates are never used).
    float pre[PRE];
#pragma unroll
    for (int u = 0; u < PRE; ++u) {
        const int i = u * kTopkThreads + tid;
        pre[u] = i < score_stride ? ld_score(in + i) : 0.0f;
    }
    const int len = *d_pos + 1;
    top_k_row<KPT>(out, in, pre, len, score_stride, page_size_log2, page_budget, cache, select_stride, match);
}

// ---------------------------------------------------------------------------------------------------------------------
// 1. Page scores
//
// Work item = a tile of 128 candidate pages of one KV head (and, for groups of more than 8 query heads, one batch of 8
// heads); thread t owns page p0 + t and sums its channels sequentially, in the CPU reference's order, so the scores
// match page_scores_ref bit for bit (fp16 x fp16 products are exact in fp32, and fmaf of an exact product rounds like
// the reference's `u += max(...)`; max(q*mn, q*mx) == q * (q >= 0 ? mx : mn) is selected on the packed fp16 bits
// with a per-channel sign mask, one LOP3 per channel pair). A persistent grid (at most the resident blocks, looping
// over the items that exist at the current length) streams each block's items as a sequence of stages, one stage =
// CH = 64 channels (a whole 128-byte line of every row) of the tile's 128 pages for kmin and kmax, through a 3-deep
// cp.async ring in shared memory (96 KB): 16-byte loads, a warp's loads cover whole lines (coalesced), and 2 stages
// stay in flight while one is consumed. The swizzled layout makes the per-thread 128-bit shared reads conflict-free.
// The query heads of the group come from shared memory (broadcast), so each metadata byte is read from global memory
// once per KV head (once per 8 heads for larger groups). Measured variants (H200, 32K tokens, MHA): CH = 32 with a
// 4-deep ring 16.7 us; CH = 64, 3-deep 12.7-12.9 us; whole rows per stage 13.9 us.
// ---------------------------------------------------------------------------------------------------------------------
#ifndef QUEST_SCORE_CH
#define QUEST_SCORE_CH 64  // channels per pipeline stage (tuning knob; 64 = whole 128-byte lines)
#endif
#ifndef QUEST_SCORE_STAGES
#define QUEST_SCORE_STAGES 3  // cp.async ring depth (tuning knob)
#endif
constexpr int kScoreThreads = 128;
constexpr int kScoreTile = 128;  // pages per item (one per thread)
constexpr int kScoreStages = QUEST_SCORE_STAGES;

template <int D, int GT>
struct ScoreCfg {
    static constexpr int CH = D < QUEST_SCORE_CH ? D : QUEST_SCORE_CH;  // channels per stage
    static constexpr int CPR = CH / 8;                                   // 16-byte pieces per staged row
    static constexpr int NCH = D / CH;                                   // stages per page row and head batch
    static constexpr int STAGES = D >= 256 && kScoreStages > 2 ? 2 : kScoreStages;
    static constexpr int STAGE_HALVES = kScoreTile * CH;  // one array (kmin or kmax) of one stage
    static constexpr int RING_BYTES = STAGES * 2 * STAGE_HALVES * 2;
    static constexpr int Q_FLOATS = GT * D;       // one buffer of q (fp32)
    static constexpr int MASK_WORDS = GT * D / 2;  // one buffer of sign masks (one 32-bit word per channel pair)
    static constexpr int SMEM_BYTES = RING_BYTES + 2 * (Q_FLOATS + MASK_WORDS) * 4;
};

// FUSED: also the top-k (section 2) of every selection row, in the tail of the scoring: per KV head a ticket counter
// (tickets[kvh], zero before the launch) counts the finished items of that head; the block finishing its last item
// publishes (fence + ticket), and the block that draws the last ticket resets the counter, drains its cp.async ring,
// runs the select for the head's rows (1 for KvMax/KvSum, G for PerHead) with the ring as shared memory:
// topk_select_row_reg (keys in registers, KPT = 16) up to 2,048 candidates when its TopkRegSmem fits the ring,
// otherwise topk_select_row (the 2048-bin histogram, then the keys when they fit); writes selected[row][0 .. K) as
// quest_top_k does, and refills its ring to go on with its next item. Dense steps write selected[row][i] = i
// (i < P) for every row.
template <int D, int GT, bool FUSED>
__global__ void __launch_bounds__(kScoreThreads, 3) page_scores_kernel(
    float* __restrict__ scores, int* __restrict__ selected, int* __restrict__ tickets, const __half* __restrict__ q,
    const __half* __restrict__ kmin, const __half* __restrict__ kmax, const int* __restrict__ d_pos, int num_heads,
    int num_kv_heads, int max_pages, int page_size_log2, int page_budget, int per_head, int kv_sum, RopeArgs ra) {
    using C = ScoreCfg<D, GT>;
    constexpr int CH = C::CH, CPR = C::CPR, NCH = C::NCH;
    extern __shared__ __align__(16) unsigned char smem[];
    constexpr int STAGES = C::STAGES;
    __half* s_ring = reinterpret_cast<__half*>(smem);                        // [stage][2][kScoreTile * CH]
    float* s_q = reinterpret_cast<float*>(smem + C::RING_BYTES);             // [2][GT][D]
    uint32_t* s_mask = reinterpret_cast<uint32_t*>(s_q + 2 * C::Q_FLOATS);  // [2][GT][D / 2]

    __shared__ int s_twarp[32];  // fused top-k scratch (scan, min / max per warp, digit, ticket)
    __shared__ uint32_t s_tmin[kScoreThreads / 32], s_tmax[kScoreThreads / 32];
    __shared__ int s_tsel[3], s_last;

    // Before pdl_wait: the position and the metadata of the complete pages (the candidates), which no kernel that may
    // still be running writes: the position changes only between decode steps, and a layer's candidate bounds only
    // in the steps that completed their pages (the current step writes the last page's bounds only, in rope_append
    // or, with ra.qkv, in this grid after its wait). The kernel before this one is rope_append, which
    // triggers only after its own wait, or with ra.qkv the qkv GEMV, which triggers before its own wait (earlier
    // kernels of the step may then still run; none of them writes these). So the first stages of metadata stream in
    // while that kernel finishes. q (or qkv) comes from it: read after pdl_wait. Every path waits before it returns
    // (a grid that completed without waiting would let its dependents pass their wait early).
    int len, P;
    if (!device_len(d_pos, page_size_log2, max_pages, len, P)) {
        pdl_wait();
        return;
    }
    const int tid = threadIdx.x;
    // ra.qkv non-null: q is rotated here from qkv (read after pdl_wait), not read from q, and the grid does the
    // token's RoPE + KV append (RopeArgs): items tid * gridDim.x + blockIdx.x + u * kScoreThreads * gridDim.x. It
    // writes only what no block of this grid reads: q_out, the token's k / v rows and the current page's bounds
    // (the scores read complete pages only).
    const bool rope_on = ra.qkv != nullptr;
    const double dyn_base = rope_on ? rope_dev::dynamic_base(ra.rope, D, len) : 0.0;
    const rope_dev::Token tk{ra.q_out, ra.kv, ra.qkv, len - 1, 1, ra.num_heads};
    const int a_first = tid * static_cast<int>(gridDim.x) + static_cast<int>(blockIdx.x);
    const int a_stride = static_cast<int>(gridDim.x) * kScoreThreads;
    auto append_from = [&](int idx0) {  // after pdl_wait
        for (int idx = idx0; idx < tk.items(); idx += a_stride)
            rope_dev::item_store(tk, idx, rope_dev::item_load(tk, idx), ra.rope, dyn_base);
    };
    if (P <= page_budget) {  // dense step: no scores; the fused kernel selects every page
        pdl_wait();
        if (rope_on) append_from(a_first);
        if constexpr (FUSED) {
            const int rows = per_head ? num_heads : num_kv_heads;
            const long long cells = static_cast<long long>(rows) * P;
            for (long long i = static_cast<long long>(blockIdx.x) * kScoreThreads + tid; i < cells;
                 i += static_cast<long long>(gridDim.x) * kScoreThreads) {
                const int r = static_cast<int>(i / P), p = static_cast<int>(i % P);
                selected[static_cast<size_t>(r) * page_budget + p] = p;
            }
        }
        return;
    }
    const int n = P - 1;  // candidates: the complete pages
    const int G = num_heads / num_kv_heads;
    const int nb = (G + GT - 1) / GT;  // head batches per item
    const int items = (n + kScoreTile - 1) / kScoreTile * num_kv_heads;
    if (static_cast<int>(blockIdx.x) >= items) {
        pdl_wait();
        if (rope_on) append_from(a_first);
        return;
    }
    const int my_items = (items - 1 - static_cast<int>(blockIdx.x)) / static_cast<int>(gridDim.x) + 1;
    const int per_item = nb * NCH;  // stages per item
    const int total = my_items * per_item;

    // Stage s of this block: item blockIdx.x + (s / per_item) * gridDim.x, head batch (s % per_item) / NCH,
    // channel chunk s % NCH.
    auto item_of = [&](int s, int& kvh, int& p0, int& np) {
        const int item = blockIdx.x + (s / per_item) * gridDim.x;
        kvh = item % num_kv_heads;
        p0 = item / num_kv_heads * kScoreTile;
        np = min(kScoreTile, n - p0);
    };
    // Stage s into its ring slot with cp.async: the pieces of the tile's rows (pages), zero-filled beyond the tile.
    auto issue = [&](int s) {
        int kvh, p0, np;
        item_of(s, kvh, p0, np);
        const int ch = s % NCH;
        __half* dmin = s_ring + (s % STAGES) * 2 * C::STAGE_HALVES;
        __half* dmax = dmin + C::STAGE_HALVES;
        const size_t meta0 = (static_cast<size_t>(kvh) * max_pages + p0) * D + ch * CH;
#pragma unroll
        for (int i = 0; i < kScoreTile * CPR / kScoreThreads; ++i) {
            const int l = tid + i * kScoreThreads;
            const int r = l / CPR, c = l % CPR;
            const bool ok = r < np;
            const size_t src = meta0 + static_cast<size_t>(ok ? r : 0) * D + c * 8;
            const int dst = r * CH + swz<CPR>(r, c) * 8;
            cp_async16(dmin + dst, kmin + src, ok ? 16 : 0);
            cp_async16(dmax + dst, kmax + src, ok ? 16 : 0);
        }
    };
    // Prologue: the first STAGES - 1 stages, before the wait (see above).
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < total) issue(s);
        cp_async_commit();
    }
    pdl_wait();  // q
    // The append's first item: loaded now, finished after the scoring items (the rest, if any, then too).
    const bool a_on = rope_on && a_first < tk.items();
    rope_dev::ItemIn a_in;
    if (a_on) a_in = rope_dev::item_load(tk, a_first);
    const int tiles = (n + kScoreTile - 1) / kScoreTile;  // items per KV head (and head batch loop)
    float acc[GT] = {};
    float agg = 0.0f;  // KvMax / KvSum aggregate of this thread's page over the item's head batches
#pragma unroll 1
    for (int s = 0; s < total; ++s) {
        int kvh, p0, np;
        item_of(s, kvh, p0, np);
        const int rem = s % per_item, gbi = rem / NCH, ch = rem % NCH;
        const int gb = gbi * GT, ng = min(GT, G - gb);
        const int qbuf = (s / NCH) & 1;                 // this head batch's q (double-buffered across batches)
        float* sq = s_q + qbuf * C::Q_FLOATS;
        uint32_t* smask = s_mask + qbuf * C::MASK_WORDS;
        if (s + STAGES - 1 < total) issue(s + STAGES - 1);
        cp_async_commit();
        if (ch == 0) {
            // q in fp32, and per channel pair a mask selecting kmax's half where q >= 0 and kmin's where q < 0.
            if (rope_on) {  // rotated here from qkv: pair i of head g is channels (i, i + D / 2)
                uint16_t* mask16 = reinterpret_cast<uint16_t*>(smask);  // [g][channel] halves of the pair words
                for (int i = tid; i < GT * D / 2; i += kScoreThreads) {
                    const int g = i / (D / 2), j = i % (D / 2);
                    float q0 = 0.0f, q1 = 0.0f;
                    if (g < ng) {
                        const float* qr = ra.qkv + static_cast<size_t>(kvh * G + gb + g) * D;
                        float c, sn;
                        rope_dev::cos_sin(ra.rope, D, j, len - 1, dyn_base, c, sn);
                        __half r1, r2;
                        rope_dev::rotate(qr[j], qr[j + D / 2], c, sn, r1, r2);
                        q0 = __half2float(r1);
                        q1 = __half2float(r2);
                    }
                    sq[g * D + j] = q0;
                    sq[g * D + j + D / 2] = q1;
                    mask16[g * D + j] = q0 >= 0.0f ? 0xFFFFu : 0u;
                    mask16[g * D + j + D / 2] = q1 >= 0.0f ? 0xFFFFu : 0u;
                }
            } else {
                for (int i = tid; i < GT * D / 2; i += kScoreThreads) {
                    const int g = i / (D / 2), c2 = i % (D / 2);
                    float q0 = 0.0f, q1 = 0.0f;
                    if (g < ng) {
                        const float2 qq = __half22float2(
                            *reinterpret_cast<const __half2*>(q + static_cast<size_t>(kvh * G + gb + g) * D + 2 * c2));
                        q0 = qq.x;
                        q1 = qq.y;
                    }
                    sq[g * D + 2 * c2] = q0;
                    sq[g * D + 2 * c2 + 1] = q1;
                    smask[i] = (q0 >= 0.0f ? 0x0000FFFFu : 0u) | (q1 >= 0.0f ? 0xFFFF0000u : 0u);
                }
            }
#pragma unroll
            for (int g = 0; g < GT; ++g) acc[g] = 0.0f;
        }
        cp_async_wait<STAGES - 1>();  // stage s has landed (this thread's pieces)
        __syncthreads();              // ... everyone's, and q
        if (tid < np) {
            const __half* smin = s_ring + (s % STAGES) * 2 * C::STAGE_HALVES;
            const __half* smax = smin + C::STAGE_HALVES;
#pragma unroll
            for (int c = 0; c < CPR; ++c) {
                const int off = tid * CH + swz<CPR>(tid, c) * 8;
                const uint4 rmn = *reinterpret_cast<const uint4*>(smin + off);
                const uint4 rmx = *reinterpret_cast<const uint4*>(smax + off);
#pragma unroll
                for (int g = 0; g < GT; ++g) {
                    const int ci = ch * CH + c * 8;
                    const float4 qa = *reinterpret_cast<const float4*>(sq + g * D + ci);
                    const float4 qb = *reinterpret_cast<const float4*>(sq + g * D + ci + 4);
                    const uint4 mk = *reinterpret_cast<const uint4*>(smask + g * (D / 2) + ci / 2);
                    // max(q*mn, q*mx) == q * (q >= 0 ? mx : mn), exactly: select the halves, then one FMA each.
                    const uint32_t w[4] = {(rmx.x & mk.x) | (rmn.x & ~mk.x), (rmx.y & mk.y) | (rmn.y & ~mk.y),
                                           (rmx.z & mk.z) | (rmn.z & ~mk.z), (rmx.w & mk.w) | (rmn.w & ~mk.w)};
                    const float qv[8] = {qa.x, qa.y, qa.z, qa.w, qb.x, qb.y, qb.z, qb.w};
#pragma unroll
                    for (int j = 0; j < 4; ++j) {
                        const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&w[j]));
                        acc[g] = fmaf(qv[2 * j], f.x, acc[g]);
                        acc[g] = fmaf(qv[2 * j + 1], f.y, acc[g]);
                    }
                }
            }
            if (ch == NCH - 1) {  // end of a head batch
                if (per_head) {
#pragma unroll
                    for (int g = 0; g < GT; ++g)
                        if (g < ng) scores[static_cast<size_t>(kvh * G + gb + g) * max_pages + p0 + tid] = acc[g];
                } else {
#pragma unroll
                    for (int g = 0; g < GT; ++g)
                        if (g < ng) agg = (gb + g == 0) ? acc[g] : (kv_sum ? agg + acc[g] : fmaxf(agg, acc[g]));
                    if (gbi == nb - 1) scores[static_cast<size_t>(kvh) * max_pages + p0 + tid] = agg;
                }
            }
        }
        if constexpr (FUSED) {
            if (rem == per_item - 1) {
                __threadfence();                    // this item's scores, before its ticket
                if (s == total - 1) pdl_trigger();  // scoring done here: the attention kernel may be scheduled
            }
        }
        __syncthreads();  // ring slot s % STAGES and the older q buffer are free
        if constexpr (FUSED) {
            if (rem == per_item - 1) {  // item (kvh, p0) done: draw a ticket
                if (tid == 0) s_last = atomicAdd(&tickets[kvh], 1) == tiles - 1;
                __syncthreads();
                if (s_last) {  // every tile of this KV head is scored: select its rows' pages
                    __threadfence();
                    if (tid == 0) tickets[kvh] = 0;  // ready for the next launch
                    cp_async_wait<0>();              // the ring's in-flight stages land (then are refetched)
                    __syncthreads();
                    constexpr int kCacheKeys = C::RING_BYTES / 4 - kTopkBins;
                    int* s_hist = reinterpret_cast<int*>(smem);
                    uint32_t* s_keys = reinterpret_cast<uint32_t*>(smem) + kTopkBins;
                    const TopkSmem sm{n <= kCacheKeys ? s_keys : nullptr, s_hist, s_twarp, s_tmin, s_tmax, s_tsel};
                    const int k = page_budget - 1;  // k < n: P > page_budget
                    const int r0 = per_head ? kvh * G : kvh, nr = per_head ? G : 1;
                    for (int r = r0; r < r0 + nr; ++r) {
                        int* out = selected + static_cast<size_t>(r) * page_budget;
                        const float* row = scores + static_cast<size_t>(r) * max_pages;
                        if (tid == 0) out[k] = P - 1;
                        if (k == 0) continue;
                        // The keys in registers (up to 2,048 candidates: 32K tokens at S = 16) when the ring holds
                        // the select's shared memory (head_dim >= 16), as the top-k kernel's register select.
                        constexpr bool kRegFits = sizeof(TopkRegSmem) <= C::RING_BYTES;
                        if (kRegFits && n <= kScoreThreads * kTopkRegMaxKpt) {
                            float key[kTopkRegMaxKpt];
#pragma unroll
                            for (int u = 0; u < kTopkRegMaxKpt; ++u) {
                                const int i = u * kScoreThreads + tid;
                                key[u] = i < n ? ld_score(row + i) : 0.0f;
                            }
                            topk_select_row_reg<kScoreThreads, kTopkRegMaxKpt>(
                                out, key, n, k, *reinterpret_cast<TopkRegSmem*>(smem));
                            __syncthreads();  // its shared memory is free (the next row, or the ring's refill)
                        } else {
                            topk_select_row<kScoreThreads>(out, row, n, k, sm);
                        }
                    }
                    __syncthreads();  // the ring is free again: refetch the stages in flight
#pragma unroll
                    for (int s2 = s + 1; s2 < s + STAGES; ++s2) {
                        if (s2 < total) issue(s2);
                        cp_async_commit();
                    }
                }
            }
        }
    }
    if (a_on) {
        rope_dev::item_store(tk, a_first, a_in, ra.rope, dyn_base);
        append_from(a_first + a_stride);
    }
    cp_async_wait<0>();
}

// ---------------------------------------------------------------------------------------------------------------------
// 3. Sparse attention (split over the selected pages), merge fused
//
// Block (128 threads, 4 warps) = one "slab" (a KV head and up to HB <= 8 of its query heads sharing a page list:
// KvMax/KvSum; or one query head: PerHead) x one split (pages_per_split consecutive entries of the row's page list).
// Register-direct flash decoding: a token's K (and V) row is read by LPT = D/8 lanes with one 16-byte load each, so
// a warp reads 32/LPT consecutive tokens per row (coalesced), and a lane keeps U rows of K and V in flight at once.
// Logits: 8 FMAs per lane against the lane's slice of q (pre-scaled to log2 units) and an xor-shuffle reduction over
// the LPT lanes. Each lane group keeps its own exp2 online softmax state (m, l) and its 8 output channels per head;
// no block barrier in the main loop. At the end the lane groups of a warp and then the 4 warps are combined (running
// maxima rescaled). Tokens >= len (the tail of the last page) are neither read nor counted. With a single split the
// block writes the output; otherwise it writes its normalised partial output and (max, sum) per head, and the last
// block of the slab to finish (a counter per slab, reset by that block) merges the valid splits (their number derives
// from len) into the output: one launch, graph-safe.
// ---------------------------------------------------------------------------------------------------------------------
constexpr int kAttnThreads = 128;
constexpr int kAttnWarps = kAttnThreads / 32;
constexpr int kMaxPagesPerSplit = 128;
static_assert(kMaxPagesPerSplit <= kAttnThreads, "one page id per thread in the attention prologue");
constexpr int kAttnMaxHeads = 8;

template <int D, int HB>
struct AttnCfg {
    static constexpr int LPT = D / 8;                              // lanes per token (one 16-byte piece each)
    static constexpr int TPW = 32 / LPT;                           // tokens per warp row
    static constexpr int TPB = kAttnWarps * TPW;                   // tokens per block row
    static constexpr int U = HB >= 8 ? 2 : (HB >= 4 ? 4 : 8);      // rows in flight per lane
    static constexpr int MIN_BLOCKS = HB >= 8 ? 2 : (HB >= 4 ? 3 : 4);
};

__device__ __forceinline__ uint4 ldg_stream(const __half* p) {
    return __ldcs(reinterpret_cast<const uint4*>(p));  // read once: evict-first in L2
}

template <int D, int HB>
__global__ void __launch_bounds__(kAttnThreads, AttnCfg<D, HB>::MIN_BLOCKS) sparse_attention_kernel(
    __half* __restrict__ out, float* __restrict__ part_o, float* __restrict__ part_ml, int* __restrict__ counters,
    const __half* __restrict__ q, const __half* __restrict__ kc, const __half* __restrict__ vc,
    const int* __restrict__ selected, const int* __restrict__ d_pos, int num_heads, int num_kv_heads, int capacity,
    int max_pages, int page_size_log2, int page_budget, int select_stride, MatchedBudget match, int pages_per_split,
    int max_splits, int per_head, float scale_log2) {
    using C = AttnCfg<D, HB>;
    constexpr int LPT = C::LPT, TPW = C::TPW, TPB = C::TPB, U = C::U;
    __shared__ __align__(16) float s_o[kAttnWarps][HB][D];
    __shared__ float s_mw[kAttnWarps][HB], s_lw[kAttnWarps][HB];
    __shared__ int s_pages[kMaxPagesPerSplit];
    __shared__ int s_last;

    pdl_wait();
    pdl_trigger();  // dependents may be scheduled now (they pdl_wait for this grid to complete)
    const int G = num_heads / num_kv_heads;
    int row, kvh, h0, hb;
    if (per_head) {
        row = blockIdx.y;
        kvh = row / G;
        h0 = row;
        hb = 1;
    } else {
        const int subs = (G + HB - 1) / HB;
        kvh = blockIdx.y / subs;
        const int sub = blockIdx.y % subs;
        row = kvh;
        h0 = kvh * G + sub * HB;
        hb = min(HB, G - sub * HB);
    }
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int grp = lane / LPT, c = lane % LPT;  // token within the warp row, 16-byte piece within the token
    const int S = 1 << page_size_log2;
    const int split = blockIdx.x;
    const int j0 = split * pages_per_split;
    // The split's page ids and the query are loaded together with the position, before the length is known (one
    // dependent round trip less): entry j0 + tid of the row (pages_per_split <= kAttnThreads; entries past this
    // step's count are never used). The grid is sized so that j0 < select_stride.
    const int* sel = selected + static_cast<size_t>(row) * select_stride + j0;
    const int page_pre = tid < pages_per_split && j0 + tid < select_stride ? sel[tid] : 0;
    // This lane's 8 channels of every head's query, in log2 units.
    float qr[HB][8];
#pragma unroll
    for (int g = 0; g < HB; ++g) {
        if (g < hb) {
            half8_to_float(*reinterpret_cast<const uint4*>(q + static_cast<size_t>(h0 + g) * D + c * 8), qr[g]);
#pragma unroll
            for (int e = 0; e < 8; ++e) qr[g][e] *= scale_log2;
        } else {
#pragma unroll
            for (int e = 0; e < 8; ++e) qr[g][e] = 0.0f;
        }
    }
    int len, P;
    if (!device_len(d_pos, page_size_log2, max_pages, len, P)) return;
    // Pages of the row at this length: min(P, K), or the matched count (<= select_stride by the workspace's sizing).
    const int n_sel = min(codes::step_pages(len, 1 << page_size_log2, page_budget, match), select_stride);
    const int ns = (n_sel + pages_per_split - 1) / pages_per_split;  // valid splits
    if (j0 >= n_sel) return;  // this split has no pages at this length
    const int np = min(pages_per_split, n_sel - j0);
    if (tid < np) s_pages[tid] = page_pre;
    __syncthreads();

    // Tokens of the split: np pages of S tokens, minus the tail beyond len of the last one (the partial last page).
    const int count = np * S - max(0, (s_pages[np - 1] + 1) * S - len);
    const int rows = (count + TPB - 1) / TPB;
    const size_t head_off = static_cast<size_t>(kvh) * capacity * D + c * 8;
    const __half* kbase = kc + head_off;
    const __half* vbase = vc + head_off;

    float o[HB][8], m[HB], l[HB];
#pragma unroll
    for (int g = 0; g < HB; ++g) {
        m[g] = -INFINITY;
        l[g] = 0.0f;
#pragma unroll
        for (int e = 0; e < 8; ++e) o[g][e] = 0.0f;
    }
#pragma unroll 1
    for (int r0 = 0; r0 < rows; r0 += U) {
        uint4 kb[U], vb[U];
        bool ok[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int j = (r0 + u) * TPB + warp * TPW + grp;
            int token = -1;
            if (j < count) token = s_pages[j >> page_size_log2] * S + (j & (S - 1));
            ok[u] = token >= 0 && token < len;
            if (ok[u]) {
                kb[u] = ldg_stream(kbase + static_cast<size_t>(token) * D);
                vb[u] = ldg_stream(vbase + static_cast<size_t>(token) * D);
            } else {
                kb[u] = make_uint4(0u, 0u, 0u, 0u);
                vb[u] = make_uint4(0u, 0u, 0u, 0u);
            }
        }
        // Logits of the U tokens of this lane group, all heads.
        float sc[U][HB];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            float kf[8];
            half8_to_float(kb[u], kf);
#pragma unroll
            for (int g = 0; g < HB; ++g) {
                float a0 = 0.0f, a1 = 0.0f;
#pragma unroll
                for (int e = 0; e < 8; e += 2) {
                    a0 = fmaf(qr[g][e], kf[e], a0);
                    a1 = fmaf(qr[g][e + 1], kf[e + 1], a1);
                }
                float a = a0 + a1;
#pragma unroll
                for (int off = 1; off < LPT; off <<= 1) a += __shfl_xor_sync(0xffffffffu, a, off);
                sc[u][g] = ok[u] ? a : -INFINITY;
            }
        }
        // Online softmax update per head (state shared by the lane group), then o += p v.
#pragma unroll
        for (int g = 0; g < HB; ++g) {
            float mb = m[g];
#pragma unroll
            for (int u = 0; u < U; ++u) mb = fmaxf(mb, sc[u][g]);
            if (mb != -INFINITY) {
                const float corr = exp2f(m[g] - mb);  // 0 while m is still -inf
                l[g] *= corr;
#pragma unroll
                for (int e = 0; e < 8; ++e) o[g][e] *= corr;
                m[g] = mb;
#pragma unroll
                for (int u = 0; u < U; ++u) {
                    const float pr = exp2f(sc[u][g] - mb);  // 0 for invalid tokens
                    sc[u][g] = pr;
                    l[g] += pr;
                }
            } else {
#pragma unroll
                for (int u = 0; u < U; ++u) sc[u][g] = 0.0f;
            }
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            float vf[8];
            half8_to_float(vb[u], vf);
#pragma unroll
            for (int g = 0; g < HB; ++g)
#pragma unroll
                for (int e = 0; e < 8; ++e) o[g][e] = fmaf(sc[u][g], vf[e], o[g][e]);
        }
    }

    // Combine the lane groups of the warp (lanes with equal c), then the warps (shared memory).
#pragma unroll
    for (int g = 0; g < HB; ++g) {
        float M = m[g];
#pragma unroll
        for (int off = LPT; off < 32; off <<= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, off));
        const float f = M == -INFINITY ? 0.0f : exp2f(m[g] - M);
        float lg = l[g] * f;
#pragma unroll
        for (int e = 0; e < 8; ++e) o[g][e] *= f;
#pragma unroll
        for (int off = LPT; off < 32; off <<= 1) {
            lg += __shfl_xor_sync(0xffffffffu, lg, off);
#pragma unroll
            for (int e = 0; e < 8; ++e) o[g][e] += __shfl_xor_sync(0xffffffffu, o[g][e], off);
        }
        if (grp == 0) {
#pragma unroll
            for (int e = 0; e < 8; ++e) s_o[warp][g][c * 8 + e] = o[g][e];
            if (c == 0) {
                s_mw[warp][g] = M;
                s_lw[warp][g] = lg;
            }
        }
    }
    __syncthreads();
    for (int i = tid; i < hb * D; i += kAttnThreads) {
        const int g = i / D, d = i % D;
        float M = -INFINITY;
#pragma unroll
        for (int w = 0; w < kAttnWarps; ++w) M = fmaxf(M, s_mw[w][g]);
        float L = 0.0f, O = 0.0f;
#pragma unroll
        for (int w = 0; w < kAttnWarps; ++w) {
            const float f = s_mw[w][g] == -INFINITY ? 0.0f : exp2f(s_mw[w][g] - M);
            L = fmaf(s_lw[w][g], f, L);
            O = fmaf(s_o[w][g][d], f, O);
        }
        if (ns == 1) {  // the only split: the output
            out[static_cast<size_t>(h0 + g) * D + d] = __float2half_rn(O / L);
        } else {
            part_o[(static_cast<size_t>(h0 + g) * max_splits + split) * D + d] = O / L;
            if (d == 0) {
                float* ml = part_ml + (static_cast<size_t>(h0 + g) * max_splits + split) * 2;
                ml[0] = M;
                ml[1] = L;
            }
        }
    }
    if (ns == 1) return;
    // Publish the partials; the last of the slab's ns blocks merges (threadFenceReduction pattern).
    __threadfence();
    __syncthreads();
    if (tid == 0) s_last = atomicAdd(&counters[h0], 1) == ns - 1;
    __syncthreads();
    if (!s_last) return;
    __threadfence();
    if (tid == 0) counters[h0] = 0;  // ready for the next launch
    // out[g][d] = sum_s w_s o_s[g][d] / sum_s w_s with w_s = l_s 2^(m_s - M). Each thread merges its OPT outputs
    // alone, online over chunks of NC splits whose (m, l) and partial outputs it loads at once (OPT * NC * 2
    // independent loads in flight, no block barrier): one round trip to L2 when NC covers the splits (the MHA case:
    // OPT = 1, NC = 16). The (m, l) loads of a head are the same address across the warp (one transaction).
    constexpr int OPT = (HB * D + kAttnThreads - 1) / kAttnThreads;
    constexpr int NC = OPT >= 16 ? 1 : 16 / OPT;  // splits per chunk
    float M[OPT], L[OPT], O[OPT];
#pragma unroll
    for (int o2 = 0; o2 < OPT; ++o2) {
        M[o2] = -INFINITY;
        L[o2] = 0.0f;
        O[o2] = 0.0f;
    }
#pragma unroll 1
    for (int s0 = 0; s0 < ns; s0 += NC) {
        float2 ml[OPT][NC];
        float po[OPT][NC];
#pragma unroll
        for (int o2 = 0; o2 < OPT; ++o2) {
            const int idx = tid + o2 * kAttnThreads;
            const int g = min(idx / D, hb - 1), d = idx % D;
            const size_t base = static_cast<size_t>(h0 + g) * max_splits + s0;
#pragma unroll
            for (int b = 0; b < NC; ++b) {
                ml[o2][b] = make_float2(-INFINITY, 0.0f);
                po[o2][b] = 0.0f;
                if (idx < hb * D && s0 + b < ns) {
                    ml[o2][b] = __ldcg(reinterpret_cast<const float2*>(part_ml + (base + b) * 2));
                    po[o2][b] = __ldcg(part_o + (base + b) * D + d);
                }
            }
        }
#pragma unroll
        for (int o2 = 0; o2 < OPT; ++o2) {
            float mc = M[o2];
#pragma unroll
            for (int b = 0; b < NC; ++b) mc = fmaxf(mc, ml[o2][b].x);
            if (mc == -INFINITY) continue;  // nothing valid yet
            const float f = M[o2] == -INFINITY ? 0.0f : exp2f(M[o2] - mc);
            L[o2] *= f;
            O[o2] *= f;
#pragma unroll
            for (int b = 0; b < NC; ++b) {
                const float w = ml[o2][b].x == -INFINITY ? 0.0f : ml[o2][b].y * exp2f(ml[o2][b].x - mc);
                L[o2] += w;
                O[o2] = fmaf(w, po[o2][b], O[o2]);
            }
            M[o2] = mc;
        }
    }
#pragma unroll
    for (int o2 = 0; o2 < OPT; ++o2) {
        const int idx = tid + o2 * kAttnThreads;
        if (idx < hb * D) out[static_cast<size_t>(h0) * D + idx] = __float2half_rn(O[o2] / L[o2]);
    }
}

// ---------------------------------------------------------------------------------------------------------------------
// Host-side dispatch
// ---------------------------------------------------------------------------------------------------------------------
// scores: [rows][max_pages]; selected / tickets: the fused kernel's outputs and its per-KV-head ticket counters
// (nullptr when !FUSED).
template <int D, int GT, bool FUSED>
void launch_scores(float* scores, int* selected, int* tickets, const __half* q, const KvLayerView& kv,
                   const int* d_pos, int num_heads, int page_budget, GqaPolicy policy, const RopeArgs& ra,
                   cudaStream_t stream) {
    constexpr int smem = ScoreCfg<D, GT>::SMEM_BYTES;
    static std::atomic<uint64_t> attr_set{0};  // devices on which the > 48 KB opt-in was made
    static std::atomic<int> per_sm{0};
    int dev = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    const uint64_t bit = dev < 64 ? (uint64_t{1} << dev) : 0;
    if (!bit || !(attr_set.load(std::memory_order_acquire) & bit)) {  // first launch on this device
        CUDA_CHECK(cudaFuncSetAttribute(page_scores_kernel<D, GT, FUSED>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        smem));
        int b = 0;
        CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, page_scores_kernel<D, GT, FUSED>, kScoreThreads,
                                                                 smem));
        per_sm.store(std::max(b, 1), std::memory_order_relaxed);
        attr_set.fetch_or(bit, std::memory_order_release);
    }
    const long long max_items =
        static_cast<long long>(ceil_div(std::max(kv.max_pages - 1, 1), kScoreTile)) * kv.num_kv_heads;
    const long long resident = static_cast<long long>(sm_count()) * per_sm.load(std::memory_order_relaxed);
    const int grid = static_cast<int>(std::min(max_items, resident));
    launch_pdl(page_scores_kernel<D, GT, FUSED>, dim3(grid), dim3(kScoreThreads), smem, stream, scores, selected,
               tickets, q, kv.kmin, kv.kmax, d_pos, num_heads, kv.num_kv_heads, kv.max_pages, log2_exact(kv.page_size),
               page_budget, static_cast<int>(policy == GqaPolicy::PerHead),
               static_cast<int>(policy == GqaPolicy::KvSum), ra);
}

// Every head_dim and query-head tile (with_head_dim / with_group_tile, kernels/common/cuda_common.cuh).
template <bool FUSED>
void launch_scores_any(float* scores, int* selected, int* tickets, const __half* q, const KvLayerView& kv,
                       const int* d_pos, int num_heads, int page_budget, GqaPolicy policy, const RopeArgs& ra,
                       cudaStream_t stream) {
    with_head_dim(kv.head_dim, "Quest page scores", [&](auto d) {
        with_group_tile(num_heads / kv.num_kv_heads, [&](auto gt) {
            launch_scores<decltype(d)::value, decltype(gt)::value, FUSED>(scores, selected, tickets, q, kv, d_pos,
                                                                          num_heads, page_budget, policy, ra, stream);
        });
    });
}

struct AttnArgs {
    __half* out;
    const __half* q;
    const KvLayerView* kv;
    const int* d_pos;
    const int* selected;
    int num_heads;
    int page_budget;
    GqaPolicy policy;
    float scale;
    const QuestWorkspace* ws;
    int pages_per_split;
    int max_splits;
    int select_stride;
    MatchedBudget match;
    cudaStream_t stream;
};

template <int D, int HB>
void launch_attention(const AttnArgs& a) {
    const KvLayerView& kv = *a.kv;
    const int G = a.num_heads / kv.num_kv_heads;
    const bool per_head = a.policy == GqaPolicy::PerHead;
    const int slabs = per_head ? a.num_heads : kv.num_kv_heads * ceil_div(G, HB);
    const dim3 grid(a.max_splits, slabs);
    launch_pdl(sparse_attention_kernel<D, HB>, grid, dim3(kAttnThreads), 0, a.stream, a.out, a.ws->partial_o,
               a.ws->partial_ml, a.ws->counters, a.q, kv.k, kv.v, a.selected, a.d_pos, a.num_heads, kv.num_kv_heads,
               kv.capacity, kv.max_pages, log2_exact(kv.page_size), a.page_budget, a.select_stride, a.match,
               a.pages_per_split, a.max_splits, static_cast<int>(per_head), a.scale * 1.4426950408889634f);
}

static_assert(kAttnMaxHeads == 8, "with_group_tile's largest tile");
void launch_attention_any(const AttnArgs& a) {
    with_head_dim(a.kv->head_dim, "Quest sparse attention", [&](auto d) {
        with_group_tile(a.policy == GqaPolicy::PerHead ? 1 : a.num_heads / a.kv->num_kv_heads,
                        [&](auto hb) { launch_attention<decltype(d)::value, decltype(hb)::value>(a); });
    });
}

}  // namespace

int quest_selection_rows(int num_heads, int num_kv_heads, GqaPolicy policy) {
    return policy == GqaPolicy::PerHead ? num_heads : num_kv_heads;
}

int quest_select_capacity(int max_pages, int page_size, int page_budget, const MatchedBudget& match) {
    if (!match.on()) return page_budget;
    QUEST_REQUIRE(match.head_dim >= 1 && match.rows >= 1 && match.meta_bytes <= 4 * match.head_dim,
                  "matched budget: head_dim and rows >= 1, metadata no larger than fp16's");
    QUEST_REQUIRE(static_cast<long long>(max_pages) * page_size < (1ll << 31), "capacity beyond 2^31 tokens");
    return std::max(page_budget, codes::max_step_pages(max_pages, page_size, page_budget, match));
}

QuestWorkspaceSizes quest_workspace_sizes(int num_heads, int num_kv_heads, int head_dim, int page_size,
                                          int max_pages, int page_budget, GqaPolicy policy, int pages_per_split,
                                          const MatchedBudget& match) {
    QUEST_REQUIRE(num_kv_heads >= 1 && num_heads >= 1 && num_heads % num_kv_heads == 0,
                  "num_heads must be a positive multiple of num_kv_heads");
    QUEST_REQUIRE(head_dim_supported(head_dim), "head_dim must be one of 8, 16, 32, 64, 128, 256");
    QUEST_REQUIRE(page_size >= 1 && page_size <= 256 && (page_size & (page_size - 1)) == 0,
                  "page_size must be a power of two in [1, 256]");
    QUEST_REQUIRE(max_pages >= 1 && page_budget >= 1, "max_pages and page_budget must be >= 1");
    QUEST_REQUIRE(pages_per_split >= 0 && pages_per_split <= kMaxPagesPerSplit, "pages_per_split in [0, 128]");
    QuestWorkspaceSizes s;
    s.rows = quest_selection_rows(num_heads, num_kv_heads, policy);
    s.select_stride = quest_select_capacity(max_pages, page_size, page_budget, match);
    int pps = pages_per_split;
    if (pps == 0) {
        // About 128 tokens per attention block (measured on an H200 at 32K tokens, B = 2048, S = 16: 8 pages per
        // block beat 2 and 4 for MHA and GQA; fewer pages per block mean more blocks to merge).
        pps = std::max(1, 128 / page_size);
    }
    pps = std::min(pps, s.select_stride);
    s.pages_per_split = pps;
    s.max_splits = ceil_div(s.select_stride, pps);
    s.scores = static_cast<size_t>(s.rows) * max_pages;
    s.selected = static_cast<size_t>(s.rows) * s.select_stride;
    s.topk_scratch = 0;
    s.partial_o = static_cast<size_t>(num_heads) * s.max_splits * head_dim;
    s.partial_ml = static_cast<size_t>(num_heads) * s.max_splits * 2;
    s.counters = static_cast<size_t>(num_heads) + num_kv_heads;
    return s;
}

void quest_page_scores(float* scores, const __half* q, const KvLayerView& kv, const int* d_pos, int num_heads,
                       int page_budget, GqaPolicy policy, cudaStream_t stream, const QuestRopeAppend* rope) {
    require_kv(kv, num_heads, page_budget);
    QUEST_REQUIRE(scores && q && kv.kmin && kv.kmax && d_pos, "null pointer");
    QUEST_REQUIRE(is_aligned(kv.kmin, 16) && is_aligned(kv.kmax, 16) && is_aligned(q, 4),
                  "metadata must be 16-byte aligned, q 4-byte aligned");
    launch_scores_any<false>(scores, nullptr, nullptr, q, kv, d_pos, num_heads, page_budget, policy,
                             rope_args(rope, kv, num_heads), stream);
}

void quest_page_scores_top_k(int* selected, float* scores, int* tickets, const __half* q, const KvLayerView& kv,
                             const int* d_pos, int num_heads, int page_budget, GqaPolicy policy,
                             cudaStream_t stream) {
    require_kv(kv, num_heads, page_budget);
    QUEST_REQUIRE(selected && scores && tickets && q && kv.kmin && kv.kmax && d_pos, "null pointer");
    QUEST_REQUIRE(is_aligned(kv.kmin, 16) && is_aligned(kv.kmax, 16) && is_aligned(q, 4),
                  "metadata must be 16-byte aligned, q 4-byte aligned");
    launch_scores_any<true>(scores, selected, tickets, q, kv, d_pos, num_heads, page_budget, policy, RopeArgs{},
                            stream);
}

namespace {
void launch_top_k(int* selected, const float* scores, int score_stride, const int* d_pos, int rows, int page_size,
                  int page_budget, cudaStream_t stream, const MatchedBudget& match, int select_stride) {
    QUEST_REQUIRE(selected && scores && d_pos, "null pointer");
    QUEST_REQUIRE(rows >= 1 && score_stride >= 1 && page_budget >= 1, "rows, score_stride, page_budget >= 1");
    if (select_stride == 0) select_stride = page_budget;
    QUEST_REQUIRE(select_stride >= page_budget, "select_stride must be >= page_budget");
    QUEST_REQUIRE(!match.on() || (match.head_dim >= 1 && match.rows >= 1 && match.meta_bytes <= 4 * match.head_dim),
                  "matched budget: head_dim and rows >= 1, metadata no larger than fp16's");
    QUEST_REQUIRE(page_size >= 1 && page_size <= 256 && (page_size & (page_size - 1)) == 0,
                  "page_size must be a power of two in [1, 256]");
    auto go = [&](auto kernel, int smem, bool cache) {
        launch_pdl(kernel, dim3(rows), dim3(kTopkThreads), static_cast<size_t>(smem), stream, selected, scores,
                   score_stride, d_pos, log2_exact(page_size), page_budget, static_cast<int>(cache), select_stride,
                   match);
    };
    if (score_stride <= kTopkThreads * 4) return go(top_k_kernel<4>, 0, false);
    if (score_stride <= kTopkThreads * 8) return go(top_k_kernel<8>, 0, false);
    if (score_stride <= kTopkThreads * kTopkRegMaxKpt) return go(top_k_kernel<kTopkRegMaxKpt>, 0, false);
    const bool cache = score_stride <= kTopkCacheMax;
    const int smem = cache ? score_stride * static_cast<int>(sizeof(uint32_t)) : 0;
    if (smem > 32 * 1024)  // opt in beyond the default 48 KB (static + dynamic); not a stream operation
        CUDA_CHECK(cudaFuncSetAttribute(top_k_kernel<0>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    go(top_k_kernel<0>, smem, cache);
}
}  // namespace

void quest_top_k(int* selected, const float* scores, int score_stride, const int* d_pos, int rows, int page_size,
                 int page_budget, cudaStream_t stream, const MatchedBudget& match, int select_stride) {
    launch_top_k(selected, scores, score_stride, d_pos, rows, page_size, page_budget, stream, match, select_stride);
}

void attention_decode_sparse(__half* out, const __half* q, const KvLayerView& kv, const int* d_pos,
                             const int* selected, int num_heads, int page_budget, GqaPolicy policy, float scale,
                             const QuestWorkspace& ws, cudaStream_t stream, const MatchedBudget& match) {
    require_kv(kv, num_heads, page_budget);
    QUEST_REQUIRE(out && q && kv.k && kv.v && d_pos && selected && ws.partial_o && ws.partial_ml && ws.counters,
                  "null pointer");
    QUEST_REQUIRE(is_aligned(kv.k, 16) && is_aligned(kv.v, 16) && is_aligned(q, 16),
                  "K/V cache and q must be 16-byte aligned");
    const QuestWorkspaceSizes sz = quest_workspace_sizes(num_heads, kv.num_kv_heads, kv.head_dim, kv.page_size,
                                                         kv.max_pages, page_budget, policy, ws.pages_per_split, match);
    AttnArgs a{out,   q,   &kv,          d_pos,           selected,         num_heads, page_budget, policy,
               scale, &ws, sz.pages_per_split, sz.max_splits, sz.select_stride, match,      stream};
    launch_attention_any(a);
}

void quest_decode(__half* out, const __half* q, const KvLayerView& kv, const int* d_pos, int num_heads,
                  int page_budget, GqaPolicy policy, float scale, const QuestWorkspace& ws, cudaStream_t stream,
                  const QuestDecodeOptions& opts) {
    const int rows = quest_selection_rows(num_heads, kv.num_kv_heads, policy);
    QUEST_REQUIRE(ws.scores && ws.selected && ws.counters, "null pointer");
    QUEST_REQUIRE(!opts.fused || (!opts.codes && !opts.match.on()),
                  "the fused scoring + top-k reads fp16 metadata and K pages only (no codes, no matched budget)");
    QUEST_REQUIRE(!opts.rope || (!opts.fused && !opts.codes && q == opts.rope->q_out),
                  "the RoPE append runs in the separate fp16-bounds scoring launch (not fused, no codes); "
                  "q must be rope->q_out");
    if (opts.fused) {
        quest_page_scores_top_k(ws.selected, ws.scores, ws.counters + num_heads, q, kv, d_pos, num_heads, page_budget,
                                policy, stream);
    } else {
        if (opts.codes)
            quest_code_scores(ws.scores, q, kv, *opts.codes, d_pos, num_heads, page_budget, policy, stream);
        else  // with opts.rope this launch also does the token's RoPE + append (RopeArgs)
            quest_page_scores(ws.scores, q, kv, d_pos, num_heads, page_budget, policy, stream, opts.rope);
        const int stride = quest_select_capacity(kv.max_pages, kv.page_size, page_budget, opts.match);
        launch_top_k(ws.selected, ws.scores, kv.max_pages, d_pos, rows, kv.page_size, page_budget, stream, opts.match,
                     stride);
    }
    attention_decode_sparse(out, q, kv, d_pos, ws.selected, num_heads, page_budget, policy, scale, ws, stream,
                            opts.match);
}

}  // namespace quest
