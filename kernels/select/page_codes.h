#pragma once
// Quantized page bounds (MetadataFormat::Int8 / Int4) and bytes-matched budgets: the scalar rules shared by the CPU
// reference (kernels/select/quest.cpp: quantize_page_codes_ref, page_score_int8_ref, quest_matched_pages) and the CUDA
// kernels (kernels/select/page_codes.cu, kernels/select/quest.cu), so that both produce bit-identical codes, scales and page
// counts. C++17, no CUDA header: QUEST_HD is __host__ __device__ under nvcc and empty for the host compiler.
//
// Device layout of one layer's codes (PageCodesView, kernels/select/page_codes.cuh), chosen so that a warp reading one
// 16-byte piece of 32 consecutive pages reads 512 contiguous bytes while each thread gets its own page's channels in
// channel order (the scoring kernel sums them sequentially, like the reference):
//   pages are grouped in tiles of kCodeTile = 32; per KV head the tiles follow each other (padded_pages = max_pages
//   rounded up to 32); inside a tile, piece j of every page: [tile][piece j][page in tile][16 bytes].
//   A piece holds C channels (C = 8 for int8, 16 for int4; D / C pieces per page) as four little-endian 32-bit
//   words: words 0-1 the C min codes, words 2-3 the C max codes. Codes are offset binary:
//     int8: channel k of the piece is byte k % 4 of word k / 4 (+ 2 for max), holding code + 128 (0..255);
//     int4: channel k is nibble k % 8 (bits 4*(k%8) .. 4*(k%8)+3) of word k / 8 (+ 2 for max), holding code + 8.
//   So a page holds 2 * D bytes of codes (int8) or D bytes (int4): page_metadata_bytes minus the scale.
// Scales: fp32, [num_kv_heads][padded_pages].
#include <cstdint>
#include <cmath>
#include <math.h>  // ::nextafterf, ::floorf, ::ceilf, ::fabsf on the host side

#include <cstring>

#include "kernels/common/host_device.h"

namespace quest::codes {

// ---------------------------------------------------------------- arithmetic (one IEEE fp32 rounding per multiplication,
// never contracted into an FMA, on both sides)

// An estimate of a / b for the rules below, which only start from it: they then step to the exact answer, defined by
// multiplications alone, so the result does not depend on the estimate (within a few units in the last place). The
// host divides exactly; the device uses the fast division (__fdividef: 2 ulp for the normal operands met here),
// which needs no slow-path subroutine (an IEEE division's slow path is a call, with a stack frame, in every kernel
// that quantizes).
QUEST_HD inline float qc_div_estimate(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fdividef(a, b);
#else
    return a / b;
#endif
}
QUEST_HD inline float qc_mul(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fmul_rn(a, b);
#else
    return a * b;
#endif
}
// Exact operations (a single correct answer): the C library's float functions serve both sides.
QUEST_HD inline float qc_next_up(float x) { return nextafterf(x, INFINITY); }
QUEST_HD inline float qc_next_down(float x) { return nextafterf(x, 0.0f); }
QUEST_HD inline float qc_floor(float x) { return floorf(x); }
QUEST_HD inline float qc_ceil(float x) { return ceilf(x); }
QUEST_HD inline float qc_abs(float x) { return fabsf(x); }
// max as std::max(a, b) (a unless a < b); the value is the same as fmaxf for every non-NaN input.
QUEST_HD inline float qc_max(float a, float b) { return a < b ? b : a; }
QUEST_HD inline float qc_sub(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fsub_rn(a, b);
#else
    return a - b;
#endif
}
QUEST_HD inline float qc_fma(float a, float b, float c) {
#ifdef __CUDA_ARCH__
    return __fmaf_rn(a, b, c);
#else
    return std::fma(a, b, c);
#endif
}
QUEST_HD inline float qc_bits_to_float(uint32_t b) {
#ifdef __CUDA_ARCH__
    return __uint_as_float(b);
#else
    float f;
    std::memcpy(&f, &b, sizeof f);
    return f;
#endif
}

// ---------------------------------------------------------------- the quantization rule

// Largest code: 127 (int8) or 7 (int4); the smallest is -qmax - 1.
QUEST_HD constexpr int code_max(bool int4) { return int4 ? 7 : 127; }

// The smallest float scale with qmax * scale >= amax (the product rounded to fp32; amax = the page's largest |kmin_i|,
// |kmax_i|); 0 when amax is 0. fl(qmax * s) is nondecreasing in s, so stepping up then down from any estimate near
// amax / qmax reaches the same float.
QUEST_HD inline float code_scale(float amax, int qmax) {
    if (!(amax > 0.0f)) return 0.0f;      // an all-zero page (or NaN metadata): codes 0
    if (!(amax <= 3.40282347e38f)) return INFINITY;  // an infinite key: codes at the ends of the range

    const float fq = static_cast<float>(qmax);
    float scale = qc_div_estimate(amax, fq);
    while (qc_mul(fq, scale) < amax) scale = qc_next_up(scale);
    for (float s = qc_next_down(scale); s > 0.0f && qc_mul(fq, s) >= amax; s = qc_next_down(s)) scale = s;
    return scale;
}

// floor(v / scale) or ceil(v / scale) clamped to [-qmax - 1, qmax] (a NaN quotient clamps to the outer end).
QUEST_HD inline int code_clamp(float f, int qmax, bool toward_max) {
    const int qmin = -qmax - 1;
    if (f != f) return toward_max ? qmax : qmin;
    return f < static_cast<float>(qmin) ? qmin : f > static_cast<float>(qmax) ? qmax : static_cast<int>(f);
}

// The largest code c in [-qmax - 1, qmax] whose decoded value fl(c * scale) is <= v (v = kmin_i; -qmax - 1 if none;
// 0 when scale is 0): the floor of the quotient's estimate, stepped down while the decoded value lies above v, then
// up while the next code's still does not (fl(c * scale) is nondecreasing in c: the answer does not depend on the
// estimate).
QUEST_HD inline int code_floor(float v, float scale, int qmax) {
    if (scale == 0.0f) return 0;
    const int qmin = -qmax - 1;
    if (scale == INFINITY) return qmin;
    int c = code_clamp(qc_floor(qc_div_estimate(v, scale)), qmax, false);
    while (c > qmin && qc_mul(static_cast<float>(c), scale) > v) --c;
    while (c < qmax && qc_mul(static_cast<float>(c + 1), scale) <= v) ++c;
    return c;
}

// The smallest code c with fl(c * scale) >= v (v = kmax_i; qmax if none; 0 when scale is 0).
QUEST_HD inline int code_ceil(float v, float scale, int qmax) {
    if (scale == 0.0f) return 0;
    const int qmin = -qmax - 1;
    if (scale == INFINITY) return qmax;
    int c = code_clamp(qc_ceil(qc_div_estimate(v, scale)), qmax, true);
    while (c < qmax && qc_mul(static_cast<float>(c), scale) < v) ++c;
    while (c > qmin && qc_mul(static_cast<float>(c - 1), scale) >= v) --c;
    return c;
}

// The score of a page from its codes (page_score_int8_ref, reproduced by the GPU kernel):
//   U8 = (sum_i max(q_i * cmin_i, q_i * cmax_i)) * scale,
// the sum in fp32 in channel order starting from +0, then one rounding for the scale. For a q whose values are fp16
// (the GPU's q) every product q_i * c_i is exact in fp32 (11 + 8 significant bits), and the maximum is
// q_i * (q_i >= 0 ? cmax_i : cmin_i), so an FMA per channel gives the same bits.
QUEST_HD inline float code_term(float q, int cmin, int cmax) {
    return qc_max(qc_mul(q, static_cast<float>(cmin)), qc_mul(q, static_cast<float>(cmax)));
}

// ---------------------------------------------------------------- device layout (see the top of the file)

constexpr int kCodeTile = 32;        // pages per tile (one warp reads a tile's piece j in one 512-byte access)
constexpr int kCodePieceBytes = 16;  // one piece: 16 bytes
QUEST_HD constexpr int code_piece_channels(bool int4) { return int4 ? 16 : 8; }
QUEST_HD constexpr int code_pieces_per_page(bool int4, int head_dim) { return head_dim / code_piece_channels(int4); }
QUEST_HD constexpr int code_padded_pages(int max_pages) { return (max_pages + kCodeTile - 1) / kCodeTile * kCodeTile; }
// Code bytes of one page (2 * head_dim for int8, head_dim for int4).
QUEST_HD constexpr int code_page_bytes(bool int4, int head_dim) { return int4 ? head_dim : 2 * head_dim; }

// Byte offset of piece j of page p of KV head h in a layer's code array.
QUEST_HD inline int64_t code_piece_offset(int h, int p, int j, int pieces_per_page, int padded_pages) {
    const int64_t tile = static_cast<int64_t>(h) * (padded_pages / kCodeTile) + p / kCodeTile;
    return (tile * pieces_per_page + j) * (kCodeTile * kCodePieceBytes) + (p % kCodeTile) * kCodePieceBytes;
}

// Code of channel k (0 <= k < C) of a piece (four words), the min (is_max = false) or the max.
QUEST_HD inline int piece_get(const uint32_t (&w)[4], int k, bool is_max, bool int4) {
    const uint32_t* half = w + (is_max ? 2 : 0);
    if (int4) return static_cast<int>((half[k / 8] >> (4 * (k % 8))) & 0xFu) - 8;
    return static_cast<int>((half[k / 4] >> (8 * (k % 4))) & 0xFFu) - 128;
}
// The scoring kernel's arithmetic on one piece (kernels/select/page_codes.cu calls these; tests/test_policy.cpp checks them
// against page_score_int8_ref on the host). The select mask of word hw (0: the piece's first C/2 channels, 1: the
// others) for one query head: field k all ones where q of its channel is >= 0 (then the max code is the one that
// maximises q * c), zero where q < 0. q: the word's C/2 values.
template <bool INT4>
QUEST_HD inline uint32_t piece_mask_word(const float* q) {
    constexpr int CW = INT4 ? 8 : 4, BITS = INT4 ? 4 : 8;
    constexpr uint32_t FIELD = INT4 ? 0xFu : 0xFFu;
    uint32_t m = 0u;
    QUEST_UNROLL
    for (int k = 0; k < CW; ++k)
        if (q[k] >= 0.0f) m |= FIELD << (BITS * k);
    return m;
}

// Byte k of w, an offset-binary code b = c + bias (bias 128 or 8), as the float c, exactly: the bits 0x4B0000bb
// are the float 2^23 + b, and magic = 2^23 + bias is exact too (a byte permute and an add: I2F is quarter-rate).
QUEST_HD inline float code_byte(uint32_t w, int k, float magic) {
    return qc_sub(qc_bits_to_float(byte_perm(w, 0x4B000000u, 0x7540u | static_cast<uint32_t>(k))), magic);
}

// acc + sum over the piece's C channels, in channel order, of q_k * (q_k >= 0 ? cmax_k : cmin_k), one FMA each
// (w: the piece's four words; m0, m1: piece_mask_word of its two words; q: the piece's C values of the head's q).
// For fp16-valued q every product is exact, so this is the reference's sum of code_term (one rounding per add).
template <bool INT4>
QUEST_HD inline float piece_fma(const uint32_t (&w)[4], uint32_t m0, uint32_t m1, const float* q, float acc) {
    const uint32_t s0 = (w[2] & m0) | (w[0] & ~m0);  // the chosen codes of word 0's channels
    const uint32_t s1 = (w[3] & m1) | (w[1] & ~m1);  // ... of word 1's
    if constexpr (!INT4) {
        constexpr float magic = 8388736.0f;  // 2^23 + 128
        QUEST_UNROLL
        for (int k = 0; k < 4; ++k) acc = qc_fma(q[k], code_byte(s0, k, magic), acc);
        QUEST_UNROLL
        for (int k = 0; k < 4; ++k) acc = qc_fma(q[4 + k], code_byte(s1, k, magic), acc);
    } else {
        constexpr float magic = 8388616.0f;  // 2^23 + 8
        QUEST_UNROLL
        for (int hw = 0; hw < 2; ++hw) {
            // Channel k of the word sits in nibble k: even channels are the low nibbles of its bytes, odd ones the
            // high nibbles.
            const uint32_t s = hw ? s1 : s0;
            const uint32_t lo = s & 0x0F0F0F0Fu, hi = (s >> 4) & 0x0F0F0F0Fu;
            QUEST_UNROLL
            for (int k = 0; k < 4; ++k) {
                acc = qc_fma(q[8 * hw + 2 * k], code_byte(lo, k, magic), acc);
                acc = qc_fma(q[8 * hw + 2 * k + 1], code_byte(hi, k, magic), acc);
            }
        }
    }
    return acc;
}

// Sets channel k of a piece (the words start zeroed; each field is written once).
QUEST_HD inline void piece_set(uint32_t (&w)[4], int k, bool is_max, bool int4, int code) {
    uint32_t* half = w + (is_max ? 2 : 0);
    if (int4)
        half[k / 8] |= (static_cast<uint32_t>(code + 8) & 0xFu) << (4 * (k % 8));
    else
        half[k / 4] |= (static_cast<uint32_t>(code + 128) & 0xFFu) << (8 * (k % 4));
}

// ---------------------------------------------------------------- bytes-matched budgets

// floor(a / b) for a >= 0, b >= 1. The device has no 64-bit divide instruction (ptxas calls a subroutine, with a
// stack frame): a reciprocal estimate refined by two Newton steps in double, then corrected exactly with integer
// multiplications (the estimate is within 1 of the quotient for a < 2^50; the loops make the result exact anyway).
QUEST_HD inline int64_t floor_div_pos(int64_t a, int64_t b) {
#ifdef __CUDA_ARCH__
    const double bd = static_cast<double>(b);
    double r = static_cast<double>(__fdividef(1.0f, static_cast<float>(b)));
    r = fma(r, fma(-bd, r, 1.0), r);
    r = fma(r, fma(-bd, r, 1.0), r);
    int64_t q = static_cast<int64_t>(static_cast<double>(a) * r);
    if (q < 0) q = 0;
    while (q > 0 && q * b > a) --q;
    while ((q + 1) * b <= a) ++q;
    return q;
#else
    return a / b;
#endif
}

// quest_matched_pages (kernels/select/quest.h): the pages besides the last that fit in the bytes fp16 Quest reads at this
// step: min(last, floor((quest - ours) / rows / (S * 4D))) (0 when quest <= ours) with
//   quest = last * 4D + rows * ((K - 1) * S + last_tokens) * 4D   (fp16 metadata of the complete pages, K pages of KV)
//   ours  = meta_pages * meta_bytes + fixed_bytes + rows * last_tokens * 4D
// (last = P - 1 complete pages, last_tokens in the last page, rows = selection rows sharing a KV head's metadata,
// fixed_bytes: a selector's bytes per step and KV head besides its per-page metadata, e.g. sparq's append write).
QUEST_HD inline int64_t matched_pages(int64_t last, int64_t last_tokens, int64_t page_size, int64_t page_budget,
                                      int64_t head_dim, int64_t meta_bytes, int64_t meta_pages, int64_t rows,
                                      int64_t fixed_bytes = 0) {
    const int64_t kv_token = 4 * head_dim;
    const int64_t quest = last * (4 * head_dim) + rows * ((page_budget - 1) * page_size + last_tokens) * kv_token;
    const int64_t ours = meta_pages * meta_bytes + fixed_bytes + rows * last_tokens * kv_token;
    // floor(floor(x / rows) / (S * 4D)) == floor(x / (rows * S * 4D)) for x >= 0.
    const int64_t n = quest <= ours ? 0 : floor_div_pos(quest - ours, rows * page_size * kv_token);
    return n < last ? n : last;
}

// A bytes-matched budget on the device: meta_bytes = page_metadata_bytes of the format the scores read (0: off,
// K pages), rows = selection rows sharing one KV head's metadata (the group for PerHead, else 1), fixed_bytes as
// in matched_pages (sparq: its D-byte append write).
struct MatchedBudget {
    int meta_bytes = 0;
    int head_dim = 0;
    int rows = 1;
    int fixed_bytes = 0;
    QUEST_HD bool on() const { return meta_bytes > 0; }
};

// Pages one row of a Quest step selects, the last page included, at len tokens (P = ceil(len / S) pages, K the page
// budget): P when P <= K (dense step); else K, or with a matched budget quest_matched_pages + 1 (>= K, <= P).
QUEST_HD inline int step_pages(int len, int page_size, int page_budget, const MatchedBudget& m) {
    const int P = (len + page_size - 1) / page_size;
    if (P <= page_budget) return P;
    if (!m.on()) return page_budget;
    const int last = P - 1;
    const int64_t last_tokens = static_cast<int64_t>(len) - static_cast<int64_t>(last) * page_size;
    return static_cast<int>(matched_pages(last, last_tokens, page_size, page_budget, m.head_dim, m.meta_bytes, last,
                                          m.rows, m.fixed_bytes)) +
           1;
}

// The largest step_pages over every len <= max_pages * S (the row stride of `selected` and the attention grid):
// step_pages is nondecreasing in len (the matched count grows with the complete pages and does not depend on the
// last page's tokens), so it is its value at the full capacity.
QUEST_HD inline int max_step_pages(int max_pages, int page_size, int page_budget, const MatchedBudget& m) {
    return step_pages(max_pages * page_size, page_size, page_budget, m);
}

}  // namespace quest::codes
