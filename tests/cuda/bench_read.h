#pragma once
// Read-only roofline kernels for quest_kernel_bench (tests/cuda/bench_read.cu): stream `bytes` from src and fold them
// into out[block] (XOR; out needs one word per block, at most 4 * SM count). Launched with programmatic dependent
// launch, loads issued before the wait, as the decode GEMVs do.
#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

namespace quest::bench {

int read_variant_count();
const char* read_variant_name(int v);
void read_variant(int v, uint32_t* out, const void* src, size_t bytes, cudaStream_t stream);

}  // namespace quest::bench
