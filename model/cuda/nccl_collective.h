#pragma once
// NCCL's all-reduce as the tensor-parallel ranks' Collective (model/cuda/collective.h): one communicator per rank,
// made together by ncclCommInitAll over the ranks' devices (one process, one distinct GPU per rank).
#include <memory>
#include <vector>

#include "model/cuda/collective.h"

namespace quest {

bool nccl_built();  // whether this build links NCCL (CMake found nccl.h and libnccl)
// InputError when the build has no NCCL or a device repeats (NCCL runs one rank per GPU); ResourceError when NCCL
// cannot make the communicators.
std::vector<std::unique_ptr<Collective>> make_nccl_collectives(const std::vector<int>& devices);

}  // namespace quest
