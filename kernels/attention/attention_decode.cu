#include <algorithm>
#include <cstdint>

#include "kernels/attention/attention_decode.cuh"
#include "kernels/common/device_utils.cuh"

namespace quest {

namespace {

constexpr int kThreads = 128;

// One block = one KV head x one span of `split_tokens` tokens, for the G query heads of the group.
// Threads form token groups of D/8 lanes; each lane owns 8 channels (one 16-byte load per row).
//   phase 1: s[g][t] = (q_g . k_t) * scale * log2(e)          (K read once)
//   phase 2: per g: m = max_t s, p = exp2(s - m), l = sum p
//   phase 3: o[g] = sum_t p[g][t] v_t / l                       (V read once), partials reduced in shared memory
// Spans of a length (the same on every block): the fewest spans of at most max_span tokens, raised to whole waves of
// the resident grid (wave_splits spans per KV head fill every SM once) so that no wave runs nearly empty, but never
// shorter than kMinSpan tokens and never more than max_splits spans. The span is ceil(len / splits) tokens; the last
// active span may be shorter, and spans past `active` do nothing.
constexpr int kMinSpan = 64;
struct Spans {
    int span, active;
};
__device__ __forceinline__ Spans decode_spans(int len, int max_span, int wave_splits, int max_splits) {
    const int need = (len + max_span - 1) / max_span;
    int splits = need;
    if (wave_splits > 0) {
        const int waves = (need + wave_splits - 1) / wave_splits;
        splits = min(waves * wave_splits, (len + kMinSpan - 1) / kMinSpan);
    }
    splits = max(need, min(splits, max_splits));
    const int span = (len + splits - 1) / splits;
    return {span, (len + span - 1) / span};
}

template <int D, int G>
__global__ void __launch_bounds__(kThreads) decode_split_kernel(__half* out, const __half* q, KvLayerView kv,
                                                                const int* d_pos, float scale_log2, int split_tokens,
                                                                int wave_splits, SplitWorkspace ws) {
    constexpr int LANES = D / 8;
    constexpr int GROUPS = kThreads / LANES;
    constexpr int kUnroll = G <= 2 ? 8 : 4;  // rows of K (or V) loaded per token group before the first use
    // Before pdl_wait: the position and the K rows of every token but the newest come from kernels that are complete
    // once this grid runs at all (the kernel before it, rope_append, triggers only after its own wait), so the first
    // batch of K rows is loaded before the wait; the newest row and q come from rope_append and are read after it.
    // The early loads go through L2 only (ld.cg): a row shorter than a 128-byte line shares its line with neighbours,
    // and an L1 copy of a line holding the newest row, fetched before rope_append wrote it, would serve stale bytes
    // to the loads after the wait (this block's later batches, or another block's on the SM). Every path waits before
    // it returns (a grid that completed without waiting would let its dependents pass their wait early).
    const int kvh = blockIdx.x, split = blockIdx.y;
    const int len = *d_pos + 1;
    if (len < 1 || len > kv.capacity) {
        pdl_wait();
        return;
    }
    // Keys [lo, len): the whole sequence, or the layer's sliding window.
    const int lo = kv.window > 0 && len > kv.window ? len - kv.window : 0;
    const Spans sp = decode_spans(len - lo, split_tokens, wave_splits, ws.max_splits);
    const int active = sp.active;
    const int t0 = lo + split * sp.span;
    if (split >= active) {  // span beyond the sequence: it takes no ticket and the merge ignores it
        pdl_wait();
        return;
    }
    const int n = min(len, t0 + sp.span) - t0;  // <= split_tokens: the shared score row's length
    const int tid = threadIdx.x, group = tid / LANES, sub = tid % LANES;
    const __half* K = kv.k + (static_cast<int64_t>(kvh) * kv.capacity + t0) * D + sub * 8;
    const __half* V = kv.v + (static_cast<int64_t>(kvh) * kv.capacity + t0) * D + sub * 8;
    const int newest = len - 1 - t0;  // the row rope_append writes (may lie outside this span)
    uint4 kr[kUnroll];                // the first batch of K rows (phase 1, base 0)
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
        const int t = group + u * GROUPS;
        kr[u] = t < n && t != newest ? __ldcg(reinterpret_cast<const uint4*>(K + static_cast<int64_t>(t) * D))
                                     : make_uint4(0, 0, 0, 0);
    }
    pdl_wait();
    pdl_trigger();  // dependents may be scheduled now (they pdl_wait for this grid to complete)
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
        if (group + u * GROUPS == newest)
            kr[u] = __ldcg(reinterpret_cast<const uint4*>(K + static_cast<int64_t>(newest) * D));

    extern __shared__ float smem[];
    float* s = smem;                      // [G][split_tokens]
    float* red = s + G * split_tokens;    // [GROUPS][G][D]
    __shared__ float m_sh[G], l_sh[G];

    const int warp = tid / 32, lane = tid % 32;

    float qr[G][8];
#pragma unroll
    for (int g = 0; g < G; ++g) {
        const uint4 raw = *reinterpret_cast<const uint4*>(q + (static_cast<int64_t>(kvh) * G + g) * D + sub * 8);
        half8_to_float(raw, qr[g]);
#pragma unroll
        for (int j = 0; j < 8; ++j) qr[g][j] *= scale_log2;
    }

    // Phase 1: scores. The loop bounds are uniform across the block (shuffles below need every lane).
    for (int base = 0; base < n; base += GROUPS * kUnroll) {
        const int tb = base + group;
        if (base > 0) {
#pragma unroll
            for (int u = 0; u < kUnroll; ++u) {
                const int t = tb + u * GROUPS;
                kr[u] = t < n ? __ldg(reinterpret_cast<const uint4*>(K + static_cast<int64_t>(t) * D))
                              : make_uint4(0, 0, 0, 0);
            }
        }
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
            const int t = tb + u * GROUPS;
            float k[8];
            half8_to_float(kr[u], k);
            float part[G];
#pragma unroll
            for (int g = 0; g < G; ++g) {
                float a = 0.0f;
#pragma unroll
                for (int j = 0; j < 8; ++j) a = fmaf(qr[g][j], k[j], a);
                part[g] = a;
            }
#pragma unroll
            for (int g = 0; g < G; ++g)
#pragma unroll
                for (int o = LANES / 2; o > 0; o >>= 1) part[g] += __shfl_xor_sync(0xffffffffu, part[g], o);
            if (sub == 0 && t < n)
#pragma unroll
                for (int g = 0; g < G; ++g) s[g * split_tokens + t] = part[g];
        }
    }
    __syncthreads();

    // Phase 2: softmax statistics of the span, one warp per query head.
    for (int g = warp; g < G; g += kThreads / 32) {
        float* sg = s + g * split_tokens;
        float m = -INFINITY;
        for (int t = lane; t < n; t += 32) m = fmaxf(m, sg[t]);
        for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        float l = 0.0f;
        for (int t = lane; t < n; t += 32) {
            const float p = exp2f(sg[t] - m);
            sg[t] = p;
            l += p;
        }
        for (int o = 16; o > 0; o >>= 1) l += __shfl_xor_sync(0xffffffffu, l, o);
        if (lane == 0) {
            m_sh[g] = m;
            l_sh[g] = l;
        }
    }
    __syncthreads();

    // Phase 3: weighted values.
    float acc[G][8];
#pragma unroll
    for (int g = 0; g < G; ++g)
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[g][j] = 0.0f;
    for (int base = 0; base < n; base += GROUPS * kUnroll) {
        const int tb = base + group;
        uint4 vr[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
            const int t = tb + u * GROUPS;
            vr[u] = t < n ? __ldg(reinterpret_cast<const uint4*>(V + static_cast<int64_t>(t) * D)) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
            const int t = tb + u * GROUPS;
            if (t >= n) break;
            float v[8];
            half8_to_float(vr[u], v);
#pragma unroll
            for (int g = 0; g < G; ++g) {
                const float p = s[g * split_tokens + t];
#pragma unroll
                for (int j = 0; j < 8; ++j) acc[g][j] = fmaf(p, v[j], acc[g][j]);
            }
        }
    }
#pragma unroll
    for (int g = 0; g < G; ++g)
#pragma unroll
        for (int j = 0; j < 8; ++j) red[(group * G + g) * D + sub * 8 + j] = acc[g][j];
    __syncthreads();
    for (int idx = tid; idx < G * D; idx += kThreads) {
        const int g = idx / D, d = idx % D;
        float sum = 0.0f;
        for (int gr = 0; gr < GROUPS; ++gr) sum += red[(gr * G + g) * D + d];
        const int64_t h = static_cast<int64_t>(kvh) * G + g;
        ws.o[(h * ws.max_splits + split) * D + d] = sum / l_sh[g];
    }
    if (tid < G) {
        const int64_t h = static_cast<int64_t>(kvh) * G + tid;
        ws.ml[(h * ws.max_splits + split) * 2] = m_sh[tid];
        ws.ml[(h * ws.max_splits + split) * 2 + 1] = l_sh[tid];
    }

    // The last span of this KV head to finish merges the group's spans (threadFenceReduction pattern).
    __shared__ bool is_last;
    __threadfence();
    __syncthreads();
    if (tid == 0) {
        const int ticket = atomicAdd(&ws.counters[kvh], 1);
        is_last = ticket == active - 1;
    }
    __syncthreads();
    if (!is_last) return;
    __threadfence();
    for (int idx = tid; idx < G * D; idx += kThreads) {
        const int g = idx / D, d = idx % D;
        const int64_t h = static_cast<int64_t>(kvh) * G + g;
        const float* ml = ws.ml + h * ws.max_splits * 2;
        float m = -INFINITY;
        for (int sp = 0; sp < active; ++sp) m = fmaxf(m, __ldcg(ml + 2 * sp));
        float num = 0.0f, den = 0.0f;
        for (int sp = 0; sp < active; ++sp) {
            const float w = exp2f(__ldcg(ml + 2 * sp) - m) * __ldcg(ml + 2 * sp + 1);
            num = fmaf(w, __ldcg(ws.o + (h * ws.max_splits + sp) * D + d), num);
            den += w;
        }
        out[h * D + d] = __float2half_rn(num / den);
    }
    if (tid == 0) ws.counters[kvh] = 0;  // ready for the next launch
}

template <int D, int G>
void launch_split(__half* out, const __half* q, const KvLayerView& kv, const int* d_pos, float scale_log2,
                  int split_tokens, const SplitWorkspace& ws, cudaStream_t stream) {
    const size_t smem = sizeof(float) * (static_cast<size_t>(G) * split_tokens + static_cast<size_t>(kThreads / (D / 8)) * G * D);
    if (smem > 48 * 1024)
        CUDA_CHECK(cudaFuncSetAttribute(decode_split_kernel<D, G>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(smem)));
    // Spans per KV head that fill every SM once (host-side occupancy query: no stream work, graph-safe; asked once
    // per shared-memory size and thread, not at every eager launch).
    thread_local size_t cached_smem = 0;
    thread_local int per_sm = 0;
    if (cached_smem != smem) {
        CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, decode_split_kernel<D, G>, kThreads, smem));
        cached_smem = smem;
    }
    const int wave_splits = std::max(1, per_sm * sm_count() / kv.num_kv_heads);
    launch_pdl(decode_split_kernel<D, G>, dim3(kv.num_kv_heads, ws.max_splits), dim3(kThreads), smem, stream, out, q, kv,
               d_pos, scale_log2, split_tokens, wave_splits, ws);
}

template <int D>
void dispatch_group(int group, __half* out, const __half* q, const KvLayerView& kv, const int* d_pos, float sl2,
                    int split_tokens, const SplitWorkspace& ws, cudaStream_t stream) {
    switch (group) {
        case 1: return launch_split<D, 1>(out, q, kv, d_pos, sl2, split_tokens, ws, stream);
        case 2: return launch_split<D, 2>(out, q, kv, d_pos, sl2, split_tokens, ws, stream);
        case 3: return launch_split<D, 3>(out, q, kv, d_pos, sl2, split_tokens, ws, stream);
        case 4: return launch_split<D, 4>(out, q, kv, d_pos, sl2, split_tokens, ws, stream);
        case 8: return launch_split<D, 8>(out, q, kv, d_pos, sl2, split_tokens, ws, stream);
        default: QUEST_REQUIRE(false, "attention_decode: GQA group size must be 1, 2, 3, 4 or 8");
    }
}

}  // namespace

size_t split_workspace_floats(int num_heads, int head_dim, int max_splits) {
    return static_cast<size_t>(num_heads) * max_splits * (head_dim + 2);
}

int decode_max_splits(int capacity, int split_tokens) { return 2 * ceil_div(capacity, split_tokens); }

int default_split_tokens(int capacity) {
    int s = 32;
    while (s < 1024 && s * 64 < capacity) s *= 2;
    return s;
}

void attention_decode(__half* out, const __half* q, const KvLayerView& kv, const int* d_pos, int num_heads, float scale,
                      int split_tokens, const SplitWorkspace& ws, cudaStream_t stream) {
    QUEST_REQUIRE(out && q && kv.k && kv.v && d_pos && ws.o && ws.ml && ws.counters, "attention_decode: null pointer");
    QUEST_REQUIRE(num_heads % kv.num_kv_heads == 0, "attention_decode: heads must be a multiple of KV heads");
    QUEST_REQUIRE(split_tokens > 0 && split_tokens <= 1024, "attention_decode: split_tokens in [1, 1024]");
    QUEST_REQUIRE(ws.max_splits >= ceil_div(kv.capacity, split_tokens), "attention_decode: workspace too small");
    QUEST_REQUIRE(is_aligned(q, 16) && is_aligned(kv.k, 16) && is_aligned(kv.v, 16), "attention_decode: alignment");
    const int group = num_heads / kv.num_kv_heads;
    const float sl2 = scale * 1.4426950408889634f;
    with_head_dim(kv.head_dim, "attention_decode", [&](auto d) {
        dispatch_group<decltype(d)::value>(group, out, q, kv, d_pos, sl2, split_tokens, ws, stream);
    });
}

}  // namespace quest
