#include "kernels/select/registry_cuda.h"

#include <map>
#include <stdexcept>
#include <string>

#include "kernels/select/page_oracle.cuh"
#include "kernels/select/page_select.cuh"
#include "kernels/select/registry.h"

namespace quest {

namespace {

void quest_layer(const CudaSelectArgs& a) {
    QuestDecodeOptions o;
    o.fused = a.fused;
    o.codes = a.codes;
    o.match = a.match;
    o.rope = a.rope;
    quest_decode(a.out, a.q, a.kv, a.d_pos, a.num_heads, a.page_budget, a.policy, a.scale, a.ws, a.stream, o);
}
// The separate-launch path on fp16 bounds folds the append into its scoring launch (off the chain's critical path).
bool quest_folds_rope(const CudaSelectArgs& a) { return !a.fused && !a.codes; }

void streaming_layer(const CudaSelectArgs& a) {
    const int rows = quest_selection_rows(a.num_heads, a.kv.num_kv_heads, a.policy);
    streaming_select(a.ws.selected, a.d_pos, rows, a.kv.page_size, a.page_budget, a.stream, a.kv.window);
    attention_decode_sparse(a.out, a.q, a.kv, a.d_pos, a.ws.selected, a.num_heads, a.page_budget, a.policy, a.scale,
                            a.ws, a.stream);
}

void oracle_layer(const CudaSelectArgs& a) {  // every key read for the true page masses, then top-k and attention
    oracle_select(a.ws.selected, a.ws.scores, a.workspace, a.q, a.kv, a.d_pos, a.num_heads, a.page_budget, a.policy,
                  a.scale, a.stream);
    attention_decode_sparse(a.out, a.q, a.kv, a.d_pos, a.ws.selected, a.num_heads, a.page_budget, a.policy, a.scale,
                            a.ws, a.stream);
}

void sparq_layer(const CudaSelectArgs& a) {  // token scores on the sketch, Quest's top-k and attention
    if (!a.sketch) throw std::logic_error("sparq_layer: the backend keeps no key sketch for this layer");
    sparq_decode(a.out, *a.sketch, a.workspace, a.q, a.kv, a.d_pos, a.num_heads, a.page_budget, a.policy, a.scale,
                 a.match, a.ws, a.stream, a.rope);
}
bool sparq_folds_rope(const CudaSelectArgs&) { return true; }  // the token's RoPE + append in the scoring launch
const float* sparq_scores(const CudaSelectArgs& a) {
    return sparq_row_scores(a.workspace, a.ws, a.num_heads, a.kv.num_kv_heads, a.policy);
}

const float* ws_scores(const CudaSelectArgs& a) { return a.ws.scores; }

// The built-in selectors the CUDA backend runs (two-level runs on the CPU backend only).
std::map<PageSelector, CudaSelectorOps>& registry() {
    static std::map<PageSelector, CudaSelectorOps> ops = {
        {PageSelector::Quest, {quest_layer, quest_folds_rope, nullptr, ws_scores}},
        {PageSelector::Streaming, {streaming_layer, nullptr, nullptr, nullptr}},
        {PageSelector::Oracle, {oracle_layer, nullptr, oracle_workspace_floats, ws_scores}},
        {PageSelector::Sparq, {sparq_layer, sparq_folds_rope, sparq_workspace_floats, sparq_scores}},
    };
    return ops;
}

}  // namespace

const CudaSelectorOps* cuda_selector_ops(PageSelector id) {
    const auto& ops = registry();
    const auto it = ops.find(id);
    return it == ops.end() ? nullptr : &it->second;
}

void register_cuda_selector(PageSelector id, const CudaSelectorOps& ops) {
    (void)page_selector_def(id);  // std::out_of_range when never registered
    if (!ops.decode_layer || !registry().emplace(id, ops).second)
        throw std::invalid_argument("register_cuda_selector: selector '" + std::string(page_selector_name(id)) +
                                    "' has CUDA ops already, or none were given");
}

}  // namespace quest
