#pragma once
// A test-only page selector, registered at run time through the selector seam (kernels/select/registry.h): the K
// most recent pages, the last one included. It exists to prove that a selector is one definition plus one
// registration, on the CPU backend and (tests/selectors/recent_cuda.cu) on the CUDA backend.
#include <numeric>
#include <vector>

#include "kernels/select/quest.h"
#include "kernels/select/registry.h"

namespace quest::test {

inline int recent_pages(int len, int page_size) { return (len + page_size - 1) / page_size; }

// Pages [P - K, P) for every query head; called for selecting steps only (P > K).
inline void recent_select_cpu(const QuestSelectArgs& a, Selection& out) {
    const int P = recent_pages(a.len, a.page_size), K = a.page_budget;
    std::vector<int> pages(static_cast<size_t>(K));
    std::iota(pages.begin(), pages.end(), P - K);
    out.block_size = a.page_size;
    for (auto& b : out.blocks) b = pages;
    const int rows = a.policy == GqaPolicy::PerHead ? a.num_heads : a.num_kv_heads;
    out.reads.rows = rows;
    out.reads.kv_tokens = static_cast<int64_t>(rows) * ((K - 1) * a.page_size + (a.len - (P - 1) * a.page_size));
}

inline SelectionReads recent_step_reads(const StepShape& s) {
    SelectionReads r;
    const int P = recent_pages(s.len, s.page_size);
    r.rows = s.rows;
    r.kv_tokens = static_cast<int64_t>(s.rows) * ((s.kv_pages - 1) * s.page_size + (s.len - (P - 1) * s.page_size));
    return r;
}

// Registers "recent" once per process (every gtest case may run in a process of its own) and returns its id.
inline PageSelector recent_selector() {
    PageSelector id;
    if (page_selector_from_name("recent", id)) return id;
    PageSelectorDef d;
    d.name = "recent";
    d.help = "the most recent pages (test-only)";
    d.select_cpu = recent_select_cpu;
    d.step_reads = recent_step_reads;
    return register_page_selector(d);
}

// A selector that only the CPU backend runs: a backend without its definition must refuse it.
inline PageSelector cpu_only_selector() {
    PageSelector id;
    if (page_selector_from_name("cpu-only-recent", id)) return id;
    PageSelectorDef d;
    d.name = "cpu-only-recent";
    d.help = "recent, without a CUDA definition (test-only)";
    d.select_cpu = recent_select_cpu;
    return register_page_selector(d);
}

}  // namespace quest::test
