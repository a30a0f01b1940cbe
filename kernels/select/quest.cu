// GPU Quest decode path: page scores (and the fused scores + top-k), the chain quest_decode launches. API and
// semantics: kernels/select/quest.cuh; the top-k: topk.cu, topk_select.cuh; the sparse attention: sparse_attention.cu.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>

#include "kernels/select/quest.cuh"
#include "kernels/select/quest_common.cuh"
#include "kernels/select/topk_select.cuh"
#include "kernels/common/device_utils.cuh"
#include "kernels/common/rope_device.cuh"

namespace quest {

namespace {

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
constexpr int kScoreCh = 64;  // channels per pipeline stage: whole 128-byte lines
constexpr int kScoreThreads = 128;
constexpr int kScoreTile = 128;  // pages per item (one per thread)
constexpr int kScoreStages = 3;  // cp.async ring depth

template <int D, int GT>
struct ScoreCfg {
    static constexpr int CH = D < kScoreCh ? D : kScoreCh;  // channels per stage
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
    int num_kv_heads, int max_pages, int page_size_log2, int page_budget, int per_head, int kv_sum, int window,
    RopeArgs ra) {
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
    // A sliding window: the candidates are the complete pages from the one holding the window's first token on
    // (page f), scored into entries 0, 1, ... of the rows (the top-k adds f back); the fused kernel has no window.
    const int f = window_start_of(len, window) >> page_size_log2;
    if (P - f <= page_budget) {  // dense step: no scores; the fused kernel selects every page
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
    const int n = P - f - 1;  // candidates: the complete pages of the window
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
        const size_t meta0 = (static_cast<size_t>(kvh) * max_pages + f + p0) * D + ch * CH;
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
               static_cast<int>(policy == GqaPolicy::KvSum), kv.window, ra);
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
    QUEST_REQUIRE(kv.window == 0, "the fused scoring + top-k does not honour a sliding window (kv.window)");
    QUEST_REQUIRE(is_aligned(kv.kmin, 16) && is_aligned(kv.kmax, 16) && is_aligned(q, 4),
                  "metadata must be 16-byte aligned, q 4-byte aligned");
    launch_scores_any<true>(scores, selected, tickets, q, kv, d_pos, num_heads, page_budget, policy, RopeArgs{},
                            stream);
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
        quest_top_k(ws.selected, ws.scores, kv.max_pages, d_pos, rows, kv.page_size, page_budget, stream, opts.match,
                    stride, kv.window);
    }
    attention_decode_sparse(out, q, kv, d_pos, ws.selected, num_heads, page_budget, policy, scale, ws, stream,
                            opts.match);
}

}  // namespace quest
