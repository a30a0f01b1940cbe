#pragma once
// Memory limits: byte sizes on the command line (--memory-limit), the host's available memory, and the CPU
// backend's memory plan, checked before anything large is allocated.
#include <cstddef>
#include <string>

#include "model/core/quest_settings.h"
#include "model/core/config.h"

namespace quest {

// Parses a byte size: a plain number of bytes ("1073741824") or a number with a binary unit, case-insensitive:
// K/KiB, M/MiB, G/GiB, T/TiB (1024-based), e.g. "24GiB", "1.5G", "512MiB". Throws InputError naming `what` (the
// flag) for anything else, for zero, and for sizes beyond 2^60 bytes.
size_t parse_byte_size(const std::string& text, const std::string& what);
// "1.50 GiB", "512.00 MiB", "900 bytes".
std::string format_bytes(size_t bytes);

// Bytes of host memory available to this process now: MemAvailable from /proc/meminfo, else the physical memory.
size_t host_memory_available();

// Host memory the CPU backend needs for a model and a context, computed from the config alone (no file is read):
// fp32 copies of the weights, the fp32 KV cache and page metadata, and the activations of a prefill of the whole
// context. Sums saturate at SIZE_MAX instead of overflowing.
struct CpuMemoryPlan {
    size_t weights = 0;
    size_t kv_cache = 0;     // keys and values, layers x 2 x kv_dim x 4 bytes per token (capacity rounded to pages)
    size_t metadata = 0;     // page min/max
    size_t activations = 0;  // a prefill of `capacity` tokens, with the logits of the last one
    size_t total() const;
    std::string describe() const;  // "weights 1.00 GiB + KV cache ... = ... GiB"
};
CpuMemoryPlan plan_cpu_memory(const ModelConfig& c, const QuestSettings& q, int capacity);

// Throws ResourceError when the plan exceeds `limit` bytes (0: host_memory_available()), with the numbers and what to
// change (-c, --memory-limit).
void check_cpu_memory(const ModelConfig& c, const QuestSettings& q, int capacity, size_t limit);

}  // namespace quest
