#pragma once
#include "kernels/select/registry_cuda.h"
#include "tests/selectors/recent.h"

namespace quest::test {

// Registers "recent" with the selector registry and its CUDA definition (once per process); returns its id.
PageSelector recent_selector_cuda();

}  // namespace quest::test
