#pragma once
// Helpers for the CUDA tests (ctest label `cuda`): skip visibly without a GPU, seeded random inputs, fp16
// round-tripping so the CPU reference sees exactly what the GPU sees, and relative errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "kernels/common/cuda_common.cuh"
#include "kernels/common/device_buffer.h"
#include "kernels/linear/gemv_int4.cuh"
#include "kernels/linear/quant.h"
#include "kernels/select/quest.cuh"
#include "kernels/select/quest.h"
#include "kernels/common/rope.cuh"
#include "kernels/common/dtype.h"

#define QUEST_REQUIRE_GPU()                                                                              \
    do {                                                                                                 \
        if (::quest::cuda_device_count() == 0) GTEST_SKIP() << "SKIPPED: no CUDA device on this machine"; \
    } while (0)

namespace quest::test {

inline std::vector<float> random_floats(std::mt19937& rng, size_t n, float scale = 1.0f, float mean = 0.0f) {
    std::normal_distribution<float> d(mean, scale);
    std::vector<float> v(n);
    for (float& x : v) x = d(rng);
    return v;
}

// Rounds every value to fp16 precision (so CPU and GPU start from identical inputs) and returns the fp16 bits.
inline std::vector<__half> to_half(std::vector<float>& v) {
    std::vector<__half> h(v.size());
    for (size_t i = 0; i < v.size(); ++i) {
        const uint16_t bits = float_to_half(v[i]);
        v[i] = half_to_float(bits);
        __half_raw raw;
        raw.x = bits;
        h[i] = __half(raw);
    }
    return h;
}

inline std::vector<float> to_float(const std::vector<__half>& h) {
    std::vector<float> v(h.size());
    for (size_t i = 0; i < h.size(); ++i) v[i] = half_to_float(__half_raw(h[i]).x);
    return v;
}

// ||a - b|| / ||b||; NaN (an unwritten poisoned element) gives NaN, which fails every `<=` check.
inline double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
    double num = 0, den = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        const double d = double(a[i]) - double(b[i]);
        num += d * d;
        den += double(b[i]) * double(b[i]);
    }
    if (std::isnan(num)) return NAN;
    return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

inline bool all_finite(const std::vector<float>& v) {
    for (float x : v)
        if (!std::isfinite(x)) return false;
    return true;
}

// The fp16 NaN used to poison device memory that must not be read (or must be written).
inline __half half_nan() {
    __half_raw r;
    r.x = 0xFFFF;
    return __half(r);
}

// A device copy of a host vector.
template <typename T>
DeviceBuffer<T> upload(const std::vector<T>& v) {
    DeviceBuffer<T> d(v.size());
    d.upload(v);
    return d;
}

// One layer's KV cache and fp16 page metadata, on the host (fp16-exact floats) and on the device.
struct LayerCache {
    // Geometry only, kmin / kmax zero-filled (nothing on the device yet).
    static LayerCache empty(int hkv, int d, int s, int cap) {
        LayerCache c;
        c.hkv = hkv;
        c.d = d;
        c.s = s;
        c.cap = cap;
        c.max_pages = cap / s;
        c.kmin.assign(static_cast<size_t>(hkv) * c.max_pages * d, 0.0f);
        c.kmax = c.kmin;
        return c;
    }
    int hkv = 0, d = 0, s = 0, cap = 0, max_pages = 0;
    std::vector<float> k, v;        // [hkv][cap][d] (empty without K/V)
    std::vector<float> kmin, kmax;  // [hkv][max_pages][d]
    DeviceBuffer<__half> dk, dv, dmin, dmax;
    KvLayerView view() const {
        KvLayerView kv;
        kv.k = dk.get();
        kv.v = dv.get();
        kv.kmin = dmin.get();
        kv.kmax = dmax.get();
        kv.num_kv_heads = hkv;
        kv.head_dim = d;
        kv.capacity = cap;
        kv.page_size = s;
        kv.max_pages = max_pages;
        return kv;
    }
    const float* kh(int h) const { return k.data() + static_cast<size_t>(h) * cap * d; }
    const float* vh(int h) const { return v.data() + static_cast<size_t>(h) * cap * d; }
    const float* mn(int h, int p) const { return kmin.data() + (static_cast<size_t>(h) * max_pages + p) * d; }
    const float* mx(int h, int p) const { return kmax.data() + (static_cast<size_t>(h) * max_pages + p) * d; }
};

// Paged K/V for the Quest tests, [hkv][cap][d]: keys N(0,1) plus off[h][page] * dir[h] (so the pages' scores spread
// out), values N(0,1), rounded to fp16 (k, v keep the rounded values the CPU reference sees); the fp16 copies hk, hv
// have the tokens >= valid_len poisoned (NaN); kmin/kmax ([hkv][max_pages][d], zero-filled by the caller) get the
// min/max of each page's valid tokens (page_metadata_update_ref).
struct PagedKv {
    std::vector<float> k, v;
    std::vector<__half> hk, hv;
};
inline PagedKv random_paged_kv(std::mt19937& rng, int hkv, int d, int s, int cap, int max_pages, int valid_len,
                               const std::vector<float>& dir, const std::vector<float>& off, std::vector<float>& kmin,
                               std::vector<float>& kmax) {
    std::normal_distribution<float> nd(0.0f, 1.0f);
    PagedKv r;
    const size_t n = static_cast<size_t>(hkv) * cap * d;
    r.k.resize(n);
    r.v.resize(n);
    for (int h = 0; h < hkv; ++h)
        for (int t = 0; t < cap; ++t)
            for (int i = 0; i < d; ++i) {
                const size_t at = (static_cast<size_t>(h) * cap + t) * d + i;
                r.k[at] = nd(rng) + off[static_cast<size_t>(h) * max_pages + t / s] * dir[h * d + i];
                r.v[at] = nd(rng);
            }
    r.hk = to_half(r.k);
    r.hv = to_half(r.v);
    for (int h = 0; h < hkv; ++h)
        for (int t = valid_len; t < cap; ++t)
            for (int i = 0; i < d; ++i) {
                const size_t at = (static_cast<size_t>(h) * cap + t) * d + i;
                r.hk[at] = half_nan();
                r.hv[at] = half_nan();
            }
    for (int h = 0; h < hkv; ++h)
        for (int t = 0; t < valid_len; ++t) {
            const size_t m = (static_cast<size_t>(h) * max_pages + t / s) * d;
            page_metadata_update_ref(&kmin[m], &kmax[m], &r.k[(static_cast<size_t>(h) * cap + t) * d], d, t % s == 0);
        }
    return r;
}

// Fills c (LayerCache::empty) with random_paged_kv: the float K/V in c.k / c.v, the poisoned fp16 copies in c.dk / c.dv,
// the pages' min / max in c.kmin / c.kmax (host only: upload_page_metadata puts them on the device).
inline void fill_paged_kv(LayerCache& c, std::mt19937& rng, int valid_len, const std::vector<float>& dir,
                          const std::vector<float>& off) {
    PagedKv kv = random_paged_kv(rng, c.hkv, c.d, c.s, c.cap, c.max_pages, valid_len, dir, off, c.kmin, c.kmax);
    c.k = std::move(kv.k);
    c.v = std::move(kv.v);
    c.dk = DeviceBuffer<__half>(c.k.size());
    c.dv = DeviceBuffer<__half>(c.v.size());
    c.dk.upload(kv.hk);
    c.dv.upload(kv.hv);
}

// The per-KV-head directions ([hkv][d], N(0,1)) and per-page offsets ([hkv][max_pages], N(0, 0.7^2)) that spread the
// pages' scores (random_paged_kv).
struct PageSpread {
    std::vector<float> dir, off;
    PageSpread(std::mt19937& rng, int hkv, int d, int max_pages)
        : dir(static_cast<size_t>(hkv) * d), off(static_cast<size_t>(hkv) * max_pages) {
        std::normal_distribution<float> nd(0.0f, 1.0f);
        for (float& x : dir) x = nd(rng);
        for (float& x : off) x = 0.7f * nd(rng);
    }
};

// Rounds c.kmin / c.kmax to fp16 (the rounding keeps min <= max) and uploads them to c.dmin / c.dmax, pages >=
// valid_pages NaN on the device.
inline void upload_page_metadata(LayerCache& c, int valid_pages) {
    const std::vector<__half> qmin = to_half(c.kmin), qmax = to_half(c.kmax);
    std::vector<__half> hmin(qmin.size(), half_nan()), hmax(qmax.size(), half_nan());
    for (int h = 0; h < c.hkv; ++h) {
        const size_t first = static_cast<size_t>(h) * c.max_pages * c.d;
        const size_t n = static_cast<size_t>(std::min(valid_pages, c.max_pages)) * c.d;
        std::copy(qmin.begin() + first, qmin.begin() + first + n, hmin.begin() + first);
        std::copy(qmax.begin() + first, qmax.begin() + first + n, hmax.begin() + first);
    }
    c.dmin = DeviceBuffer<__half>(hmin.size());
    c.dmax = DeviceBuffer<__half>(hmax.size());
    c.dmin.upload(hmin);
    c.dmax.upload(hmax);
}

// An Int4Matrix on the device, its codes repacked into the device layout (kernels/linear/int4_layout.h) as the CUDA
// backend does at upload.
struct DeviceInt4 {
    DeviceBuffer<uint32_t> qweight;
    DeviceBuffer<__half> scales;
    DeviceBuffer<uint8_t> zeros;
    Int4View view;
    explicit DeviceInt4(const Int4Matrix& m)
        : qweight(m.qweight.size()), scales(m.scales.size()), zeros(m.zeros.size()) {
        std::vector<uint32_t> q = m.qweight;
        int4_to_device_layout(q, m.rows, m.cols, m.group);
        qweight.upload(q);
        CUDA_CHECK(cudaMemcpy(scales.get(), m.scales.data(), m.scales.size() * 2, cudaMemcpyHostToDevice));
        zeros.upload(m.zeros);
        view = {qweight.get(), scales.get(), zeros.get(), m.rows, m.cols, m.group};
    }
};

// The device buffers of a QuestWorkspace, sized by quest_workspace_sizes for a test shape (any struct with num_heads,
// num_kv_heads, head_dim, page_size, page_budget and policy); the counters zeroed once, as the kernels expect.
struct QuestBuffers {
    QuestWorkspaceSizes sz;
    int pps = 0;  // pages_per_split as passed (0: the default)
    DeviceBuffer<float> scores, o, ml;
    DeviceBuffer<int> selected, counters;
    template <class Shape>
    QuestBuffers(const Shape& s, int max_pages, int pages_per_split = 0, const MatchedBudget& match = {})
        : sz(quest_workspace_sizes(s.num_heads, s.num_kv_heads, s.head_dim, s.page_size, max_pages, s.page_budget,
                                   s.policy, pages_per_split, match)),
          pps(pages_per_split),
          scores(sz.scores),
          o(sz.partial_o),
          ml(sz.partial_ml),
          selected(sz.selected),
          counters(sz.counters) {
        counters.fill_bytes(0);  // zeroed once; the kernels leave them zero
    }
    QuestWorkspace ws() const {
        QuestWorkspace w;
        w.scores = scores.get();
        w.selected = selected.get();
        w.partial_o = o.get();
        w.partial_ml = ml.get();
        w.counters = counters.get();
        w.pages_per_split = pps;
        return w;
    }
    void poison() {  // every buffer but the counters: unwritten entries read as NaN / -1
        scores.fill_bytes(0xFF);
        selected.fill_bytes(0xFF);
        o.fill_bytes(0xFF);
        ml.fill_bytes(0xFF);
    }
    bool counters_zero() const {
        for (int c : counters.download())
            if (c != 0) return false;
        return true;
    }
};

}  // namespace quest::test
