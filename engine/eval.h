#pragma once
// Quality of sparse attention through the decode path (`quest eval`):
//   passkey: the paper's protocol — filler text with a 5-digit pass key at depths spread from 0 to 100%, the context
//            prefilled with the full cache, the question fed ONE TOKEN AT A TIME through decode (so Quest selects
//            pages for it), the answer greedy-decoded, exact match of the integer;
//   ppl:     perplexity of a text whose tokens after the first window go through the decode path (Quest active),
//            against full attention.
// With diagnostics (CPU backend), each row also reports the share of the true softmax mass that lies in the
// selected pages against the oracle pages at the same budget.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "model/core/backend.h"
#include "tokenizer/tokenizer.h"

namespace quest {

// Makes a backend for the given Quest settings (full attention when settings.full_attention) and capacity.
using BackendMaker = std::function<std::unique_ptr<Backend>(const QuestSettings& settings, int capacity)>;

struct SelectionSummary {
    bool valid = false;
    double selected_mass = 0;  // mean over Quest layers, heads and steps
    double oracle_mass = 0;
    int steps = 0;
    std::vector<std::vector<double>> per_layer_head_selected, per_layer_head_oracle;  // [layer][head] means
};

// The bytes model (kernels/select/quest.h selection_bytes: FP16 KV and metadata), means per decode step over every decode
// step of a row (CPU backend; invalid otherwise).
struct BytesSummary {
    bool valid = false;
    double bytes_per_step = 0;           // attention bytes over all layers (the dense layers' KV included)
    double quest_bytes_per_step = 0;     // the Quest layers only (layers >= dense_layers): metadata + KV
    double metadata_bytes_per_step = 0;  // the metadata part of quest_bytes_per_step
    double tokens_per_row = 0;           // KV tokens a selection row read at a selecting step (P > K)
    double reused_fraction = 0;          // of the selecting (layer, step) pairs, the share that kept the last selection
    int64_t steps = 0;                   // decode steps counted
};

struct PasskeyRequest {
    std::vector<int> contexts;  // tokens
    std::vector<int> budgets;   // 0 = full attention
    int samples = 10;           // keys per (context, budget), depths spread evenly over [0, 1]
    uint64_t seed = 1;
    bool diagnostics = false;
    QuestSettings base;  // page size, dense layers, GQA policy
};

struct PasskeyRow {
    int context = 0, budget = 0, samples = 0, correct = 0;
    double accuracy() const { return samples ? static_cast<double>(correct) / samples : 0.0; }
    std::vector<int> depths_percent;  // per sample
    std::vector<bool> ok;             // per sample
    BytesSummary bytes;
    SelectionSummary selection;
};

// The token ids of one passkey prompt of about `context` tokens (BOS, task, filler, the key at `depth` in [0, 1],
// filler, question) split into the part that is prefilled and the question fed token by token.
struct PasskeyPrompt {
    std::vector<int> prefill;
    std::vector<int> question;
    int key = 0;
};
PasskeyPrompt make_passkey_prompt(const Tokenizer& tok, int context, double depth, int key);

std::vector<PasskeyRow> run_passkey(const BackendMaker& make, const Tokenizer& tok, const PasskeyRequest& r,
                                    const std::function<void(const std::string&)>& progress);

// Another model scored in lockstep with the main one (same tokenizer): e.g. a 4-bit copy against its FP16 original.
struct PplModel {
    std::string label;
    BackendMaker make;
};

struct PplRequest {
    std::string text_file;
    int window = 0;             // tokens prefilled densely (0: half the text, at most 1024)
    int max_tokens = 0;         // 0: the whole text
    std::vector<int> budgets;   // 0 = full attention
    bool diagnostics = false;
    QuestSettings base;
    std::string label;              // the main model's label in the rows (with compare)
    std::vector<PplModel> compare;  // each budget runs these too, token for token; rows get their KL from the main
};

struct PplRow {
    int budget = 0;
    int tokens = 0;   // tokens scored through the decode path
    double nll = 0;   // mean negative log-likelihood (nats)
    std::string model;  // the label (with compare), else ""
    // With compare: the mean over the scored tokens of KL(P_main || P_this) (nats), the main model's own row 0;
    // negative when not computed.
    double kl = -1;
    double ppl() const;
    BytesSummary bytes;
    SelectionSummary selection;
};

std::vector<PplRow> run_ppl(const BackendMaker& make, const Tokenizer& tok, const PplRequest& r,
                            const std::function<void(const std::string&)>& progress);

// ---- JSONL retrieval sets (tools/make_retrieval_data.py eval-set; docs/training.md) ----
// One prompt per line with prefill_ids, question_ids and answer (digits). Protocol: prefill prefill_ids with the full
// cache, feed question_ids one by one through decode (the selector picks pages for each), greedy-decode at most 8
// tokens up to the first '.', exact match of the integer. Each prompt is prefilled ONCE and every (policy, budget)
// decodes from a copy of that cache (CPU backend; a CUDA backend prefills per policy).
struct JsonlPrompt {
    std::string id;
    int context = 0;             // the set's nominal context
    std::vector<int> prefill;    // BOS first
    std::vector<int> question;
    std::string answer;          // the digits
};
// Reads the first max_samples prompts (0: all) of a set; InputError naming the line otherwise.
std::vector<JsonlPrompt> load_jsonl_set(const std::string& path, int max_samples);

// A policy: a page selector with its options, written `name[+opt...]` (parse_policy, model/core/quest_settings.h:
// the options are the tokens of quest_settings_table()). E.g. "two-level+s4+x4", "quest+int8+S8", "quest+r0.9".
struct PolicySpec {
    std::string label;      // the spec as written
    QuestSettings settings; // budget set per row
};
PolicySpec parse_policy_spec(const std::string& spec, const QuestSettings& base);

struct JsonlRequest {
    std::string set;                    // path
    int samples = 0;                    // first N prompts (0: all)
    std::vector<int> budgets;           // 0 = full attention (one row, whatever the policies)
    std::vector<std::string> policies;  // parse_policy_spec
    bool diagnostics = false;
    QuestSettings base;
    std::string partial_json;           // if set: the rows so far are written here after every prompt
};

struct JsonlRow {
    int context = 0, budget = 0, page_size = 0, samples = 0, correct = 0;
    std::string policy;  // label ("full" for full attention)
    double accuracy() const { return samples ? static_cast<double>(correct) / samples : 0.0; }
    std::vector<std::string> ids;
    std::vector<bool> ok;
    BytesSummary bytes;
    SelectionSummary selection;
};

std::vector<JsonlRow> run_jsonl(const BackendMaker& make, const Tokenizer& tok, const JsonlRequest& r,
                                const std::function<void(const std::string&)>& progress);
std::string jsonl_table(const std::vector<JsonlRow>& rows);
std::string jsonl_json(const std::vector<JsonlRow>& rows);

std::string passkey_table(const std::vector<PasskeyRow>& rows);
std::string passkey_json(const std::vector<PasskeyRow>& rows);
std::string ppl_table(const std::vector<PplRow>& rows);
std::string ppl_json(const std::vector<PplRow>& rows);

}  // namespace quest
