// The decode step's L2 prefetch (CudaOptions::l2_prefetch): a second stream, forked off the step's stream where a
// latency-bound phase begins (a layer's attention: the Quest chain of dependent launches, or the split-K attention),
// runs one small kernel (kernels/linear/l2_prefetch.cuh) that asks L2 for the first bytes of the GEMVs that follow,
// so that DRAM works while the phase waits on itself. The prefetches read immutable weights and write nothing, so
// the forked stream joins back only at the step's end (inside the CUDA graph, a branch that no kernel waits for).
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "kernels/common/error.h"
#include "kernels/linear/format_int4.h"
#include "model/cuda/layout.h"
#include "model/cuda/llama_cuda.h"

namespace quest {

using namespace cuda_layout;

CudaLlama::PrefetchState::~PrefetchState() {
    if (fork) cudaEventDestroy(fork);
    if (join) cudaEventDestroy(join);
    if (stream) cudaStreamDestroy(stream);
}

namespace {

// One linear matrix as the byte arrays a GEMV reads, each [rows][row_bytes] with rows contiguous: FP16 the matrix;
// int4 the codes (cols / 2 bytes a row, the device layout permutes only within a row), the fp16 scales and the
// uint8 zero points (cols / group of each a row).
struct MatrixBytes {
    const void* part[3] = {};
    size_t row_bytes[3] = {};
    int parts = 0;
    size_t rows = 0;
};

MatrixBytes matrix_bytes(const LinearWeight& W) {
    MatrixBytes m;
    m.rows = static_cast<size_t>(W.rows);
    const size_t cols = static_cast<size_t>(W.cols);
    if (W.storage.format == LinearFormat::Int4) {
        const Int4View w4 = int4_view(W);
        const size_t groups = cols / static_cast<size_t>(w4.group);
        m.part[0] = w4.qweight, m.row_bytes[0] = cols / 2;
        m.part[1] = w4.scales, m.row_bytes[1] = groups * 2;
        m.part[2] = w4.zeros, m.row_bytes[2] = groups;
        m.parts = 3;
    } else {
        m.part[0] = W.data, m.row_bytes[0] = cols * 2;
        m.parts = 1;
    }
    return m;
}

// Appends the first rows of m, as many whole rows as `budget` bytes hold (every part's share of them); returns the
// bytes those rows occupy.
size_t add_first_rows(L2PrefetchList& list, const MatrixBytes& m, size_t budget) {
    size_t per_row = 0;
    for (int i = 0; i < m.parts; ++i) per_row += m.row_bytes[i];
    if (per_row == 0) return 0;
    const size_t rows = std::min(m.rows, budget / per_row);
    if (rows == 0) return 0;
    for (int i = 0; i < m.parts; ++i)
        if (!list.add(m.part[i], rows * m.row_bytes[i]))
            throw std::logic_error("l2 prefetch: more ranges than L2PrefetchList holds");
    return rows * per_row;
}

}  // namespace

void CudaLlama::setup_l2_prefetch() {
    if (opts_.l2_prefetch == CudaOptions::L2Prefetch::Off) return;
    if (!(opts_.l2_prefetch_fraction >= 0 && opts_.l2_prefetch_fraction <= 1))
        throw InputError("--l2-prefetch-fraction: expected a number in [0, 1], got " +
                         std::to_string(opts_.l2_prefetch_fraction));
    const L2PrefetchParams& p = opts_.l2_prefetch_params;
    if (!(std::isfinite(p.rate_gbps) && p.rate_gbps >= 0))
        throw InputError("--l2-prefetch-rate: expected a number >= 0, got " + std::to_string(p.rate_gbps));
    const size_t l2 = l2_cache_bytes();
    if (l2 == 0) throw ResourceError("--l2-prefetch: the device reports no L2 cache size");
    prefetch_.window_bytes = static_cast<size_t>(opts_.l2_prefetch_fraction * static_cast<double>(l2));
    CUDA_CHECK(cudaStreamCreateWithFlags(&prefetch_.stream, cudaStreamNonBlocking));
    CUDA_CHECK(cudaEventCreateWithFlags(&prefetch_.fork, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&prefetch_.join, cudaEventDisableTiming));
    // evict_last lines are kept within the context's persisting set-aside: make room for one window's bytes when
    // the device allows it (a context-wide limit; it only changes which lines L2 evicts first).
    std::string persisting;
    if (p.form != L2PrefetchForm::Bulk) {
        const size_t most = l2_persisting_max_bytes(), now = l2_persisting_limit_bytes();
        const size_t want = std::min(most, prefetch_.window_bytes);
        if (want > now) CUDA_CHECK(cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, want));
        persisting = ", persisting L2 set-aside " + std::to_string(std::max(want, now) >> 20) + " MiB (device most " +
                     std::to_string(most >> 20) + " MiB)";
    }
    const char* where = opts_.l2_prefetch == CudaOptions::L2Prefetch::Attention ? "every layer's attention"
                        : opts_.l2_prefetch == CudaOptions::L2Prefetch::Quest   ? "the Quest layers' attention"
                                                                                : "every attention and down GEMV";
    spdlog::info("l2 prefetch: during {}, {:.1f} MiB per window ({:.2f} of the {:.1f} MiB L2), {}, {}{}", where,
                 prefetch_.window_bytes / 1048576.0, opts_.l2_prefetch_fraction, l2 / 1048576.0,
                 l2_prefetch_form_name(p.form),
                 p.rate_gbps > 0 ? "paced at " + std::to_string(static_cast<int>(p.rate_gbps)) + " GB/s"
                                 : std::string("unpaced"),
                 persisting);
}

void CudaLlama::enqueue_l2_prefetch(const Layer& L, int first, int last) {
    if (!prefetch_.stream || prefetch_.window_bytes == 0) return;
    const LinearWeight* W[4] = {&L.qkv, &L.o, &L.gu, &L.down};
    L2PrefetchList list;
    size_t left = prefetch_.window_bytes;
    for (int k = std::max(first, 0); k <= std::min(last, 3) && left > 0; ++k)
        left -= add_first_rows(list, matrix_bytes(*W[k]), left);
    if (list.count == 0) return;
    CUDA_CHECK(cudaEventRecord(prefetch_.fork, stream_));
    CUDA_CHECK(cudaStreamWaitEvent(prefetch_.stream, prefetch_.fork, 0));
    l2_prefetch(list, opts_.l2_prefetch_params, prefetch_.stream);
    prefetch_.forked = true;
}

void CudaLlama::join_l2_prefetch() {
    if (!prefetch_.forked) return;
    CUDA_CHECK(cudaEventRecord(prefetch_.join, prefetch_.stream));
    CUDA_CHECK(cudaStreamWaitEvent(stream_, prefetch_.join, 0));
    prefetch_.forked = false;
}

}  // namespace quest
