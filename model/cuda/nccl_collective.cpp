#include "model/cuda/nccl_collective.h"

#include <algorithm>
#include <atomic>
#include <string>

#include <spdlog/spdlog.h>

#include "kernels/common/error.h"

#ifdef QUEST_HAVE_NCCL
#include <nccl.h>
#endif

namespace quest {

#ifdef QUEST_HAVE_NCCL

namespace {

class NcclCollective final : public Collective {
public:
    explicit NcclCollective(ncclComm_t comm) : comm_(comm) {}
    ~NcclCollective() override {
        if (!aborted_.load()) ncclCommDestroy(comm_);
    }
    void all_reduce_sum(float* data, size_t count, cudaStream_t stream) override {
        if (aborted_.load()) throw ResourceError("NCCL all-reduce: the communicator was aborted (another rank failed)");
        const ncclResult_t r = ncclAllReduce(data, data, count, ncclFloat, ncclSum, comm_, stream);
        if (r != ncclSuccess)
            throw ResourceError(std::string("NCCL all-reduce: ") + ncclGetErrorString(r) + ": " + ncclGetLastError(comm_));
    }
    bool capturable() const override { return true; }
    void abort() override {
        if (!aborted_.exchange(true)) ncclCommAbort(comm_);
    }

private:
    ncclComm_t comm_;
    std::atomic<bool> aborted_{false};
};

}  // namespace

bool nccl_built() { return true; }

std::vector<std::unique_ptr<Collective>> make_nccl_collectives(const std::vector<int>& devices) {
    std::vector<int> sorted = devices;
    std::sort(sorted.begin(), sorted.end());
    if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end())
        throw InputError("--tp: NCCL runs one rank per GPU, and the ranks' devices repeat one");
    std::vector<ncclComm_t> comms(devices.size());
    const ncclResult_t r = ncclCommInitAll(comms.data(), static_cast<int>(devices.size()), devices.data());
    if (r != ncclSuccess)
        throw ResourceError(std::string("--tp: NCCL could not make the communicators: ") + ncclGetErrorString(r) +
                            ": " + ncclGetLastError(nullptr));
    int version = 0;
    ncclGetVersion(&version);
    spdlog::info("NCCL {}: {} communicators", version, devices.size());
    std::vector<std::unique_ptr<Collective>> out;
    for (ncclComm_t c : comms) out.push_back(std::make_unique<NcclCollective>(c));
    return out;
}

#else

bool nccl_built() { return false; }

std::vector<std::unique_ptr<Collective>> make_nccl_collectives(const std::vector<int>&) {
    throw InputError("--tp: this build has no NCCL (install NCCL, nccl.h and libnccl, beside the CUDA toolkit or on "
                     "the system, and configure again)");
}

#endif

}  // namespace quest
