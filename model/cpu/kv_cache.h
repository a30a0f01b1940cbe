#pragma once
// The CPU backend's paged KV cache and page metadata (fp32), for one sequence.
//
// Layout, per layer l and KV head h (the same on the GPU, in FP16):
//   k[l][h][t][head_dim], v[l][h][t][head_dim]   t < capacity; page p holds tokens [p*S, (p+1)*S)
//   kmin[l][h][p][head_dim], kmax[l][h][p][head_dim]   per-channel min and max of the post-RoPE keys of page p
//   sub_kmin[l][h][j][head_dim], sub_kmax[l][h][j][head_dim]   the same per sub-page j of sub_page tokens (only when
//                                                               sub_page > 0: the two-level selector's fine level)
// A KV head's tokens are contiguous, so a page is one contiguous run of S*head_dim values, and the metadata of one
// KV head is contiguous over pages (what the scoring pass streams).
#include <cstddef>
#include <cstdint>
#include <vector>

namespace quest {

struct KvCacheShape {
    int num_layers = 0;
    int num_kv_heads = 0;
    int head_dim = 0;
    int page_size = 16;  // S
    int capacity = 0;    // tokens (rounded up to whole pages)
    int sub_page = 0;    // tokens per sub-page of the fine metadata (0: none; else a power of two < page_size)
    int pages() const { return (capacity + page_size - 1) / page_size; }
    int sub_pages() const { return sub_page ? pages() * (page_size / sub_page) : 0; }
};

class KvCache {
public:
    explicit KvCache(const KvCacheShape& shape);
    const KvCacheShape& shape() const { return shape_; }

    // Stores the post-RoPE key and the value of token `pos` for every KV head of `layer` (k, v: [num_kv_heads][head_dim])
    // and folds the key into its page's metadata (O(head_dim) per head).
    void write(int layer, int pos, const float* k, const float* v);
    // Forgets the tokens at positions >= len in every layer (a prefill undone part-way): the metadata of the page
    // holding position len is rebuilt from the keys before len (later pages are reset by their first write).
    void truncate(int len);
    // Replaces this cache's tokens [0, len) with src's (keys, values; the metadata rebuilt at this cache's page and
    // sub-page sizes). Same layers, KV heads and head_dim; len within both capacities.
    void copy_tokens_from(const KvCache& src, int len);

    const float* keys(int layer, int kv_head) const { return k_.data() + token_offset(layer, kv_head); }
    const float* values(int layer, int kv_head) const { return v_.data() + token_offset(layer, kv_head); }
    // Metadata of a layer, all KV heads: [num_kv_heads][pages][head_dim].
    const float* kmin(int layer) const { return kmin_.data() + meta_offset(layer, 0); }
    const float* kmax(int layer) const { return kmax_.data() + meta_offset(layer, 0); }
    // Sub-page metadata of a layer, all KV heads: [num_kv_heads][sub_pages][head_dim] (nullptr when sub_page == 0).
    const float* sub_kmin(int layer) const { return sub_kmin_.empty() ? nullptr : sub_kmin_.data() + sub_offset(layer, 0); }
    const float* sub_kmax(int layer) const { return sub_kmax_.empty() ? nullptr : sub_kmax_.data() + sub_offset(layer, 0); }

    size_t bytes() const {
        return (k_.size() + v_.size() + kmin_.size() + kmax_.size() + sub_kmin_.size() + sub_kmax_.size()) * sizeof(float);
    }

private:
    int64_t token_offset(int layer, int kv_head) const {
        return (static_cast<int64_t>(layer) * shape_.num_kv_heads + kv_head) * shape_.capacity * shape_.head_dim;
    }
    int64_t meta_offset(int layer, int kv_head) const {
        return (static_cast<int64_t>(layer) * shape_.num_kv_heads + kv_head) * shape_.pages() * shape_.head_dim;
    }
    int64_t sub_offset(int layer, int kv_head) const {
        return (static_cast<int64_t>(layer) * shape_.num_kv_heads + kv_head) * shape_.sub_pages() * shape_.head_dim;
    }
    KvCacheShape shape_;
    std::vector<float> k_, v_, kmin_, kmax_, sub_kmin_, sub_kmax_;
};

}  // namespace quest
