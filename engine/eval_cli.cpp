#include "engine/eval_cli.h"

#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>

#include "engine/backend_factory.h"
#include "engine/cli.h"
#include "engine/eval.h"
#include "model/atomic_file.h"
#include "model/error.h"
#include "model/llama_cpu.h"
#include "model/safetensors.h"
#include "model/weights.h"

namespace quest {

namespace {

struct EvalFlags {
    std::string model, backend = "cpu", contexts = "1024,4096", budgets = "full,32,64,128", json, plot, text;
    int samples = 10, page_size = 0, dense_layers = -1, window = 0, max_tokens = 0;
    std::string gqa_policy, selector, metadata, set, policies = "quest";
    int shortlist = 0, sub_page = 0, jsonl_samples = 0;
    double mass_target = -1;
    std::optional<double> reuse_cos;
    bool match_bytes = false;
    bool diagnostics = false;
    uint64_t seed = 1;
};

QuestSettings base_settings(const EvalFlags& f) {
    QuestSettings q = default_quest_settings();
    if (f.page_size > 0) q.page_size = f.page_size;
    if (f.dense_layers >= 0) q.dense_layers = f.dense_layers;
    if (!f.gqa_policy.empty() && !gqa_policy_from_name(f.gqa_policy, q.gqa_policy))
        throw InputError("--gqa-policy: expected kv-max, kv-sum or per-head, got '" + f.gqa_policy + "'");
    if (!f.selector.empty() && !page_selector_from_name(f.selector, q.selector))
        throw InputError("--selector: expected quest, streaming, oracle or two-level, got '" + f.selector + "'");
    if (!f.metadata.empty() && !metadata_format_from_name(f.metadata, q.metadata))
        throw InputError("--metadata: expected fp16, int8 or int4, got '" + f.metadata + "'");
    if (f.shortlist > 0) q.shortlist = f.shortlist;
    if (f.sub_page > 0) q.sub_page = f.sub_page;
    if (f.mass_target >= 0) q.mass_target = f.mass_target;
    if (f.match_bytes) q.match_bytes = true;
    if (f.reuse_cos) q.reuse_cos = *f.reuse_cos;
    q.budget = std::max(q.budget, q.page_size);
    return q;
}

// The CPU backend shares one copy of the weights across every (settings, capacity); CUDA reloads per backend.
BackendMaker maker(const EvalFlags& f, const ModelFolder& model) {
    if (f.backend == "cpu") {
        auto w = std::make_shared<LlamaWeightsF32>(load_llama_weights_f32(ModelFiles(model.dir), model.config));
        return [w](const QuestSettings& q, int capacity) -> std::unique_ptr<Backend> {
            return std::make_unique<CpuLlama>(w, q, capacity);
        };
    }
    return [model, kind = f.backend](const QuestSettings& q, int capacity) {
        BackendOptions o;
        o.kind = kind;
        o.capacity = capacity;
        o.quest = q;
        return create_backend(model, o);
    };
}

void write_atomic(const std::string& path, const std::string& text) {
    if (!path.empty()) write_file_atomic(path, text);  // never partial, no temporary left (model/atomic_file.h)
}

void progress(const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); }

}  // namespace

EvalCommand add_eval_command(CLI::App& parent) {
    auto flags = std::make_shared<EvalFlags>();
    EvalCommand cmd;
    cmd.app = parent.add_subcommand("eval", "Quality of sparse attention through the decode path: passkey, ppl, jsonl");
    cmd.app->require_subcommand(1);
    auto common = [flags](CLI::App* a) {
        a->add_option("-m,--model", flags->model, "Hugging Face Llama folder")->required();
        a->add_option("--backend", flags->backend, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}));
        a->add_option("--budgets", flags->budgets, "comma-separated Quest budgets, 'full' for full attention")
            ->capture_default_str();
        a->add_option("--page-size", flags->page_size, "KV page size (default from configs/quest-default.json)");
        a->add_option("--dense-layers", flags->dense_layers, "layers that always use full attention");
        a->add_option("--gqa-policy", flags->gqa_policy, "kv-max, kv-sum or per-head");
        a->add_option("--selector", flags->selector, "quest, streaming (first + recent pages), oracle or two-level");
        a->add_option("--metadata", flags->metadata, "page bounds: fp16 (exact), int8 or int4");
        a->add_option("--shortlist", flags->shortlist, "two-level: pages shortlisted per selected page (default 4)");
        a->add_option("--sub-page", flags->sub_page, "two-level: tokens per sub-page (default 4)");
        a->add_option("--mass-target", flags->mass_target, "adaptive budget: estimated softmax share to reach (0: off)");
        a->add_flag("--match-bytes", flags->match_bytes,
                    "quest, two-level: as many pages (sub-pages) as fit in fp16 Quest's bytes per step");
        a->add_option("--reuse-cos", flags->reuse_cos,
                      "quest: keep the last selection while the page is the same and the query's cosine to it >= this");
        a->add_flag("--diagnostics", flags->diagnostics,
                    "per layer and head: softmax mass in the selected pages vs the oracle pages (CPU backend)");
        a->add_option("--json", flags->json, "write the rows as JSON");
    };
    auto* passkey = cmd.app->add_subcommand("passkey", "Pass-key retrieval at several contexts and budgets");
    common(passkey);
    passkey->add_option("--contexts", flags->contexts, "comma-separated context lengths")->capture_default_str();
    passkey->add_option("--samples", flags->samples, "keys per context and budget (depths 0..100%)")
        ->capture_default_str();
    passkey->add_option("--seed", flags->seed, "seed of the pass keys")->capture_default_str();
    passkey->add_option("--plot", flags->plot, "accuracy vs budget as PNG (python3 + matplotlib)");
    auto* ppl = cmd.app->add_subcommand("ppl", "Perplexity with the tokens after the first window decoded one by one");
    common(ppl);
    ppl->add_option("--text", flags->text, "text file")->required();
    ppl->add_option("--window", flags->window, "tokens prefilled densely (default: half the text, at most 1024)");
    ppl->add_option("--max-tokens", flags->max_tokens, "use at most this many tokens of the text");
    auto* jsonl = cmd.app->add_subcommand(
        "jsonl", "Retrieval sets (tools/make_retrieval_data.py eval-set): one prefill per prompt, then every policy "
                 "and budget through the decode path");
    common(jsonl);
    jsonl->add_option("--set", flags->set, "JSONL set (prefill_ids, question_ids, answer)")->required();
    jsonl->add_option("--samples", flags->jsonl_samples, "the first N prompts (default: all)");
    jsonl->add_option("--policies", flags->policies,
                      "comma-separated policies name[+opt...]: quest, streaming, oracle, two-level; opts fp16, int8, "
                      "int4, S<page>, s<sub-page>, x<shortlist>, p<mass target>, m (bytes-matched), r<reuse cosine> "
                      "(e.g. two-level+s4+x4,quest+int8+S8,quest+int4+m,quest+r0.5)")
        ->capture_default_str();
    cmd.run = [flags, passkey, jsonl]() -> int {
        const EvalFlags& f = *flags;
        const ModelFolder model = open_model_folder(f.model);
        const auto tok_owner = load_tokenizer(model.dir);
    const Tokenizer& tok = *tok_owner;
        const BackendMaker make = maker(f, model);
        if (passkey->parsed()) {
            PasskeyRequest r;
            r.contexts = parse_int_list(f.contexts, "--contexts", false);
            r.budgets = parse_int_list(f.budgets, "--budgets", true);
            r.samples = f.samples;
            r.seed = f.seed;
            r.diagnostics = f.diagnostics;
            r.base = base_settings(f);
            const auto rows = run_passkey(make, tok, r, progress);
            std::fputs(passkey_table(rows).c_str(), stdout);
            const std::string json = passkey_json(rows);
            write_atomic(f.json, json);
            if (!f.plot.empty()) {
                const std::string tmp = f.plot + ".json";
                write_atomic(tmp, json);
                const std::string c = "python3 '" + std::string(QUEST_SOURCE_DIR) + "/tools/plot_passkey.py' '" + tmp +
                                      "' '" + f.plot + "'";
                const int rc = std::system(c.c_str());
                std::filesystem::remove(tmp);
                if (rc != 0) throw InputError("--plot: '" + c + "' failed (needs python3 with matplotlib)");
            }
            return 0;
        }
        if (jsonl->parsed()) {
            JsonlRequest r;
            r.set = f.set;
            r.samples = f.jsonl_samples;
            r.budgets = parse_int_list(f.budgets, "--budgets", true);
            std::stringstream ss(f.policies);
            for (std::string item; std::getline(ss, item, ',');) r.policies.push_back(item);
            r.diagnostics = f.diagnostics;
            r.base = base_settings(f);
            if (!f.json.empty()) r.partial_json = f.json + ".partial";
            const auto rows = run_jsonl(make, tok, r, progress);
            std::fputs(jsonl_table(rows).c_str(), stdout);
            write_atomic(f.json, jsonl_json(rows));
            if (!r.partial_json.empty()) std::filesystem::remove(r.partial_json);
            return 0;
        }
        PplRequest r;
        r.text_file = f.text;
        r.window = f.window;
        r.max_tokens = f.max_tokens;
        r.budgets = parse_int_list(f.budgets, "--budgets", true);
        r.diagnostics = f.diagnostics;
        r.base = base_settings(f);
        const auto rows = run_ppl(make, tok, r, progress);
        std::fputs(ppl_table(rows).c_str(), stdout);
        write_atomic(f.json, ppl_json(rows));
        return 0;
    };
    return cmd;
}

}  // namespace quest
