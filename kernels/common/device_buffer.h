#pragma once
// RAII device memory (cudaMalloc/cudaFree) for host code and tests. Allocation happens at set-up, never in the
// decode loop.
#include <cuda_runtime.h>

#include <cstddef>
#include <utility>
#include <vector>

#include "kernels/common/cuda_common.cuh"

namespace quest {

template <typename T>
class DeviceBuffer {
public:
    using value_type = T;
    DeviceBuffer() = default;
    explicit DeviceBuffer(size_t n) : n_(n) {
        if (n) CUDA_CHECK(cudaMalloc(&p_, n * sizeof(T)));
    }
    ~DeviceBuffer() {
        if (p_) cudaFree(p_);
    }
    DeviceBuffer(DeviceBuffer&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
    DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
        if (this != &o) {
            if (p_) cudaFree(p_);
            p_ = std::exchange(o.p_, nullptr);
            n_ = std::exchange(o.n_, 0);
        }
        return *this;
    }
    DeviceBuffer(const DeviceBuffer&) = delete;
    DeviceBuffer& operator=(const DeviceBuffer&) = delete;

    T* get() const { return p_; }
    size_t size() const { return n_; }
    size_t bytes() const { return n_ * sizeof(T); }

    void upload(const T* host, size_t n, size_t offset = 0) {
        CUDA_CHECK(cudaMemcpy(p_ + offset, host, n * sizeof(T), cudaMemcpyHostToDevice));
    }
    void upload(const std::vector<T>& v) { upload(v.data(), v.size()); }
    std::vector<T> download() const {
        std::vector<T> v(n_);
        if (n_) CUDA_CHECK(cudaMemcpy(v.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
        return v;
    }
    // Fills every byte with `byte` (tests poison outputs with 0xFF: NaN in fp16 and fp32).
    void fill_bytes(int byte) {
        if (n_) CUDA_CHECK(cudaMemset(p_, byte, n_ * sizeof(T)));
    }

private:
    T* p_ = nullptr;
    size_t n_ = 0;
};

}  // namespace quest
