#pragma once
// Functions shared by the CUDA kernels and the host code (CPU references and tests): QUEST_HD marks them
// __host__ __device__ under nvcc and plain C++ otherwise; QUEST_UNROLL asks nvcc to unroll the loop after it.
#if defined(__CUDACC__)
#define QUEST_HD __host__ __device__
#define QUEST_UNROLL _Pragma("unroll")
#else
#define QUEST_HD
#define QUEST_UNROLL
#endif
