#include "engine/cli.h"

#include <CLI/CLI.hpp>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <random>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <sstream>

#include "engine/backend.h"
#include "engine/generate.h"
#include "engine/quest_settings.h"
#include "engine/sampler.h"
#include "engine/timing.h"
#include "model/error.h"
#include "model/make_model.h"
#include "tokenizer/tokenizer.h"

namespace quest {

namespace {

// Flags shared by the subcommands that run a model.
struct ModelFlags {
    std::string model_dir;
    std::string backend = "cpu";
    int context = 0;  // 0: what the request needs, up to the model's maximum
    // Quest settings: defaults from configs/quest-default.json, then --quest-config, then these flags.
    std::string quest_config;
    std::optional<int> budget, page_size, dense_layers;
    std::optional<std::string> gqa_policy;
    bool full_attention = false;

    void add(CLI::App& app) {
        app.add_option("-m,--model", model_dir, "Hugging Face Llama folder (config.json, safetensors, tokenizer.model)")
            ->required();
        app.add_option("--backend", backend, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}));
        app.add_option("-c,--context", context, "KV cache capacity in tokens (default: prompt + new tokens)");
        app.add_option("--quest-config", quest_config, "JSON file with Quest settings (see configs/)");
        app.add_option("--budget", budget, "Quest token budget B per step");
        app.add_option("--page-size", page_size, "KV page size S in tokens (power of two)");
        app.add_option("--dense-layers", dense_layers, "layers that always use full attention");
        app.add_option("--gqa-policy", gqa_policy, "page selection for grouped heads: kv-max, kv-sum, per-head");
        app.add_flag("--full-attention", full_attention, "full attention in every layer (no Quest)");
    }

    QuestSettings quest_settings() const {
        QuestSettings s = default_quest_settings();
        if (!quest_config.empty()) s = load_quest_settings(quest_config, s);
        if (budget) s.budget = *budget;
        if (page_size) s.page_size = *page_size;
        if (dense_layers) s.dense_layers = *dense_layers;
        if (gqa_policy && !gqa_policy_from_name(*gqa_policy, s.gqa_policy))
            throw InputError("--gqa-policy: expected kv-max, kv-sum or per-head, got '" + *gqa_policy + "'");
        if (full_attention) s.full_attention = true;
        s.validate();
        return s;
    }
};

std::unique_ptr<Backend> make_backend(const ModelFlags& f, const ModelFolder& model, const QuestSettings& q,
                                      int capacity) {
    if (f.backend == "cpu") return make_cpu_backend(model, q, capacity);
    throw InputError("--backend cuda: this build has no CUDA backend (configure with -DQUEST_CUDA=ON on a machine "
                     "with nvcc)");
}

std::string read_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw InputError(path + ": cannot open");
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

void print_summary(const GenerateResult& r, const Backend& b) {
    const LatencyStats s = summarize_latency(r.decode_ms);
    std::fprintf(stderr, "\n---\n");
    std::fprintf(stderr, "backend %s, %s, context %d/%d tokens\n", b.name().c_str(), b.quest().describe().c_str(),
                 b.position(), b.capacity());
    std::fprintf(stderr, "prefill: %d tokens in %.2f ms (%.1f tokens/s)\n", r.prompt_tokens, r.prefill_ms,
                 r.prefill_ms > 0 ? 1000.0 * r.prompt_tokens / r.prefill_ms : 0.0);
    std::fprintf(stderr, "decode: %zu tokens generated, %d steps, p50 %.3f ms/token, p90 %.3f, mean %.3f (sampling excluded)\n",
                 r.tokens.size(), s.count, s.p50, s.p90, s.mean);
    std::fprintf(stderr, "stop: %s\n", r.stop_reason.c_str());
}

int cmd_generate(const ModelFlags& mf, const std::string& prompt_in, const std::string& prompt_file, int n,
                 SamplerSettings ss, bool seed_given) {
    const QuestSettings q = mf.quest_settings();
    const ModelFolder model = open_model_folder(mf.model_dir);
    const Tokenizer tok(model.tokenizer_file());
    const std::string prompt = prompt_file.empty() ? prompt_in : read_file(prompt_file);
    const std::vector<int> ids = tok.encode(prompt, /*add_bos=*/true);
    if (n < 0) throw InputError("-n must be >= 0, got " + std::to_string(n));
    const int max_ctx = model.config.max_context();
    int capacity = mf.context > 0 ? mf.context : std::min<int>(static_cast<int>(ids.size()) + n, max_ctx);
    if (mf.context > max_ctx)
        throw InputError("-c " + std::to_string(mf.context) + " exceeds the model's maximum context of " +
                         std::to_string(max_ctx) + " tokens (max_position_embeddings in config.json)");
    if (static_cast<int>(ids.size()) > capacity)
        throw InputError("the prompt has " + std::to_string(ids.size()) + " tokens but the context holds " +
                         std::to_string(capacity) + " (model maximum " + std::to_string(max_ctx) + ")");
    if (!seed_given) ss.seed = std::random_device{}();

    Stopwatch load;
    auto backend = make_backend(mf, model, q, capacity);
    spdlog::info("loaded {} ({} layers, {} heads / {} KV heads, head_dim {}) on {} in {:.0f} ms; {}; seed {}",
                 mf.model_dir, model.config.num_layers, model.config.num_heads, model.config.num_kv_heads,
                 model.config.head_dim, backend->name(), load.ms(), q.describe(), ss.seed);

    Sampler sampler(ss);
    StreamingDecoder stream(tok);
    const GenerateResult r = generate(*backend, sampler, ids, n, [&](int token) {
        if (model.config.is_eos(token)) return true;
        const std::string text = stream.push(token);
        std::fwrite(text.data(), 1, text.size(), stdout);
        std::fflush(stdout);
        return true;
    });
    const std::string rest = stream.flush();
    std::fwrite(rest.data(), 1, rest.size(), stdout);
    std::fputc('\n', stdout);
    std::fflush(stdout);
    if (r.stop_reason == "context_full")
        spdlog::warn("stopped: the context is full ({} tokens); raise it with -c", backend->capacity());
    print_summary(r, *backend);
    return 0;
}

int cmd_make_model(const std::string& config_file, const std::string& out_dir, const std::string& tokenizer,
                   uint64_t seed, const std::string& dtype_name) {
    ModelConfig c = load_model_config(config_file);
    RandomModelOptions opts;
    opts.seed = seed;
    if (dtype_name == "f32") opts.dtype = DType::F32;
    else if (dtype_name == "f16") opts.dtype = DType::F16;
    else if (dtype_name == "bf16") opts.dtype = DType::BF16;
    else throw InputError("--dtype: expected f32, f16 or bf16, got '" + dtype_name + "'");
    write_random_llama(out_dir, c, opts);
    if (!tokenizer.empty()) {
        const Tokenizer tok(tokenizer);  // validates the file
        if (tok.vocab_size() != c.vocab_size)
            throw InputError(tokenizer + ": vocabulary of " + std::to_string(tok.vocab_size()) +
                             " pieces, but " + config_file + " says vocab_size " + std::to_string(c.vocab_size));
        std::filesystem::copy_file(tokenizer, std::filesystem::path(out_dir) / "tokenizer.model",
                                   std::filesystem::copy_options::overwrite_existing);
    }
    spdlog::info("wrote a random-weight model (seed {}, {}) to {}", seed, dtype_name, out_dir);
    return 0;
}

}  // namespace

int run_cli(int argc, char** argv) {
    auto logger = spdlog::stderr_color_mt("quest");
    spdlog::set_default_logger(logger);
    spdlog::set_pattern("[%^%l%$] %v");

    CLI::App app{"quest: long-context Llama decoding with Quest query-aware sparse attention"};
    app.require_subcommand(1);
    app.set_version_flag("--version", "quest 0.1.0");

    // generate
    ModelFlags gen_flags;
    std::string prompt, prompt_file;
    int n_tokens = 128;
    SamplerSettings sampling;
    auto* gen = app.add_subcommand("generate", "Generate text after a prompt (text on stdout, timings on stderr)");
    gen_flags.add(*gen);
    gen->add_option("-p,--prompt", prompt, "prompt text (empty: BOS only)");
    gen->add_option("--prompt-file", prompt_file, "read the prompt from a file");
    gen->add_option("-n,--n-tokens", n_tokens, "tokens to generate")->capture_default_str();
    gen->add_option("--temp", sampling.temperature, "sampling temperature (0: greedy)")->capture_default_str();
    gen->add_option("--top-k", sampling.top_k, "top-k (0: off)")->capture_default_str();
    gen->add_option("--top-p", sampling.top_p, "nucleus top-p (1: off)")->capture_default_str();
    auto* seed_opt = gen->add_option("--seed", sampling.seed, "sampling seed (default: random, printed)");

    // make-model
    std::string mm_config, mm_out, mm_tokenizer, mm_dtype = "f16";
    uint64_t mm_seed = 0;
    auto* mm = app.add_subcommand("make-model", "Write a deterministic random-weight Llama model (tests, demos)");
    mm->add_option("--config", mm_config, "config.json describing the model")->required();
    mm->add_option("-o,--out", mm_out, "output folder")->required();
    mm->add_option("--tokenizer", mm_tokenizer, "tokenizer.model to copy into the folder");
    mm->add_option("--seed", mm_seed, "weight seed")->capture_default_str();
    mm->add_option("--dtype", mm_dtype, "f32, f16 or bf16")->capture_default_str();

    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        const int code = app.exit(e);
        return code == 0 ? 0 : 2;
    }

    try {
        if (gen->parsed()) return cmd_generate(gen_flags, prompt, prompt_file, n_tokens, sampling, seed_opt->count() > 0);
        if (mm->parsed()) return cmd_make_model(mm_config, mm_out, mm_tokenizer, mm_seed, mm_dtype);
    } catch (const InputError& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 2;
    } catch (const ResourceError& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 2;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "internal error: %s\n", e.what());
        return 1;
    }
    return 0;
}

}  // namespace quest
