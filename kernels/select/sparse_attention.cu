// GPU sparse attention over the selected pages with the merge fused (attention_decode_sparse,
// kernels/select/quest.cuh), and the Quest workspace it is sized by.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/select/quest.cuh"
#include "kernels/select/quest_common.cuh"

namespace quest {

namespace {

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
    int max_splits, int per_head, float scale_log2, int window) {
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
    // A sliding window: tokens before t0 are masked; the row was selected from page t0 / S on (quest.cuh).
    const int t0 = window_start_of(len, window);
    // Pages of the row at this length: min(P, K), or the matched count (<= select_stride by the workspace's sizing).
    const int n_sel =
        min(codes::step_pages(len - ((t0 >> page_size_log2) << page_size_log2), 1 << page_size_log2, page_budget,
                              match),
            select_stride);
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
            ok[u] = token >= t0 && token < len;
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
               a.pages_per_split, a.max_splits, static_cast<int>(per_head), a.scale * 1.4426950408889634f,
               kv.window);
}

static_assert(kAttnMaxHeads == 8, "with_group_tile's largest tile");
void launch_attention_any(const AttnArgs& a) {
    with_head_dim(a.kv->head_dim, "Quest sparse attention", [&](auto d) {
        with_group_tile(a.policy == GqaPolicy::PerHead ? 1 : a.num_heads / a.kv->num_kv_heads,
                        [&](auto hb) { launch_attention<decltype(d)::value, decltype(hb)::value>(a); });
    });
}

}  // namespace

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

}  // namespace quest
