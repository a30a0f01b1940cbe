#pragma once
// The page-selector seam. A selector is one definition (PageSelectorDef): its name, the settings it takes, its CPU
// reference and its bytes model; the CUDA backend's launch is a second, optional definition
// (kernels/select/registry_cuda.h). The built-in selectors are listed once, in registry.cpp; a backend that has no
// definition for a selector refuses it by asking its registry (never by running another selector).
//
// Adding a selector: one file with its CPU reference and PageSelectorDef (and, for the GPU, a .cu with its kernels
// and CudaSelectorOps), plus one line in each registry table.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/select/selection.h"

namespace quest {

struct QuestSelectArgs;

// Settings a selector takes besides the common ones (budget, page size, dense layers, GQA policy); settings it does
// not take must keep their defaults (QuestSettings::validate).
enum SelectorUses : uint32_t {
    kUsesMetadataFormat = 1u << 0,  // metadata: int8 / int4 page bounds instead of fp16
    kUsesMassTarget = 1u << 1,      // mass_target: the adaptive budget
    kUsesMatchBytes = 1u << 2,      // match_bytes: bytes-matched budget
    kUsesReuse = 1u << 3,           // reuse_cos: selection reuse across steps
    kUsesSubPages = 1u << 4,        // sub_page, shortlist: the KV cache keeps sub-page metadata
};

// One selecting step (P > K pages) of one Quest layer, for the bytes model.
struct StepShape {
    int len = 0;           // tokens in the cache, the current one included
    int page_size = 0;     // S
    int num_kv_heads = 0;
    int rows = 0;          // selection rows: KV heads, or query heads under the per-head policy
    int kv_pages = 0;      // pages whose keys and values each row reads, the last (partial) page included
                           // (K, or with match_bytes the settings' matched count: codes::step_pages)
    int head_dim = 0;      // D (sparq's sketch bytes)
};

struct PageSelectorDef {
    std::string_view name;  // settings, flags and --policies spelling: "quest", "streaming", ... (a string literal:
                            // the settings table hands out name.data() as a C string)
    std::string_view help;  // one line for --help
    uint32_t uses = 0;      // SelectorUses
    // CPU reference of a selecting step: fills out.blocks (ascending, covering the last page), out.block_size and
    // out.reads, within the contract of select_blocks_ref (kernels/select/quest.h).
    void (*select_cpu)(const QuestSelectArgs& a, Selection& out) = nullptr;
    // The reads of a selecting step without running the selector (the bytes model of quest bench's CUDA rows and
    // of the CUDA backend), with `kv_pages` pages of KV read per row. Null: only a running CPU backend counts them.
    SelectionReads (*step_reads)(const StepShape& s) = nullptr;
};

// The definition of a registered selector; std::out_of_range for an id that was never registered.
const PageSelectorDef& page_selector_def(PageSelector id);
std::string_view page_selector_name(PageSelector id);
bool page_selector_from_name(std::string_view name, PageSelector& out);
// Every registered selector, in registration order (the built-ins first, in PageSelector's order).
std::vector<PageSelector> page_selectors();
// "quest, streaming, oracle, two-level": for messages that list the choices.
std::string page_selector_names();
// Adds a selector (the built-ins are in registry.cpp's table; tests register their own). Returns its id. Call before
// any backend is built: the registry is not locked. std::invalid_argument for a name already registered or a def
// without select_cpu.
PageSelector register_page_selector(const PageSelectorDef& def);

}  // namespace quest
