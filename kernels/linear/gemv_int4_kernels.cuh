#pragma once
// The kernels gemv_int4() chooses between by the matrix's shape, one by one: for the tests and quest_kernel_bench
// only. The product calls gemv_int4() and the fused epilogues (kernels/linear/gemv_int4.cuh), which choose by the
// auto rule (gemv_int4_kernel_for); nothing here is read from the environment.
//   Fp16R2  the stream kernel (a persistent grid of warps, each streaming tiles of rows with loads always in
//           flight, x in shared memory) on tiles of 2 rows, the fp16 dot
//   I16R2   the stream kernel on tiles of 2 rows, the integer dot (x in block floating point, dp4a)
//   I16R4   the stream kernel on tiles of 4 rows, the integer dot
//   Wide    the block-per-rows kernel reading x from global memory: what the others fall back to when x does not
//           fit in shared memory (cols above about 24K)
#include "kernels/linear/gemv_int4.cuh"

namespace quest {

enum class Int4Kernel { Fp16R2, I16R2, I16R4, Wide };
inline constexpr Int4Kernel kInt4Kernels[] = {Int4Kernel::Fp16R2, Int4Kernel::I16R2, Int4Kernel::I16R4,
                                              Int4Kernel::Wide};

const char* gemv_int4_kernel_name(Int4Kernel k);
// The kernel gemv_int4() runs on W; but for Wide, also the one the fused epilogues run.
Int4Kernel gemv_int4_kernel_for(const Int4View& W);
// y = dequant(W) x by kernel k, with gemv_int4()'s requirements; the stream kernels fall back to Wide where x does
// not fit in shared memory, as in gemv_int4().
void gemv_int4_run(Int4Kernel k, float* y, const Int4View& W, const __half* x, cudaStream_t stream);

}  // namespace quest
