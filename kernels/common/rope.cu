#include <algorithm>
#include <cstdint>
#include <string>

#include "kernels/common/rope.cuh"
#include "kernels/common/rope_device.cuh"

namespace quest {

namespace {

// grid (tokens, slices): the threads of a token's blocks walk the (head, pair) grid of q and k, then copy v
// (kernels/common/rope_device.cuh, the same code the Quest launches run when they take this work over: the scoring kernel
// rotates q for its scores, the top-k kernel writes q, k, v and the page bounds; QuestDecodeOptions::rope).
__global__ void rope_append_kernel(__half* q_out, KvLayerView kv, const float* qkv, const int* d_pos, int T,
                                   int num_heads, RopeDeviceParams rope) {
    pdl_wait();
    // The next kernel (Quest scoring, decode attention) may be scheduled now: it waits (pdl_wait) before reading
    // anything. Triggered after the wait, never before: the kernels before this one are then complete.
    pdl_trigger();
    const int t = blockIdx.x;
    const int D = kv.head_dim;
    const int q_dim = num_heads * D, kv_dim = kv.num_kv_heads * D;
    const double dyn_base = rope_dev::dynamic_base(rope, D, *d_pos + T);
    const int stride = gridDim.y * blockDim.x, first = blockIdx.y * blockDim.x + threadIdx.x;
    const rope_dev::Token tk{q_out + static_cast<int64_t>(t) * q_dim, kv,
                             qkv + static_cast<int64_t>(t) * (q_dim + 2 * kv_dim), *d_pos + t, T, num_heads};
    rope_dev::append_token(tk, rope, dyn_base, first, stride);
}

// grid (kv heads, pages), threads over channels.
__global__ void metadata_rebuild_kernel(KvLayerView kv, int first_page, int len) {
    const int kh = blockIdx.x, page = first_page + blockIdx.y, D = kv.head_dim;
    const int t0 = page * kv.page_size, t1 = min(len, t0 + kv.page_size);
    if (t0 >= t1) return;
    const __half* k = kv.k + static_cast<int64_t>(kh) * kv.capacity * D;
    const int64_t m = (static_cast<int64_t>(kh) * kv.max_pages + page) * D;
    for (int i = threadIdx.x; i < D; i += blockDim.x) {
        __half mn = k[static_cast<int64_t>(t0) * D + i], mx = mn;
        for (int t = t0 + 1; t < t1; ++t) {
            const __half x = k[static_cast<int64_t>(t) * D + i];
            mn = __hmin(mn, x);
            mx = __hmax(mx, x);
        }
        kv.kmin[m + i] = mn;
        kv.kmax[m + i] = mx;
    }
}

}  // namespace

void require_rope_append(const char* who, const __half* q_out, const KvLayerView& kv, const float* qkv, int T,
                         int num_heads, const RopeDeviceParams& rope) {
    // (the messages are built only on failure)
    QUEST_REQUIRE(q_out && kv.k && kv.v && qkv && T > 0 && num_heads > 0, std::string(who) + ": bad arguments");
    QUEST_REQUIRE(kv.head_dim % 2 == 0 && kv.page_size > 0, std::string(who) + ": head_dim must be even");
    QUEST_REQUIRE(rope.dynamic || rope.inv_freq, std::string(who) + ": inv_freq table missing");
    QUEST_REQUIRE(T > 1 || (kv.kmin && kv.kmax), std::string(who) + ": metadata missing");
}

void rope_append_kv(__half* q_out, const KvLayerView& kv, const float* qkv, const int* d_pos, int T, int num_heads,
                    const RopeDeviceParams& rope, cudaStream_t stream) {
    require_rope_append("rope_append_kv", q_out, kv, qkv, T, num_heads, rope);
    QUEST_REQUIRE(d_pos, "rope_append_kv: bad arguments");
    const int work = (num_heads + kv.num_kv_heads) * kv.head_dim / 2;
    const int threads = work >= 128 ? 128 : ((work + 31) / 32) * 32;
    const int slices = std::min(ceil_div(work, threads), 64);  // a decode step's token spreads over several SMs
    launch_pdl(rope_append_kernel, dim3(T, slices), dim3(threads), 0, stream, q_out, kv, qkv, d_pos, T, num_heads,
               rope);
}

void page_metadata_rebuild(const KvLayerView& kv, int first_page, int last_page, int len, cudaStream_t stream) {
    QUEST_REQUIRE(kv.kmin && kv.kmax && first_page >= 0 && last_page < kv.max_pages && len <= kv.capacity,
                  "page_metadata_rebuild: bad arguments");
    if (last_page < first_page) return;
    QUEST_REQUIRE(last_page - first_page < 65536, "page_metadata_rebuild: at most 65535 pages per call");
    const int threads = kv.head_dim >= 128 ? 128 : ((kv.head_dim + 31) / 32) * 32;
    metadata_rebuild_kernel<<<dim3(kv.num_kv_heads, last_page - first_page + 1), threads, 0, stream>>>(kv, first_page,
                                                                                                     len);
    CUDA_CHECK_LAUNCH();
}

}  // namespace quest
