// Kernel micro-benchmarks on Llama-2-7B shapes (not a test): the batch-1 GEMV against cuBLAS, and decode attention
// (full split-K, and Quest at several budgets) over one layer at 4K / 32K / 128K tokens. Times are medians of
// CUDA-event-timed launches after warm-up, inputs random (never zeros), rotated over several copies so that the
// 60 MB L2 cannot hold them. GB/s counts the bytes each launch must read.
//
//   quest_kernel_bench [gemv] [gemv4] [read] [fused] [attention] [quest] [codes] [tp] [--json FILE]   (no section
//   named: all of them but tp; read: read-only ceilings at the GEMVs' byte counts; codes: only the page-codes part of
//   quest; fused: one layer's GEMVs with and without the fused epilogues; tp: whole decode steps of the 7B shape on
//   one GPU, the whole-model backend against tensor parallelism of one rank through NCCL, what the TP machinery costs). QUEST_BENCH_ONLY=<text> restricts gemv4 to the rows whose
//   name contains the text (e.g. one kernel and shape under Nsight Compute).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iterator>
#include <string>
#include <vector>

#include "kernels/attention/attention_decode.cuh"
#include "kernels/common/device_buffer.h"
#include "kernels/common/elementwise.cuh"
#include "kernels/linear/gemv.cuh"
#include "kernels/linear/gemv_int4.cuh"
#include "kernels/linear/gemv_int4_kernels.cuh"
#include "kernels/select/page_codes.cuh"
#include "kernels/select/quest.cuh"
#include "kernels/select/page_oracle.cuh"
#include "kernels/select/sparq.cuh"
#include "kernels/select/sparq_rule.h"
#include "engine/timing.h"
#include "model/core/config.h"
#include "model/cuda/llama_cuda.h"
#include "model/cuda/nccl_collective.h"
#include "model/cuda/tp_llama.h"
#include "tests/cuda/bench_read.h"

using namespace quest;

namespace {

// Median milliseconds of `iters` launches of fn(i) (i rotates the input copy), after `warmup` launches.
double time_ms(const std::function<void(int)>& fn, int iters = 50, int warmup = 5) {
    cudaEvent_t a, b;
    CUDA_CHECK(cudaEventCreate(&a));
    CUDA_CHECK(cudaEventCreate(&b));
    for (int i = 0; i < warmup; ++i) fn(i);
    std::vector<float> ms;
    for (int i = 0; i < iters; ++i) {
        CUDA_CHECK(cudaEventRecord(a));
        fn(i);
        CUDA_CHECK(cudaEventRecord(b));
        CUDA_CHECK(cudaEventSynchronize(b));
        float t = 0;
        CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
        ms.push_back(t);
    }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
}

std::vector<std::string> g_json;

// Milliseconds per layer of `layers` launches of body(l, stream) captured in one CUDA graph on `stream` (PDL between
// them, as in the decode step): the graph's median over 30 launches after 3, divided by the layers. One body(0)
// runs first, outside the capture (first-use attribute and occupancy queries).
using LayerBody = std::function<void(int, cudaStream_t)>;
double graph_ms_per_layer(cudaStream_t stream, int layers, const LayerBody& body) {
    body(0, stream);
    CUDA_CHECK(cudaStreamSynchronize(stream));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    for (int l = 0; l < layers; ++l) body(l, stream);
    CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    const double t = time_ms([&](int) { CUDA_CHECK(cudaGraphLaunch(exec, nullptr)); }, 30, 3) / layers;
    CUDA_CHECK(cudaGraphExecDestroy(exec));
    CUDA_CHECK(cudaGraphDestroy(graph));
    return t;
}

// QUEST_BENCH_ONLY=<text>: only the int4 GEMV rows whose name contains it (e.g. to profile one kernel under ncu).
bool selected(const std::string& name) {
    const char* only = std::getenv("QUEST_BENCH_ONLY");
    return only == nullptr || name.find(only) != std::string::npos;
}

void report(const std::string& what, double ms, double bytes) {
    const double gbps = bytes / (ms * 1e-3) / 1e9;
    std::printf("%-62s %10.4f ms %9.1f GB/s  (%5.1f%% of 4200)\n", what.c_str(), ms, gbps, 100.0 * gbps / 4200.0);
    char buf[256];
    std::snprintf(buf, sizeof buf, R"({"what": "%s", "ms": %.5f, "bytes": %.0f, "gbps": %.1f})", what.c_str(), ms, bytes,
                  gbps);
    g_json.push_back(buf);
}

void bench_gemv() {
    cublasHandle_t h;
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) throw CudaError("cublasCreate failed");
    struct Shape { const char* name; int rows, cols; };
    for (Shape s : {Shape{"qkv 12288x4096", 12288, 4096}, Shape{"o 4096x4096", 4096, 4096},
                    Shape{"gate|up 22016x4096", 22016, 4096}, Shape{"down 4096x11008", 4096, 11008},
                    Shape{"lm_head 32000x4096", 32000, 4096}}) {
        const size_t n = size_t(s.rows) * s.cols;
        const int copies = std::max<int>(2, int(std::ceil(240e6 / (n * 2.0))));
        DeviceBuffer<__half> W(n * copies), x(size_t(s.cols) * copies);
        DeviceBuffer<float> y(size_t(s.rows) * copies);
        fill_random_half(W.get(), W.size(), 1, 0.02f, 0.0f, nullptr);
        fill_random_half(x.get(), x.size(), 2, 1.0f, 0.0f, nullptr);
        const double bytes = n * 2.0 + s.cols * 2.0 + s.rows * 4.0;
        const double t_own = time_ms([&](int i) {
            const int c = i % copies;
            gemv(y.get() + size_t(c) * s.rows, W.get() + n * c, x.get() + size_t(c) * s.cols, s.rows, s.cols, nullptr);
        });
        const double t_cublas = time_ms([&](int i) {
            const int c = i % copies;
            gemm_cublas(h, y.get() + size_t(c) * s.rows, W.get() + n * c, x.get() + size_t(c) * s.cols, 1, s.rows,
                        s.cols, nullptr);
        });
        report(std::string("gemv own    ") + s.name, t_own, bytes);
        report(std::string("gemv cuBLAS ") + s.name, t_cublas, bytes);
    }
    cublasDestroy(h);
}

// The int4 GEMV (group 128) at the 7B shapes: bytes = packed codes + fp16 scales + uint8 zero points + x + y.
// Also the prefill's dequantize-to-FP16 (bytes read + written). gemv_int4 ("gemv int4 g128", with the kernel its
// auto rule picks for the shape), then every kernel it chooses from ("  int4 kernel").
void bench_gemv_int4() {
    struct Shape { const char* name; int rows, cols; };
    const int group = 128;
    for (Shape s : {Shape{"qkv 12288x4096", 12288, 4096}, Shape{"o 4096x4096", 4096, 4096},
                    Shape{"gate|up 22016x4096", 22016, 4096}, Shape{"down 4096x11008", 4096, 11008}}) {
        const size_t words = size_t(s.rows) * s.cols / 8, groups = size_t(s.rows) * s.cols / group;
        const double packed = words * 4.0 + groups * 3.0;
        const int copies = std::max<int>(2, int(std::ceil(240e6 / packed)));
        DeviceBuffer<uint32_t> q(words * copies);
        DeviceBuffer<__half> sc(groups * copies), x(size_t(s.cols) * copies), out(size_t(s.rows) * s.cols);
        DeviceBuffer<uint8_t> z(groups * copies);
        DeviceBuffer<float> y(size_t(s.rows) * copies);
        fill_random_int4(q.get(), sc.get(), z.get(), s.rows * copies, s.cols, group, 7, 0.02f, nullptr);
        fill_random_half(x.get(), x.size(), 8, 1.0f, 0.0f, nullptr);
        auto view = [&](int c) {
            return Int4View{q.get() + words * c, sc.get() + groups * c, z.get() + groups * c, s.rows, s.cols, group};
        };
        const double bytes = packed + s.cols * 2.0 + s.rows * 4.0;
        // gemv_int4 (v = -1), then each kernel it chooses from: isolated launches, then 16 launches back to back
        // (as in the decode graph: each one's weight loads start under the previous one's tail, programmatic
        // dependent launch), time per launch.
        for (int v = -1; v < int(std::size(kInt4Kernels)); ++v) {
            const std::string name =
                v < 0 ? std::string("gemv int4 g128 [") + gemv_int4_kernel_name(gemv_int4_kernel_for(view(0))) + "] " +
                            s.name
                      : std::string("  int4 kernel [") + gemv_int4_kernel_name(kInt4Kernels[v]) + "] " + s.name;
            if (!selected(name)) continue;
            auto run = [&](int c) {
                float* yc = y.get() + size_t(c) * s.rows;
                const __half* xc = x.get() + size_t(c) * s.cols;
                if (v < 0) gemv_int4(yc, view(c), xc, nullptr);
                else gemv_int4_run(kInt4Kernels[v], yc, view(c), xc, nullptr);
            };
            const double tv = time_ms([&](int i) { run(i % copies); });
            report(name, tv, bytes);
            const double tb = time_ms([&](int i) {
                for (int k = 0; k < 16; ++k) run((i * 16 + k) % copies);
            }) / 16;
            report(name + " x16", tb, bytes);
        }
        const std::string dq = std::string("dequant int4->fp16 ") + s.name;
        if (!selected(dq)) continue;
        const double td = time_ms([&](int i) { dequantize_int4_to_half(out.get(), view(i % copies), nullptr); });
        report(dq, td, packed + size_t(s.rows) * s.cols * 2.0);
    }
}

// The read-only ceiling at the int4 and FP16 GEMVs' byte counts (tests/cuda/bench_read.cu): isolated launches and 16
// back to back (programmatic dependent launch), bytes rotated over copies past the L2.
void bench_read() {
    struct Size { const char* name; double bytes; };
    const double g = 3.0 / 128;  // int4 g128: half a byte per weight plus 3 bytes (scale, zero) per group
    const Size sizes[] = {{"int4 qkv 12288x4096", 12288.0 * 4096 * (0.5 + g)},
                          {"int4 o 4096x4096", 4096.0 * 4096 * (0.5 + g)},
                          {"int4 gate|up 22016x4096", 22016.0 * 4096 * (0.5 + g)},
                          {"int4 down 4096x11008", 4096.0 * 11008 * (0.5 + g)},
                          {"fp16 qkv 12288x4096", 12288.0 * 4096 * 2},
                          {"fp16 gate|up 22016x4096", 22016.0 * 4096 * 2}};
    int sms = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    DeviceBuffer<uint32_t> out(size_t(sms) * 4);
    for (const Size& s : sizes) {
        const size_t bytes = (static_cast<size_t>(s.bytes) + 255) / 256 * 256;
        const int copies = std::max<int>(2, int(std::ceil(240e6 / double(bytes))));
        DeviceBuffer<uint8_t> src(bytes * copies);
        fill_random_half(reinterpret_cast<__half*>(src.get()), bytes * copies / 2, 3, 1.0f, 0.0f, nullptr);
        for (int v = 0; v < bench::read_variant_count(); ++v) {
            const std::string name = std::string("read [") + bench::read_variant_name(v) + "] " + s.name;
            const double t1 = time_ms([&](int i) {
                bench::read_variant(v, out.get(), src.get() + bytes * (i % copies), bytes, nullptr);
            });
            report(name, t1, double(bytes));
            const double t16 = time_ms([&](int i) {
                for (int k = 0; k < 16; ++k)
                    bench::read_variant(v, out.get(), src.get() + bytes * ((i * 16 + k) % copies), bytes, nullptr);
            }) / 16;
            report(name + " x16", t16, double(bytes));
        }
    }
}

// The decode step's linear part of one Llama-2-7B layer (qkv, o, gate+up, down with their norms, residual adds and
// SwiGLU; no attention), unfused (rms_norm + gemv ... + swiglu: 7 launches) against the fused GEMV epilogues
// (kernels/linear/gemv_epilogue.h: 4 launches), FP16 and int4 g128, time per layer with 8 layers back to back (weights
// rotated over copies past the L2).
void bench_fused() {
    const int H = 4096, F = 11008, Q = 12288, group = 128;
    struct Dims { int rows, cols; };
    const Dims dims[4] = {{Q, H}, {H, H}, {2 * F, H}, {H, F}};  // qkv, o, gate+up, down
    DeviceBuffer<float> x(H), proj(H), qkv(Q), gu(2 * F), w_norm(H);
    DeviceBuffer<__half> xn(H), att(H), act(F);
    fill_random_float(x.get(), H, 11, 1.0f, 0.0f, nullptr);
    fill_random_float(w_norm.get(), H, 12, 0.1f, 1.0f, nullptr);
    fill_random_half(att.get(), H, 13, 1.0f, 0.0f, nullptr);
    fill_random_half(xn.get(), H, 14, 1.0f, 0.0f, nullptr);
    for (bool int4 : {false, true}) {
        double layer_bytes = 0;
        for (const Dims& d : dims)
            layer_bytes += int4 ? d.rows * (d.cols / 2.0 + d.cols / group * 3.0) : d.rows * (d.cols * 2.0);
        const int copies = std::max<int>(2, int(std::ceil(240e6 / layer_bytes)));
        // Per copy and matrix: FP16 weights, or int4 codes / scales / zero points.
        std::vector<DeviceBuffer<__half>> w16;
        std::vector<DeviceBuffer<uint32_t>> q;
        std::vector<DeviceBuffer<__half>> sc;
        std::vector<DeviceBuffer<uint8_t>> z;
        std::vector<Int4View> v4;
        for (int c = 0; c < copies; ++c)
            for (int m = 0; m < 4; ++m) {
                const Dims d = dims[m];
                if (!int4) {
                    w16.emplace_back(size_t(d.rows) * d.cols);
                    fill_random_half(w16.back().get(), w16.back().size(), 20 + c * 4 + m, 0.02f, 0.0f, nullptr);
                    continue;
                }
                const size_t words = size_t(d.rows) * d.cols / 8, groups = size_t(d.rows) * d.cols / group;
                q.emplace_back(words);
                sc.emplace_back(groups);
                z.emplace_back(groups);
                fill_random_int4(q.back().get(), sc.back().get(), z.back().get(), d.rows, d.cols, group, 40 + c * 4 + m,
                                 0.02f, nullptr);
                v4.push_back(Int4View{q.back().get(), sc.back().get(), z.back().get(), d.rows, d.cols, group});
            }
        const int partials =
            int4 ? std::max(gemv_int4_residual_partials(v4[1]), gemv_int4_residual_partials(v4[3])) : gemv_residual_partials(H);
        // The consumers add `partials` partial sums of x^2 (as after the residual GEMVs, which rewrite them).
        DeviceBuffer<float> part(partials);
        part.upload(std::vector<float>(partials, float(H) / partials));
        const NormScale norm{part.get(), partials, H, 1e-5f};
        const ResidualNorm res{x.get(), xn.get(), w_norm.get(), part.get(), partials};
        auto plain = [&](int c, int m, float* y, const __half* in) {
            if (int4) gemv_int4(y, v4[c * 4 + m], in, nullptr);
            else gemv(y, w16[c * 4 + m].get(), in, dims[m].rows, dims[m].cols, nullptr);
        };
        const double t_unfused = time_ms([&](int i) {
            for (int k = 0; k < 8; ++k) {
                const int c = (i * 8 + k) % copies;
                rms_norm(xn.get(), x.get(), proj.get(), w_norm.get(), 1, H, 1e-5f, nullptr);
                plain(c, 0, qkv.get(), xn.get());
                plain(c, 1, proj.get(), att.get());
                rms_norm(xn.get(), x.get(), proj.get(), w_norm.get(), 1, H, 1e-5f, nullptr);
                plain(c, 2, gu.get(), xn.get());
                swiglu_interleaved(act.get(), gu.get(), 1, F, nullptr);
                plain(c, 3, proj.get(), act.get());
            }
        }) / 8;
        const double t_fused = time_ms([&](int i) {
            for (int k = 0; k < 8; ++k) {
                const int c = (i * 8 + k) % copies;
                if (int4) {
                    gemv_int4_scaled(qkv.get(), v4[c * 4], xn.get(), norm, nullptr);
                    gemv_int4_residual(res, v4[c * 4 + 1], att.get(), nullptr);
                    gemv_int4_swiglu(act.get(), v4[c * 4 + 2], xn.get(), norm, nullptr);
                    gemv_int4_residual(res, v4[c * 4 + 3], act.get(), nullptr);
                } else {
                    gemv_scaled(qkv.get(), w16[c * 4].get(), xn.get(), Q, H, norm, nullptr);
                    gemv_residual(res, w16[c * 4 + 1].get(), att.get(), H, H, nullptr);
                    gemv_swiglu(act.get(), w16[c * 4 + 2].get(), xn.get(), 2 * F, H, norm, nullptr);
                    gemv_residual(res, w16[c * 4 + 3].get(), act.get(), H, F, nullptr);
                }
            }
        }) / 8;
        const std::string w = int4 ? "int4 g128" : "fp16";
        report("layer linear part unfused (7 launches) " + w, t_unfused, layer_bytes);
        report("layer linear part fused   (4 launches) " + w, t_fused, layer_bytes);
        // The residual stream grows with every residual add (values do not change the timing): reset it.
        fill_random_float(x.get(), H, 11, 1.0f, 0.0f, nullptr);
    }
}

void bench_attention() {
    const int NH = 32, NKV = 32, D = 128, S = 16;
    for (int L : {4096, 32768, 131072}) {
        const int pages = L / S;
        const size_t kv_elems = size_t(NKV) * L * D;
        const int copies = L <= 4096 ? 4 : 1;  // 4K: 67 MB per layer, rotate past the L2
        DeviceBuffer<__half> k(kv_elems * copies), v(kv_elems * copies), kmin(size_t(NKV) * pages * D * copies),
            kmax(kmin.size()), q(size_t(NH) * D), out(size_t(NH) * D);
        fill_random_half(k.get(), k.size(), 3, 1.0f, 0.0f, nullptr);
        fill_random_half(v.get(), v.size(), 4, 1.0f, 0.0f, nullptr);
        fill_random_half(q.get(), q.size(), 5, 1.0f, 0.0f, nullptr);
        // Metadata consistent with the keys (a page's min/max over its tokens).
        std::vector<KvLayerView> views(copies);
        for (int c = 0; c < copies; ++c) {
            views[c] = {k.get() + kv_elems * c, v.get() + kv_elems * c, kmin.get() + size_t(NKV) * pages * D * c,
                        kmax.get() + size_t(NKV) * pages * D * c, NKV, D, L, S, pages};
            page_metadata_rebuild(views[c], 0, std::min(pages, 65535) - 1, L, nullptr);
            if (pages > 65535) page_metadata_rebuild(views[c], 65535, pages - 1, L, nullptr);
        }
        DeviceBuffer<int> pos(1);
        std::vector<int> p = {L - 1};
        pos.upload(p);
        const int split = default_split_tokens(L), splits = decode_max_splits(L, split);
        DeviceBuffer<float> wsb(split_workspace_floats(NH, D, splits));
        DeviceBuffer<int> counters(NKV);
        counters.fill_bytes(0);
        SplitWorkspace ws{wsb.get(), wsb.get() + size_t(NH) * splits * D, counters.get(), splits};
        const double kv_bytes = 2.0 * kv_elems * 2;
        const double t_full = time_ms([&](int i) {
            attention_decode(out.get(), q.get(), views[i % copies], pos.get(), NH, 0.088f, split, ws, nullptr);
        });
        report("attention full  L=" + std::to_string(L) + " split " + std::to_string(split), t_full, kv_bytes);
        const QuestWorkspaceSizes qs = quest_workspace_sizes(NH, NKV, D, S, pages, 4096 / S, GqaPolicy::KvMax);
        DeviceBuffer<float> q_scores(qs.scores), q_partial(qs.partial_o + qs.partial_ml);
        DeviceBuffer<int> q_selected(qs.selected), q_counters(qs.counters);
        q_counters.fill_bytes(0);
        QuestWorkspace qws;
        qws.scores = q_scores.get();
        qws.selected = q_selected.get();
        qws.partial_o = q_partial.get();
        qws.partial_ml = q_partial.get() + qs.partial_o;
        qws.counters = q_counters.get();
        for (int B : {512, 1024, 2048, 4096}) {
            const double t = time_ms([&](int i) {
                quest_decode(out.get(), q.get(), views[i % copies], pos.get(), NH, B / S, GqaPolicy::KvMax, 0.088f,
                             qws, nullptr);
            });
            const double meta_bytes = 2.0 * NKV * pages * D * 2;
            const double sel_bytes = 2.0 * NKV * double(std::min(B, L)) * D * 2;
            report("attention quest L=" + std::to_string(L) + " B=" + std::to_string(B) + " (x" +
                       std::to_string(t_full / t).substr(0, 4) + ")",
                   t, meta_bytes + sel_bytes);
        }
    }
}

// One Quest layer on the Llama-2-7B shape (32 heads, 32 KV heads, D = 128, S = 16, KvMax) at 4K / 32K / 128K tokens
// and B = 512 / 1024 / 2048 / 4096: the fused path (quest_page_scores_top_k + attention, 2 launches) against the
// separate launches (3), each alone (event-timed single launches, launch latency included), then 16 layers captured
// in one CUDA graph (time per layer: the gaps between launches as in the decode graph, programmatic dependent launch
// overlapping each launch's start with the previous one's tail), then each kernel alone. Bytes model per layer:
// metadata (kmin + kmax of every page of every KV head) + the selected pages' K and V (min(B, L) tokens per KV head);
// the top-k line counts the scores it reads. Inputs rotate over several copies (> the 60 MB L2).
void bench_quest() {
    const int NH = 32, NKV = 32, D = 128, S = 16, kLayers = 16;
    cudaStream_t cap_stream;
    CUDA_CHECK(cudaStreamCreateWithFlags(&cap_stream, cudaStreamNonBlocking));
    for (int L : {4096, 32768, 131072}) {
        const int pages = L / S;
        const int copies = L <= 4096 ? 4 : 3;
        const size_t kv_elems = size_t(NKV) * L * D, meta_elems = size_t(NKV) * pages * D;
        DeviceBuffer<__half> k(kv_elems * copies), v(kv_elems * copies), kmin(meta_elems * copies),
            kmax(meta_elems * copies), q(size_t(NH) * D), out(size_t(NH) * D);
        fill_random_half(k.get(), k.size(), 13, 1.0f, 0.0f, nullptr);
        fill_random_half(v.get(), v.size(), 14, 1.0f, 0.0f, nullptr);
        fill_random_half(q.get(), q.size(), 15, 1.0f, 0.0f, nullptr);
        std::vector<KvLayerView> views(copies);
        for (int c = 0; c < copies; ++c) {
            views[c] = {k.get() + kv_elems * c, v.get() + kv_elems * c, kmin.get() + meta_elems * c,
                        kmax.get() + meta_elems * c, NKV, D, L, S, pages};
            page_metadata_rebuild(views[c], 0, std::min(pages, 65535) - 1, L, nullptr);
            if (pages > 65535) page_metadata_rebuild(views[c], 65535, pages - 1, L, nullptr);
        }
        DeviceBuffer<int> pos(1);
        pos.upload(std::vector<int>{L - 1});
        const int max_budget = 4096 / S;  // the workspace of the largest budget serves the smaller ones
        const QuestWorkspaceSizes qs = quest_workspace_sizes(NH, NKV, D, S, pages, max_budget, GqaPolicy::KvMax);
        DeviceBuffer<float> q_scores(qs.scores), q_partial(qs.partial_o + qs.partial_ml);
        DeviceBuffer<int> q_selected(qs.selected), q_counters(qs.counters);
        q_counters.fill_bytes(0);
        QuestWorkspace qws;
        qws.scores = q_scores.get();
        qws.selected = q_selected.get();
        qws.partial_o = q_partial.get();
        qws.partial_ml = q_partial.get() + qs.partial_o;
        qws.counters = q_counters.get();
        const int rows = quest_selection_rows(NH, NKV, GqaPolicy::KvMax);
        for (int B : {512, 1024, 2048, 4096}) {
            const int K = B / S;
            const double meta_bytes = 2.0 * meta_elems * 2;
            const double sel_bytes = 2.0 * NKV * double(std::min(B, L)) * D * 2;
            const std::string tag = "quest L=" + std::to_string(L) + " B=" + std::to_string(B);
            auto layer = [&](int c, bool fused, cudaStream_t st) {
                QuestDecodeOptions o;
                o.fused = fused;
                quest_decode(out.get(), q.get(), views[c % copies], pos.get(), NH, K, GqaPolicy::KvMax, 0.088f, qws,
                             st, o);
            };
            double t_layer[2] = {0, 0};
            for (int fused = 1; fused >= 0; --fused) {
                t_layer[fused] = time_ms([&](int i) { layer(i, fused, nullptr); });
                report(tag + (fused ? " fused   1 layer" : " unfused 1 layer"), t_layer[fused], meta_bytes + sel_bytes);
            }
            auto graph_ms = [&](const LayerBody& body) { return graph_ms_per_layer(cap_stream, kLayers, body); };
            for (int fused = 1; fused >= 0; --fused)
                report(tag + (fused ? " fused   graph x16, per layer" : " unfused graph x16, per layer"),
                       graph_ms([&](int l, cudaStream_t st) { layer(l, fused, st); }), meta_bytes + sel_bytes);
            // The stages' share of the unfused layer inside a graph: scores alone, then scores + top-k (the
            // differences are what the top-k and the attention add to the critical path).
            const double g_sc = graph_ms([&](int l, cudaStream_t st) {
                quest_page_scores(qws.scores, q.get(), views[l % copies], pos.get(), NH, K, GqaPolicy::KvMax, st);
            });
            report("  " + tag + " graph x16: scores", g_sc, meta_bytes);
            const double g_tk = graph_ms([&](int l, cudaStream_t st) {
                quest_page_scores(qws.scores, q.get(), views[l % copies], pos.get(), NH, K, GqaPolicy::KvMax, st);
                quest_top_k(qws.selected, qws.scores, pages, pos.get(), rows, S, K, st);
            });
            report("  " + tag + " graph x16: scores + top-k", g_tk, meta_bytes);
            // The kernels alone (the top-k and the attention read what the last launches left: valid inputs).
            const double t_sc = time_ms([&](int i) {
                quest_page_scores(qws.scores, q.get(), views[i % copies], pos.get(), NH, K, GqaPolicy::KvMax, nullptr);
            });
            report("  " + tag + " scores", t_sc, meta_bytes);
            const double t_tk = time_ms([&](int) {
                quest_top_k(qws.selected, qws.scores, pages, pos.get(), rows, S, K, nullptr);
            });
            report("  " + tag + " top-k", t_tk, 4.0 * rows * (pages - 1));
            const double t_fu = time_ms([&](int i) {
                quest_page_scores_top_k(qws.selected, qws.scores, qws.counters + NH, q.get(), views[i % copies],
                                        pos.get(), NH, K, GqaPolicy::KvMax, nullptr);
            });
            report("  " + tag + " scores+top-k fused", t_fu, meta_bytes);
            const double t_at = time_ms([&](int i) {
                attention_decode_sparse(out.get(), q.get(), views[i % copies], pos.get(), qws.selected, NH, K,
                                        GqaPolicy::KvMax, 0.088f, qws, nullptr);
            });
            report("  " + tag + " attention", t_at, sel_bytes);
        }
    }
    CUDA_CHECK(cudaStreamDestroy(cap_stream));
}

// Quest scores from int8 / int4 page codes (kernels/select/page_codes.cuh) on the Llama-2-7B shape (32 heads, 32 KV heads,
// D = 128, S = 16, KvMax) at 32K and 128K tokens, against the fp16 scoring of the same metadata: GB/s counts the
// metadata each launch must read (the complete pages' codes + scale: page_metadata_bytes per page and KV head; fp16:
// kmin + kmax). Then one whole Quest layer with the codes (scores + top-k + attention) at B = 2048, K pages and
// bytes-matched (+m: the metadata saved buys pages; bytes = metadata + the selected pages' K and V). Metadata and
// codes rotate over 3 copies (> the 60 MB L2).
void bench_quest_codes() {
    const int NH = 32, NKV = 32, D = 128, S = 16, B = 2048, K = B / S, copies = 3;
    for (int L : {32768, 131072}) {
        const int pages = L / S;
        const size_t kv_elems = size_t(NKV) * L * D, meta_elems = size_t(NKV) * pages * D;
        DeviceBuffer<__half> k(kv_elems), v(kv_elems), kmin(meta_elems * copies), kmax(meta_elems * copies),
            q(size_t(NH) * D), out(size_t(NH) * D);
        fill_random_half(k.get(), k.size(), 23, 1.0f, 0.0f, nullptr);
        fill_random_half(v.get(), v.size(), 24, 1.0f, 0.0f, nullptr);
        fill_random_half(q.get(), q.size(), 25, 1.0f, 0.0f, nullptr);
        std::vector<KvLayerView> views(copies);
        for (int c = 0; c < copies; ++c) {
            views[c] = {k.get(), v.get(), kmin.get() + meta_elems * c, kmax.get() + meta_elems * c, NKV, D, L, S, pages};
            page_metadata_rebuild(views[c], 0, std::min(pages, 65535) - 1, L, nullptr);
            if (pages > 65535) page_metadata_rebuild(views[c], 65535, pages - 1, L, nullptr);
        }
        DeviceBuffer<int> pos(1);
        pos.upload(std::vector<int>{L - 1});
        const std::string tag = "quest L=" + std::to_string(L);
        {
            DeviceBuffer<float> scores(size_t(NKV) * pages);
            const double t = time_ms([&](int i) {
                quest_page_scores(scores.get(), q.get(), views[i % copies], pos.get(), NH, K, GqaPolicy::KvMax, nullptr);
            });
            report("  " + tag + " scores fp16 metadata", t, double(pages - 1) * NKV * page_metadata_bytes(MetadataFormat::Fp16, D));
        }
        for (MetadataFormat f : {MetadataFormat::Int8, MetadataFormat::Int4}) {
            const std::string fn(metadata_format_name(f));
            DeviceBuffer<uint8_t> codes(page_codes_bytes(f, NKV, D, pages) * copies);
            DeviceBuffer<float> scales(page_code_scales_bytes(NKV, pages) / 4 * copies);
            std::vector<PageCodesView> cv(copies);
            for (int c = 0; c < copies; ++c) {
                cv[c].codes = codes.get() + page_codes_bytes(f, NKV, D, pages) * c;
                cv[c].scales = scales.get() + page_code_scales_bytes(NKV, pages) / 4 * c;
                cv[c].format = f;
                cv[c].num_kv_heads = NKV;
                cv[c].head_dim = D;
                cv[c].max_pages = pages;
                page_codes_quantize(cv[c], views[c], 0, pages - 1, L, nullptr);
            }
            const double meta_bytes = double(pages - 1) * NKV * page_metadata_bytes(f, D);
            for (bool match : {false, true}) {
                const MatchedBudget m =
                    match ? matched_budget(f, D, NH, NKV, GqaPolicy::KvMax) : MatchedBudget{};
                const QuestWorkspaceSizes qs = quest_workspace_sizes(NH, NKV, D, S, pages, K, GqaPolicy::KvMax, 0, m);
                DeviceBuffer<float> q_scores(qs.scores), q_partial(qs.partial_o + qs.partial_ml);
                DeviceBuffer<int> q_selected(qs.selected), q_counters(qs.counters);
                q_counters.fill_bytes(0);
                QuestWorkspace qws;
                qws.scores = q_scores.get();
                qws.selected = q_selected.get();
                qws.partial_o = q_partial.get();
                qws.partial_ml = q_partial.get() + qs.partial_o;
                qws.counters = q_counters.get();
                if (!match) {
                    const double t = time_ms([&](int i) {
                        quest_code_scores(qws.scores, q.get(), views[i % copies], cv[i % copies], pos.get(), NH, K,
                                          GqaPolicy::KvMax, nullptr);
                    });
                    report("  " + tag + " scores " + fn + " codes", t, meta_bytes);
                }
                const int n = codes::step_pages(L, S, K, m);  // pages read per KV head (the last one included)
                const double sel_bytes = 2.0 * NKV * double(n) * S * D * 2;
                const double t = time_ms([&](int i) {
                    QuestDecodeOptions o;
                    o.codes = &cv[i % copies];
                    o.match = m;
                    quest_decode(out.get(), q.get(), views[i % copies], pos.get(), NH, K, GqaPolicy::KvMax, 0.088f, qws,
                                 nullptr, o);
                });
                report(tag + " B=" + std::to_string(B) + " " + fn + (match ? "+m" : "") + " 1 layer (" +
                           std::to_string(n) + " pages)",
                       t, meta_bytes + sel_bytes);
            }
        }
    }
}


// One Quest layer of the Llama-2-7B shape (32 heads, 32 KV heads, D = 128, S = 16, kv-sum, B = 2048) and of the
// Llama-3.1-8B shape (32 heads on 8 KV heads) with the sparq selector (K pages, and bytes-matched: sparq+m) against
// fp16 Quest, at 4K, 32K and (8B) 128K tokens: whole layers captured 16 to a graph (per layer, PDL between the
// launches as in the step), alternated in two rounds; then the selection stages cumulatively in graphs (Quest:
// scores; + top-k. sparq: scores; + shares where a row has several heads; + top-k), then sparq's launches alone.
// Bytes per layer: Quest metadata + its 128 pages' K and V; sparq the r = 16 chosen sketch rows of every complete
// page + the current token's sketch + its pages' K and V. KV, metadata and sketches rotate over 3 copies (> the
// 60 MB L2). No RoPE folded in on either side (the step folds it in both).
void bench_sparq() {
    struct Shape {
        int NKV, L;
    };
    const int NH = 32, D = 128, S = 16, B = 2048, K = B / S, kLayers = 16, copies = 3;
    const GqaPolicy pol = GqaPolicy::KvSum;
    cudaStream_t cap_stream;
    CUDA_CHECK(cudaStreamCreateWithFlags(&cap_stream, cudaStreamNonBlocking));
    for (const Shape row : {Shape{32, 4096}, Shape{32, 32768}, Shape{8, 32768}, Shape{8, 131072}}) {
        const int NKV = row.NKV, L = row.L;
        const bool shares = NH > NKV;
        const int pages = L / S;
        const size_t kv_elems = size_t(NKV) * L * D, meta_elems = size_t(NKV) * pages * D;
        DeviceBuffer<__half> k(kv_elems * copies), v(kv_elems * copies), kmin(meta_elems * copies),
            kmax(meta_elems * copies), q(size_t(NH) * D), out(size_t(NH) * D);
        DeviceBuffer<uint8_t> k8(key_sketch_bytes(NKV, D, L) * copies);
        fill_random_half(k.get(), k.size(), 33, 1.0f, 0.0f, nullptr);
        fill_random_half(v.get(), v.size(), 34, 1.0f, 0.0f, nullptr);
        fill_random_half(q.get(), q.size(), 35, 1.0f, 0.0f, nullptr);
        std::vector<KvLayerView> views(copies);
        std::vector<KeySketchView> sks(copies);
        for (int c = 0; c < copies; ++c) {
            views[c] = {k.get() + kv_elems * c, v.get() + kv_elems * c, kmin.get() + meta_elems * c,
                        kmax.get() + meta_elems * c, NKV, D, L, S, pages};
            page_metadata_rebuild(views[c], 0, pages - 1, L, nullptr);
            sks[c] = {k8.get() + key_sketch_bytes(NKV, D, L) * c, NKV, D, L};
            sparq_sketch_write(sks[c], views[c], 0, L, nullptr);
        }
        DeviceBuffer<int> pos(1);
        pos.upload(std::vector<int>{L - 1});
        const MatchedBudget m = sparq::budget(S, D, 1), off{};
        const QuestWorkspaceSizes qs0 = quest_workspace_sizes(NH, NKV, D, S, pages, K, pol);
        const QuestWorkspaceSizes qs1 = quest_workspace_sizes(NH, NKV, D, S, pages, K, pol, 0, m);
        auto make_ws = [](const QuestWorkspaceSizes& qs, DeviceBuffer<float>& f, DeviceBuffer<int>& i) {
            f = DeviceBuffer<float>(qs.scores + qs.partial_o + qs.partial_ml);
            i = DeviceBuffer<int>(qs.selected + qs.counters);
            i.fill_bytes(0);
            QuestWorkspace w;
            w.scores = f.get();
            w.partial_o = f.get() + qs.scores;
            w.partial_ml = f.get() + qs.scores + qs.partial_o;
            w.selected = i.get();
            w.counters = i.get() + qs.selected;
            return w;
        };
        DeviceBuffer<float> f0, f1, lse(sparq_workspace_floats(NH, pages));
        DeviceBuffer<int> i0, i1;
        const QuestWorkspace w0 = make_ws(qs0, f0, i0), w1 = make_ws(qs1, f1, i1);
        const int n1 = codes::step_pages(L, S, K, m);  // sparq's pages per KV head (the last one included)
        const double quest_bytes = 2.0 * meta_elems * 2 + 2.0 * NKV * double(std::min(B, L)) * D * 2;
        const double sketch_bytes = double(NKV) * double(sparq::own_bytes(pages - 1, S, D));
        const double sparq_bytes = sketch_bytes + 2.0 * NKV * double(std::min(B, L)) * D * 2;
        const double sparq_m_bytes = sketch_bytes + 2.0 * NKV * double(n1) * S * D * 2;
        auto graph_ms = [&](const LayerBody& body) { return graph_ms_per_layer(cap_stream, kLayers, body); };
        const std::string tag = "Hkv=" + std::to_string(NKV) + " L=" + std::to_string(L) + " B=" + std::to_string(B);
        const int rows = quest_selection_rows(NH, NKV, pol);
        auto sp_scores = [&](int l, cudaStream_t st) {
            sparq_page_lse(lse.get(), sks[l % copies], q.get(), views[l % copies], pos.get(), NH, K, 0.088f, st);
        };
        auto sp_rows = [&](cudaStream_t st) {
            if (shares) sparq_row_shares(w1.scores, lse.get(), pos.get(), NH, NKV, pages, S, K, pol, st);
        };
        const float* sp_ranked = shares ? w1.scores : lse.get();
        const int stride = quest_select_capacity(pages, S, K, m);
        auto sp_topk = [&](cudaStream_t st) { quest_top_k(w1.selected, sp_ranked, pages, pos.get(), rows, S, K, st, m, stride); };
        for (int round = 0; round < 2; ++round) {
            report("quest " + tag + " graph x16, per layer", graph_ms([&](int l, cudaStream_t st) {
                       quest_decode(out.get(), q.get(), views[l % copies], pos.get(), NH, K, pol, 0.088f, w0, st);
                   }), quest_bytes);
            report("sparq " + tag + " graph x16, per layer (" + std::to_string(K) + " pages)",
                   graph_ms([&](int l, cudaStream_t st) {
                       sparq_decode(out.get(), sks[l % copies], lse.get(), q.get(), views[l % copies], pos.get(), NH,
                                    K, pol, 0.088f, off, w0, st);
                   }), sparq_bytes);
            report("sparq+m " + tag + " graph x16, per layer (" + std::to_string(n1) + " pages)",
                   graph_ms([&](int l, cudaStream_t st) {
                       sparq_decode(out.get(), sks[l % copies], lse.get(), q.get(), views[l % copies], pos.get(), NH,
                                    K, pol, 0.088f, m, w1, st);
                   }), sparq_m_bytes);
        }
        report("  quest " + tag + " graph x16: scores", graph_ms([&](int l, cudaStream_t st) {
                   quest_page_scores(w0.scores, q.get(), views[l % copies], pos.get(), NH, K, pol, st);
               }), 2.0 * meta_elems * 2);
        report("  quest " + tag + " graph x16: scores + top-k", graph_ms([&](int l, cudaStream_t st) {
                   quest_page_scores(w0.scores, q.get(), views[l % copies], pos.get(), NH, K, pol, st);
                   quest_top_k(w0.selected, w0.scores, pages, pos.get(), rows, S, K, st);
               }), 2.0 * meta_elems * 2);
        report("  sparq " + tag + " graph x16: scores", graph_ms(sp_scores), sketch_bytes);
        if (shares)
            report("  sparq " + tag + " graph x16: scores + shares", graph_ms([&](int l, cudaStream_t st) {
                       sp_scores(l, st);
                       sp_rows(st);
                   }), sketch_bytes);
        report("  sparq " + tag + " graph x16: scores" + (shares ? " + shares" : "") + " + top-k",
               graph_ms([&](int l, cudaStream_t st) {
                   sp_scores(l, st);
                   sp_rows(st);
                   sp_topk(st);
               }), sketch_bytes);
        report("  sparq " + tag + " scores alone", time_ms([&](int i) { sp_scores(i, nullptr); }), sketch_bytes);
        if (shares) report("  sparq " + tag + " shares alone", time_ms([&](int) { sp_rows(nullptr); }), 4.0 * NH * pages * 2);
        report("  sparq " + tag + " top-k alone", time_ms([&](int) { sp_topk(nullptr); }), 4.0 * rows * pages);
    }
    CUDA_CHECK(cudaStreamDestroy(cap_stream));
}
}  // namespace

// Whole decode steps of Llama-2-7B (random FP16 weights) on one GPU: the backend as the product runs it (fused
// norms), on the path tensor parallelism runs (separate norm kernels), and tensor parallel with one rank through NCCL
// (that path plus 65 all-reduces of one rank in the graph and the handoff to the rank's thread). Steps alternate
// between the backends in rounds; device ms (events around the graph) and host ms (the decode() call) are medians.
void bench_tp() {
    if (!nccl_built()) {
        std::printf("tp: SKIPPED (this build has no NCCL)\n");
        return;
    }
    const char* src = std::getenv("QUEST_SOURCE_DIR");
    const ModelConfig c = load_model_config(std::string(src ? src : ".") + "/configs/llama2-7b.json");
    struct Row {
        int context, budget;
    };
    for (const Row row : {Row{32768, 2048}, Row{4096, 0}}) {
        QuestSettings q;
        q.full_attention = row.budget == 0;
        if (row.budget) q.budget = row.budget;
        const int cap = row.context + 256;
        CudaOptions fused, separate;
        separate.fused_norms = false;
        TpSetup one;
        one.ranks = 1;
        std::vector<std::pair<std::string, std::unique_ptr<Backend>>> b;
        b.emplace_back("whole, fused norms", CudaLlama::random(c, q, cap, 1, fused));
        b.emplace_back("whole, separate norms", CudaLlama::random(c, q, cap, 1, separate));
        b.emplace_back("tp 1 (NCCL)", TpCudaLlama::random(c, q, cap, 1, separate, one));
        std::vector<int> prompt(row.context, 7);
        for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = 3 + static_cast<int>((i * 7919) % (c.vocab_size - 3));
        for (auto& [name, m] : b) m->prefill(prompt);
        std::vector<std::vector<double>> dev(b.size()), host(b.size());
        for (int round = 0; round < 4; ++round)
            for (size_t k = 0; k < b.size(); ++k)
                for (int s = 0; s < 40; ++s) {
                    Stopwatch sw;
                    b[k].second->decode(100 + s);
                    const double h = sw.ms();
                    if (round == 0 && s < 8) continue;  // warm-up (the first step also captures the graph)
                    dev[k].push_back(b[k].second->last_decode_ms());
                    host[k].push_back(h);
                }
        auto median = [](std::vector<double> v) {
            std::sort(v.begin(), v.end());
            return v[v.size() / 2];
        };
        for (size_t k = 0; k < b.size(); ++k) {
            const std::string what = "tp " + std::to_string(row.context) + " " +
                                     (row.budget ? "B=" + std::to_string(row.budget) : std::string("full")) + ": " +
                                     b[k].first;
            report(what + " (device)", median(dev[k]), static_cast<double>(b[k].second->decode_bytes()));
            report(what + " (host call)", median(host[k]), static_cast<double>(b[k].second->decode_bytes()));
        }
    }
    // Where the time of the TP path goes (eager launches with events between kernel groups: "all-reduce" is NCCL's).
    QuestSettings q;
    q.budget = 2048;
    CudaOptions prof;
    prof.fused_norms = false;
    prof.profile = true;
    TpSetup one;
    one.ranks = 1;
    auto m = TpCudaLlama::random(c, q, 32768 + 64, 1, prof, one);
    m->prefill(std::vector<int>(32768, 11));
    for (int s = 0; s < 24; ++s) m->decode(200 + s);
    std::printf("tp 32768 B=2048, tp 1 (NCCL), eager with events:\n%s\n", m->profile_report().c_str());
}

int main(int argc, char** argv) {
    if (cuda_device_count() == 0) {
        std::printf("SKIPPED: no CUDA device\n");
        return 0;
    }
    std::vector<std::string> what;
    std::string json;
    for (int i = 1; i < argc; ++i) {
        if (std::strcmp(argv[i], "--json") == 0 && i + 1 < argc) json = argv[++i];
        else what.push_back(argv[i]);
    }
    auto want = [&](const char* w) { return what.empty() || std::find(what.begin(), what.end(), w) != what.end(); };
    try {
        if (want("gemv")) bench_gemv();
        if (want("gemv4")) bench_gemv_int4();
        if (want("read")) bench_read();
        if (want("fused")) bench_fused();
        if (want("attention")) bench_attention();
        if (want("quest")) bench_quest();
        if (want("quest") || want("codes")) bench_quest_codes();
        if (want("sparq")) bench_sparq();
        if (std::find(what.begin(), what.end(), "tp") != what.end()) bench_tp();
    } catch (const std::exception& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
    if (!json.empty()) {
        FILE* f = std::fopen(json.c_str(), "w");
        std::fprintf(f, "[\n");
        for (size_t i = 0; i < g_json.size(); ++i) std::fprintf(f, "  %s%s\n", g_json[i].c_str(), i + 1 < g_json.size() ? "," : "");
        std::fprintf(f, "]\n");
        std::fclose(f);
    }
    return 0;
}
