#include "model/cuda/tp_llama.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <map>
#include <mutex>
#include <thread>
#include <type_traits>

#include "kernels/common/cuda_common.cuh"
#include "kernels/common/error.h"
#include "model/core/memory.h"
#include "model/cuda/nccl_collective.h"
#include "model/io/quantize.h"
#include "model/io/shard_source.h"
#include "model/io/weight_source.h"

namespace quest {

// One host thread per rank, its CUDA device current: run(f) calls f(r) on every rank's thread at once (the ranks
// meet in their collectives, so they must run concurrently) and returns when all have.
class RankThreads {
public:
    RankThreads(const std::vector<int>& devices, std::function<void()> on_error)
        : errors_(devices.size()), on_error_(std::move(on_error)) {
        for (size_t r = 0; r < devices.size(); ++r) threads_.emplace_back([this, r, d = devices[r]] { loop(r, d); });
    }
    ~RankThreads() {
        {
            std::lock_guard<std::mutex> lock(m_);
            stop_ = true;
        }
        start_.notify_all();
        for (std::thread& t : threads_) t.join();
    }
    // Rethrows the exception of the lowest rank that threw; when one throws, on_error (the collectives' abort)
    // releases the others from collectives that rank will never join. f is called through a pointer to it (no
    // std::function: nothing is allocated per decode step).
    template <class F>
    void run(F&& f) {
        {
            std::lock_guard<std::mutex> lock(m_);
            job_ = Job{&f, [](void* p, int r) { (*static_cast<std::remove_reference_t<F>*>(p))(r); }};
            pending_ = static_cast<int>(threads_.size());
            std::fill(errors_.begin(), errors_.end(), nullptr);
            ++generation_;
        }
        start_.notify_all();
        std::unique_lock<std::mutex> lock(m_);
        done_.wait(lock, [&] { return pending_ == 0; });
        job_ = {};
        for (const std::exception_ptr& e : errors_)
            if (e) std::rethrow_exception(e);
    }

private:
    void loop(size_t r, int device) {
        const cudaError_t set = cudaSetDevice(device);
        uint64_t seen = 0;
        for (;;) {
            Job job;
            {
                std::unique_lock<std::mutex> lock(m_);
                start_.wait(lock, [&] { return stop_ || generation_ != seen; });
                if (stop_) return;
                seen = generation_;
                job = job_;
            }
            std::exception_ptr error;
            try {
                if (set != cudaSuccess)
                    throw ResourceError("tensor parallel rank " + std::to_string(r) + ": cudaSetDevice(" +
                                        std::to_string(device) + "): " + cudaGetErrorString(set));
                job.call(job.f, static_cast<int>(r));
            } catch (...) {
                error = std::current_exception();
            }
            if (error && on_error_) on_error_();
            std::lock_guard<std::mutex> lock(m_);
            errors_[r] = error;
            if (--pending_ == 0) done_.notify_one();
        }
    }

    std::vector<std::thread> threads_;
    std::mutex m_;
    std::condition_variable start_, done_;
    struct Job {
        void* f = nullptr;                 // the caller's callable, alive until run() returns
        void (*call)(void*, int) = nullptr;
    };
    Job job_;
    uint64_t generation_ = 0;
    int pending_ = 0;
    bool stop_ = false;
    std::vector<std::exception_ptr> errors_;
    std::function<void()> on_error_;
};

namespace {

// The intermediate split's granule: the int4 group when the linear layers are int4 (requested, or stored in a
// 4-bit folder), so that each rank's down_proj columns hold whole groups.
int ffn_unit_for(const ModelConfig& c, const WeightRequest& w, int stored_group) {
    const int g = w.stored ? stored_group : (w.format == LinearFormat::Int4 ? w.group : 0);
    return g > 0 && c.intermediate_size % g == 0 ? g : 1;
}

std::vector<int> rank_devices(const TpSetup& s) {
    if (s.ranks < 1) throw InputError("--tp: expected a number of GPUs >= 1, got " + std::to_string(s.ranks));
    if (!s.devices.empty()) {
        if (static_cast<int>(s.devices.size()) != s.ranks)
            throw std::logic_error("TpSetup: devices must name one device per rank");
        return s.devices;
    }
    const int n = cuda_device_count();
    if (n < s.ranks)
        throw ResourceError("--tp " + std::to_string(s.ranks) + ": " + std::to_string(n) +
                            " CUDA device(s) visible on this machine, one per rank needed");
    std::vector<int> d(s.ranks);
    for (int r = 0; r < s.ranks; ++r) d[r] = r;
    return d;
}

}  // namespace

TpCudaLlama::TpCudaLlama(TpPlan plan, const QuestSettings& quest, const TpSetup& setup)
    : plan_(std::move(plan)), quest_(quest), devices_(rank_devices(setup)), make_collectives_(setup.collectives) {
    if (!make_collectives_) make_collectives_ = make_nccl_collectives;
    logits_.resize(plan_.model.vocab_size);
}

void TpCudaLlama::start(const CudaOptions& opts, const std::vector<MemoryPlan>& plans, const MakeRank& make) {
    // Every rank's plan against its GPU before any rank allocates (ranks sharing a GPU add up).
    std::map<int, size_t> need;
    for (int r = 0; r < plan_.ranks; ++r) need[devices_[r]] += plans[r].total();
    for (const auto& [device, bytes] : need) {
        CUDA_CHECK(cudaSetDevice(device));
        size_t free_b = 0, total_b = 0;
        CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
        const size_t limit = opts.memory_limit ? opts.memory_limit : free_b - std::min<size_t>(free_b, 512ull << 20);
        if (bytes > limit) {
            const int r = static_cast<int>(std::find(devices_.begin(), devices_.end(), device) - devices_.begin());
            throw ResourceError("--tp " + std::to_string(plan_.ranks) + ": rank " + std::to_string(r) + " needs " +
                                plans[r].describe() + " on GPU " + std::to_string(device) + ", but " +
                                format_bytes(limit) + " are available there. Hint: more GPUs (--tp), a shorter "
                                "context (-c), or 4-bit weights.");
        }
    }
    for (int r = 0; r < plan_.ranks; ++r)
        spdlog::info("tensor parallel rank {} on GPU {}: heads [{}, {}), KV heads [{}, {}), ffn [{}, {}), vocab [{}, {}); "
                     "memory plan: {}",
                     r, devices_[r], plan_.rank[r].heads.begin, plan_.rank[r].heads.end(), plan_.rank[r].kv_heads.begin,
                     plan_.rank[r].kv_heads.end(), plan_.rank[r].ffn.begin, plan_.rank[r].ffn.end(),
                     plan_.rank[r].vocab.begin, plan_.rank[r].vocab.end(), plans[r].describe());
    collectives_ = make_collectives_(devices_);
    if (static_cast<int>(collectives_.size()) != plan_.ranks)
        throw std::logic_error("TpSetup::collectives: one collective per rank expected");
    threads_ = std::make_unique<RankThreads>(devices_, [this] {
        for (const auto& c : collectives_) c->abort();
    });
    ranks_.resize(plan_.ranks);
    threads_->run([&](int r) {
        CudaOptions o = opts;
        o.tp.collective = collectives_[r].get();
        o.tp.vocab_begin = plan_.rank[r].vocab.begin;
        o.tp.vocab_size = plan_.model.vocab_size;
        ranks_[r] = make(r, o);
    });
}

std::unique_ptr<TpCudaLlama> TpCudaLlama::from_folder(const ModelFolder& model, const QuestSettings& quest,
                                                      int capacity, const CudaOptions& opts, const TpSetup& setup) {
    const std::unique_ptr<WeightSource> source = open_weight_source(model);
    const int stored_group = model.is_gguf() ? 0 : read_quantization_info(model.dir).group;
    TpPlan plan = make_tp_plan(model.config, setup.ranks, ffn_unit_for(model.config, opts.weights, stored_group));
    std::unique_ptr<TpCudaLlama> m(new TpCudaLlama(plan, quest, setup));
    std::vector<std::unique_ptr<WeightSource>> shards;
    std::vector<MemoryPlan> plans;
    for (const TpRank& r : plan.rank) {
        shards.push_back(shard_weight_source(*source, model.config, r));
        const ModelConfig shard = r.shard(model.config);
        const LinearLayout layout = source_linear_layout(shard, *shards.back(), opts.weights);
        plans.push_back(plan_memory(shard, quest, capacity, opts, &layout));
    }
    m->start(opts, plans, [&](int r, const CudaOptions& o) {
        return CudaLlama::from_source(plan.rank[r].shard(model.config), *shards[r], quest, capacity, o);
    });
    return m;
}

std::unique_ptr<TpCudaLlama> TpCudaLlama::random(const ModelConfig& config, const QuestSettings& quest, int capacity,
                                                 uint64_t seed, const CudaOptions& opts, const TpSetup& setup) {
    TpPlan plan = make_tp_plan(config, setup.ranks, ffn_unit_for(config, opts.weights, 0));
    std::unique_ptr<TpCudaLlama> m(new TpCudaLlama(plan, quest, setup));
    std::vector<MemoryPlan> plans;
    for (const TpRank& r : plan.rank) plans.push_back(plan_memory(r.shard(config), quest, capacity, opts));
    m->start(opts, plans, [&](int r, const CudaOptions& o) {
        return CudaLlama::random(plan.rank[r].shard(config), quest, capacity, seed + r, o);
    });
    return m;
}

TpCudaLlama::~TpCudaLlama() {
    // Each rank's device objects are released on its own thread, with its device current.
    if (threads_) {
        try {
            threads_->run([&](int r) { ranks_[r].reset(); });
        } catch (const std::exception& e) {
            spdlog::error("tensor parallel: releasing a rank failed: {}", e.what());
        }
    }
    threads_.reset();
    collectives_.clear();
}

int TpCudaLlama::capacity() const { return ranks_[0]->capacity(); }
int TpCudaLlama::position() const { return ranks_[0]->position(); }

void TpCudaLlama::reset() {
    threads_->run([&](int r) { ranks_[r]->reset(); });
}

std::span<const float> TpCudaLlama::prefill(std::span<const int> tokens, std::vector<float>* all_logits) {
    const int V = plan_.model.vocab_size;
    std::vector<std::vector<float>> rank_all(all_logits ? plan_.ranks : 0);
    threads_->run([&](int r) {
        const std::span<const float> l = ranks_[r]->prefill(tokens, all_logits ? &rank_all[r] : nullptr);
        std::memcpy(logits_.data() + plan_.rank[r].vocab.begin, l.data(), l.size_bytes());
    });
    if (all_logits) {
        const size_t T = tokens.size();
        all_logits->assign(T * V, 0.0f);
        for (int r = 0; r < plan_.ranks; ++r) {
            const TpRange v = plan_.rank[r].vocab;
            for (size_t t = 0; t < T; ++t)
                std::memcpy(all_logits->data() + t * V + v.begin, rank_all[r].data() + t * v.count,
                            sizeof(float) * v.count);
        }
    }
    return logits_;
}

std::span<const float> TpCudaLlama::decode(int token) {
    threads_->run([&](int r) {
        const std::span<const float> l = ranks_[r]->decode(token);
        std::memcpy(logits_.data() + plan_.rank[r].vocab.begin, l.data(), l.size_bytes());
    });
    last_ms_ = 0;
    for (const auto& r : ranks_) last_ms_ = std::max(last_ms_, r->last_decode_ms());
    return logits_;
}

size_t TpCudaLlama::device_memory_bytes() const {
    // cudaMemGetInfo reads the current device: each rank's on its own thread.
    std::vector<size_t> b(plan_.ranks);
    threads_->run([&](int r) { b[r] = ranks_[r]->device_memory_bytes(); });
    size_t sum = 0;
    for (size_t x : b) sum += x;
    return sum;
}

size_t TpCudaLlama::decode_bytes() const {
    size_t sum = 0;
    for (const auto& r : ranks_) sum += r->decode_bytes();
    return sum;
}

std::string TpCudaLlama::profile_report() const { return ranks_[0]->profile_report(); }

}  // namespace quest
