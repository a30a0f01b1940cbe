// The sparq selector on the GPU: the fp8 channel-major key sketch, its scoring, then Quest's top-k and sparse
// attention. API and semantics: kernels/select/sparq.cuh; the rules: kernels/select/sparq_rule.h.
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "kernels/select/page_oracle.cuh"
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

__global__ void sketch_write_kernel(uint8_t* __restrict__ k8, const __half* __restrict__ k, int head_dim,
                                    int capacity, int t0, int t1) {
    const int kvh = blockIdx.y;
    const int tile0 = t0 + static_cast<int>(blockIdx.x) * kWriteTokens;
    const int n = head_dim * kWriteTokens;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const int c = i / kWriteTokens, t = tile0 + i % kWriteTokens;
        if (t >= t1) continue;
        const __half v = k[(static_cast<size_t>(kvh) * capacity + t) * head_dim + c];
        k8[(static_cast<size_t>(kvh) * head_dim + c) * capacity + t] = to_e4m3(v);
    }
}

// ---------------------------------------------------------------------------------------------------------------------
// Decode scoring. Block = kThreads threads of one KV head, thread x = kTok consecutive tokens (kThreads * kTok tokens
// per block; a warp reads 512 contiguous bytes of a channel's row per 16-byte load). After the wait the block holds its
// group's q in shared memory (read from q, or with the RoPE folded in rotated from qkv exactly as rope_append_kv
// rotates it) and picks the r channels (sparq_rule.h: a_i = sum_g |q_g,i| in head order, the r largest, ties to the
// lower channel, ascending); each thread then streams its 16 bytes of the r rows (up to 8 loads in flight) and keeps
// kTok token logits per head of the batch (GT heads; larger groups in batches). A page of S tokens takes the max over
// its S / kTok threads (xor shuffles inside a warp; none at S = 16), and the page's first thread writes its value.
// With the RoPE folded in (ra.qkv): block 0 of each KV head writes the token's sketch from its own rotation of the
// key (the same expressions), and after its scores the grid does rope_append_kv's work for the token (q_out, its k
// and v, the current page's bounds; rope_dev items spread over every thread), which no block of it reads.
// ---------------------------------------------------------------------------------------------------------------------
constexpr int kThreads = 256;
constexpr int kTok = 16;  // tokens per load (16 bytes of a channel's row: one page of 16, or a part of a larger one)
constexpr int kSub = 1;   // loads per channel and thread: a block covers kThreads * kTok * kSub = 4096 tokens

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

template <int D, int GT>
__device__ __forceinline__ void score_block(float* __restrict__ lse, const uint8_t* __restrict__ k8,
                                            const KvLayerView& kv, int num_heads, int len, int f, float scale,
                                            const float* s_qf, float* s_w, int* s_ch, int* s_warp, float (*s_q)[D / 8]) {
    constexpr int RMAX = D / 8;
    const int capacity = kv.capacity, page_size = kv.page_size;
    const int R = sparq::channels(D, page_size);  // <= RMAX
    const int kvh = blockIdx.y, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int G = num_heads / kv.num_kv_heads;
    const int P = (len + page_size - 1) / page_size;
    const int complete_tokens = (P - 1) * page_size;
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
    // Thread tid covers tokens t0 + s * kThreads * kTok + tid * kTok (+0..15) for s < kSub: each load of a warp reads
    // 512 contiguous bytes of one channel's row (16-byte aligned: t0 is a multiple of S >= 16, capacity of 16). The
    // candidates start at page f (a sliding window's first page, else 0); page f + i is entry i of the head's row.
    const int t0 = f * page_size + static_cast<int>(blockIdx.x) * kThreads * kTok * kSub;
    const int TP = page_size / kTok;  // threads per page (1..8)
    const bool first = (tid % TP) == 0;
    const uint8_t* base = k8 + static_cast<size_t>(kvh) * D * capacity + t0 + tid * kTok;
    constexpr int U = RMAX < 8 ? RMAX : 8;  // channels per batch of loads (kSub loads each)
    for (int gb = 0; gb < G; gb += GT) {
        const int ng = min(GT, G - gb);
        __syncthreads();  // s_ch ready (first batch); the previous batch's s_q read
        for (int i = tid; i < GT * R; i += kThreads) {
            const int g = i / R, j = i % R;
            s_q[g][j] = g < ng ? s_qf[(gb + g) * D + s_ch[j]] : 0.0f;
        }
        __syncthreads();
        float acc[kSub][GT][kTok];
#pragma unroll
        for (int sb = 0; sb < kSub; ++sb)
#pragma unroll
            for (int g = 0; g < GT; ++g)
#pragma unroll
                for (int u = 0; u < kTok; ++u) acc[sb][g][u] = 0.0f;
#pragma unroll 1
        for (int j0 = 0; j0 < R; j0 += U) {  // R is RMAX / 2^k: a multiple of U, or below it
            const int nu = min(U, R - j0);
            uint4 raw[U][kSub];
#pragma unroll
            for (int u = 0; u < U; ++u)
#pragma unroll
                for (int sb = 0; sb < kSub; ++sb) {
                    const int t = t0 + sb * kThreads * kTok + tid * kTok;
                    raw[u][sb] = u < nu && t < complete_tokens
                                     ? *reinterpret_cast<const uint4*>(base + static_cast<size_t>(s_ch[j0 + u]) * capacity +
                                                                       sb * kThreads * kTok)
                                     : make_uint4(0u, 0u, 0u, 0u);
                }
#pragma unroll
            for (int u = 0; u < U; ++u) {
                if (u >= nu) break;
#pragma unroll
                for (int sb = 0; sb < kSub; ++sb) {
                    float kf[kTok];
                    e4m3x16_to_float(raw[u][sb], kf);
#pragma unroll
                    for (int g = 0; g < GT; ++g) {
                        const float qv = s_q[g][j0 + u];
#pragma unroll
                        for (int e = 0; e < kTok; ++e) acc[sb][g][e] = fmaf(qv, kf[e], acc[sb][g][e]);
                    }
                }
            }
        }
#pragma unroll
        for (int sb = 0; sb < kSub; ++sb) {
            const int t = t0 + sb * kThreads * kTok + tid * kTok;
            const bool live = t < complete_tokens;  // tokens of complete pages only (the last page is never scored)
            const int p = t / page_size - f;
#pragma unroll
            for (int g = 0; g < GT; ++g) {
                float m = acc[sb][g][0];
#pragma unroll
                for (int e = 1; e < kTok; ++e) m = fmaxf(m, acc[sb][g][e]);
                for (int o = 1; o < TP; o <<= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
                if (g < ng && live && first) lse[static_cast<size_t>(kvh * G + gb + g) * kv.max_pages + p] = scale * m;
            }
        }
    }
}

template <int D, int GT>
__global__ void __launch_bounds__(kThreads) sparq_scores_kernel(float* __restrict__ lse,
                                                               uint8_t* __restrict__ k8,
                                                               const __half* __restrict__ q, KvLayerView kv,
                                                               const int* __restrict__ d_pos, int num_heads,
                                                               int page_budget, float scale, SparqRope ra) {
    extern __shared__ float s_qf[];  // [G][D]: the group's q, fp32
    __shared__ float s_w[D];
    __shared__ int s_ch[D / 8];
    __shared__ int s_warp[kThreads / 32];
    __shared__ float s_q[GT][D / 8];  // the batch's q on the chosen channels
    pdl_wait();  // q (or qkv) and the token's key come from the kernels before; scores are read by the previous top-k
    const int capacity = kv.capacity, page_size = kv.page_size;
    const int len = *d_pos + 1;
    if (len < 1 || len > capacity) return;
    const int kvh = blockIdx.y, tid = threadIdx.x;
    const int G = num_heads / kv.num_kv_heads;
    const bool rope_on = ra.qkv != nullptr;
    const double dyn_base = rope_on ? rope_dev::dynamic_base(ra.rope, D, len) : 0.0;
    if (blockIdx.x == 0) {  // the current token's sketch (every step)
        uint8_t* col = k8 + static_cast<size_t>(kvh) * D * capacity + (len - 1);
        if (rope_on) {
            const float* kr = ra.qkv + static_cast<size_t>(num_heads) * D + static_cast<size_t>(kvh) * D;
            for (int i = tid; i < D / 2; i += kThreads) {
                float c, sn;
                rope_dev::cos_sin(ra.rope, D, i, len - 1, dyn_base, c, sn);
                __half k1, k2;
                rope_dev::rotate(kr[i], kr[i + D / 2], c, sn, k1, k2);
                col[static_cast<size_t>(i) * capacity] = to_e4m3(k1);
                col[static_cast<size_t>(i + D / 2) * capacity] = to_e4m3(k2);
            }
        } else {
            for (int c = tid; c < D; c += kThreads)
                col[static_cast<size_t>(c) * capacity] = to_e4m3(kv.k[(static_cast<size_t>(kvh) * capacity + (len - 1)) * D + c]);
        }
    }
    const int P = (len + page_size - 1) / page_size;
    const int f = window_start_of(len, kv.window) / page_size;  // the window's first page (0 without one)
    const bool scoring = P - f > page_budget && P <= kv.max_pages &&  // a selecting step inside the cache, and this
                         (f + static_cast<int>(blockIdx.x) * kSub * kTok * kThreads / page_size) < P - 1;  // candidates
    if (scoring && blockIdx.x == 0)  // the last page is no candidate: no share of the normalisation
        for (int g = tid; g < G; g += kThreads)
            lse[static_cast<size_t>(kvh * G + g) * kv.max_pages + (P - 1 - f)] = -INFINITY;
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
        score_block<D, GT>(lse, k8, kv, num_heads, len, f, scale, s_qf, s_w, s_ch, s_warp, s_q);
    }
    if (rope_on) {  // the token's RoPE + append, spread over the grid, after the scores
        const rope_dev::Token tk{ra.q_out, kv, ra.qkv, len - 1, 1, num_heads};
        const int block = blockIdx.y * gridDim.x + blockIdx.x, blocks = gridDim.x * gridDim.y;
        rope_dev::append_token(tk, ra.rope, dyn_base, tid * blocks + block, blocks * kThreads);
    }
}

template <int D>
void launch_scores(float* lse, const KeySketchView& sk, const __half* q, const KvLayerView& kv, const int* d_pos,
                   int num_heads, int page_budget, float scale, const SparqRope& ra, cudaStream_t stream) {
    const dim3 grid(ceil_div(kv.capacity, kThreads * kTok * kSub), kv.num_kv_heads);
    const int G = num_heads / kv.num_kv_heads;
    const size_t smem = sizeof(float) * static_cast<size_t>(G) * D;
    QUEST_REQUIRE(smem <= 48 * 1024, "sparq: the group's q must fit in 48 KB of shared memory");
    with_group_tile(G, [&](auto gt) {
        constexpr int GT = decltype(gt)::value < 4 ? decltype(gt)::value : 4;
        launch_pdl(sparq_scores_kernel<D, GT>, grid, dim3(kThreads), smem, stream, lse, sk.k8, q, kv, d_pos,
                   num_heads, page_budget, scale, ra);
    });
}

void require_view(const KeySketchView& sk, const KvLayerView& kv) {
    QUEST_REQUIRE(sk.k8 && kv.k, "null pointer");
    QUEST_REQUIRE(sk.num_kv_heads == kv.num_kv_heads && sk.head_dim == kv.head_dim && sk.capacity == kv.capacity,
                  "the sketch's shape must be the KV cache's");
    QUEST_REQUIRE(is_aligned(sk.k8, 16) && sk.capacity % 16 == 0,
                  "the sketch must be 16-byte aligned with a capacity multiple of 16");
    require_sparq_supported(kv.head_dim, kv.page_size);
    QUEST_REQUIRE(kv.window >= 0, "window must be >= 0");
}

}  // namespace

size_t sparq_workspace_floats(int num_heads, int max_pages) { return oracle_workspace_floats(num_heads, max_pages); }

const float* sparq_row_scores(const float* lse, const QuestWorkspace& ws, int num_heads, int num_kv_heads,
                              GqaPolicy policy) {
    return sparq::rows_rank_values(policy == GqaPolicy::PerHead, num_heads / num_kv_heads) ? lse : ws.scores;
}

size_t key_sketch_bytes(int num_kv_heads, int head_dim, int capacity) {
    return static_cast<size_t>(num_kv_heads) * static_cast<size_t>(head_dim) * static_cast<size_t>(capacity);
}

void require_sparq_supported(int head_dim, int page_size) {
    if (head_dim < 16 || head_dim > 256 || (head_dim & (head_dim - 1)) != 0)
        throw std::invalid_argument("sparq on the GPU needs head_dim a power of two in [16, 256], got " +
                                    std::to_string(head_dim));
    if (page_size < 16 || page_size > 128 || (page_size & (page_size - 1)) != 0 ||
        !sparq::supported(head_dim, page_size))
        throw std::invalid_argument("sparq on the GPU needs a page size that is a power of two in [16, 128] and at "
                                    "most 2 x head_dim, got " + std::to_string(page_size) + " (head_dim " +
                                    std::to_string(head_dim) + ")");
}

void sparq_sketch_write(const KeySketchView& sk, const KvLayerView& kv, int t0, int t1, cudaStream_t stream) {
    require_view(sk, kv);
    QUEST_REQUIRE(0 <= t0 && t0 <= t1 && t1 <= kv.capacity, "token range outside the cache");
    if (t1 == t0) return;
    const dim3 grid(ceil_div(t1 - t0, kWriteTokens), kv.num_kv_heads);
    sketch_write_kernel<<<grid, 256, 0, stream>>>(sk.k8, kv.k, kv.head_dim, kv.capacity, t0, t1);
    CUDA_CHECK_LAUNCH();
}

void sparq_page_lse(float* lse, const KeySketchView& sk, const __half* q, const KvLayerView& kv, const int* d_pos,
                    int num_heads, int page_budget, float scale, cudaStream_t stream, const QuestRopeAppend* rope) {
    require_view(sk, kv);
    QUEST_REQUIRE(lse && q && d_pos, "null pointer");
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
    with_head_dim(kv.head_dim, "sparq_page_lse", [&](auto d) {
        constexpr int D = decltype(d)::value;
        if constexpr (D >= 16) launch_scores<D>(lse, sk, q, kv, d_pos, num_heads, page_budget, scale, ra, stream);
    });
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
        oracle_row_scores(ws.scores, nullptr, lse, d_pos, num_heads, kv.num_kv_heads, kv.max_pages, kv.page_size,
                          page_budget, policy, stream, kv.window);
    const int stride = quest_select_capacity(kv.max_pages, kv.page_size, page_budget, match);
    quest_top_k(ws.selected, scores, kv.max_pages, d_pos, rows, kv.page_size, page_budget, stream, match, stride,
                kv.window);
    attention_decode_sparse(out, q, kv, d_pos, ws.selected, num_heads, page_budget, policy, scale, ws, stream, match);
}

}  // namespace quest
