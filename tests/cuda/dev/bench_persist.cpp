// quest_kernel_bench "persist" (issue 27 stage 1): the tail of a Llama-2-7B decode layer (o + residual -> RMSNorm ->
// gate+up + SwiGLU -> down + residual; H 4096, F 11008, batch 1), int4 (group 128) and FP16 weights, 32 layers' worth
// of distinct weights (int4 2.5 GB, FP16 9.7 GB: nothing stays in the 60 MB L2 from one tail to the next):
//   (a) today: the product's launchers (gemv[_int4]_residual / _swiglu, as model/cuda/forward.cpp calls them), 3
//       launches per tail with programmatic dependent launch, 32 tails captured in one CUDA graph;
//   (b) the persistent kernel of tests/cuda/dev/persist_layer.cu, 1, 4 or 32 tails per launch, in one graph;
//   (c) each tail after a stand-in for the attention phase (a 25 us spin on 32 blocks of 128 threads, no memory
//       traffic, triggering its dependents right after its wait as the sparse attention does): (a) and (b) at 1 tail
//       per launch; the tail's share is the graph's time minus that of the stand-ins alone.
// Times: median of 30 graph replays (after 3), divided by 32 tails. Bytes per tail: the weights (int4: codes, scales,
// zero points) plus the three GEMV inputs. Error: max |b - a| / max |a| over x (fp32 residual stream), xg and act
// (fp16), each and the worst of the three, after one tail and after the 32-tail graph from the same start (and (a)
// against a second run of itself); a worst above 1e-3, or a NaN (xg and act are poisoned with NaN before each run),
// prints a FAIL line. One fp16 rounding flipped by the norm's last bits costs at most 2^-10 of max |xg| or |act|.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kernels/common/device_buffer.h"
#include "kernels/common/dtype.h"
#include "kernels/common/elementwise.cuh"
#include "kernels/linear/gemv.cuh"
#include "kernels/linear/gemv_int4.cuh"
#include "kernels/linear/gemv_int4_kernels.cuh"
#include "tests/cuda/dev/persist_layer.h"

namespace quest::bench {
namespace {

constexpr int kH = 4096, kF = 11008, kGroup = 128, kLayers = 32;
constexpr float kEps = 1e-5f;
constexpr int kReplays = 30, kWarmup = 3;
constexpr double kTol = 1e-3;
constexpr int64_t kStandinNs = 25000;
constexpr int kStandinBlocks = 32, kStandinThreads = 128;

struct Dims {
    int rows, cols;
};
constexpr Dims kDims[3] = {{kH, kH}, {2 * kF, kH}, {kH, kF}};  // o, gate+up (interleaved), down

class Graph {
public:
    // Runs body once outside the capture (first-use module loads and attribute queries), then captures it.
    Graph(const std::function<void(cudaStream_t)>& body, cudaStream_t st) : st_(st) {
        body(st);
        CUDA_CHECK(cudaStreamSynchronize(st));
        cudaGraph_t g = nullptr;
        CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
        body(st);
        CUDA_CHECK(cudaStreamEndCapture(st, &g));
        CUDA_CHECK(cudaGraphInstantiate(&exec_, g, 0));
        CUDA_CHECK(cudaGraphDestroy(g));
    }
    ~Graph() {
        if (exec_) cudaGraphExecDestroy(exec_);
    }
    Graph(const Graph&) = delete;
    Graph& operator=(const Graph&) = delete;

    void launch() const { CUDA_CHECK(cudaGraphLaunch(exec_, st_)); }
    // Median milliseconds of kReplays replays after kWarmup.
    double median_ms() const {
        cudaEvent_t a, b;
        CUDA_CHECK(cudaEventCreate(&a));
        CUDA_CHECK(cudaEventCreate(&b));
        for (int i = 0; i < kWarmup; ++i) launch();
        std::vector<float> ms;
        for (int i = 0; i < kReplays; ++i) {
            CUDA_CHECK(cudaEventRecord(a, st_));
            launch();
            CUDA_CHECK(cudaEventRecord(b, st_));
            CUDA_CHECK(cudaEventSynchronize(b));
            float t = 0;
            CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
            ms.push_back(t);
        }
        CUDA_CHECK(cudaEventDestroy(a));
        CUDA_CHECK(cudaEventDestroy(b));
        std::sort(ms.begin(), ms.end());
        return ms[ms.size() / 2];
    }

private:
    cudaStream_t st_;
    cudaGraphExec_t exec_ = nullptr;
};

// max |got - ref| / max |ref|; NaN when either holds a NaN.
double rel_err(const std::vector<float>& ref, const std::vector<float>& got) {
    double d = 0, m = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
        if (std::isnan(ref[i]) || std::isnan(got[i])) return NAN;
        d = std::max(d, std::fabs(double(got[i]) - ref[i]));
        m = std::max(m, std::fabs(double(ref[i])));
    }
    return m > 0 ? d / m : d;
}

std::vector<float> halves(const DeviceBuffer<__half>& b) {
    const std::vector<__half> h = b.download();
    std::vector<float> f(h.size());
    for (size_t i = 0; i < h.size(); ++i) {
        uint16_t bits;
        std::memcpy(&bits, &h[i], 2);
        f[i] = half_to_float(bits);
    }
    return f;
}

struct State {
    std::vector<float> x, xg, act;
};

// The errors of x, xg and act, and the worst of them (NaN when any is).
struct Err {
    double x = 0, xg = 0, act = 0, worst = 0;
};
Err state_err(const State& ref, const State& got) {
    Err e{rel_err(ref.x, got.x), rel_err(ref.xg, got.xg), rel_err(ref.act, got.act), 0};
    e.worst = std::isnan(e.x) || std::isnan(e.xg) || std::isnan(e.act) ? NAN : std::max({e.x, e.xg, e.act});
    return e;
}

bool bench_format(bool int4, std::vector<std::string>& json) {
    const char* fmt = int4 ? "int4" : "fp16";
    struct Stream {
        cudaStream_t s = nullptr;
        Stream() { CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }
        ~Stream() { cudaStreamDestroy(s); }
    } stream;
    const cudaStream_t st = stream.s;

    // Weights: 32 layers x (o, gate+up, down), distinct buffers.
    std::vector<DeviceBuffer<uint32_t>> q;
    std::vector<DeviceBuffer<__half>> sc, w16;
    std::vector<DeviceBuffer<uint8_t>> z;
    std::vector<Int4View> v4;
    double weight_bytes = 0;
    for (const Dims& d : kDims)
        weight_bytes += int4 ? d.rows * (d.cols / 2.0 + d.cols / kGroup * 3.0) : d.rows * (d.cols * 2.0);
    const double bytes = weight_bytes + 2.0 * (kH + kH + kF);  // + the inputs att, xg, act
    for (int l = 0; l < kLayers; ++l)
        for (int m = 0; m < 3; ++m) {
            const Dims d = kDims[m];
            const uint64_t seed = 100 + 3 * l + m;
            if (!int4) {
                w16.emplace_back(size_t(d.rows) * d.cols);
                fill_random_half(w16.back().get(), w16.back().size(), seed, 0.02f, 0.0f, nullptr);
                continue;
            }
            const size_t words = size_t(d.rows) * d.cols / 8, groups = size_t(d.rows) * d.cols / kGroup;
            q.emplace_back(words);
            sc.emplace_back(groups);
            z.emplace_back(groups);
            fill_random_int4(q.back().get(), sc.back().get(), z.back().get(), d.rows, d.cols, kGroup, seed, 0.02f,
                             nullptr);
            v4.push_back(Int4View{q.back().get(), sc.back().get(), z.back().get(), d.rows, d.cols, kGroup});
        }
    DeviceBuffer<float> g_mlp(size_t(kLayers) * kH), g_next(size_t(kLayers) * kH), x0(kH), x(kH);
    DeviceBuffer<__half> att(kH), xg(kH), act(kF);
    fill_random_float(g_mlp.get(), g_mlp.size(), 11, 0.1f, 1.0f, nullptr);
    fill_random_float(g_next.get(), g_next.size(), 12, 0.1f, 1.0f, nullptr);
    fill_random_float(x0.get(), kH, 13, 1.0f, 0.0f, nullptr);
    fill_random_half(att.get(), kH, 14, 1.0f, 0.0f, nullptr);

    // (a): the product's partial sums (one buffer, as forward.cpp's norm_partials_).
    const int parts_o = int4 ? gemv_int4_residual_partials(v4[0]) : gemv_residual_partials(kH);
    const int parts_down = int4 ? gemv_int4_residual_partials(v4[2]) : gemv_residual_partials(kH);
    const int parts_a = std::max(parts_o, parts_down);
    DeviceBuffer<float> part_a(parts_a);
    auto tail_a = [&](int l, cudaStream_t s) {
        const ResidualNorm r_o{x.get(), xg.get(), g_mlp.get() + size_t(l) * kH, part_a.get(), parts_a};
        const ResidualNorm r_down{x.get(), xg.get(), g_next.get() + size_t(l) * kH, part_a.get(), parts_a};
        const NormScale n{part_a.get(), parts_o, kH, kEps};
        if (int4) {
            gemv_int4_residual(r_o, v4[3 * l + 0], att.get(), s);
            gemv_int4_swiglu(act.get(), v4[3 * l + 1], xg.get(), n, s);
            gemv_int4_residual(r_down, v4[3 * l + 2], act.get(), s);
        } else {
            gemv_residual(r_o, w16[3 * l + 0].get(), att.get(), kH, kH, s);
            gemv_swiglu(act.get(), w16[3 * l + 1].get(), xg.get(), 2 * kF, kH, n, s);
            gemv_residual(r_down, w16[3 * l + 2].get(), act.get(), kH, kF, s);
        }
    };

    // (b): the persistent kernel.
    const int G = persist_blocks(int4, kH, kF);
    DeviceBuffer<float> part_b(size_t(2) * G);
    DeviceBuffer<int> counters(persist_counter_ints(kLayers)), error(1);
    counters.fill_bytes(0);
    error.fill_bytes(0);
    std::vector<PersistLayerDev> host_layers(kLayers);
    for (int l = 0; l < kLayers; ++l) {
        PersistLayerDev& L = host_layers[l];
        for (int m = 0; m < 3; ++m) {
            if (int4) {
                L.w[m] = v4[3 * l + m].qweight;
                L.scales[m] = v4[3 * l + m].scales;
                L.zeros[m] = v4[3 * l + m].zeros;
            } else {
                L.w[m] = w16[3 * l + m].get();
            }
        }
        L.g_mlp = g_mlp.get() + size_t(l) * kH;
        L.g_next = g_next.get() + size_t(l) * kH;
    }
    DeviceBuffer<PersistLayerDev> layers(kLayers);
    layers.upload(host_layers);
    PersistArgs pa;
    pa.att = att.get();
    pa.x = x.get();
    pa.xg = xg.get();
    pa.act = act.get();
    pa.partials = part_b.get();
    pa.partials_capacity = 2 * G;
    pa.counters = counters.get();
    pa.counters_capacity = static_cast<int>(counters.size());
    pa.error = error.get();
    pa.hidden = kH;
    pa.inter = kF;
    pa.group = kGroup;
    pa.eps = kEps;
    auto tail_b = [&](int first, int count, cudaStream_t s) {
        persist_layer_tails(int4, layers.get(), first, count, pa, s);
    };
    DeviceBuffer<uint32_t> sink(kStandinBlocks);
    auto standin = [&](cudaStream_t s) { persist_standin(sink.get(), kStandinBlocks, kStandinThreads, kStandinNs, s); };
    CUDA_CHECK(cudaDeviceSynchronize());
    std::printf("persist %s: grid %d blocks (%s); the product's o / down launches have %d / %d blocks\n", fmt, G,
                persist_kernel_info(int4, kH, kF).c_str(), parts_o, parts_down);
    if (int4)
        std::printf("persist int4: the product's kernels: o [%s], gate+up [%s], down [%s]\n",
                    gemv_int4_kernel_name(gemv_int4_kernel_for(v4[0])), gemv_int4_kernel_name(gemv_int4_kernel_for(v4[1])),
                    gemv_int4_kernel_name(gemv_int4_kernel_for(v4[2])));

    bool ok = true;
    auto check_error = [&](const std::string& what) {
        CUDA_CHECK(cudaStreamSynchronize(st));
        const int e = error.download()[0];
        if (e != 0) {
            std::printf("FAIL persist %s %s: %s\n", fmt, what.c_str(), persist_error_text(e).c_str());
            ok = false;
            error.fill_bytes(0);
            counters.fill_bytes(0);
        }
        return e == 0;
    };
    // The start of every comparison run: x from x0, xg and act poisoned (NaN).
    auto reset = [&]() {
        CUDA_CHECK(cudaStreamSynchronize(st));
        CUDA_CHECK(cudaMemcpy(x.get(), x0.get(), kH * sizeof(float), cudaMemcpyDeviceToDevice));
        xg.fill_bytes(0xFF);
        act.fill_bytes(0xFF);
        CUDA_CHECK(cudaDeviceSynchronize());
    };
    auto snapshot = [&]() {
        CUDA_CHECK(cudaStreamSynchronize(st));
        return State{x.download(), halves(xg), halves(act)};
    };
    auto fmt_err = [](const Err& e) {
        char b[96];
        std::snprintf(b, sizeof b, "%.2e (x %.1e xg %.1e act %.1e)", e.worst, e.x, e.xg, e.act);
        return std::string(b);
    };
    auto line = [&](const std::string& what, double us, const std::string& err) {
        const double gbps = bytes / (us * 1e-6) / 1e9;
        std::printf("%-66s %8.2f us/tail %7.1f MB %7.1f GB/s (%5.1f%% of 4200)  max rel err %s\n", what.c_str(), us,
                    bytes / 1e6, gbps, 100.0 * gbps / 4200.0, err.c_str());
        char buf[512];
        std::snprintf(buf, sizeof buf, R"({"what": "%s", "us_per_tail": %.3f, "bytes": %.0f, "gbps": %.1f, "err": "%s"})",
                      what.c_str(), us, bytes, gbps, err.c_str());
        json.push_back(buf);
    };
    auto judge = [&](const std::string& what, const Err& e) {
        if (!(e.worst <= kTol)) {
            std::printf("FAIL persist %s %s: max relative error %s > %.0e\n", fmt, what.c_str(), fmt_err(e).c_str(),
                        kTol);
            ok = false;
        }
    };

    // One tail from the same start: (a) launched directly, (b) one launch.
    reset();
    tail_a(0, st);
    const State ref1 = snapshot();
    reset();
    tail_b(0, 1, st);
    if (!check_error("1 tail")) return false;
    const Err e1 = state_err(ref1, snapshot());
    judge("(b) 1 tail", e1);

    const int per_launch[3] = {1, 4, kLayers};
    Graph ga([&](cudaStream_t s) { for (int l = 0; l < kLayers; ++l) tail_a(l, s); }, st);
    std::vector<std::unique_ptr<Graph>> gb;
    for (int k : per_launch)
        gb.push_back(std::make_unique<Graph>(
            [&, k](cudaStream_t s) { for (int f = 0; f < kLayers; f += k) tail_b(f, std::min(k, kLayers - f), s); },
            st));
    Graph gs([&](cudaStream_t s) { for (int l = 0; l < kLayers; ++l) standin(s); }, st);
    Graph gas(
        [&](cudaStream_t s) {
            for (int l = 0; l < kLayers; ++l) {
                standin(s);
                tail_a(l, s);
            }
        },
        st);
    Graph gbs(
        [&](cudaStream_t s) {
            for (int l = 0; l < kLayers; ++l) {
                standin(s);
                tail_b(l, 1, s);
            }
        },
        st);
    if (!check_error("graph set-up runs")) return false;

    // 32 tails from the same start, every graph.
    reset();
    ga.launch();
    const State ref = snapshot();
    reset();
    ga.launch();
    const Err ea = state_err(ref, snapshot());  // (a) against itself: its run-to-run determinism
    judge("(a) run to run", ea);
    Err eb[3];
    for (int i = 0; i < 3; ++i) {
        reset();
        gb[i]->launch();
        const std::string what = "(b) " + std::to_string(per_launch[i]) + " tails per launch";
        if (!check_error(what)) return false;
        eb[i] = state_err(ref, snapshot());
        judge(what + ", 32 tails", eb[i]);
    }
    reset();
    gas.launch();
    const Err eas = state_err(ref, snapshot());
    judge("(c) stand-in + (a)", eas);
    reset();
    gbs.launch();
    if (!check_error("(c) stand-in + (b)")) return false;
    const Err ebs = state_err(ref, snapshot());
    judge("(c) stand-in + (b)", ebs);

    const std::string p = std::string("persist ") + fmt + " ";
    const double ta = ga.median_ms() * 1e3 / kLayers;
    line(p + "(a) today: 3 product launches per tail", ta, "ref, run to run " + fmt_err(ea));
    for (int i = 0; i < 3; ++i) {
        const double tb = gb[i]->median_ms() * 1e3 / kLayers;
        if (!check_error("timing")) return false;
        line(p + "(b) persistent, " + std::to_string(per_launch[i]) + " tails per launch", tb,
             fmt_err(eb[i]));
        if (i == 0) std::printf("%-66s %s\n", (p + "    its error after 1 tail").c_str(), fmt_err(e1).c_str());
    }
    const double ts = gs.median_ms() * 1e3 / kLayers;
    std::printf("%-66s %8.2f us/layer (spin %.1f us, %d x %d threads)\n", (p + "(c) stand-in alone").c_str(), ts,
                kStandinNs / 1e3, kStandinBlocks, kStandinThreads);
    const double tas = gas.median_ms() * 1e3 / kLayers;
    const double tbs = gbs.median_ms() * 1e3 / kLayers;
    if (!check_error("timing")) return false;
    std::printf("%-66s %8.2f us/layer\n", (p + "(c) stand-in + (a), total").c_str(), tas);
    std::printf("%-66s %8.2f us/layer\n", (p + "(c) stand-in + (b) 1 tail per launch, total").c_str(), tbs);
    line(p + "(c) (a) after the stand-in: total - stand-in", tas - ts, fmt_err(eas));
    line(p + "(c) (b) 1 tail/launch after the stand-in: total - stand-in", tbs - ts, fmt_err(ebs));
    return ok;
}

}  // namespace

bool bench_persist(std::vector<std::string>& json) {
    bool ok = true;
    for (bool int4 : {true, false}) ok = bench_format(int4, json) && ok;
    return ok;
}

}  // namespace quest::bench
