#include "kernels/common/cuda_common.cuh"

namespace quest {

void cuda_fail(cudaError_t err, const char* expr, const char* file, int line) {
    throw CudaError(std::string("CUDA error '") + cudaGetErrorString(err) + "' (" + cudaGetErrorName(err) + ") in " +
                    expr + " at " + file + ":" + std::to_string(line));
}

void precondition_fail(const char* cond, const std::string& msg, const char* file, int line) {
    throw std::invalid_argument(std::string("precondition failed: ") + cond + " (" + msg + ") at " + file + ":" +
                                std::to_string(line));
}

int cuda_device_count() {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();  // clear the sticky error
        return 0;
    }
    return n;
}

}  // namespace quest
