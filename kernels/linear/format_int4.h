#pragma once
// The int4 format's device layout inside a LinearWeight (kernels/linear/format_int4.cpp): the codes, then the fp16
// scales, then the zero points, each part aligned to 256 bytes.
#include "kernels/linear/gemv_int4.cuh"
#include "kernels/linear/linear.h"

namespace quest {

Int4View int4_view(const LinearWeight& W);

}  // namespace quest
