#include "engine/eval_cli.h"

#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <set>
#include <sstream>

#include "engine/backend_factory.h"
#include "engine/cli.h"
#include "engine/eval.h"
#include "engine/settings_cli.h"
#include "model/core/config.h"
#include "model/io/atomic_file.h"
#include "kernels/common/error.h"
#include "model/cpu/llama_cpu.h"
#include "model/io/safetensors.h"
#include "model/io/weights.h"

namespace quest {

namespace {

struct EvalFlags {
    std::string model, contexts = "1024,4096", budgets = "full,32,64,128", json, plot, text, compare;
    int samples = 10, window = 0, max_tokens = 0;
    std::string set, policies;  // empty: the policy of the settings (the default selector unless --selector says)
    int jsonl_samples = 0;
    bool diagnostics = false;
    uint64_t seed = 1;
    SettingsFlags settings;  // the Quest settings and --backend (engine/settings_cli.h)
};

// The flags eval does not take: the budget and full attention are --budgets' ("full"), the CUDA tuning flags are
// those of generate / bench.
const std::set<std::string> kEvalSkips = {"budget",      "full_attention", "graph",        "fused_norms",
                                          "quest_fused", "memory_limit",   "prefill_chunk"};

// Each row sets its own budget: the base is not validated here (every row's settings are).
QuestSettings base_settings(const EvalFlags& f) {
    QuestSettings q = f.settings.quest(/*validate=*/false);
    q.budget = std::max(q.budget, q.page_size);
    return q;
}

// The CPU backend shares one copy of the weights across every (settings, capacity); CUDA reloads per backend.
BackendMaker maker(const EvalFlags& f, const ModelFolder& model) {
    BackendOptions backend;
    f.settings.apply_backend(backend);
    if (backend.kind == "cpu") {
        auto w = std::make_shared<LlamaWeightsF32>(load_model_weights_f32(model));
        return [w, model](const QuestSettings& q, int capacity) -> std::unique_ptr<Backend> {
            check_context(model.config, capacity,
                          "eval: the prompts need " + std::to_string(capacity) + " positions, which",
                          model.config_file().string());
            return std::make_unique<CpuLlama>(w, q, capacity);
        };
    }
    return [model, backend](const QuestSettings& q, int capacity) {
        check_context(model.config, capacity, "eval: the prompts need " + std::to_string(capacity) + " positions, which",
                      model.config_file().string());
        BackendOptions o = backend;
        o.capacity = capacity;
        o.quest = q;
        return create_backend(model, o);
    };
}

void write_atomic(const std::string& path, const std::string& text) {
    if (!path.empty()) write_file_atomic(path, text);  // never partial, no temporary left (model/io/atomic_file.h)
}

void progress(const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); }

}  // namespace

EvalCommand add_eval_command(CLI::App& parent) {
    auto flags = std::make_shared<EvalFlags>();
    EvalCommand cmd;
    cmd.app = parent.add_subcommand("eval", "Quality of sparse attention through the decode path: passkey, ppl, jsonl");
    cmd.app->require_subcommand(1);
    auto common = [flags](CLI::App* a) {
        a->add_option("-m,--model", flags->model,
                      "Hugging Face folder or .gguf file (" + supported_architectures() + ")")->required();
        a->add_option("--budgets", flags->budgets, "comma-separated Quest budgets, 'full' for full attention")
            ->capture_default_str();
        add_settings_flags(*a, flags->settings, kEvalSkips);
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
    ppl->add_option("--compare", flags->compare,
                    "comma-separated models (folders or .gguf files, the same tokenizer) scored token for token with "
                    "-m at each budget; each row gets its KL divergence from -m's distribution");
    auto* jsonl = cmd.app->add_subcommand(
        "jsonl", "Retrieval sets (tools/make_retrieval_data.py eval-set): one prefill per prompt, then every policy "
                 "and budget through the decode path");
    common(jsonl);
    jsonl->add_option("--set", flags->set, "JSONL set (prefill_ids, question_ids, answer)")->required();
    jsonl->add_option("--samples", flags->jsonl_samples, "the first N prompts (default: all)");
    jsonl->add_option("--policies", flags->policies,
                      "comma-separated policies name[+opt...]: sparq, quest, streaming, oracle, two-level; opts " +
                          policy_options_help() +
                          " (e.g. sparq+m,two-level+s4+x4,quest+int8+S8,quest+int4+m,quest+r0.5; default: the "
                          "settings' own, the default selector unless --selector names another)");
    cmd.run = [flags, passkey, jsonl]() -> int {
        const EvalFlags& f = *flags;
        if (passkey->parsed() && !f.plot.empty()) check_plot_dependency();  // before the run, not after it
        const QuestSettings base = base_settings(f);  // the flags checked before the model is opened
        const ModelFolder model = open_model_folder(f.model);
        f.settings.check_model(model.config);
        if (passkey->parsed())  // before any work (the weights load): a prompt of ctx tokens, then the answer's 8
            for (int ctx : parse_int_list(f.contexts, "--contexts", false))
                check_context(model.config, int64_t(ctx) + 8,
                              "--contexts " + std::to_string(ctx) + " (+ 8 answer tokens)",
                              model.config_file().string());
        const auto tok_owner = load_model_tokenizer(model);
        const Tokenizer& tok = *tok_owner;
        check_tokenizer_vocab(tok, model);
        const BackendMaker make = maker(f, model);
        if (passkey->parsed()) {
            PasskeyRequest r;
            r.contexts = parse_int_list(f.contexts, "--contexts", false);
            r.budgets = parse_int_list(f.budgets, "--budgets", true);
            r.samples = f.samples;
            r.seed = f.seed;
            r.diagnostics = f.diagnostics;
            r.base = base;
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
            std::stringstream ss(f.policies.empty() ? base.policy_label() : f.policies);
            for (std::string item; std::getline(ss, item, ',');) r.policies.push_back(item);
            r.diagnostics = f.diagnostics;
            r.base = base;
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
        r.base = base;
        if (!f.compare.empty()) {
            r.label = f.model;
            std::ifstream in(f.text, std::ios::binary);
            if (!in) throw InputError(f.text + ": cannot open (--text)");
            const std::string text((std::istreambuf_iterator<char>(in)), {});
            const std::vector<int> ids = tok.encode(text, true);
            std::stringstream ss(f.compare);
            for (std::string path; std::getline(ss, path, ',');) {
                const ModelFolder other = open_model_folder(path);
                f.settings.check_model(other.config);
                const auto other_tok = load_model_tokenizer(other);
                check_tokenizer_vocab(*other_tok, other);
                if (other.config.vocab_size != model.config.vocab_size || other_tok->encode(text, true) != ids)
                    throw InputError("--compare " + path + ": its vocabulary or tokenizer differs from -m " + f.model +
                                     "'s on " + f.text + " (expected the same tokenizer: one distribution per token)");
                r.compare.push_back({path, maker(f, other)});
            }
        }
        const auto rows = run_ppl(make, tok, r, progress);
        std::fputs(ppl_table(rows).c_str(), stdout);
        write_atomic(f.json, ppl_json(rows));
        return 0;
    };
    return cmd;
}

}  // namespace quest
