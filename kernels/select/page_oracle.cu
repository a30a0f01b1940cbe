// The oracle selector on the GPU: page log-sum-exps over every key, the selection rows' true-mass scores, then
// Quest's top-k. API and semantics: kernels/select/page_oracle.cuh.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "kernels/common/device_utils.cuh"
#include "kernels/select/page_oracle.cuh"
#include "kernels/select/quest.cuh"

namespace quest {

namespace {

bool oracle_head_dim(int d) { return d >= 8 && d <= 256 && (d & (d - 1)) == 0; }
bool oracle_page_size(int s) { return s >= 1 && s <= 256 && (s & (s - 1)) == 0; }

__device__ __forceinline__ float oracle_warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// ---------------------------------------------------------------------------------------------------------------------
// 1. Page log-sum-exps
//
// Block (128 threads, 4 warps) = one KV head x a chunk of kLsePagesPerBlock pages; warp w handles pages
// chunk0 + w, chunk0 + w + 4, ... (kLsePagesPerWarp of them). Within a page, a key row is read by LPT = D/8 lanes with
// one 16-byte load each (a warp load covers 32/LPT consecutive rows: coalesced), kLseUnroll loads in flight per lane.
// Each lane keeps its slice of q for up to GT heads of the group (fp32 registers); the logit of (token, head) is the
// 8-channel partial dot reduced over the token's LPT lanes (xor shuffles: every lane of the group gets it), times
// scale. Each lane group keeps an online (max, sum exp(l - max)) per head, in expf (no fast math); at the end of the
// page the lane groups are merged (xor shuffles) and lane 0 writes lse = max + log(sum) of each head. Groups above GT
// heads are done in batches of GT (the keys re-read, from L2). Tokens >= len are never read.
// ---------------------------------------------------------------------------------------------------------------------
constexpr int kLseThreads = 128;
constexpr int kLseWarps = kLseThreads / 32;
constexpr int kLsePagesPerWarp = 4;
constexpr int kLsePagesPerBlock = kLseWarps * kLsePagesPerWarp;
constexpr int kLseUnroll = 4;

template <int D, int GT>
__global__ void __launch_bounds__(kLseThreads, 1) page_lse_kernel(float* __restrict__ lse, const __half* __restrict__ q,
                                                               const __half* __restrict__ k,
                                                               const int* __restrict__ d_pos, int num_heads,
                                                               int num_kv_heads, int capacity, int max_pages,
                                                               int page_size_log2, int page_budget, float scale,
                                                               int window) {
    constexpr int LPT = D / 8;     // lanes per key row (one 16-byte piece = 8 channels each)
    constexpr int TPW = 32 / LPT;  // key rows per warp load
    pdl_wait();  // q and the current token's key come from the kernels before this one; lse is read by the last step
    const int len = *d_pos + 1;
    const int S = 1 << page_size_log2;
    const int P = (len + S - 1) >> page_size_log2;
    // A sliding window: pages f .. P-1, page f + p's lse in entry p (kernels/select/quest.cuh).
    const int f = window_start_of(len, window) >> page_size_log2;
    if (len < 1 || P > max_pages || P - f <= page_budget) return;  // outside the cache, or a dense step
    const int kvh = blockIdx.y;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int row_in_load = lane / LPT, piece = lane % LPT;
    const int G = num_heads / num_kv_heads;
    const __half* kh = k + static_cast<size_t>(kvh) * capacity * D + piece * 8;
    const int chunk0 = static_cast<int>(blockIdx.x) * kLsePagesPerBlock;
    if (chunk0 >= P - f) return;
    for (int gb = 0; gb < G; gb += GT) {
        const int ng = min(GT, G - gb);
        float qs[GT][8];  // this lane's 8 channels of q for the batch's heads (0 beyond the group)
#pragma unroll
        for (int g = 0; g < GT; ++g) {
            if (g < ng) {
                const uint4 raw =
                    *reinterpret_cast<const uint4*>(q + static_cast<size_t>(kvh * G + gb + g) * D + piece * 8);
                half8_to_float(raw, qs[g]);
            } else {
#pragma unroll
                for (int j = 0; j < 8; ++j) qs[g][j] = 0.0f;
            }
        }
#pragma unroll 1
        for (int j = 0; j < kLsePagesPerWarp; ++j) {
            const int p = chunk0 + j * kLseWarps + warp;
            if (p >= P - f) break;  // warp-uniform
            const int t0 = (f + p) << page_size_log2, t1 = min(len, t0 + S);
            float m[GT], s[GT];
#pragma unroll
            for (int g = 0; g < GT; ++g) {
                m[g] = -INFINITY;
                s[g] = 0.0f;
            }
#pragma unroll 1
            for (int tb = t0; tb < t1; tb += TPW * kLseUnroll) {  // warp-uniform bounds
                uint4 raw[kLseUnroll];
#pragma unroll
                for (int u = 0; u < kLseUnroll; ++u) {
                    const int t = tb + u * TPW + row_in_load;
                    raw[u] = t < t1 ? *reinterpret_cast<const uint4*>(kh + static_cast<size_t>(t) * D)
                                    : make_uint4(0u, 0u, 0u, 0u);
                }
#pragma unroll
                for (int u = 0; u < kLseUnroll; ++u) {
                    const int t = tb + u * TPW + row_in_load;
                    float kf[8];
                    half8_to_float(raw[u], kf);
#pragma unroll
                    for (int g = 0; g < GT; ++g) {
                        float dot = 0.0f;
#pragma unroll
                        for (int c = 0; c < 8; ++c) dot = fmaf(qs[g][c], kf[c], dot);
#pragma unroll
                        for (int o = LPT / 2; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
                        if (t < t1) {
                            const float x = dot * scale;
                            const float mn = fmaxf(m[g], x);
                            s[g] = s[g] * expf(m[g] - mn) + expf(x - mn);  // m = -inf at first: expf(-inf) = 0
                            m[g] = mn;
                        }
                    }
                }
            }
            // Merge the warp's lane groups (each holds the same state on its LPT lanes).
#pragma unroll
            for (int o = LPT; o < 32; o <<= 1)
#pragma unroll
                for (int g = 0; g < GT; ++g) {
                    const float mo = __shfl_xor_sync(0xffffffffu, m[g], o);
                    const float so = __shfl_xor_sync(0xffffffffu, s[g], o);
                    lse_merge(m[g], s[g], mo, so);
                }
            // Every lane holds the merged state; lane 0 writes (a per-lane pick m[lane] would index the register
            // arrays dynamically: local memory).
            if (lane == 0) {
#pragma unroll
                for (int g = 0; g < GT; ++g)  // s >= 1: the page's largest logit contributes exp(0)
                    if (g < ng) lse[static_cast<size_t>(kvh * G + gb + g) * max_pages + p] = m[g] + logf(s[g]);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------------------------------
// 2. Row scores
//
// One block (256 threads) per selection row. For each head of the row in head order: M = max_p lse (block max), then
// Z = sum_p exp(lse_p - M) (thread t sums pages t, t + 256, ... in order, then a fixed warp-shuffle tree and the 8
// warps' sums in warp order: the same bits at every launch), then thread t turns its pages into masses
// exp(lse_p - M) / Z and folds them into the row score of the complete pages it owns (the same thread owns the same
// pages for every head: no race, no barrier needed for the scores).
// ---------------------------------------------------------------------------------------------------------------------
constexpr int kRowThreads = 256;
constexpr int kRowWarps = kRowThreads / 32;

// The block's max (MAX) or sum of v, in a fixed order; every thread gets it. Uses s_red[kRowWarps]; barriers inside.
template <bool MAX>
__device__ __forceinline__ float row_block_reduce(float v, float* s_red) {
    v = MAX ? oracle_warp_max(v) : warp_sum(v);
    if ((threadIdx.x & 31) == 0) s_red[threadIdx.x >> 5] = v;
    __syncthreads();
    float r = s_red[0];
#pragma unroll
    for (int w = 1; w < kRowWarps; ++w) r = MAX ? fmaxf(r, s_red[w]) : r + s_red[w];
    __syncthreads();  // s_red is free for the next reduction
    return r;
}

__global__ void __launch_bounds__(kRowThreads) oracle_rows_kernel(float* __restrict__ scores, float* __restrict__ mass,
                                                                  const float* __restrict__ lse,
                                                                  const int* __restrict__ d_pos, int num_heads,
                                                                  int num_kv_heads, int max_pages, int page_size_log2,
                                                                  int page_budget, int per_head, int kv_sum,
                                                                  int window) {
    __shared__ float s_red[kRowWarps];
    pdl_wait();  // lse comes from page_lse_kernel; scores are read by the previous layer's top-k
    const int len = *d_pos + 1;
    const int P_all = (len + (1 << page_size_log2) - 1) >> page_size_log2;
    // A sliding window: the entries are pages f, f + 1, ... (page_lse_kernel); P counts the window's pages.
    const int P = P_all - (window_start_of(len, window) >> page_size_log2);
    if (len < 1 || P_all > max_pages || P <= page_budget) return;  // block-uniform
    const int G = num_heads / num_kv_heads;
    const int r = blockIdx.x;
    const int h0 = per_head ? r : r * G, nh = per_head ? 1 : G;
    float* row = scores + static_cast<size_t>(r) * max_pages;
    const int tid = threadIdx.x;
    for (int g = 0; g < nh; ++g) {
        const float* lh = lse + static_cast<size_t>(h0 + g) * max_pages;
        float mx = -INFINITY;
        for (int p = tid; p < P; p += kRowThreads) mx = fmaxf(mx, lh[p]);
        mx = row_block_reduce<true>(mx, s_red);
        float z = 0.0f;
        for (int p = tid; p < P; p += kRowThreads) z += expf(lh[p] - mx);
        z = row_block_reduce<false>(z, s_red);  // >= 1: the largest page contributes exp(0)
        for (int p = tid; p < P; p += kRowThreads) {
            const float w = expf(lh[p] - mx) / z;
            if (mass) mass[static_cast<size_t>(h0 + g) * max_pages + p] = w;
            if (p < P - 1) row[p] = g == 0 ? w : kv_sum ? row[p] + w : fmaxf(row[p], w);
        }
    }
}

// ---------------------------------------------------------------------------------------------------------------------
// Host-side dispatch
// ---------------------------------------------------------------------------------------------------------------------
template <int D, int GT>
void launch_lse(float* lse, const __half* q, const KvLayerView& kv, const int* d_pos, int num_heads, int page_budget,
                float scale, cudaStream_t stream) {
    const dim3 grid(ceil_div(kv.max_pages, kLsePagesPerBlock), kv.num_kv_heads);
    launch_pdl(page_lse_kernel<D, GT>, grid, dim3(kLseThreads), 0, stream, lse, q, kv.k, d_pos, num_heads,
               kv.num_kv_heads, kv.capacity, kv.max_pages, log2_exact(kv.page_size), page_budget, scale, kv.window);
}

template <int D>
void launch_lse_d(float* lse, const __half* q, const KvLayerView& kv, const int* d_pos, int num_heads,
                  int page_budget, float scale, cudaStream_t stream) {
    const int G = num_heads / kv.num_kv_heads;
    if (G <= 1) return launch_lse<D, 1>(lse, q, kv, d_pos, num_heads, page_budget, scale, stream);
    if (G <= 2) return launch_lse<D, 2>(lse, q, kv, d_pos, num_heads, page_budget, scale, stream);
    if (G <= 4) return launch_lse<D, 4>(lse, q, kv, d_pos, num_heads, page_budget, scale, stream);
    return launch_lse<D, 8>(lse, q, kv, d_pos, num_heads, page_budget, scale, stream);  // batches of 8 beyond
}

}  // namespace

size_t oracle_workspace_floats(int num_heads, int max_pages) {
    QUEST_REQUIRE(num_heads >= 1 && max_pages >= 1, "num_heads and max_pages must be >= 1");
    return static_cast<size_t>(num_heads) * static_cast<size_t>(max_pages);
}

void oracle_page_lse(float* lse, const __half* q, const KvLayerView& kv, const int* d_pos, int num_heads,
                     int page_budget, float scale, cudaStream_t stream) {
    QUEST_REQUIRE(lse && q && kv.k && d_pos, "null pointer");
    QUEST_REQUIRE(kv.num_kv_heads >= 1 && num_heads >= 1 && num_heads % kv.num_kv_heads == 0,
                  "num_heads must be a positive multiple of num_kv_heads");
    QUEST_REQUIRE(oracle_head_dim(kv.head_dim), "head_dim must be a power of two in [8, 256]");
    QUEST_REQUIRE(oracle_page_size(kv.page_size), "page_size must be a power of two in [1, 256]");
    QUEST_REQUIRE(kv.max_pages >= 1 && page_budget >= 1, "max_pages and page_budget must be >= 1");
    QUEST_REQUIRE(static_cast<long long>(kv.max_pages) * kv.page_size <= kv.capacity,
                  "max_pages * page_size must fit in capacity");
    QUEST_REQUIRE(is_aligned(kv.k, 16) && is_aligned(q, 16), "the K cache and q must be 16-byte aligned");
    QUEST_REQUIRE(std::isfinite(scale) && scale > 0.0f, "scale must be positive and finite");
    with_head_dim(kv.head_dim, "oracle_lse", [&](auto d) {
        launch_lse_d<decltype(d)::value>(lse, q, kv, d_pos, num_heads, page_budget, scale, stream);
    });
}

void oracle_row_scores(float* scores, float* mass, const float* lse, const int* d_pos, int num_heads,
                       int num_kv_heads, int max_pages, int page_size, int page_budget, GqaPolicy policy,
                       cudaStream_t stream, int window) {
    QUEST_REQUIRE(scores && lse && d_pos, "null pointer");
    QUEST_REQUIRE(num_kv_heads >= 1 && num_heads >= 1 && num_heads % num_kv_heads == 0,
                  "num_heads must be a positive multiple of num_kv_heads");
    QUEST_REQUIRE(oracle_page_size(page_size), "page_size must be a power of two in [1, 256]");
    QUEST_REQUIRE(max_pages >= 1 && page_budget >= 1, "max_pages and page_budget must be >= 1");
    QUEST_REQUIRE(window >= 0, "window must be >= 0");
    const int rows = quest_selection_rows(num_heads, num_kv_heads, policy);
    launch_pdl(oracle_rows_kernel, dim3(rows), dim3(kRowThreads), 0, stream, scores, mass, lse, d_pos, num_heads,
               num_kv_heads, max_pages, log2_exact(page_size), page_budget,
               static_cast<int>(policy == GqaPolicy::PerHead), static_cast<int>(policy == GqaPolicy::KvSum),
               window);
}

void oracle_select(int* selected, float* scores, float* lse, const __half* q, const KvLayerView& kv, const int* d_pos,
                   int num_heads, int page_budget, GqaPolicy policy, float scale, cudaStream_t stream) {
    QUEST_REQUIRE(selected && scores, "null pointer");
    oracle_page_lse(lse, q, kv, d_pos, num_heads, page_budget, scale, stream);
    oracle_row_scores(scores, nullptr, lse, d_pos, num_heads, kv.num_kv_heads, kv.max_pages, kv.page_size,
                      page_budget, policy, stream, kv.window);
    quest_top_k(selected, scores, kv.max_pages, d_pos, quest_selection_rows(num_heads, kv.num_kv_heads, policy),
                kv.page_size, page_budget, stream, {}, 0, kv.window);
}

}  // namespace quest
