#include "tokenizer/nfc.h"

#include <algorithm>
#include <unordered_map>
#include <vector>

#include "tokenizer/nfc_tables.h"
#include "tokenizer/utf8.h"

namespace quest {

namespace {

// Hangul syllables compose and decompose algorithmically (Unicode chapter 3.12).
constexpr uint32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr uint32_t kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount, kSCount = kLCount * kNCount;

uint8_t ccc(uint32_t cp) {
    const auto* end = std::end(nfc::kCcc);
    const auto* it = std::upper_bound(std::begin(nfc::kCcc), end, cp,
                                      [](uint32_t c, const nfc::CccRun& r) { return c < r.first; });
    if (it == std::begin(nfc::kCcc)) return 0;
    --it;
    return cp <= it->last ? it->ccc : 0;
}

const nfc::Decomposition* decomposition(uint32_t cp) {
    const auto* end = std::end(nfc::kDecompositions);
    const auto* it = std::lower_bound(std::begin(nfc::kDecompositions), end, cp,
                                      [](const nfc::Decomposition& d, uint32_t c) { return d.cp < c; });
    return it != end && it->cp == cp ? it : nullptr;
}

void decompose(uint32_t cp, std::vector<uint32_t>& out) {
    if (cp >= kSBase && cp < kSBase + kSCount) {
        const uint32_t s = cp - kSBase;
        out.push_back(kLBase + s / kNCount);
        out.push_back(kVBase + (s % kNCount) / kTCount);
        if (s % kTCount) out.push_back(kTBase + s % kTCount);
        return;
    }
    if (const auto* d = decomposition(cp)) {
        decompose(d->a, out);
        if (d->b) decompose(d->b, out);
        return;
    }
    out.push_back(cp);
}

// The primary composite of a + b, 0 when there is none.
uint32_t compose(uint32_t a, uint32_t b) {
    if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount)
        return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
    if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase && b < kTBase + kTCount)
        return a + (b - kTBase);
    // The pair table: constant data derived from the generated table once.
    static const std::unordered_map<uint64_t, uint32_t> pairs = [] {
        std::unordered_map<uint64_t, uint32_t> m;
        for (const auto& d : nfc::kDecompositions)
            if (d.recomposes) m.emplace((uint64_t(d.a) << 32) | d.b, d.cp);
        return m;
    }();
    const auto it = pairs.find((uint64_t(a) << 32) | b);
    return it == pairs.end() ? 0 : it->second;
}

}  // namespace

std::string to_nfc(std::string_view text) {
    bool simple = true;
    for (size_t i = 0, len = 0; i < text.size() && simple; i += len) simple = utf8::decode(text, i, len) < 0x300;
    if (simple) return std::string(text);

    std::vector<uint32_t> cps;
    for (size_t i = 0, len = 0; i < text.size(); i += len) {
        const int32_t cp = utf8::decode(text, i, len);
        decompose(cp < 0 ? 0xFFFD : static_cast<uint32_t>(cp), cps);
    }
    // Canonical ordering: a stable sort of every run of non-starters by combining class.
    for (size_t i = 0; i < cps.size();) {
        if (ccc(cps[i]) == 0) {
            ++i;
            continue;
        }
        size_t j = i;
        while (j < cps.size() && ccc(cps[j]) != 0) ++j;
        std::stable_sort(cps.begin() + i, cps.begin() + j, [](uint32_t a, uint32_t b) { return ccc(a) < ccc(b); });
        i = j;
    }
    // Canonical composition (UAX #15's reference algorithm).
    if (!cps.empty()) {
        size_t starter = 0, out = 1;
        int last_class = ccc(cps[0]) ? 256 : 0;
        for (size_t i = 1; i < cps.size(); ++i) {
            const uint32_t c = cps[i];
            const int cls = ccc(c);
            const uint32_t composite = compose(cps[starter], c);
            if (composite && (last_class < cls || last_class == 0)) {
                cps[starter] = composite;
                continue;
            }
            if (cls == 0) starter = out;
            last_class = cls;
            cps[out++] = c;
        }
        cps.resize(out);
    }
    std::string result;
    result.reserve(text.size());
    for (uint32_t cp : cps) utf8::append(result, cp);
    return result;
}

}  // namespace quest
