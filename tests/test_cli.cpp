// The `quest` binary end to end: exit codes and one-line messages for bad input, and the demo model running.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sys/wait.h>

#include "engine/chat.h"
#include "model/core/config.h"
#include "model/io/make_model.h"
#include "test_util.h"

using namespace quest;
using ::testing::HasSubstr;
using ::testing::Not;

namespace {

using test::run_quest;
using test::RunResult;

std::filesystem::path small_model(const std::string& name) {
    const auto dir = test::temp_dir(name);
    const ModelConfig c = parse_model_config(
        R"({"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 3, "num_attention_heads": 4,
            "num_key_value_heads": 2, "vocab_size": 512, "max_position_embeddings": 256})",
        "inline");
    write_random_llama(dir, c, {5, DType::F16});
    std::filesystem::copy_file(test::source_dir() / "tests/fixtures/tokenizer/demo-512.model", dir / "tokenizer.model");
    return dir;
}

}  // namespace

TEST(Cli, GenerateOnDemoModel) {
    const RunResult r = run_quest("generate -m '" + test::demo_model_dir().string() +
                                  "' -p 'Once upon a time' -n 40 --temp 0 --budget 32 --page-size 8");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_FALSE(r.out.empty());
    EXPECT_THAT(r.err, HasSubstr("decode: 40 tokens generated"));
    EXPECT_THAT(r.err, HasSubstr("p50"));
    EXPECT_THAT(r.err, HasSubstr("sparq B=32 S=8"));  // the default selector
}

TEST(Cli, GreedyIsReproducibleAndSeedsToo) {
    const auto m = small_model("cli_repro");
    const std::string base = "generate -m '" + m.string() + "' -p 'hello' -n 20 ";
    EXPECT_EQ(run_quest(base + "--temp 0").out, run_quest(base + "--temp 0").out);
    EXPECT_EQ(run_quest(base + "--temp 1 --seed 5").out, run_quest(base + "--temp 1 --seed 5").out);
}

TEST(Cli, TruncatedModelFolderExitsNonZeroNamingTheFile) {
    const auto m = small_model("cli_trunc");
    std::filesystem::resize_file(m / "model.safetensors", 1000);
    const RunResult r = run_quest("generate -m '" + m.string() + "' -p hi -n 4");
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_THAT(r.err, HasSubstr("model.safetensors"));
    EXPECT_THAT(r.err, HasSubstr("error: "));
}

TEST(Cli, MissingPiecesOfAModelFolder) {
    const auto m = small_model("cli_missing");
    std::filesystem::remove(m / "tokenizer.model");
    RunResult r = run_quest("generate -m '" + m.string() + "' -p hi -n 4");
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_THAT(r.err, HasSubstr("tokenizer.model"));
    r = run_quest("generate -m /nonexistent/model -p hi -n 4");
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_THAT(r.err, HasSubstr("/nonexistent/model"));
    std::filesystem::remove(m / "config.json");
    r = run_quest("generate -m '" + m.string() + "' -p hi -n 4");
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_THAT(r.err, HasSubstr("config.json"));
}

TEST(Cli, UnknownArchitectureIsOneLineNamingTheFileAndTheList) {
    const auto m = small_model("cli_arch");
    std::string cfg;
    {
        std::ifstream in(m / "config.json");
        cfg.assign(std::istreambuf_iterator<char>(in), {});
    }
    const size_t at = cfg.find("\"LlamaForCausalLM\"");
    ASSERT_NE(at, std::string::npos);
    cfg.replace(at, 18, "\"GPTNeoXForCausalLM\"");
    std::ofstream(m / "config.json") << cfg;
    const RunResult r = run_quest("generate -m '" + m.string() + "' -p hi -n 4");
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_THAT(r.err, HasSubstr("error: " + (m / "config.json").string() +
                                 ": field 'architectures': unsupported architecture [\"GPTNeoXForCausalLM\"] "
                                 "(supported: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM)\n"));
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
}

TEST(Cli, BadFlagsExitTwo) {
    const auto m = small_model("cli_flags");
    const std::string base = "generate -m '" + m.string() + "' -p hi -n 4 ";
    RunResult r = run_quest(base + "--page-size 12");
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_THAT(r.err, HasSubstr("page_size must be a power of two"));
    r = run_quest(base + "--budget 8 --page-size 16");
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_THAT(r.err, HasSubstr("smaller than one page"));
    r = run_quest(base + "--no-such-flag");
    EXPECT_EQ(r.exit_code, 2);
    r = run_quest(base + "--temp -1");
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_THAT(r.err, HasSubstr("--temp"));
}

// --tp on every subcommand: a number of GPUs in [1, 64], for the CUDA backend only; one line, exit 2.
TEST(Cli, TensorParallelFlag) {
    const auto m = small_model("cli_tp");
    for (const char* cmd : {"generate -p hi -n 4", "bench --contexts 16 --budgets full --steps 1", "eval passkey --contexts 64 --samples 1"}) {
        const std::string base = std::string(cmd) + " -m '" + m.string() + "' ";
        RunResult r = run_quest(base + "--backend cpu --tp 2");
        EXPECT_EQ(r.exit_code, 2) << cmd;
        EXPECT_EQ(r.err, "error: --tp 2: tensor parallelism runs on --backend cuda\n") << cmd;
        r = run_quest(base + "--tp 0");
        EXPECT_EQ(r.exit_code, 2) << cmd;
        EXPECT_THAT(r.err, HasSubstr("--tp")) << cmd;
        r = run_quest(base + "--tp 65");
        EXPECT_EQ(r.exit_code, 2) << cmd;
        EXPECT_THAT(r.err, HasSubstr("--tp")) << cmd;
    }
}

TEST(Cli, EmptyPromptMeansBos) {
    const auto m = small_model("cli_empty");
    const RunResult r = run_quest("generate -m '" + m.string() + "' -p '' -n 3 --temp 0");
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_THAT(r.err, HasSubstr("prefill: 1 tokens"));
}

TEST(Cli, BenchWritesJsonRowsOnTheCpu) {
    const auto dir = test::temp_dir("cli_bench");
    const RunResult r = run_quest("bench -m '" + test::demo_model_dir().string() +
                                  "' --backend cpu --contexts 40,70 --budgets full,16 --page-size 8 --steps 3 "
                                  "--warmup 1 --json '" + (dir / "b.json").string() + "' --csv '" +
                                  (dir / "b.csv").string() + "'");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    std::ifstream in(dir / "b.json");
    const std::string json((std::istreambuf_iterator<char>(in)), {});
    for (const char* key : {"\"context\"", "\"budget\"", "\"weights\"", "\"p50\"", "\"p90\"", "\"mean\"", "\"gbps\"",
                            "\"prefill_s\"", "\"full\""})
        EXPECT_THAT(json, HasSubstr(key));
    EXPECT_THAT(r.out, HasSubstr("p50_ms"));
    // 2 contexts x 2 budgets: 4 rows (+ header) in the CSV.
    std::ifstream csv(dir / "b.csv");
    int lines = 0;
    for (std::string l; std::getline(csv, l);) ++lines;
    EXPECT_EQ(lines, 5);
}

TEST(Cli, BenchReportsTheBytesModelOfEveryPolicy) {
    // demo-random: 4 layers (2 dense), 2 KV heads, head_dim 32. Context 70 + 1 warm-up + 2 steps: positions 71..73.
    const auto dir = test::temp_dir("cli_bench_policy");
    for (const char* sel : {"quest", "two-level --metadata int8"}) {
        const RunResult r = run_quest("bench -m '" + test::demo_model_dir().string() +
                                      "' --backend cpu --contexts 70 --budgets full,16 --page-size 8 --steps 2 "
                                      "--warmup 1 --selector " + sel + " --json '" + (dir / "b.json").string() + "'");
        ASSERT_EQ(r.exit_code, 0) << r.err;
        std::ifstream in(dir / "b.json");
        const auto rows = nlohmann::json::parse(in);
        ASSERT_EQ(rows.size(), 2u);
        // Full attention: every token of 4 layers x 2 KV heads x 128 bytes, at lengths 72 and 73 (the timed steps).
        EXPECT_DOUBLE_EQ(rows[0]["attention_bytes"].get<double>(), (72 + 73) / 2.0 * 4 * 2 * 128);
        EXPECT_EQ(rows[0]["metadata_bytes"].get<double>(), 0.0);
        EXPECT_GT(rows[1]["metadata_bytes"].get<double>(), 0.0);
        EXPECT_LT(rows[1]["attention_bytes"].get<double>(), rows[0]["attention_bytes"].get<double>());
        EXPECT_EQ(rows[1]["selector"].get<std::string>(), std::string(sel).find("two") == 0 ? "two-level+int8+S8" : "quest+S8");
    }
}

TEST(Cli, BenchRejectsBadLists) {
    const RunResult r = run_quest("bench -m '" + test::demo_model_dir().string() + "' --contexts 4k --budgets full");
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_THAT(r.err, HasSubstr("--contexts"));
}

TEST(Cli, ScriptedChatOverAPipe) {
    const auto m = small_model("cli_chat");
    const auto dir = test::temp_dir("cli_chat_in");
    std::ofstream(dir / "in.txt") << "hello there\n/stats\nand more\n/reset\nagain\n";
    const RunResult r = run_quest("chat -m '" + m.string() + "' -n 5 --temp 0 < '" + (dir / "in.txt").string() + "'");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    int answers = 0;
    for (char ch : r.out) answers += ch == '\n';
    EXPECT_GE(answers, 3);  // one line per prompt (an answer may hold newlines itself)
    EXPECT_THAT(r.err, HasSubstr("last answer: prefill"));
    EXPECT_THAT(r.err, HasSubstr("(conversation reset)"));
}

TEST(Cli, GenerateJsonHasTokensTextAndTimings) {
    const auto m = small_model("cli_json");
    const auto dir = test::temp_dir("cli_json_out");
    const RunResult r = run_quest("generate -m '" + m.string() + "' -p 'hello' -n 6 --temp 0 --json '" +
                                  (dir / "g.json").string() + "'");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    std::ifstream in(dir / "g.json");
    const std::string json((std::istreambuf_iterator<char>(in)), {});
    for (const char* key : {"\"tokens\"", "\"text\"", "\"prefill_ms\"", "\"decode_ms\"", "\"decode_p50_ms\"",
                            "\"stop_reason\": \"max_tokens\"", "\"prompt_tokens\""})
        EXPECT_THAT(json, HasSubstr(key));
    EXPECT_FALSE(std::filesystem::exists(dir / "g.json.tmp")) << "written through a temporary file";
}

TEST(Cli, ContextBeyondTheModelMaximumIsRefused) {
    const auto m = small_model("cli_ctx");  // max_position_embeddings 256, no rope scaling
    const RunResult r = run_quest("generate -m '" + m.string() + "' -p hi -n 4 -c 100000");
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_THAT(r.err, HasSubstr("exceeds the model's maximum context of 256"));
}

TEST(Cli, BenchPrefillsFromAText) {
    const auto dir = test::temp_dir("cli_bench_text");
    std::ofstream(dir / "t.txt") << "The little fox ran into the woods to find the old tree.";
    const RunResult r = run_quest("bench -m '" + test::demo_model_dir().string() +
                                  "' --contexts 100 --budgets 16 --page-size 8 --steps 2 --warmup 0 --text '" +
                                  (dir / "t.txt").string() + "'");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_THAT(r.out, HasSubstr("p50_ms"));
    const RunResult bad = run_quest("bench -m '" + test::demo_model_dir().string() +
                                    "' --contexts 100 --budgets full --text /nonexistent/t.txt");
    EXPECT_EQ(bad.exit_code, 2);
    EXPECT_THAT(bad.err, HasSubstr("/nonexistent/t.txt"));
}

TEST(Cli, BenchPlotWhenMatplotlibIsThere) {
    if (std::system("python3 -c 'import matplotlib' >/dev/null 2>&1") != 0)
        GTEST_SKIP() << "SKIPPED: python3 with matplotlib is not installed (bench --plot needs it)";
    const auto dir = test::temp_dir("cli_plot");
    const RunResult r = run_quest("bench -m '" + test::demo_model_dir().string() +
                                  "' --contexts 40,80 --budgets full,16 --page-size 8 --steps 2 --warmup 0 --plot '" +
                                  (dir / "p.png").string() + "'");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_GT(std::filesystem::file_size(dir / "p.png"), 1000u);
}

// The front door: every bad flag is one line "error: ..." naming the flag, exit 2, before any model file is read,
// and nothing written.
TEST(Cli, FlagChecksBeforeTheModelLoads) {
    const auto m = small_model("cli_front");  // 3 layers
    const auto dir = test::temp_dir("cli_front_out");
    const std::string json = (dir / "g.json").string();
    const std::string ok = "generate -m '" + m.string() + "' -n 2 --temp 0 --json '" + json + "' ";
    // A model folder that does not exist: the flag error comes first, so nothing was opened.
    const std::string none = "generate -m /nonexistent/model -n 2 --json '" + json + "' ";
    auto expect_error = [&](const std::string& args, const std::string& message) {
        SCOPED_TRACE(args);
        const RunResult r = run_quest(args);
        EXPECT_EQ(r.exit_code, 2);
        EXPECT_THAT(r.err, HasSubstr("error: " + message));
        EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
        EXPECT_TRUE(r.out.empty());
        EXPECT_FALSE(std::filesystem::exists(json));
    };
    expect_error(none + "-p hi -c 0", "-c: expected a positive number of tokens");
    expect_error(none + "-p hi -c -5", "-c: expected a positive number of tokens");
    expect_error(none + "-p hi --temp -1", "--temp");
    expect_error(none + "-p hi --top-p 1.5", "--top-p");
    expect_error(none + "-p hi --top-k -1", "--top-k");
    expect_error(none + "-p hi --page-size 512", "--page-size: expected an integer between 1 and 256, got '512'");
    expect_error(none + "-p hi --selector h2o", "--selector: expected one of quest, streaming, oracle, two-level");
    expect_error(none + "-p hi --memory-limit lots", "--memory-limit: expected a size in bytes");
    std::ofstream(dir / "prompt.txt") << "hello";
    expect_error(none + "-p hi --prompt-file '" + (dir / "prompt.txt").string() + "'",
                 "--prompt-file: cannot be combined with -p/--prompt");
    expect_error(none + "--prompt-file '" + dir.string() + "'", "--prompt-file: " + dir.string() + " is a directory");
    expect_error(none + "--prompt-file /nonexistent/p.txt", "--prompt-file: /nonexistent/p.txt: cannot open");
    // --dense-layers beyond the model's 3 layers: refused once config.json is read, naming the flag and the count.
    expect_error(ok + "-p hi --dense-layers 4", "--dense-layers: 4 exceeds the model's 3 layers");
    const RunResult three = run_quest(ok + "-p hi --dense-layers 3");
    EXPECT_EQ(three.exit_code, 0) << three.err;
    std::filesystem::remove(json);
    // chat, bench and soak refuse the same.
    const RunResult chat = run_quest("chat -m '" + m.string() + "' --dense-layers 9 < /dev/null");
    EXPECT_EQ(chat.exit_code, 2);
    EXPECT_THAT(chat.err, HasSubstr("error: --dense-layers: 9 exceeds the model's 3 layers"));
    const RunResult chat0 = run_quest("chat -m '" + m.string() + "' -c 0 < /dev/null");
    EXPECT_EQ(chat0.exit_code, 2);
    EXPECT_THAT(chat0.err, HasSubstr("error: -c: expected a positive number of tokens"));
    const RunResult bench = run_quest("bench -m '" + m.string() + "' --contexts 40 --budgets 16 --page-size 8 "
                                      "--dense-layers 4 --steps 1 --warmup 0");
    EXPECT_EQ(bench.exit_code, 2);
    EXPECT_THAT(bench.err, HasSubstr("error: --dense-layers: 4 exceeds the model's 3 layers"));
    const RunResult soak = run_quest("soak -m '" + m.string() + "' -c 0 --tokens 4");
    EXPECT_EQ(soak.exit_code, 2);
    EXPECT_THAT(soak.err, HasSubstr("error: -c: expected a positive number of tokens"));
}

TEST(Cli, PromptFileDashReadsStdin) {
    const auto m = small_model("cli_stdin");
    const auto dir = test::temp_dir("cli_stdin_in");
    std::ofstream(dir / "p.txt") << "hello there";
    const std::string base = "generate -m '" + m.string() + "' -n 5 --temp 0 ";
    const RunResult piped = run_quest(base + "--prompt-file - < '" + (dir / "p.txt").string() + "'");
    ASSERT_EQ(piped.exit_code, 0) << piped.err;
    const RunResult direct = run_quest(base + "-p 'hello there'");
    ASSERT_EQ(direct.exit_code, 0) << direct.err;
    EXPECT_EQ(piped.out, direct.out);
    EXPECT_THAT(piped.err, HasSubstr("prefill:"));
}

TEST(Cli, HelpShowsEverySettingsDefault) {
    for (const char* cmd : {"generate", "chat", "bench", "soak"}) {
        const RunResult r = run_quest(std::string(cmd) + " --help");
        ASSERT_EQ(r.exit_code, 0) << cmd;
        for (const char* s : {"--budget INT=2048", "--page-size INT=16", "--dense-layers INT=2",
                              "--gqa-policy kv-max|kv-sum|per-head=kv-sum", "--backend cpu|cuda=cpu",
                              "--fused-norms off|on=on", "--mass-target FLOAT=0"})
            EXPECT_THAT(r.out, HasSubstr(s)) << cmd;
    }
    const RunResult eval = run_quest("eval jsonl --help");
    EXPECT_THAT(eval.out, HasSubstr("--page-size INT=16"));
    EXPECT_THAT(eval.out, ::testing::Not(HasSubstr("--budget ")));
}

// `quest eval jsonl` without --policies runs the settings' own policy: the default selector, or --selector's.
TEST(Cli, EvalJsonlRunsTheDefaultSelectorWithoutPolicies) {
    const auto dir = test::temp_dir("cli_jsonl_default");
    {
        std::ofstream f(dir / "set.jsonl");
        f << R"({"id": "s0", "context": 120, "answer": "42", "prefill_ids": [1)";
        for (int t = 0; t < 110; ++t) f << ", " << 3 + (t * 13) % 90;
        f << R"(], "question_ids": [7, 8, 9], "answer_ids": [5, 6]})" << "\n";
    }
    const std::string base = "eval jsonl -m '" + test::demo_model_dir().string() + "' --set '" +
                             (dir / "set.jsonl").string() + "' --budgets 32 --page-size 8";
    const RunResult def = run_quest(base);
    ASSERT_EQ(def.exit_code, 0) << def.err;
    EXPECT_THAT(def.out, HasSubstr(" sparq+S8 "));
    EXPECT_THAT(def.out, ::testing::Not(HasSubstr(" quest+S8 ")));
    const RunResult q = run_quest(base + " --selector quest");
    ASSERT_EQ(q.exit_code, 0) << q.err;
    EXPECT_THAT(q.out, HasSubstr(" quest+S8 "));
    EXPECT_THAT(q.out, ::testing::Not(HasSubstr(" sparq+S8 ")));
}

// ---------------------------------------------------------------------------------------------------------------------
// The front door: bad input is one line `error: ...` naming the file or flag, exit 2, nothing written
// ---------------------------------------------------------------------------------------------------------------------

namespace {

// A random-weight model folder with `config` (JSON) and the committed 512-piece tokenizer.
std::filesystem::path model_with(const std::string& name, const std::string& config) {
    const auto dir = test::temp_dir(name);
    write_random_llama(dir, parse_model_config(config, "inline"), {3, DType::F16});
    std::filesystem::copy_file(test::source_dir() / "tests/fixtures/tokenizer/demo-512.model", dir / "tokenizer.model");
    return dir;
}

int count(const std::string& s, const std::string& what) {
    int n = 0;
    for (size_t i = s.find(what); i != std::string::npos; i = s.find(what, i + 1)) ++n;
    return n;
}

}  // namespace

// One context rule for every subcommand (generate's -c was the only one checked): eval passkey, bench and chat refuse
// a context past max_position_embeddings before any work, naming the flag; nothing is written.
TEST(Cli, ContextBeyondTheModelMaximumIsRefusedByEverySubcommand) {
    const auto m = small_model("cli_ctx_all");  // max_position_embeddings 256
    const auto dir = test::temp_dir("cli_ctx_all_out");
    const std::string json = (dir / "r.json").string();
    RunResult r = run_quest("eval passkey -m '" + m.string() + "' --contexts 128,300 --budgets full --samples 1 --json '" +
                            json + "'");
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_THAT(r.err, HasSubstr("error: --contexts 300 (+ 8 answer tokens) exceeds the model's maximum context of 256"));
    EXPECT_THAT(r.err, HasSubstr("config.json"));
    EXPECT_THAT(r.err, Not(HasSubstr("passkey context 128")));  // refused before the first context ran
    r = run_quest("bench -m '" + m.string() + "' --contexts 64,300 --budgets full --steps 2 --warmup 0 --json '" + json + "'");
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_THAT(r.err, HasSubstr("error: --contexts 300 (+ --warmup 0 + --steps 2 = 302) exceeds the model's maximum "
                                 "context of 256"));
    EXPECT_THAT(r.err, Not(HasSubstr("prefill")));
    // The positions are what counts: 250 prefilled + 8 timed steps do not fit either.
    r = run_quest("bench -m '" + m.string() + "' --contexts 250 --budgets full --steps 8 --warmup 0");
    EXPECT_EQ(r.exit_code, 2) << r.err;
    r = run_quest("chat -m '" + m.string() + "' -c 1000 < /dev/null");
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_THAT(r.err, HasSubstr("error: -c 1000 exceeds the model's maximum context of 256"));
    EXPECT_FALSE(std::filesystem::exists(json));
    // --random-weights measures latency only: any length (e.g. configs/llama2-7b.json at 32K).
    r = run_quest("bench -m '" + (m / "config.json").string() + "' --random-weights --contexts 300 --budgets full "
                  "--steps 1 --warmup 0");
    EXPECT_EQ(r.exit_code, 0) << r.err;
}

// `quest foo`: the unknown word and the subcommands, not "A subcommand is required".
TEST(Cli, UnknownSubcommandIsNamedWithTheList) {
    const RunResult r = run_quest("foo");
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_THAT(r.err, HasSubstr("error: unknown subcommand 'foo'"));
    for (const char* sub : {"generate", "bench", "eval", "chat", "quantize", "soak", "make-model"})
        EXPECT_THAT(r.err, HasSubstr(sub));
    EXPECT_EQ(count(r.err, "\n"), 1) << r.err;
}

// An unknown /command is answered, not sent to the model; /help lists the commands; "//x" sends "/x".
TEST(Cli, ChatUnknownCommandIsNotSentToTheModel) {
    const auto m = small_model("cli_chat_cmd");
    const auto dir = test::temp_dir("cli_chat_cmd_in");
    std::ofstream(dir / "in.txt") << "/foo bar\n/help\n";
    RunResult r = run_quest("chat -m '" + m.string() + "' -n 5 --temp 0 < '" + (dir / "in.txt").string() + "'");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_THAT(r.err, HasSubstr("unknown command /foo, /help lists them"));
    EXPECT_THAT(r.err, HasSubstr("/reset"));
    EXPECT_THAT(r.err, HasSubstr("/stats"));
    EXPECT_EQ(r.out, "");  // nothing answered: nothing reached the model
    std::ofstream(dir / "in.txt") << "//not a command\n/stats\n";
    r = run_quest("chat -m '" + m.string() + "' -n 5 --temp 0 < '" + (dir / "in.txt").string() + "'");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_THAT(r.err, Not(HasSubstr("unknown command")));
    EXPECT_THAT(r.err, HasSubstr("last answer: prefill"));
    EXPECT_NE(r.out, "");
}

TEST(Cli, ChatCommandsParse) {
    EXPECT_EQ(parse_chat_command("hello"), ChatCommand::Text);
    EXPECT_EQ(parse_chat_command(""), ChatCommand::Text);
    EXPECT_EQ(parse_chat_command("//x"), ChatCommand::Text);
    EXPECT_EQ(parse_chat_command("/quit"), ChatCommand::Quit);
    EXPECT_EQ(parse_chat_command("/exit"), ChatCommand::Quit);
    EXPECT_EQ(parse_chat_command("/reset"), ChatCommand::Reset);
    EXPECT_EQ(parse_chat_command("/stats"), ChatCommand::Stats);
    EXPECT_EQ(parse_chat_command("/help"), ChatCommand::Help);
    EXPECT_EQ(parse_chat_command("/foo"), ChatCommand::Unknown);
    EXPECT_EQ(parse_chat_command("/reset now"), ChatCommand::Unknown);
}

// --plot without matplotlib: refused before the benchmark runs (it used to run it all, then fail).
TEST(Cli, PlotWithoutMatplotlibIsRefusedBeforeTheRun) {
    const auto bin = test::temp_dir("cli_noplot_bin");
    std::ofstream(bin / "python3") << "#!/bin/sh\nexit 1\n";  // a python3 without matplotlib
    std::filesystem::permissions(bin / "python3", std::filesystem::perms::owner_all);
    const std::string old_path = std::getenv("PATH") ? std::getenv("PATH") : "";
    setenv("PATH", (bin.string() + ":" + old_path).c_str(), 1);
    const auto dir = test::temp_dir("cli_noplot");
    const RunResult b = run_quest("bench -m '" + test::demo_model_dir().string() +
                                  "' --contexts 40 --budgets full --steps 2 --warmup 0 --plot '" +
                                  (dir / "p.png").string() + "'");
    const RunResult e = run_quest("eval passkey -m '" + test::demo_model_dir().string() +
                                  "' --contexts 100 --budgets full --samples 1 --plot '" + (dir / "e.png").string() + "'");
    setenv("PATH", old_path.c_str(), 1);
    for (const RunResult& r : {b, e}) {
        EXPECT_EQ(r.exit_code, 2) << r.err;
        EXPECT_EQ(r.err, "error: --plot: needs python3 with matplotlib (Debian: python3-matplotlib)\n");
        EXPECT_EQ(r.out, "");
    }
    EXPECT_TRUE(std::filesystem::is_empty(dir));
}

// A tokenizer with more pieces than the model's vocab_size (ids past the embedding table) is refused at load, naming
// both files; fewer pieces (a padded vocabulary) is allowed and said once.
TEST(Cli, TokenizerLargerThanTheVocabularyIsRefused) {
    const std::string dims = R"("hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256)";
    const auto small = model_with("cli_vocab_small", "{" + dims + R"(, "vocab_size": 300})");  // demo-512: 512 pieces
    for (const std::string& sub : std::vector<std::string>{"generate -p hi -n 2", "chat -n 2 < /dev/null", "eval passkey --contexts 64 --samples 1 "
                                  "--budgets full", "bench --contexts 16 --budgets full --steps 1 --text '" + (small / "config.json").string() + "'"}) {
        const std::string verb = sub.substr(0, sub.find(' '));
        const std::string rest = sub.substr(sub.find(' '));
        const std::string args = verb == "eval" ? "eval passkey -m '" + small.string() + "'" + rest.substr(8)
                                                : verb + " -m '" + small.string() + "'" + rest;
        const RunResult r = run_quest(args);
        EXPECT_EQ(r.exit_code, 2) << sub << ": " << r.err;
        EXPECT_THAT(r.err, HasSubstr("tokenizer.model: 512 pieces, more than vocab_size 300 in")) << sub;
        EXPECT_THAT(r.err, HasSubstr("config.json")) << sub;
    }
    const auto padded = model_with("cli_vocab_padded", "{" + dims + R"(, "vocab_size": 640})");
    const RunResult r = run_quest("generate -m '" + padded.string() + "' -p hi -n 0");
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(count(r.err, "has 512 pieces"), 1) << r.err;
    EXPECT_THAT(r.err, HasSubstr("vocab_size 640"));
}

// The same with a real pair: the Llama-2 tokenizer (32000 pieces) in stories260K's folder (vocab_size 512).
TEST(Cli, Llama2TokenizerWithStories260KIsRefused) {
    const auto stories = test::shared_dir() / "models/stories260K";
    const auto llama2 = test::shared_dir() / "models/llama2-tokenizer/tokenizer.model";
    QUEST_REQUIRE_PATH(stories);
    QUEST_REQUIRE_PATH(llama2);
    const auto dir = test::temp_dir("cli_vocab_llama2");
    for (const char* f : {"config.json", "model.safetensors"}) std::filesystem::copy_file(stories / f, dir / f);
    std::filesystem::copy_file(llama2, dir / "tokenizer.model");
    const RunResult r = run_quest("generate -m '" + dir.string() + "' -p hi -n 2");
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_THAT(r.err, HasSubstr("tokenizer.model: 32000 pieces, more than vocab_size"));
}

// quantize -o: a file there, or a parent that is not a folder, is refused before any layer is read.
TEST(Cli, QuantizeOutputPathIsCheckedFirst) {
    const auto m = small_model("cli_q_out");
    const auto dir = test::temp_dir("cli_q_out_dir");
    std::ofstream(dir / "file") << "keep";
    RunResult r = run_quest("quantize -m '" + m.string() + "' -o '" + (dir / "file").string() + "' --group 32");
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_THAT(r.err, HasSubstr("error: -o " + (dir / "file").string() + ": exists and is not a folder"));
    EXPECT_THAT(r.err, Not(HasSubstr("layer 1 of")));
    EXPECT_EQ(test::slurp(dir / "file"), "keep");
    r = run_quest("quantize -m '" + m.string() + "' -o '" + (dir / "file/sub").string() + "' --group 32");
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_THAT(r.err, HasSubstr("is not a folder"));
    if (::geteuid() != 0) {  // permissions do not stop root
        std::filesystem::create_directory(dir / "ro");
        std::filesystem::permissions(dir / "ro", std::filesystem::perms::owner_read | std::filesystem::perms::owner_exec);
        r = run_quest("quantize -m '" + m.string() + "' -o '" + (dir / "ro/out").string() + "' --group 32");
        EXPECT_EQ(r.exit_code, 2) << r.err;
        EXPECT_THAT(r.err, HasSubstr("is not writable"));
    }
}

// A model whose every input dimension is below the group (stories260K, the small test models at group 128): no
// "weight error 0.0000" over zero layers, but exit 2 with the group that works; nothing is written.
TEST(Cli, QuantizeWithNoQuantizableLayerSaysSo) {
    const auto m = small_model("cli_q_none");  // hidden 32, intermediate 64, q_dim 32
    const auto out = test::temp_dir("cli_q_none_out") / "q";
    RunResult r = run_quest("quantize -m '" + m.string() + "' -o '" + out.string() + "'");
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_THAT(r.err, HasSubstr("error: --group 128: no linear layer of"));
    EXPECT_THAT(r.err, HasSubstr("input dimensions 32, 64 are not multiples of 128"));
    EXPECT_THAT(r.err, HasSubstr("try --group 32 (7 of the 7 linear layers per block)"));
    EXPECT_FALSE(std::filesystem::exists(out));
    r = run_quest("quantize -m '" + m.string() + "' -o '" + out.string() + "' --group 32");
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_THAT(r.err, HasSubstr("quantized 21 of 21"));
}

// CPU bench rows: GB/step counts what the CPU reads (fp32 weights + the attention's bytes model: Quest below full),
// the weights are labelled fp32, mem_GiB is the host memory plan; bench --help explains every column.
TEST(Cli, CpuBenchRowsReportWhatTheCpuReads) {
    const auto dir = test::temp_dir("cli_bench_cpu_bytes");
    // demo-random: 4 layers (2 dense); 256 tokens of pages of 8 = 32 pages > the budget's 2.
    const RunResult r = run_quest("bench -m '" + test::demo_model_dir().string() +
                                  "' --backend cpu --contexts 256 --budgets full,16 --page-size 8 --steps 2 "
                                  "--warmup 0 --json '" + (dir / "b.json").string() + "'");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    std::ifstream in(dir / "b.json");
    const auto rows = nlohmann::json::parse(in);
    ASSERT_EQ(rows.size(), 2u);
    EXPECT_LT(rows[1]["bytes"].get<double>(), rows[0]["bytes"].get<double>());
    EXPECT_LT(rows[1]["attention_bytes"].get<double>(), rows[0]["attention_bytes"].get<double>() * 0.75);
    // The difference of the rows is the attention's alone (the same fp32 weights).
    EXPECT_NEAR(rows[0]["bytes"].get<double>() - rows[1]["bytes"].get<double>(),
                rows[0]["attention_bytes"].get<double>() - rows[1]["attention_bytes"].get<double>(), 1.0);
    for (const auto& row : rows) {
        EXPECT_EQ(row["weights"], "fp32");
        EXPECT_GT(row["device_memory"].get<double>(), 0.0);
    }
    EXPECT_THAT(r.out, Not(HasSubstr(" fp16 ")));
    const RunResult help = run_quest("bench --help");
    for (const char* col : {"GB/step", "attn_KiB", "meta_KiB", "mem_GiB", "host memory", "fp32"})
        EXPECT_THAT(help.out, HasSubstr(col));
}
