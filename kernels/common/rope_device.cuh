#pragma once
// Device side of RoPE + KV append for one decode token (kernels/common/rope.cuh), shared by rope_append_kv's kernel
// (kernels/common/rope.cu) and the Quest launches that fold the same work in (kernels/select/quest.cu, QuestRopeAppend: the
// scoring kernel rotates q and appends the token): the same expressions in both, so the rotated q, the cached
// k / v and the page bounds are bit for bit those of rope_append_kv. CUDA only (no host code includes this header).
#include <cstdint>

#include "kernels/common/rope.cuh"
#include "kernels/common/sincos.h"

namespace quest::rope_dev {

// Dynamic NTK: the base for a pass whose length is `len` (model/core/rope.cpp, rope_frequencies); 0 when not dynamic.
__device__ __forceinline__ double dynamic_base(const RopeDeviceParams& rope, int D, int len) {
    if (!rope.dynamic) return 0.0;
    const double max_pos = rope.max_position_embeddings;
    const double l = fmax(static_cast<double>(rope.dynamic_len > 0 ? rope.dynamic_len : len), max_pos);
    return rope.theta * pow((rope.factor * l / max_pos) - (rope.factor - 1.0), double(D) / (D - 2));
}

// cos and sin (times attention_scaling) of pair i (channels i and i + D / 2) at position pos.
__device__ __forceinline__ void cos_sin(const RopeDeviceParams& rope, int D, int i, int pos, double dyn_base, float& c,
                                        float& s) {
    float inv_freq;
    if (rope.dynamic) {
        const float exponent = static_cast<float>(2 * i) / static_cast<float>(D);
        inv_freq = 1.0f / powf(static_cast<float>(dyn_base), exponent);
    } else {
        inv_freq = rope.inv_freq[i];
    }
    const float angle = static_cast<float>(pos) * inv_freq;
    sincos_reduced(angle, s, c);  // kernels/common/sincos.h: no sincosf slow path (its local-memory frame)
    c *= rope.attention_scaling;
    s *= rope.attention_scaling;
}

// The rotated pair (a, b) = (x_i, x_{i + D/2}) in fp16: a c - b s (two products, one subtraction) and b c + a s (one
// FMA), spelled with intrinsics so that no caller's context changes the contraction (what nvcc made of the plain
// expressions before this header existed).
__device__ __forceinline__ void rotate(float a, float b, float c, float s, __half& r1, __half& r2) {
    r1 = __float2half_rn(__fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s)));
    r2 = __float2half_rn(__fmaf_rn(a, s, __fmul_rn(b, c)));
}

// The work of one token at position pos (row: its fp32 qkv row) as items: item idx < pairs = (num_heads +
// num_kv_heads) D / 2 is the (head, pair) idx (q: rotated into q_out [num_heads][D]; k: rotated into the cache and,
// when T == 1, folded into its page's bounds), item pairs + c is value channel c (copied to the cache). Split into
// the loads (item_load) and the arithmetic and stores (item_store), so that a kernel can issue the loads early and
// finish the item later (the Quest scoring kernel, QuestRopeAppend).
struct Token {
    __half* q_out;           // [num_heads][D] of this token
    KvLayerView kv;
    const float* row;        // [num_heads*D | num_kv_heads*D | num_kv_heads*D]
    int pos, T, num_heads;
    __device__ __forceinline__ int pairs() const { return (num_heads + kv.num_kv_heads) * (kv.head_dim / 2); }
    __device__ __forceinline__ int items() const { return pairs() + kv.num_kv_heads * kv.head_dim; }
};

struct ItemIn {
    float a = 0.0f, b = 0.0f;                  // the pair (or a = the value)
    __half mn1, mx1, mn2, mx2;                 // the page's bounds at the pair's channels (k, T == 1, not first)
};

__device__ __forceinline__ ItemIn item_load(const Token& tk, int idx) {
    const int D = tk.kv.head_dim, half = D / 2;
    const int q_dim = tk.num_heads * D, kv_dim = tk.kv.num_kv_heads * D;
    ItemIn in;
    const int pairs = tk.pairs();
    if (idx >= pairs) {
        in.a = tk.row[q_dim + kv_dim + (idx - pairs)];
        return in;
    }
    const int h = idx / half, i = idx % half;
    if (h < tk.num_heads) {
        in.a = tk.row[h * D + i];
        in.b = tk.row[h * D + i + half];
        return in;
    }
    const int kh = h - tk.num_heads;
    in.a = tk.row[q_dim + kh * D + i];
    in.b = tk.row[q_dim + kh * D + i + half];
    if (tk.T == 1 && tk.pos % tk.kv.page_size != 0) {
        const int64_t m = (static_cast<int64_t>(kh) * tk.kv.max_pages + tk.pos / tk.kv.page_size) * D;
        in.mn1 = tk.kv.kmin[m + i];
        in.mx1 = tk.kv.kmax[m + i];
        in.mn2 = tk.kv.kmin[m + i + half];
        in.mx2 = tk.kv.kmax[m + i + half];
    }
    return in;
}

__device__ __forceinline__ void item_store(const Token& tk, int idx, const ItemIn& in, const RopeDeviceParams& rope,
                                           double dyn_base) {
    const int D = tk.kv.head_dim, half = D / 2;
    const int pairs = tk.pairs();
    if (idx >= pairs) {  // values: copied as they are
        const int c = idx - pairs, kh = c / D, i = c % D;
        tk.kv.v[(static_cast<int64_t>(kh) * tk.kv.capacity + tk.pos) * D + i] = __float2half_rn(in.a);
        return;
    }
    const int h = idx / half, i = idx % half;
    float c, s;
    cos_sin(rope, D, i, tk.pos, dyn_base, c, s);
    if (h < tk.num_heads) {  // query head
        __half* qo = tk.q_out + static_cast<int64_t>(h) * D;
        rotate(in.a, in.b, c, s, qo[i], qo[i + half]);
        return;
    }
    // key head: rotate, store, fold into the page metadata
    const int kh = h - tk.num_heads;
    __half k1, k2;
    rotate(in.a, in.b, c, s, k1, k2);
    __half* kc = tk.kv.k + (static_cast<int64_t>(kh) * tk.kv.capacity + tk.pos) * D;
    kc[i] = k1;
    kc[i + half] = k2;
    if (tk.T == 1) {
        const int64_t m = (static_cast<int64_t>(kh) * tk.kv.max_pages + tk.pos / tk.kv.page_size) * D;
        const bool first_in_page = tk.pos % tk.kv.page_size == 0;
        tk.kv.kmin[m + i] = first_in_page ? k1 : __hmin(in.mn1, k1);
        tk.kv.kmax[m + i] = first_in_page ? k1 : __hmax(in.mx1, k1);
        tk.kv.kmin[m + i + half] = first_in_page ? k2 : __hmin(in.mn2, k2);
        tk.kv.kmax[m + i + half] = first_in_page ? k2 : __hmax(in.mx2, k2);
    }
}

// Items first, first + stride, ... of the token, each loaded and finished in turn (rope_append_kv's kernel).
__device__ __forceinline__ void append_token(const Token& tk, const RopeDeviceParams& rope, double dyn_base, int first,
                                             int stride) {
    for (int idx = first; idx < tk.items(); idx += stride) item_store(tk, idx, item_load(tk, idx), rope, dyn_base);
}

}  // namespace quest::rope_dev
