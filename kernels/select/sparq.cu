// The sparq selector on the GPU: the fp8 channel-major key sketch, its scoring, then Quest's top-k and sparse
// attention. API and semantics: kernels/select/sparq.cuh; the rules: kernels/select/sparq_rule.h.
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "kernels/common/device_utils.cuh"
#include "kernels/select/sparq.cuh"
#include "kernels/common/rope_device.cuh"
#include "kernels/select/sparq_rule.h"

namespace quest {

namespace {

__device__ __forceinline__ uint8_t to_e4m3(__half h) {
    return static_cast<uint8_t>(__nv_cvt_halfraw_to_fp8(static_cast<__half_raw>(h), __NV_SATFINITE, __NV_E4M3));
}

// ---------------------------------------------------------------------------------------------------------------------
// Prefill: tokens [t0, t1) of one KV head per block row; thread i of a tile writes channel i / 64's token i % 64
// (64 consecutive bytes per channel: coalesced), reading the fp16 key from the cache.
// ---------------------------------------------------------------------------------------------------------------------
constexpr int kWriteTokens = 64;

__global__ void sketch_write_kernel(uint8_t* __restrict__ k8, int kcap, const __half* __restrict__ k, int head_dim,
                                    int capacity, int t0, int t1) {
    const int kvh = blockIdx.y;
    const int tile0 = t0 + static_cast<int>(blockIdx.x) * kWriteTokens;
    const int n = head_dim * kWriteTokens;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const int c = i / kWriteTokens, t = tile0 + i % kWriteTokens;
        if (t >= t1) continue;
        const __half v = k[(static_cast<size_t>(kvh) * capacity + t) * head_dim + c];
        k8[(static_cast<size_t>(kvh) * head_dim + c) * kcap + t] = to_e4m3(v);
    }
}

// ---------------------------------------------------------------------------------------------------------------------
// Decode scoring. Block = kThreads threads of one KV head, thread x = kTok consecutive tokens (kBlockTokens per block;
// a warp reads 512 contiguous bytes of a channel's row per 16-byte load). After the wait the block holds its group's
// q in shared memory (read from q, or with the RoPE folded in rotated from qkv exactly as rope_append_kv rotates it)
// and picks the r channels (sparq_rule.h: a_i = sum_g |q_g,i| in head order, the r largest, ties to the lower
// channel, ascending); each thread then streams its 16 bytes of the r rows (up to 8 loads in flight) and keeps kTok
// token logits per head of the batch (GT heads; larger groups in batches). A page's value is the max over its tokens:
// pages of S < kTok tokens inside a thread (a tree over its logits), of S > kTok over its S / kTok threads (xor
// shuffles inside a warp); the thread holding a page's first token writes it. The blocks start at the 16-aligned
// token at or below the window's first page (token 0 without a window), so that every load is 16-byte aligned; pages
// before the window's are not written. For a group above one head each block also writes, per head, the (max, sum of
// exp(v - max)) of the page values it wrote (parts; sparq_shares_kernel combines them).
// With the RoPE folded in (ra.qkv): block 0 of each KV head writes the token's sketch from its own rotation of the
// key (the same expressions), and after its scores the grid does rope_append_kv's work for the token (q_out, its k
// and v, the current page's bounds; rope_dev items spread over every thread), which no block of it reads.
// ---------------------------------------------------------------------------------------------------------------------
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kTok = 16;                         // tokens per thread: one 16-byte load of a channel's row
constexpr int kBlockTokens = kThreads * kTok;    // 4096 tokens per scoring block
constexpr int kMaxPage = 256;                    // the largest page size (QuestSettings)

// Partial slots per head (above every scoring block's index): block b starts at a token >= b * kBlockTokens below
// the complete tokens, (max_pages - 1) * S <= (max_pages - 1) * kMaxPage.
QUEST_HD inline int parts_per_head(int max_pages) { return (max_pages - 1) / (kBlockTokens / kMaxPage) + 1; }
// Where the partials start in the workspace, in floats: after the page values, 8-byte aligned for float2.
inline size_t parts_offset(int num_heads, int max_pages) {
    return (static_cast<size_t>(num_heads) * static_cast<size_t>(max_pages) + 1) / 2 * 2;
}
// The first scoring block's first token: the window's first page's token rounded down to a multiple of kTok.
QUEST_HD inline int scoring_origin(int f, int page_size) { return (f * page_size) & ~(kTok - 1); }
// The scoring blocks of a selecting step with P pages from the window's first page f on: those holding a token of a
// complete page (the blocks of the grid beyond them score nothing).
QUEST_HD inline int scoring_blocks(int P, int f, int page_size) {
    return ((P - 1) * page_size - scoring_origin(f, page_size) + kBlockTokens - 1) / kBlockTokens;
}

struct SparqRope {
    const float* qkv = nullptr;  // [q_dim | kv_dim | kv_dim] fp32, or null: q is read, the append was done before
    __half* q_out = nullptr;
    RopeDeviceParams rope;
};

__device__ __forceinline__ void e4m3x4_to_float(uint32_t w, float (&f)[4]) {
    const __half2_raw lo = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(w & 0xFFFFu), __NV_E4M3);
    const __half2_raw hi = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(w >> 16), __NV_E4M3);
    const float2 a = __half22float2(__half2(lo)), b = __half22float2(__half2(hi));
    f[0] = a.x;
    f[1] = a.y;
    f[2] = b.x;
    f[3] = b.y;
}

__device__ __forceinline__ void e4m3x16_to_float(const uint4& w, float (&f)[16]) {
    const uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        float q[4];
        e4m3x4_to_float(words[i], q);
#pragma unroll
        for (int j = 0; j < 4; ++j) f[4 * i + j] = q[j];
    }
}

struct ScoreOut {
    float* lse = nullptr;     // [num_heads][max_pages]: entry p - f of head h is page p's value
    float2* parts = nullptr;  // [num_heads][parts_per_head(max_pages)]: per block (max, sum exp(v - max)); null for a
                              // group of one head
};

template <int D, int GT, bool SMALL>
__device__ __forceinline__ void score_block(const ScoreOut& o, const uint8_t* __restrict__ k8, int kcap,
                                            const KvLayerView& kv, int num_heads, int len, int f, float scale,
                                            const float* s_qf, float* s_w, int* s_ch, int* s_warp, float (*s_q)[D / 8],
                                            float2 (*s_part)[GT]) {
    constexpr int RMAX = D / 8;
    constexpr bool kParts = GT > 1;  // a group above one head (o.parts set)
    const int page_size = kv.page_size;
    const int R = sparq::channels(D, page_size);  // <= RMAX
    const int kvh = blockIdx.y, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int G = num_heads / kv.num_kv_heads;
    const int P = (len + page_size - 1) / page_size;
    const int complete_tokens = (P - 1) * page_size;
    const int page_log2 = 31 - __clz(page_size);
    // The channel choice: thread i < D weighs channel i, ranks it against every channel, and the chosen ones find
    // their ascending place with a ballot per warp.
    if (tid < D) {
        float w = 0.0f;
        for (int g = 0; g < G; ++g) w += fabsf(s_qf[g * D + tid]);
        s_w[tid] = w;
    }
    __syncthreads();
    bool chosen = false;
    if (tid < D) {
        const float wi = s_w[tid];
        int rank = 0;
#pragma unroll 16
        for (int j = 0; j < D; ++j) {
            const float wj = s_w[j];
            rank += (wj > wi || (wj == wi && j < tid)) ? 1 : 0;
        }
        chosen = rank < R;
    }
    const unsigned ballot = __ballot_sync(0xffffffffu, chosen);
    if (lane == 0) s_warp[warp] = __popc(ballot);
    __syncthreads();
    if (chosen) {
        int pos = __popc(ballot & ((1u << lane) - 1u));
        for (int w = 0; w < warp; ++w) pos += s_warp[w];
        s_ch[pos] = tid;
    }
    // Thread tid covers tokens t .. t + 15: each load of a warp reads 512 contiguous bytes of one channel's row
    // (16-byte aligned: t is a multiple of 16, the sketch's capacity too). Page p >= f is entry p - f of the head's row.
    const int t = scoring_origin(f, page_size) + static_cast<int>(blockIdx.x) * kBlockTokens + tid * kTok;
    const bool load = t < complete_tokens;      // a token of a complete page among them
    const int TP = max(page_size / kTok, 1);   // threads per page (1..16)
    const bool first = (tid % TP) == 0;
    const uint8_t* base = k8 + static_cast<size_t>(kvh) * D * kcap + t;
    constexpr int U = RMAX < 8 ? RMAX : 8;  // channels per batch of loads
    for (int gb = 0; gb < G; gb += GT) {
        const int ng = min(GT, G - gb);
        __syncthreads();  // s_ch ready (first batch); the previous batch's s_q and s_part read
        for (int i = tid; i < GT * R; i += kThreads) {
            const int g = i / R, j = i % R;
            s_q[g][j] = g < ng ? s_qf[(gb + g) * D + s_ch[j]] : 0.0f;
        }
        __syncthreads();
        float acc[GT][kTok];
#pragma unroll
        for (int g = 0; g < GT; ++g)
#pragma unroll
            for (int u = 0; u < kTok; ++u) acc[g][u] = 0.0f;
#pragma unroll 1
        for (int j0 = 0; j0 < R; j0 += U) {  // R is RMAX / 2^k: a multiple of U, or below it
            const int nu = min(U, R - j0);
            uint4 raw[U];
#pragma unroll
            for (int u = 0; u < U; ++u)
                raw[u] = u < nu && load ? *reinterpret_cast<const uint4*>(base + static_cast<size_t>(s_ch[j0 + u]) * kcap)
                                        : make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
            for (int u = 0; u < U; ++u) {
                if (u >= nu) break;
                float kf[kTok];
                e4m3x16_to_float(raw[u], kf);
#pragma unroll
                for (int g = 0; g < GT; ++g) {
                    const float qv = s_q[g][j0 + u];
#pragma unroll
                    for (int e = 0; e < kTok; ++e) acc[g][e] = fmaf(qv, kf[e], acc[g][e]);
                }
            }
        }
#pragma unroll
        for (int g = 0; g < GT; ++g) {
            float pm = -INFINITY, ps = 0.0f;  // this thread's share of the block's partial
            if constexpr (SMALL) {  // pages of S < kTok tokens: m[e] the max of tokens e .. e + S - 1 at e % S == 0
                float* m = acc[g];
#pragma unroll
                for (int w = 1; w < kTok / 2; w <<= 1)
                    if (w < page_size) {
#pragma unroll
                        for (int e = 0; e < kTok; e += 2 * w) m[e] = fmaxf(m[e], m[e + w]);
                    }
#pragma unroll
                for (int e = 0; e < kTok; ++e) {
                    const int p = (t + e) >> page_log2;
                    if ((e & (page_size - 1)) == 0 && g < ng && load && p >= f && p < P - 1) {
                        const float v = scale * m[e];
                        o.lse[static_cast<size_t>(kvh * G + gb + g) * kv.max_pages + (p - f)] = v;
                        if (kParts) lse_merge(pm, ps, v, 1.0f);
                    }
                }
            } else {  // pages of kTok tokens or more: over the thread's tokens, then its page's TP threads
                float m = acc[g][0];
#pragma unroll
                for (int e = 1; e < kTok; ++e) m = fmaxf(m, acc[g][e]);
                for (int x = 1; x < TP; x <<= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, x));
                if (g < ng && load && first) {
                    const float v = scale * m;
                    o.lse[static_cast<size_t>(kvh * G + gb + g) * kv.max_pages + (t >> page_log2) - f] = v;
                    if (kParts) lse_merge(pm, ps, v, 1.0f);
                }
            }
            if (kParts) {
                warp_lse_merge(pm, ps);
                if (lane == 0) s_part[warp][g] = make_float2(pm, ps);
            }
        }
        if (kParts) {
            __syncthreads();
            if (tid < ng) {  // the warps' partials in warp order
                float pm = s_part[0][tid].x, ps = s_part[0][tid].y;
                for (int w = 1; w < kWarps; ++w) lse_merge(pm, ps, s_part[w][tid].x, s_part[w][tid].y);
                o.parts[static_cast<size_t>(kvh * G + gb + tid) * parts_per_head(kv.max_pages) + blockIdx.x] =
                    make_float2(pm, ps);
            }
        }
    }
}

template <int D, int GT, bool SMALL>
__global__ void __launch_bounds__(kThreads) sparq_scores_kernel(ScoreOut o, uint8_t* __restrict__ k8, int kcap,
                                                               const __half* __restrict__ q, KvLayerView kv,
                                                               const int* __restrict__ d_pos, int num_heads,
                                                               int page_budget, float scale, SparqRope ra) {
    extern __shared__ float s_qf[];  // [G][D]: the group's q, fp32
    __shared__ float s_w[D];
    __shared__ int s_ch[D / 8];
    __shared__ int s_warp[kWarps];
    __shared__ float s_q[GT][D / 8];   // the batch's q on the chosen channels
    __shared__ float2 s_part[kWarps][GT];  // the warps' partials of the batch's heads
    pdl_wait();  // q (or qkv) and the token's key come from the kernels before; scores are read by the previous top-k
    const int capacity = kv.capacity, page_size = kv.page_size;
    const int len = *d_pos + 1;
    if (len < 1 || len > capacity) return;
    const int kvh = blockIdx.y, tid = threadIdx.x;
    const int G = num_heads / kv.num_kv_heads;
    const bool rope_on = ra.qkv != nullptr;
    const double dyn_base = rope_on ? rope_dev::dynamic_base(ra.rope, D, len) : 0.0;
    if (blockIdx.x == 0) {  // the current token's sketch (every step)
        uint8_t* col = k8 + static_cast<size_t>(kvh) * D * kcap + (len - 1);
        if (rope_on) {
            const float* kr = ra.qkv + static_cast<size_t>(num_heads) * D + static_cast<size_t>(kvh) * D;
            for (int i = tid; i < D / 2; i += kThreads) {
                float c, sn;
                rope_dev::cos_sin(ra.rope, D, i, len - 1, dyn_base, c, sn);
                __half k1, k2;
                rope_dev::rotate(kr[i], kr[i + D / 2], c, sn, k1, k2);
                col[static_cast<size_t>(i) * kcap] = to_e4m3(k1);
                col[static_cast<size_t>(i + D / 2) * kcap] = to_e4m3(k2);
            }
        } else {
            for (int c = tid; c < D; c += kThreads)
                col[static_cast<size_t>(c) * kcap] = to_e4m3(kv.k[(static_cast<size_t>(kvh) * capacity + (len - 1)) * D + c]);
        }
    }
    const int P = (len + page_size - 1) / page_size;
    const int f = window_start_of(len, kv.window) / page_size;  // the window's first page (0 without one)
    const bool scoring = P - f > page_budget && P <= kv.max_pages &&  // a selecting step inside the cache, and this
                         static_cast<int>(blockIdx.x) < scoring_blocks(P, f, page_size);  // block holds candidates
    if (scoring && blockIdx.x == 0)  // the last page is no candidate: no share of the normalisation
        for (int g = tid; g < G; g += kThreads)
            o.lse[static_cast<size_t>(kvh * G + g) * kv.max_pages + (P - 1 - f)] = -INFINITY;
    if (scoring) {  // block-uniform
        for (int i = tid; i < G * D / 2; i += kThreads) {  // the group's q
            const int g = i / (D / 2), j = i % (D / 2);
            const size_t h = static_cast<size_t>(kvh * G + g);
            float q0, q1;
            if (rope_on) {
                float c, sn;
                rope_dev::cos_sin(ra.rope, D, j, len - 1, dyn_base, c, sn);
                __half r1, r2;
                rope_dev::rotate(ra.qkv[h * D + j], ra.qkv[h * D + j + D / 2], c, sn, r1, r2);
                q0 = __half2float(r1);
                q1 = __half2float(r2);
            } else {
                q0 = __half2float(q[h * D + j]);
                q1 = __half2float(q[h * D + j + D / 2]);
            }
            s_qf[g * D + j] = q0;
            s_qf[g * D + j + D / 2] = q1;
        }
        __syncthreads();
        score_block<D, GT, SMALL>(o, k8, kcap, kv, num_heads, len, f, scale, s_qf, s_w, s_ch, s_warp, s_q, s_part);
    }
    if (rope_on) {  // the token's RoPE + append, spread over the grid, after the scores
        const rope_dev::Token tk{ra.q_out, kv, ra.qkv, len - 1, 1, num_heads};
        const int block = blockIdx.y * gridDim.x + blockIdx.x, blocks = gridDim.x * gridDim.y;
        rope_dev::append_token(tk, ra.rope, dyn_base, tid * blocks + block, blocks * kThreads);
    }
}

// ---------------------------------------------------------------------------------------------------------------------
// The shares of rows of several heads. Block = kSharesThreads threads of one KV head's row x a chunk of kSharesPages
// pages. Warp w combines the scoring blocks' partials of heads w, w + kWarps, ... (lanes over the blocks in order,
// then xor shuffles: M_h and Z_h, the same bits in every block), then thread t turns pages t, t + kSharesThreads, ...
// of the chunk into each head's share exp(v - M_h) / Z_h and aggregates them in head order (kv-sum: sum, kv-max:
// max). Measured against doing this in the last scoring block of each KV head (docs/quest.md): one block per row is
// compute-bound at 128K (8192 pages x 4 heads of exp), these 64 blocks are not.
// ---------------------------------------------------------------------------------------------------------------------
constexpr int kSharesThreads = 256;
constexpr int kSharesPages = 4 * kSharesThreads;
constexpr int kMaxGroup = 64;

__global__ void __launch_bounds__(kSharesThreads) sparq_shares_kernel(float* __restrict__ scores,
                                                                      const float* __restrict__ lse,
                                                                      const float2* __restrict__ parts,
                                                                      const int* __restrict__ d_pos, int num_heads,
                                                                      int num_kv_heads, int max_pages, int page_size,
                                                                      int page_budget, int kv_sum, int window) {
    __shared__ float s_m[kMaxGroup], s_z[kMaxGroup];
    pdl_wait();  // lse and parts come from the scoring launch; scores are read by the previous layer's top-k
    const int len = *d_pos + 1;
    const int P_all = (len + page_size - 1) / page_size;
    const int f = window_start_of(len, window) / page_size;
    const int P = P_all - f;  // the window's pages, entries 0 .. P - 1
    if (len < 1 || P_all > max_pages || P <= page_budget) return;  // block-uniform: a dense step, or past the cache
    const int p0 = static_cast<int>(blockIdx.x) * kSharesPages;
    if (p0 >= P - 1) return;
    const int G = num_heads / num_kv_heads, r = blockIdx.y, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int blocks = scoring_blocks(P_all, f, page_size);
    const int stride = parts_per_head(max_pages);
    for (int g = warp; g < G; g += kSharesThreads / 32) {
        const float2* ph = parts + static_cast<size_t>(r * G + g) * stride;
        float m = -INFINITY, z = 0.0f;
        for (int b = lane; b < blocks; b += 32) lse_merge(m, z, ph[b].x, ph[b].y);
        warp_lse_merge(m, z);
        if (lane == 0) {
            s_m[g] = m;
            s_z[g] = z;  // >= 1: the largest page contributes exp(0)
        }
    }
    __syncthreads();
    const int p1 = min(p0 + kSharesPages, P - 1);
    float* row = scores + static_cast<size_t>(r) * max_pages;
    for (int p = p0 + tid; p < p1; p += kSharesThreads) {
        float a = 0.0f;
        for (int g = 0; g < G; ++g) {
            const float w = expf(lse[static_cast<size_t>(r * G + g) * max_pages + p] - s_m[g]) / s_z[g];
            a = g == 0 ? w : kv_sum ? a + w : fmaxf(a, w);
        }
        row[p] = a;
    }
}

template <int D>
void launch_scores(const ScoreOut& o, const KeySketchView& sk, const __half* q, const KvLayerView& kv,
                   const int* d_pos, int num_heads, int page_budget, float scale, const SparqRope& ra,
                   cudaStream_t stream) {
    const dim3 grid(ceil_div(kv.capacity, kBlockTokens), kv.num_kv_heads);
    const int G = num_heads / kv.num_kv_heads;
    const size_t smem = sizeof(float) * static_cast<size_t>(G) * D;
    QUEST_REQUIRE(smem <= 48 * 1024, "sparq: the group's q must fit in 48 KB of shared memory");
    with_group_tile(G, [&](auto gt) {
        constexpr int GT = decltype(gt)::value < 4 ? decltype(gt)::value : 4;
        auto* kernel = kv.page_size < kTok ? sparq_scores_kernel<D, GT, true> : sparq_scores_kernel<D, GT, false>;
        launch_pdl(kernel, grid, dim3(kThreads), smem, stream, o, sk.k8, sk.capacity, q, kv, d_pos, num_heads,
                   page_budget, scale, ra);
    });
}

void require_view(const KeySketchView& sk, const KvLayerView& kv) {
    QUEST_REQUIRE(sk.k8 && kv.k, "null pointer");
    QUEST_REQUIRE(sk.num_kv_heads == kv.num_kv_heads && sk.head_dim == kv.head_dim &&
                      sk.capacity == sparq_sketch_capacity(kv.capacity),
                  "the sketch's shape must be the KV cache's (capacity: sparq_sketch_capacity)");
    QUEST_REQUIRE(is_aligned(sk.k8, 16), "the sketch must be 16-byte aligned");
    require_sparq_supported(kv.head_dim, kv.page_size);
    QUEST_REQUIRE(kv.window >= 0, "window must be >= 0");
}

}  // namespace

size_t sparq_workspace_floats(int num_heads, int max_pages) {
    QUEST_REQUIRE(num_heads >= 1 && max_pages >= 1, "num_heads and max_pages must be >= 1");
    return parts_offset(num_heads, max_pages) + 2 * static_cast<size_t>(num_heads) * parts_per_head(max_pages);
}

const float* sparq_row_scores(const float* lse, const QuestWorkspace& ws, int num_heads, int num_kv_heads,
                              GqaPolicy policy) {
    return sparq::rows_rank_values(policy == GqaPolicy::PerHead, num_heads / num_kv_heads) ? lse : ws.scores;
}

int sparq_sketch_capacity(int kv_capacity) { return (kv_capacity + 15) / 16 * 16; }

size_t key_sketch_bytes(int num_kv_heads, int head_dim, int kv_capacity) {
    return static_cast<size_t>(num_kv_heads) * static_cast<size_t>(head_dim) *
           static_cast<size_t>(sparq_sketch_capacity(kv_capacity));
}

void require_sparq_supported(int head_dim, int page_size) {
    if (head_dim < 8 || head_dim > 256 || (head_dim & (head_dim - 1)) != 0)
        throw std::invalid_argument("sparq on the GPU needs head_dim a power of two in [8, 256], got " +
                                    std::to_string(head_dim));
    if (page_size < 1 || page_size > kMaxPage || (page_size & (page_size - 1)) != 0 ||
        !sparq::supported(head_dim, page_size))
        throw std::invalid_argument("sparq needs a page size that is a power of two of at most 2 x head_dim (" +
                                    std::to_string(std::min(2 * head_dim, kMaxPage)) + "), got " +
                                    std::to_string(page_size) + " (head_dim " + std::to_string(head_dim) + ")");
}

void sparq_sketch_write(const KeySketchView& sk, const KvLayerView& kv, int t0, int t1, cudaStream_t stream) {
    require_view(sk, kv);
    QUEST_REQUIRE(0 <= t0 && t0 <= t1 && t1 <= kv.capacity, "token range outside the cache");
    if (t1 == t0) return;
    const dim3 grid(ceil_div(t1 - t0, kWriteTokens), kv.num_kv_heads);
    sketch_write_kernel<<<grid, 256, 0, stream>>>(sk.k8, sk.capacity, kv.k, kv.head_dim, kv.capacity, t0, t1);
    CUDA_CHECK_LAUNCH();
}

void sparq_page_lse(float* lse, const KeySketchView& sk, const __half* q, const KvLayerView& kv, const int* d_pos,
                    int num_heads, int page_budget, float scale, cudaStream_t stream, const QuestRopeAppend* rope) {
    require_view(sk, kv);
    QUEST_REQUIRE(lse && q && d_pos, "null pointer");
    QUEST_REQUIRE(is_aligned(lse, 8), "the workspace must be 8-byte aligned");
    QUEST_REQUIRE(std::isfinite(scale) && scale > 0.0f, "scale must be positive and finite");
    QUEST_REQUIRE(num_heads >= 1 && num_heads % kv.num_kv_heads == 0,
                  "num_heads must be a positive multiple of num_kv_heads");
    QUEST_REQUIRE(kv.max_pages >= 1 && page_budget >= 1, "max_pages and page_budget must be >= 1");
    QUEST_REQUIRE(static_cast<long long>(kv.max_pages) * kv.page_size <= kv.capacity,
                  "max_pages * page_size must fit in capacity");
    SparqRope ra;
    if (rope) {
        require_rope_append("sparq RoPE append", rope->q_out, kv, rope->qkv, 1, num_heads, rope->rope);
        QUEST_REQUIRE(q == rope->q_out, "with the RoPE folded in, q must be rope->q_out");
        ra.qkv = rope->qkv;
        ra.q_out = rope->q_out;
        ra.rope = rope->rope;
    }
    ScoreOut o;
    o.lse = lse;
    o.parts = num_heads > kv.num_kv_heads
                  ? reinterpret_cast<float2*>(lse + parts_offset(num_heads, kv.max_pages))
                  : nullptr;
    with_head_dim(kv.head_dim, "sparq_page_lse", [&](auto d) {
        launch_scores<decltype(d)::value>(o, sk, q, kv, d_pos, num_heads, page_budget, scale, ra, stream);
    });
}

void sparq_row_shares(float* scores, const float* lse, const int* d_pos, int num_heads, int num_kv_heads,
                      int max_pages, int page_size, int page_budget, GqaPolicy policy, cudaStream_t stream,
                      int window) {
    QUEST_REQUIRE(scores && lse && d_pos, "null pointer");
    QUEST_REQUIRE(is_aligned(lse, 8), "the workspace must be 8-byte aligned");
    QUEST_REQUIRE(num_kv_heads >= 1 && num_heads > num_kv_heads && num_heads % num_kv_heads == 0 &&
                      num_heads / num_kv_heads <= kMaxGroup,
                  "the shares need a group of 2 to 64 query heads per KV head");
    QUEST_REQUIRE(policy != GqaPolicy::PerHead, "per-head rows rank the page values themselves (no shares)");
    QUEST_REQUIRE(page_size >= 1 && page_size <= kMaxPage && (page_size & (page_size - 1)) == 0,
                  "page_size must be a power of two in [1, 256]");
    QUEST_REQUIRE(max_pages >= 1 && page_budget >= 1 && window >= 0, "max_pages, page_budget >= 1, window >= 0");
    const float2* parts = reinterpret_cast<const float2*>(lse + parts_offset(num_heads, max_pages));
    launch_pdl(sparq_shares_kernel, dim3(ceil_div(max_pages, kSharesPages), num_kv_heads), dim3(kSharesThreads), 0,
               stream, scores, lse, parts, d_pos, num_heads, num_kv_heads, max_pages, page_size, page_budget,
               static_cast<int>(policy == GqaPolicy::KvSum), window);
}

void sparq_decode(__half* out, const KeySketchView& sk, float* lse, const __half* q, const KvLayerView& kv,
                  const int* d_pos, int num_heads, int page_budget, GqaPolicy policy, float scale,
                  const MatchedBudget& match, const QuestWorkspace& ws, cudaStream_t stream,
                  const QuestRopeAppend* rope) {
    QUEST_REQUIRE(ws.scores && ws.selected && lse, "null pointer");
    const int rows = quest_selection_rows(num_heads, kv.num_kv_heads, policy);
    if (match.on()) {
        const MatchedBudget own = sparq::budget(kv.page_size, kv.head_dim, policy == GqaPolicy::PerHead ? num_heads / kv.num_kv_heads : 1);
        QUEST_REQUIRE(match.meta_bytes == own.meta_bytes && match.head_dim == own.head_dim && match.rows == own.rows &&
                          match.fixed_bytes == own.fixed_bytes,
                      "a matched budget must be sparq::budget of the layer's shape");
    }
    sparq_page_lse(lse, sk, q, kv, d_pos, num_heads, page_budget, scale, stream, rope);
    // A row of one head ranks v itself (sparq_rule.h): lse is its score row (stride max_pages, the last page -inf).
    const float* scores = sparq_row_scores(lse, ws, num_heads, kv.num_kv_heads, policy);
    if (scores != lse)
        sparq_row_shares(ws.scores, lse, d_pos, num_heads, kv.num_kv_heads, kv.max_pages, kv.page_size, page_budget,
                         policy, stream, kv.window);
    const int stride = quest_select_capacity(kv.max_pages, kv.page_size, page_budget, match);
    quest_top_k(ws.selected, scores, kv.max_pages, d_pos, rows, kv.page_size, page_budget, stream, match, stride,
                kv.window);
    attention_decode_sparse(out, q, kv, d_pos, ws.selected, num_heads, page_budget, policy, scale, ws, stream, match);
}

}  // namespace quest
