#include "model/core/memory.h"

#include <unistd.h>

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <sstream>

#include "kernels/common/error.h"

namespace quest {

namespace {

constexpr size_t kMax = std::numeric_limits<size_t>::max();

// Saturating arithmetic: the plan of an absurd config must come out as "too large", never wrap around.
size_t mul(size_t a, size_t b) {
    size_t r = 0;
    return __builtin_mul_overflow(a, b, &r) ? kMax : r;
}
size_t add(size_t a, size_t b) {
    size_t r = 0;
    return __builtin_add_overflow(a, b, &r) ? kMax : r;
}
// xs combined by op from left to right, starting from r (op's identity).
size_t fold(size_t (*op)(size_t, size_t), size_t r, std::initializer_list<size_t> xs) {
    for (size_t x : xs) r = op(r, x);
    return r;
}
size_t mul(std::initializer_list<size_t> xs) { return fold(mul, 1, xs); }
size_t add(std::initializer_list<size_t> xs) { return fold(add, 0, xs); }
size_t z(int v) { return v > 0 ? static_cast<size_t>(v) : 0; }

}  // namespace

size_t parse_byte_size(const std::string& text, const std::string& what) {
    auto bad = [&](const std::string& why) -> size_t {
        throw InputError(what + ": expected a size in bytes, e.g. 1073741824, 512MiB or 24GiB; got '" + text + "'" +
                         (why.empty() ? "" : " (" + why + ")"));
    };
    size_t i = 0;
    while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) ++i;
    const std::string number = text.substr(0, i);
    std::string unit = text.substr(i);
    if (!unit.empty() && unit[0] == ' ') unit.erase(0, 1);
    for (char& ch : unit) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    if (number.empty() || number == "." || number.find('.') != number.rfind('.')) return bad("");
    double scale = 1;
    if (unit.empty() || unit == "b") scale = 1;
    else if (unit == "k" || unit == "kib") scale = 1024.0;
    else if (unit == "m" || unit == "mib") scale = 1024.0 * 1024;
    else if (unit == "g" || unit == "gib") scale = 1024.0 * 1024 * 1024;
    else if (unit == "t" || unit == "tib") scale = 1024.0 * 1024 * 1024 * 1024;
    else return bad("unknown unit '" + text.substr(i) + "': use K, M, G, T or KiB, MiB, GiB, TiB");
    const double bytes = std::strtod(number.c_str(), nullptr) * scale;
    if (!(bytes >= 1)) return bad("must be at least 1 byte");
    if (bytes > 0x1p60) return bad("larger than 2^60 bytes");
    if (unit.empty() && number.find('.') != std::string::npos) return bad("a byte count is a whole number");
    return static_cast<size_t>(bytes);
}

std::string format_bytes(size_t bytes) {
    char buf[64];
    const double b = static_cast<double>(bytes);
    if (bytes == kMax) return "more than 16 EiB";
    if (b >= 1024.0 * 1024 * 1024 * 1024) std::snprintf(buf, sizeof buf, "%.2f TiB", b / (1024.0 * 1024 * 1024 * 1024));
    else if (b >= 1024.0 * 1024 * 1024) std::snprintf(buf, sizeof buf, "%.2f GiB", b / (1024.0 * 1024 * 1024));
    else if (b >= 1024.0 * 1024) std::snprintf(buf, sizeof buf, "%.2f MiB", b / (1024.0 * 1024));
    else if (b >= 1024.0) std::snprintf(buf, sizeof buf, "%.2f KiB", b / 1024.0);
    else std::snprintf(buf, sizeof buf, "%zu bytes", bytes);
    return buf;
}

size_t host_memory_available() {
    std::ifstream in("/proc/meminfo");
    for (std::string line; std::getline(in, line);) {
        if (line.rfind("MemAvailable:", 0) != 0) continue;
        std::istringstream ss(line.substr(13));
        size_t kib = 0;
        if (ss >> kib) return mul(kib, 1024);
    }
    const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
    return pages > 0 && page > 0 ? mul(static_cast<size_t>(pages), static_cast<size_t>(page)) : kMax;
}

size_t CpuMemoryPlan::total() const { return add({weights, kv_cache, metadata, activations}); }

std::string CpuMemoryPlan::describe() const {
    return "weights " + format_bytes(weights) + " + KV cache " + format_bytes(kv_cache) + " + page metadata " +
           format_bytes(metadata) + " + activations " + format_bytes(activations) + " = " + format_bytes(total());
}

CpuMemoryPlan plan_cpu_memory(const ModelConfig& c, const QuestSettings& q, int capacity) {
    const size_t H = z(c.hidden_size), F = z(c.intermediate_size), V = z(c.vocab_size), L = z(c.num_layers);
    const size_t D = z(c.head_dim), NH = z(c.num_heads), NKV = z(c.num_kv_heads);
    const size_t qd = mul(NH, D), kv = mul(NKV, D);
    const size_t S = z(q.page_size) ? z(q.page_size) : 1;
    const size_t pages = (z(capacity) + S - 1) / S;
    const size_t tokens = mul(pages, S);
    CpuMemoryPlan p;
    const size_t per_layer = add({mul(H, 2), mul({qd, H, 2}), mul({kv, H, 2}), mul({F, H, 3})});
    p.weights = mul(add({mul(V, H), c.tie_word_embeddings ? 0 : mul(V, H), mul(L, per_layer), H}), 4);
    p.kv_cache = mul({L, 2, kv, tokens, 4});
    p.metadata = mul({L, 2, NKV, pages, D, 4});
    if (const int sub = q.cache_sub_page(); sub > 0)  // two-level: sub-page min/max too
        p.metadata = add({p.metadata, mul({L, 2, NKV, pages, S / z(sub), D, 4})});
    // CpuLlama::forward over n tokens: x, xn, proj [n][H]; q, att_out [n][q_dim]; k, v [n][kv_dim]; gate, up [n][F];
    // the last token's logits twice (the output row and the backend's copy).
    p.activations = add(mul({z(capacity), add({mul(H, 3), mul(qd, 2), mul(kv, 2), mul(F, 2)}), 4}), mul(V, 8));
    return p;
}

void check_cpu_memory(const ModelConfig& c, const QuestSettings& q, int capacity, size_t limit) {
    const bool given = limit != 0;
    if (!given) limit = host_memory_available();
    const CpuMemoryPlan p = plan_cpu_memory(c, q, capacity);
    if (p.total() <= limit) return;
    throw ResourceError("not enough host memory for the CPU backend with a " + std::to_string(capacity) +
                        "-token context: need " + p.describe() + ", but " +
                        (given ? "--memory-limit allows " : "the host has ") + format_bytes(limit) +
                        (given ? "" : " available") + ". Lower the context with -c" +
                        (given ? " or raise --memory-limit" : "") + ".");
}

}  // namespace quest
