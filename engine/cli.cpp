#include "engine/cli.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <sstream>

#include <csignal>
#include <unistd.h>

#include "model/core/config.h"
#include "model/core/backend.h"
#include "model/io/model_folder.h"
#include "engine/backend_factory.h"
#include "engine/bench.h"
#include "engine/chat.h"
#include "engine/eval_cli.h"
#include "engine/generate.h"
#include "model/core/memory.h"
#include "engine/quantize_cmd.h"
#include "model/core/quest_settings.h"
#include "engine/sampler.h"
#include "engine/settings_cli.h"
#include "engine/soak.h"
#include "engine/timing.h"
#include "model/io/atomic_file.h"
#include "kernels/common/error.h"
#include "model/io/make_model.h"
#include "tokenizer/bpe.h"
#include "tokenizer/sentencepiece.h"
#include "tokenizer/tokenizer.h"

namespace quest {

namespace {

// Flags shared by the subcommands that run a model; the Quest and backend settings come from their tables
// (engine/settings_cli.h), registered once here.
struct ModelFlags {
    std::string model_dir;
    std::optional<int> context;  // -c; absent: what the request needs, up to the model's maximum
    SettingsFlags settings;
    bool profile = false;

    void add(CLI::App& app, bool model_required = true) {
        auto* m = app.add_option("-m,--model", model_dir,
                                 "model: a Hugging Face folder (config.json, safetensors, tokenizer.json/.model) or a "
                                 ".gguf file; architectures: " + supported_architectures());
        if (model_required) m->required();
        app.add_option("-c,--context", context, "KV cache capacity in tokens (default: prompt + new tokens)");
        add_settings_flags(app, settings);
    }

    // The flags' own checks, before any file is read.
    void check() const {
        if (context && *context < 1)
            throw InputError("-c: expected a positive number of tokens, got " + std::to_string(*context));
        (void)quest_settings();
        (void)backend_options(0);
    }
    int capacity_flag() const { return context.value_or(0); }

    BackendOptions backend_options(int capacity) const {
        BackendOptions o = settings.backend(capacity);
        o.profile = profile;
        return o;
    }

    QuestSettings quest_settings() const { return settings.quest(); }
};

// The prompt file: "-" reads stdin; a directory or a file that cannot be opened is an error naming the flag.
std::string read_prompt_file(const std::string& path) {
    if (path == "-") {
        std::stringstream ss;
        ss << std::cin.rdbuf();
        return ss.str();
    }
    if (std::filesystem::is_directory(path)) throw InputError("--prompt-file: " + path + " is a directory");
    std::ifstream in(path, std::ios::binary);
    if (!in) throw InputError("--prompt-file: " + path + ": cannot open");
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

// Ctrl-C: the first press stops the current answer (chat) or generation; the handler only sets this flag.
std::atomic<bool> g_interrupted{false};
extern "C" void on_sigint(int) { g_interrupted.store(true); }

void install_sigint() {
    struct sigaction sa {};
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0;  // no SA_RESTART: a blocked read returns so the REPL sees the interrupt
    sigaction(SIGINT, &sa, nullptr);
}

// Output files (--json, --csv) go through write_file_atomic (model/io/atomic_file.h): never partial, and an interrupted
// or killed run leaves no temporary behind.

int cmd_generate(const ModelFlags& mf, const std::string& prompt_in, bool prompt_given, const std::string& prompt_file,
                 int n, SamplerSettings ss, bool seed_given, const std::string& json_path) {
    // Every flag is checked before the model is opened (and the prompt file read before the weights).
    mf.check();
    const QuestSettings q = mf.quest_settings();
    if (n < 0) throw InputError("-n must be >= 0, got " + std::to_string(n));
    (void)Sampler(ss);  // --temp, --top-k, --top-p in range
    if (prompt_given && !prompt_file.empty()) throw InputError("--prompt-file: cannot be combined with -p/--prompt");
    const std::string prompt = prompt_file.empty() ? prompt_in : read_prompt_file(prompt_file);
    const ModelFolder model = open_model_folder(mf.model_dir);
    mf.settings.check_model(model.config);
    const auto tok_owner = load_model_tokenizer(model);
    const Tokenizer& tok = *tok_owner;
    check_tokenizer_vocab(tok, model);
    const std::vector<int> end_of_turn = tok.end_of_turn_ids();
    std::vector<int> ids = tok.encode(prompt, /*add_bos=*/true);
    if (ids.empty()) {  // an empty prompt with a tokenizer that adds nothing (byte-level BPE): BOS alone, if any
        if (tok.bos_id() < 0)
            throw InputError("-p: the prompt is empty and " + tok.file().string() +
                             "'s tokenizer has no BOS to start from: give a prompt");
        ids.push_back(tok.bos_id());
    }
    const int max_ctx = model.config.max_context();
    const int ctx_flag = mf.capacity_flag();
    // In 64 bits: -n 2147483647 overflowed int here (UBSan).
    int capacity = ctx_flag > 0 ? ctx_flag
                                : static_cast<int>(std::min<int64_t>(static_cast<int64_t>(ids.size()) + n, max_ctx));
    check_context(model.config, ctx_flag, "-c " + std::to_string(ctx_flag));
    if (static_cast<int>(ids.size()) > capacity)
        throw InputError("the prompt has " + std::to_string(ids.size()) + " tokens but the context holds " +
                         std::to_string(capacity) + " (model maximum " + std::to_string(max_ctx) + ")");
    if (!seed_given) ss.seed = std::random_device{}();

    Stopwatch load;
    auto backend = create_backend(model, mf.backend_options(capacity));
    spdlog::info("loaded {} ({} layers, {} heads / {} KV heads, head_dim {}) on {} in {:.0f} ms; {}; seed {}",
                 mf.model_dir, model.config.num_layers, model.config.num_heads, model.config.num_kv_heads,
                 model.config.head_dim, backend->name(), load.ms(), q.describe(), ss.seed);

    Sampler sampler(ss);
    StreamingDecoder stream(tok);
    std::string text;
    install_sigint();
    backend->set_interrupt([] { return g_interrupted.load(); });  // Ctrl-C also stops a long prefill
    // Generation ends at EOS or an end-of-turn token of the tokenizer (<|im_end|>, <|eot_id|>, ...).
    const GenerateResult r = generate(
        *backend, sampler, ids, n,
        [&](int token) {
            if (g_interrupted.load()) return false;
            if (model.config.is_eos(token) ||
                std::find(end_of_turn.begin(), end_of_turn.end(), token) != end_of_turn.end())
                return true;
            const std::string piece = stream.push(token);
            text += piece;
            std::fwrite(piece.data(), 1, piece.size(), stdout);
            std::fflush(stdout);
            return true;
        },
        /*stop_at_eos=*/true, end_of_turn);
    const std::string rest = stream.flush();
    text += rest;
    std::fwrite(rest.data(), 1, rest.size(), stdout);
    std::fputc('\n', stdout);
    std::fflush(stdout);
    if (r.stop_reason == "context_full")
        spdlog::warn("stopped: the context is full ({} tokens); raise it with -c", backend->capacity());
    print_summary(r, *backend);
    if (!json_path.empty()) {
        const LatencyStats st = summarize_latency(r.decode_ms);
        const nlohmann::json j = {{"model", mf.model_dir},
                                  {"backend", backend->name()},
                                  {"attention", q.describe()},
                                  {"seed", ss.seed},
                                  {"prompt_tokens", ids},
                                  {"tokens", r.tokens},
                                  {"text", text},
                                  {"stop_reason", r.stop_reason},
                                  {"prefill_ms", r.prefill_ms},
                                  {"decode_ms", r.decode_ms},
                                  {"decode_p50_ms", st.p50},
                                  {"decode_p90_ms", st.p90},
                                  {"decode_mean_ms", st.mean}};
        write_file_atomic(json_path, j.dump(2) + "\n");
    }
    return 0;
}

struct BenchFlags {
    bool random_weights = false;
    std::string contexts = "4096", budgets = "full,2048";
    int steps = 64, warmup = 8;
    uint64_t seed = 1;
    std::string json, csv, plot, text;
    std::string weights;  // --weights: fp16, int4, int4-g<G> (comma-separated; empty: as stored)
};

int cmd_bench(const ModelFlags& mf, const BenchFlags& bf) {
    mf.check();
    if (!bf.plot.empty()) check_plot_dependency();  // before the run, not after it
    mf.settings.check_model(open_model_or_config(mf.model_dir, bf.random_weights).config);
    BenchRequest r;
    r.model = mf.model_dir;
    r.random_weights = bf.random_weights;
    r.backend = mf.backend_options(0);
    r.contexts = parse_int_list(bf.contexts, "--contexts", false);
    r.budgets = parse_int_list(bf.budgets, "--budgets", true);
    r.steps = bf.steps;
    r.warmup = bf.warmup;
    r.seed = bf.seed;
    r.text_file = bf.text;
    r.weights = parse_weights_list(bf.weights);
    const auto rows = run_bench(r, [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); });
    std::fputs(bench_table(rows).c_str(), stdout);
    if (!bf.json.empty()) write_file_atomic(bf.json, bench_json(rows));
    if (!bf.csv.empty()) write_file_atomic(bf.csv, bench_csv(rows));
    if (!bf.plot.empty()) {  // latency vs context, one line per budget and weight type (tools/plot_bench.py)
        const std::string json = bf.json.empty() ? bf.plot + ".json" : bf.json;
        if (bf.json.empty()) write_file_atomic(json, bench_json(rows));
        const std::string script = std::string(QUEST_SOURCE_DIR) + "/tools/plot_bench.py";
        const std::string cmd = "python3 '" + script + "' '" + json + "' '" + bf.plot + "'";
        if (std::system(cmd.c_str()) != 0)
            throw InputError("--plot: '" + cmd + "' failed (needs python3 with matplotlib)");
        if (bf.json.empty()) std::filesystem::remove(json);
    }
    return 0;
}

struct SoakFlags {
    bool random_weights = false;
    int prompt_tokens = 16, bucket = 4096;
    long tokens = 100000;
    double time_limit = 0;
    uint64_t seed = 1;
    std::string csv;
};

int cmd_soak(const ModelFlags& mf, const SoakFlags& sf) {
    mf.check();
    mf.settings.check_model(open_model_or_config(mf.model_dir, sf.random_weights).config);
    SoakRequest r;
    r.model = mf.model_dir;
    r.random_weights = sf.random_weights;
    r.backend = mf.backend_options(mf.capacity_flag());
    r.prompt_tokens = sf.prompt_tokens;
    r.tokens = sf.tokens;
    r.bucket = sf.bucket;
    r.time_limit_s = sf.time_limit;
    r.seed = sf.seed;
    install_sigint();
    const SoakResult res = run_soak(
        r, [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); },
        [] { return g_interrupted.load(); });
    std::fputs(soak_summary(res).c_str(), stderr);
    if (!sf.csv.empty()) write_file_atomic(sf.csv, soak_csv(res));
    if (!res.ok()) return 1;
    return res.stop_reason == "interrupted" ? 130 : 0;
}

struct ChatFlags {
    int max_tokens = 512;
    std::string system, format = "auto";
    SamplerSettings sampling;
    bool seed_given = false;
};

int cmd_chat(const ModelFlags& mf, ChatFlags cf) {
    mf.check();
    (void)Sampler(cf.sampling);  // --temp, --top-k, --top-p in range
    const std::optional<ChatFormat> format_flag = parse_chat_format(cf.format);  // before the model is opened
    const ModelFolder model = open_model_folder(mf.model_dir);
    mf.settings.check_model(model.config);
    const auto tok_owner = load_model_tokenizer(model);
    const Tokenizer& tok = *tok_owner;
    check_tokenizer_vocab(tok, model);
    const int capacity = mf.capacity_flag() > 0 ? mf.capacity_flag() : model.config.max_context();
    check_context(model.config, capacity, "-c " + std::to_string(capacity));
    // The model's chat template picks the format (ChatML, Llama-3, Llama-2; none: a base model, plain
    // continuation); --format overrides it.
    const std::string chat_template = model_chat_template(model);
    bool unknown_template = false;
    ChatFormat format = detect_chat_format(chat_template, &unknown_template);
    if (format_flag) format = *format_flag;
    else if (unknown_template)
        std::fprintf(stderr, "note: %s: the chat template is none of ChatML, Llama-3 or Llama-2 (recognised by their "
                             "tokens): plain continuation (--format chooses one)\n",
                     (model.is_gguf() ? model.dir : model.dir / "tokenizer_config.json").string().c_str());
    // A ChatML template's own system message when none is given (SmolLM2's "You are a helpful AI assistant ...").
    const std::string system = !cf.system.empty() || format != ChatFormat::ChatML
                                   ? cf.system
                                   : chat_template_default_system(chat_template);
    if (!cf.seed_given) cf.sampling.seed = std::random_device{}();
    auto backend = create_backend(model, mf.backend_options(capacity));
    Sampler sampler(cf.sampling);
    ChatSession chat(*backend, tok, sampler, format, system);
    const bool tty = isatty(STDIN_FILENO);
    spdlog::info("chat with {} on {} ({} format, context {} tokens, {}); /help lists the commands, Ctrl-D to quit",
                 mf.model_dir, backend->name(), chat_format_label(format),
                 backend->capacity(), backend->quest().describe());
    install_sigint();
    backend->set_interrupt([] { return g_interrupted.load(); });  // Ctrl-C also stops a long prefill
    std::string line;
    while (true) {
        if (tty) {
            std::fputs("> ", stdout);
            std::fflush(stdout);
        }
        g_interrupted.store(false);
        if (!std::getline(std::cin, line)) {
            if (g_interrupted.load() && !std::feof(stdin)) {  // Ctrl-C at the prompt, not the end of the input
                std::clearerr(stdin);
                std::cin.clear();
                if (tty) std::fputc('\n', stdout);  // a fresh prompt
                continue;
            }
            if (tty) std::fputc('\n', stdout);  // Ctrl-D: leave the prompt line
            break;  // Ctrl-D or end of the piped input
        }
        const ChatCommand command = parse_chat_command(line);
        if (command == ChatCommand::Quit) break;
        if (command == ChatCommand::Unknown) {  // never sent to the model
            const std::string word = line.substr(0, line.find_first_of(" \t"));
            std::fprintf(stderr, "unknown command %s, /help lists them\n", word.c_str());
            continue;
        }
        if (command == ChatCommand::Help) {
            std::fputs(chat_help().c_str(), stderr);
            continue;
        }
        if (command == ChatCommand::Text && line.rfind("//", 0) == 0) line.erase(0, 1);
        if (command == ChatCommand::Reset) {
            chat.reset();
            std::fprintf(stderr, "(conversation reset)\n");
            continue;
        }
        if (command == ChatCommand::Stats) {
            const GenerateResult& r = chat.last();
            const LatencyStats s = summarize_latency(r.decode_ms);
            std::fprintf(stderr, "last answer: prefill %d tokens in %.2f ms; %zu tokens, decode p50 %.3f ms/token, "
                                 "p90 %.3f; context %d/%d; stop %s\n",
                         r.prompt_tokens, r.prefill_ms, r.tokens.size(), s.p50, s.p90, backend->position(),
                         backend->capacity(), r.stop_reason.empty() ? "-" : r.stop_reason.c_str());
            continue;
        }
        if (line.empty()) continue;
        try {
            const GenerateResult r = chat.answer(line, cf.max_tokens, [](const std::string& text) {
                std::fwrite(text.data(), 1, text.size(), stdout);
                std::fflush(stdout);
            }, &g_interrupted);
            std::fputc('\n', stdout);
            std::fflush(stdout);
            if (r.stop_reason == "stopped") std::fprintf(stderr, "(stopped)\n");
            if (r.stop_reason == "context_full")
                std::fprintf(stderr, "(the context is full: /reset to start a new conversation)\n");
        } catch (const ResourceError& e) {
            std::fprintf(stderr, "error: %s\n", e.what());
        } catch (const Interrupted&) {  // Ctrl-C during the prefill: the conversation is as before this message
            std::fputc('\n', stdout);
            std::fflush(stdout);
            std::fprintf(stderr, "(interrupted: this message was not added to the conversation)\n");
        }
    }
    return 0;
}

// Token ids of a text, as llama.cpp's llama-tokenize prints them: one "id -> 'piece'" per line (the piece as the text
// it stands for; special tokens by their name), or with --ids one Python-style list.
int cmd_tokenize(const std::string& model_path, const std::string& text, bool ids_only, bool no_bos) {
    const ModelFolder model = open_model_folder(model_path);
    const auto tok = load_model_tokenizer(model);
    check_tokenizer_vocab(*tok, model);
    const std::vector<int> ids = tok->encode(text, /*add_bos=*/!no_bos);
    std::string out;
    if (ids_only) {
        out = "[";
        for (size_t i = 0; i < ids.size(); ++i) out += (i ? ", " : "") + std::to_string(ids[i]);
        out += "]\n";
    } else {
        char num[32];
        for (int id : ids) {
            std::snprintf(num, sizeof num, "%6d", id);
            out += std::string(num) + " -> '" + (tok->is_control(id) ? tok->piece(id) : tok->token_bytes(id)) + "'\n";
        }
    }
    std::fwrite(out.data(), 1, out.size(), stdout);
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
        // A tokenizer.json (byte-level BPE, with the tokenizer_config.json beside it when there is one) or a
        // SentencePiece tokenizer.model; loading validates the file.
        const std::filesystem::path src(tokenizer);
        const bool is_json = src.extension() == ".json";
        const std::unique_ptr<Tokenizer> tok =
            is_json ? std::unique_ptr<Tokenizer>(std::make_unique<BpeTokenizer>(BpeTokenizer::from_json_file(src)))
                    : std::make_unique<SentencePieceTokenizer>(src);
        if (tok->vocab_size() != c.vocab_size)
            throw InputError(tokenizer + ": vocabulary of " + std::to_string(tok->vocab_size()) +
                             " pieces, but " + config_file + " says vocab_size " + std::to_string(c.vocab_size));
        const std::filesystem::path out(out_dir);
        copy_file_atomic(tokenizer, out / (is_json ? "tokenizer.json" : "tokenizer.model"));
        const auto config_json = src.parent_path() / "tokenizer_config.json";
        if (is_json && std::filesystem::exists(config_json))
            copy_file_atomic(config_json, out / "tokenizer_config.json");
    }
    spdlog::info("wrote a random-weight model (seed {}, {}) to {}", seed, dtype_name, out_dir);
    return 0;
}

}  // namespace

std::vector<int> parse_int_list(const std::string& s, const std::string& flag, bool allow_full) {
    std::vector<int> out;
    std::stringstream ss(s);
    std::string item;
    while (std::getline(ss, item, ',')) {
        if (allow_full && item == "full") {
            out.push_back(0);
            continue;
        }
        try {
            size_t used = 0;
            const int v = std::stoi(item, &used);
            if (used != item.size() || v < 1) throw std::invalid_argument(item);
            out.push_back(v);
        } catch (const std::exception&) {
            throw InputError(flag + ": expected a comma-separated list of positive integers" +
                             std::string(allow_full ? " or 'full'" : "") + ", got '" + item + "'");
        }
    }
    if (out.empty()) throw InputError(flag + ": empty list");
    return out;
}

void check_plot_dependency() {
    if (std::system("python3 -c 'import matplotlib' >/dev/null 2>&1") != 0)
        throw InputError("--plot: needs python3 with matplotlib (Debian: python3-matplotlib)");
}

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
    auto* prompt_opt = gen->add_option("-p,--prompt", prompt, "prompt text (empty: BOS only)");
    gen->add_option("--prompt-file", prompt_file, "read the prompt from a file (-: stdin)");
    gen->add_option("-n,--n-tokens", n_tokens, "tokens to generate")->capture_default_str();
    gen->add_option("--temp", sampling.temperature, "sampling temperature (0: greedy)")->capture_default_str();
    gen->add_option("--top-k", sampling.top_k, "top-k (0: off)")->capture_default_str();
    gen->add_option("--top-p", sampling.top_p, "nucleus top-p (1: off)")->capture_default_str();
    auto* seed_opt = gen->add_option("--seed", sampling.seed, "sampling seed (default: random, printed)");
    std::string gen_json;
    gen->add_option("--json", gen_json, "write tokens, text and timings as JSON");

    // make-model
    std::string mm_config, mm_out, mm_tokenizer, mm_dtype = "f16";
    uint64_t mm_seed = 0;
    auto* mm = app.add_subcommand("make-model", "Write a deterministic random-weight Llama model (tests, demos)");
    mm->add_option("--config", mm_config, "config.json describing the model")->required();
    mm->add_option("-o,--out", mm_out, "output folder")->required();
    mm->add_option("--tokenizer", mm_tokenizer, "tokenizer.model or tokenizer.json to copy into the folder");
    mm->add_option("--seed", mm_seed, "weight seed")->capture_default_str();
    mm->add_option("--dtype", mm_dtype, "f32, f16 or bf16")->capture_default_str();

    // bench
    ModelFlags bench_flags;
    BenchFlags bf;
    auto* bench = app.add_subcommand("bench", "Decode latency over contexts x budgets (table on stdout, JSON/CSV files)");
    bench_flags.add(*bench);
    bench->add_flag("--random-weights", bf.random_weights,
                    "-m names a config.json (or a folder's config): weights are random, generated on the device");
    bench->add_option("--contexts", bf.contexts, "comma-separated context lengths")->capture_default_str();
    bench->add_option("--budgets", bf.budgets, "comma-separated Quest budgets, 'full' for full attention")
        ->capture_default_str();
    bench->add_option("--steps", bf.steps, "timed decode steps per row")->capture_default_str();
    bench->add_option("--warmup", bf.warmup, "untimed decode steps before timing")->capture_default_str();
    bench->add_option("--seed", bf.seed, "seed of the random prompt and weights")->capture_default_str();
    bench->add_option("--json", bf.json, "write the rows as JSON");
    bench->add_option("--csv", bf.csv, "write the rows as CSV");
    bench->add_flag("--breakdown", bench_flags.profile,
                    "cuda: time the decode step per kernel group (eager launches; printed per row)");
    bench->add_option("--plot", bf.plot, "draw latency vs context as PNG (python3 + matplotlib)");
    bench->add_option("--text", bf.text, "prefill with this text's tokens (repeated) instead of random ids");
    bench->footer(
        "Columns (one row per context x budget x weights):\n"
        "  backend, policy   the backend; the page selector and its options (S = page size)\n"
        "  weights           the linear layers as the backend holds them: fp16 / int4-g<G> (cuda), fp32 (cpu: float\n"
        "                    checkpoints; int4 rows hold the dequantized int4 values in fp32)\n"
        "  context, budget   prefilled tokens; Quest token budget per step and layer ('full': no Quest)\n"
        "  p50_ms .. mean_ms decode step latency over --steps timed steps (after --warmup)\n"
        "  tok/s             1000 / mean_ms\n"
        "  GB/step           bytes one decode step reads: the weights (cpu: 4 bytes per parameter) + attn_KiB\n"
        "  GB/s              GB/step / p50 (under --tp every GPU's reads: GB/s / gpus per GPU)\n"
        "  prefill_s         the prefill of the context\n"
        "  attn_KiB          attention bytes per step, every layer: dense layers' K and V, Quest layers' metadata and\n"
        "                    selected pages (model/core/step_bytes.h's bytes model, K/V counted in fp16 on both\n"
        "                    backends; cpu: counted as it reads, cuda: the model)\n"
        "  meta_KiB          the page-metadata part of attn_KiB (page bounds scored; the oracle's key pass)\n"
        "  mem_GiB           cuda: device memory held (peak); cpu: host memory of the memory plan (weights + KV cache\n"
        "                    + metadata + activations); under --tp summed over the GPUs\n"
        "  gpus              --tp: the GPUs the model is split over (one rank each, NCCL)");
    bench->add_option("--weights", bf.weights,
                      "comma-separated linear-layer formats, rows side by side: fp16, int4 (group 128), int4-g64, ... "
                      "(FP16 checkpoints are quantized on load; --random-weights draws int4 on the device)");

    // quantize
    QuantizeFlags qf;
    auto* qz = add_quantize_subcommand(app, qf);

    // soak
    ModelFlags soak_flags;
    SoakFlags sf;
    auto* soak = app.add_subcommand("soak", "Long greedy decode: every step's logits checked finite, latency per bucket "
                                            "of positions against the bytes model (summary on stderr, CSV file)");
    soak_flags.add(*soak);
    soak->add_flag("--random-weights", sf.random_weights,
                   "-m names a config.json (or a folder's config): weights are random, generated on the device");
    soak->add_option("--tokens", sf.tokens, "greedy decode steps")->capture_default_str();
    soak->add_option("--prompt-tokens", sf.prompt_tokens, "random prompt tokens prefilled first (BOS included)")
        ->capture_default_str();
    soak->add_option("--bucket", sf.bucket, "positions per latency bucket")->capture_default_str();
    soak->add_option("--time-limit", sf.time_limit, "stop cleanly after this many seconds (0: no limit)")
        ->capture_default_str();
    soak->add_option("--seed", sf.seed, "seed of the random prompt and weights")->capture_default_str();
    soak->add_option("--csv", sf.csv, "write the buckets as CSV");

    // chat
    ModelFlags chat_flags;
    ChatFlags cf;
    auto* chat = app.add_subcommand("chat", "Interactive chat (the chat model's format: ChatML, Llama-3 or Llama-2; "
                                            "plain continuation for base models); one prompt per line when piped");
    chat_flags.add(*chat);
    chat->add_option("-n,--max-tokens", cf.max_tokens, "longest answer in tokens")->capture_default_str();
    chat->add_option("--system", cf.system, "system prompt (chat models)");
    chat->add_option("--format", cf.format,
                     "auto (from the model's chat template), chatml, llama3, llama2 or plain")
        ->capture_default_str();
    chat->add_option("--temp", cf.sampling.temperature, "sampling temperature (0: greedy)")->capture_default_str();
    chat->add_option("--top-k", cf.sampling.top_k, "top-k (0: off)")->capture_default_str();
    chat->add_option("--top-p", cf.sampling.top_p, "nucleus top-p (1: off)")->capture_default_str();
    auto* chat_seed = chat->add_option("--seed", cf.sampling.seed, "sampling seed (default: random)");

    // eval
    EvalCommand eval = add_eval_command(app);

    // tokenize
    std::string tk_model, tk_prompt;
    bool tk_ids = false, tk_no_bos = false;
    auto* tk = app.add_subcommand("tokenize", "Print the token ids of a text (as llama-tokenize: id -> 'piece' per line)");
    tk->add_option("-m,--model", tk_model, "a model folder or a .gguf file (only its tokenizer is read)")->required();
    tk->add_option("-p,--prompt", tk_prompt, "the text")->required();
    tk->add_flag("--ids", tk_ids, "print the ids only, as a Python list");
    tk->add_flag("--no-bos", tk_no_bos, "add nothing around the text (default: what the tokenizer adds, e.g. BOS)");

    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        // `quest foo`: CLI11 would say "A subcommand is required"; name the word and the subcommands instead.
        if (argc > 1 && argv[1][0] != '-') {
            bool known = false;
            std::string names;
            for (const CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) {
                known = known || sub->get_name() == argv[1];
                names += (names.empty() ? "" : ", ") + sub->get_name();
            }
            if (!known) {
                std::fprintf(stderr, "error: unknown subcommand '%s' (expected one of: %s; quest --help)\n", argv[1],
                             names.c_str());
                return 2;
            }
        }
        const int code = app.exit(e);
        return code == 0 ? 0 : 2;
    }

    try {
        if (gen->parsed())
            return cmd_generate(gen_flags, prompt, prompt_opt->count() > 0, prompt_file, n_tokens, sampling,
                                seed_opt->count() > 0, gen_json);
        if (bench->parsed()) return cmd_bench(bench_flags, bf);
        if (soak->parsed()) return cmd_soak(soak_flags, sf);
        if (eval.app->parsed()) return eval.run();
        if (chat->parsed()) {
            cf.seed_given = chat_seed->count() > 0;
            return cmd_chat(chat_flags, cf);
        }
        if (qz->parsed()) return cmd_quantize(qf);
        if (tk->parsed()) return cmd_tokenize(tk_model, tk_prompt, tk_ids, tk_no_bos);
        if (mm->parsed()) return cmd_make_model(mm_config, mm_out, mm_tokenizer, mm_seed, mm_dtype);
    } catch (const InputError& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 2;
    } catch (const ResourceError& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 2;
    } catch (const Interrupted& e) {  // Ctrl-C during a prefill (generate): nothing was written
        std::fprintf(stderr, "interrupted: %s\n", e.what());
        return 130;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "internal error: %s\n", e.what());
        return 1;
    }
    return 0;
}

}  // namespace quest
