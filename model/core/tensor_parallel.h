#pragma once
// Tensor parallelism over the GPUs of one host (Megatron-style sharding): which rows and columns of every matrix
// each rank holds, validated against the model, and the bytes each rank needs, so that a model that fits on no
// layout is refused with numbers before anything is allocated. Design: docs/tensor_parallel.md.
//
// Per decoder layer, with H = hidden_size, D = head_dim, rank r holding the query heads heads_r, the KV heads kv_r
// and the intermediate rows ffn_r:
//   q_proj [num_heads*D][H]    column-parallel: rows [heads.begin*D, heads.end()*D)      -> q_r [heads.count*D]
//   k_proj, v_proj [kv_dim][H] column-parallel: rows [kv_heads.begin*D, kv_heads.end()*D) -> k_r, v_r
//   (Qwen2 biases: the same rows of bq, bk, bv)
//   attention and Quest (metadata, scoring, top-k, sparse attention) on the rank's own heads and KV cache
//   o_proj [H][num_heads*D]    row-parallel: columns [heads.begin*D, heads.end()*D)  -> a partial [H], all-reduce (sum)
//   gate_proj, up_proj [F][H]  column-parallel: rows ffn_r                          -> gate_r, up_r [ffn.count]
//   down_proj [H][F]           row-parallel: columns ffn_r                          -> a partial [H], all-reduce (sum)
//   RMSNorm weights            replicated
// Embedding [V][H] and lm_head [V][H] (the same matrix when tied): rows vocab_r. The embedding is a lookup of the
// rank's rows (zero for a token outside them) summed by an all-reduce; the logits are the ranks' slices gathered in
// rank order.
#include <cstddef>
#include <string>
#include <vector>

#include "model/core/config.h"
#include "model/core/quest_settings.h"

namespace quest {

inline constexpr int kMaxTpRanks = 64;  // --tp: at most this many GPUs (one host holds 8; the bound keeps plans small)

// A contiguous range [begin, begin + count).
struct TpRange {
    int begin = 0;
    int count = 0;
    int end() const { return begin + count; }
};

// What one rank holds (fields in units of the model's heads, KV heads, intermediate rows, vocabulary rows).
struct TpRank {
    int rank = 0;
    TpRange heads;     // query heads: whole KV-head groups, heads = kv_heads * group_size
    TpRange kv_heads;  // KV heads: num_kv_heads / ranks each
    TpRange ffn;       // intermediate rows (gate/up rows, down columns): balanced, in units of ffn_unit
    TpRange vocab;     // vocabulary rows of the embedding and lm_head: balanced, the first vocab % ranks get one more
    // The rank's shard as a model of its own: num_heads, num_kv_heads, intermediate_size and vocab_size reduced to
    // the rank's share, everything else (hidden_size, head_dim, layers, RoPE, norms) the model's. Its matrices have
    // exactly the shapes above, so a single-GPU memory plan of this config is the rank's plan (less the
    // all-reduce buffers).
    ModelConfig shard(const ModelConfig& model) const;
};

// The layout of a model over `ranks` GPUs.
struct TpPlan {
    ModelConfig model;
    int ranks = 1;
    int ffn_unit = 1;  // the intermediate split's granule (int4: the quantization group, so down_proj keeps whole groups)
    std::vector<TpRank> rank;  // [ranks]
};

// The plan of `ranks` GPUs. Rules (InputError naming --tp and the numbers otherwise):
//   1 <= ranks <= kMaxTpRanks, and ranks divides num_kv_heads: each rank owns whole KV heads and their query heads,
//     so GQA groups and Quest's per-KV-head selection never cross ranks;
//   the intermediate size is split in units of ffn_unit (ffn_unit divides intermediate_size), balanced, unevenly when
//     ranks does not divide intermediate_size / ffn_unit (ranks differ by at most one unit), every rank at least one;
//   the vocabulary is split unevenly the same way (no padding: the gathered logits are exactly vocab_size long),
//     every rank at least one row.
TpPlan make_tp_plan(const ModelConfig& c, int ranks, int ffn_unit = 1);

// The storage of the linear matrices on the GPUs.
enum class TpWeights { F16, Int4 };

// Device bytes one rank needs.
struct TpRankMemory {
    size_t weights = 0;    // its shard: linear matrices (fp16, or int4 + an fp16 scale and zero per group), embedding
                           // and lm_head rows (fp16), replicated norms (fp16), Qwen2 bias slices (fp16)
    size_t kv_cache = 0;   // layers x 2 x its kv heads x head_dim x 2 bytes per token (capacity rounded to pages)
    size_t metadata = 0;   // fp16 page min/max of its KV heads in the Quest layers (none under full attention)
    size_t workspace = 0;  // activations of a prefill chunk, its logits slice and the gathered logits (fp32), the
                           // all-reduce buffers, and a fixed slack for cuBLAS and NCCL
    size_t total() const;
    std::string describe() const;  // "weights 1.00 GiB + KV cache ... = ... GiB"
};

struct TpMemoryOptions {
    TpWeights weights = TpWeights::F16;
    int group = 128;           // int4 group size
    int prefill_chunk = 512;   // tokens per prefill chunk (the activations of the workspace)
};
inline constexpr size_t kTpSlackBytes = size_t(512) << 20;  // cuBLAS workspaces and NCCL's own buffers per rank

std::vector<TpRankMemory> plan_tp_memory(const TpPlan& p, const QuestSettings& q, int capacity,
                                         const TpMemoryOptions& o = {});

// The fit of one layout on GPUs of `per_gpu` bytes each: the ranks' needs, and when some rank does not fit a
// one-line refusal with the numbers ("--tp 2: rank 0 needs ... = 70.1 GiB, but a GPU holds 64.0 GiB"); empty
// when every rank fits.
struct TpFit {
    std::vector<TpRankMemory> ranks;
    std::string refusal;
    bool fits() const { return refusal.empty(); }
};
TpFit fit_tp_memory(const TpPlan& p, const QuestSettings& q, int capacity, size_t per_gpu,
                    const TpMemoryOptions& o = {});

// The smallest valid layout of at most max_gpus GPUs on which every rank fits; ResourceError when none does, one line
// with the numbers of every layout tried (the largest rank's need of each) and the per-GPU memory. InputError when
// no valid layout exists (the --tp rules).
TpPlan choose_tp_layout(const ModelConfig& c, const QuestSettings& q, int capacity, size_t per_gpu, int max_gpus,
                        const TpMemoryOptions& o = {});

}  // namespace quest
