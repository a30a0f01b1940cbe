// Hardening: memory limits (--memory-limit, the CPU backend's host-memory plan), Ctrl-C during a prefill, output
// files that are never partial, and the soak mode (quest soak) at small sizes.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fcntl.h>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "model/core/backend.h"
#include "model/core/memory.h"
#include "model/io/atomic_file.h"
#include "model/core/config.h"
#include "kernels/common/error.h"
#include "model/io/make_model.h"
#include "model/cpu/llama_cpu.h"
#include "model/io/safetensors.h"
#include "model/io/weights.h"
#include "test_util.h"

using namespace quest;
using ::testing::AnyOf;
using ::testing::HasSubstr;
using ::testing::Not;

namespace {

using test::run_quest;
using test::RunResult;
using test::slurp;

std::string demo() { return "'" + test::demo_model_dir().string() + "'"; }

}  // namespace

// ---------------------------------------------------------------------------------------------------------------------
// Memory limits
// ---------------------------------------------------------------------------------------------------------------------

TEST(MemoryLimit, ByteSizesParse) {
    EXPECT_EQ(parse_byte_size("1073741824", "--memory-limit"), 1073741824u);
    EXPECT_EQ(parse_byte_size("24GiB", "--memory-limit"), 24ull << 30);
    EXPECT_EQ(parse_byte_size("24g", "--memory-limit"), 24ull << 30);
    EXPECT_EQ(parse_byte_size("1.5G", "--memory-limit"), 3ull << 29);
    EXPECT_EQ(parse_byte_size("512MiB", "--memory-limit"), 512ull << 20);
    EXPECT_EQ(parse_byte_size("64 KiB", "--memory-limit"), 64ull << 10);
    EXPECT_EQ(parse_byte_size("2T", "--memory-limit"), 2ull << 40);
    for (const char* bad : {"", "abc", "12XB", "-1", "0", "0.5", "1.2.3", "GiB", "1e9", "99999999TiB"}) {
        try {
            parse_byte_size(bad, "--memory-limit");
            ADD_FAILURE() << "accepted '" << bad << "'";
        } catch (const InputError& e) {
            EXPECT_THAT(e.what(), HasSubstr("--memory-limit: expected a size in bytes")) << bad;
        }
    }
    EXPECT_EQ(format_bytes(3ull << 29), "1.50 GiB");
    EXPECT_EQ(format_bytes(900), "900 bytes");
}

// The model presets in configs/ (benchmarks with --random-weights) parse, with the shapes their names promise.
TEST(ConfigPresets, ModelShapesParse) {
    const ModelConfig l2 = load_model_config(test::source_dir() / "configs/llama2-7b.json");
    EXPECT_EQ(l2.num_kv_heads, 32);
    EXPECT_EQ(l2.group_size(), 1);
    const ModelConfig l3 = load_model_config(test::source_dir() / "configs/llama3.1-8b.json");
    EXPECT_EQ(l3.hidden_size, 4096);
    EXPECT_EQ(l3.num_heads, 32);
    EXPECT_EQ(l3.num_kv_heads, 8);
    EXPECT_EQ(l3.head_dim, 128);
    EXPECT_EQ(l3.intermediate_size, 14336);
    EXPECT_EQ(l3.vocab_size, 128256);
    EXPECT_EQ(l3.rope.type, RopeType::Llama3);
    EXPECT_DOUBLE_EQ(l3.rope.factor, 8.0);
    EXPECT_EQ(l3.rope.original_max_position_embeddings, 8192);
    EXPECT_DOUBLE_EQ(l3.rope_theta, 500000.0);
    EXPECT_EQ(l3.max_position_embeddings, 131072);
    for (const char* name : {"longchat-7b-32k.json", "yarn-llama2-7b-128k.json", "demo-random-model.json"})
        EXPECT_NO_THROW(load_model_config(test::source_dir() / "configs" / name)) << name;
}

TEST(MemoryLimit, CpuPlanCountsWeightsKvAndActivations) {
    const ModelConfig c = load_model_config(test::source_dir() / "configs/llama2-7b.json");
    QuestSettings q;
    const CpuMemoryPlan p = plan_cpu_memory(c, q, 4096);
    // 6.74e9 parameters in fp32; K and V: 32 layers x 2 x 4096 x 4 bytes per token.
    EXPECT_NEAR(static_cast<double>(p.weights), 6.74e9 * 4, 0.01e9 * 4);
    EXPECT_EQ(p.kv_cache, 32ull * 2 * 4096 * 4 * 4096);
    EXPECT_EQ(p.metadata, 32ull * 2 * 32 * (4096 / 16) * 128 * 4);
    EXPECT_GT(p.activations, 0u);
    EXPECT_EQ(p.total(), p.weights + p.kv_cache + p.metadata + p.activations);
    // Saturates instead of wrapping: 2^30 layers of 2^30-wide matrices.
    ModelConfig huge = c;
    huge.num_layers = huge.hidden_size = huge.intermediate_size = 1 << 30;
    EXPECT_EQ(plan_cpu_memory(huge, q, 1 << 30).total(), std::numeric_limits<size_t>::max());
}

TEST(MemoryLimit, CpuBackendRefusesAContextBeyondTheLimitWithTheNumbers) {
    const ModelFolder m = open_model_folder(test::demo_model_dir());
    try {
        make_cpu_backend(m, default_quest_settings(), 4096, /*memory_limit=*/4 << 20);
        FAIL() << "expected a ResourceError";
    } catch (const ResourceError& e) {
        const std::string msg = e.what();
        EXPECT_THAT(msg, HasSubstr("not enough host memory for the CPU backend with a 4096-token context"));
        EXPECT_THAT(msg, HasSubstr("KV cache 8.00 MiB"));  // 4 layers x 2 x (2 x 32) x 4 bytes x 4096 tokens
        EXPECT_THAT(msg, HasSubstr("--memory-limit allows 4.00 MiB"));
    }
    EXPECT_NO_THROW(make_cpu_backend(m, default_quest_settings(), 64, /*memory_limit=*/64 << 20));
}

TEST(MemoryLimit, CliFlagIsValidatedAndAppliedOnTheCpu) {
    RunResult r = run_quest("generate -m " + demo() + " -p hi -n 2 --memory-limit lots");
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_THAT(r.err, HasSubstr("error: --memory-limit: expected a size in bytes"));
    r = run_quest("generate -m " + demo() + " -p hi -n 2 -c 4096 --memory-limit 4MiB");
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_THAT(r.err, HasSubstr("error: not enough host memory"));
    EXPECT_THAT(r.err, HasSubstr("Lower the context with -c or raise --memory-limit"));
    r = run_quest("generate -m " + demo() + " -p hi -n 2 --temp 0 --memory-limit 1GiB");
    EXPECT_EQ(r.exit_code, 0) << r.err;
}

// `--backend cuda` where there is no CUDA backend or no GPU (this machine, CI): exit 2 with a one-line message,
// never a crash or a fall-back to the CPU. On the GPU machine a 1 MiB limit must be refused by the memory plan with
// its numbers, before anything is allocated.
TEST(MemoryLimit, CudaBackendWithoutAGpuOrBelowThePlanExitsTwo) {
    const RunResult r = run_quest("generate -m " + demo() + " -p hi -n 2 --backend cuda --memory-limit 1MiB");
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_THAT(r.err, HasSubstr("error: "));
    EXPECT_THAT(r.err, AnyOf(HasSubstr("this build has no CUDA backend"), HasSubstr("no CUDA device is available"),
                             HasSubstr("not enough GPU memory")));
    if (r.err.find("not enough GPU memory") != std::string::npos) {
        EXPECT_THAT(r.err, HasSubstr("KV cache"));
        EXPECT_THAT(r.err, HasSubstr("0.00 GiB are available"));
    }
    EXPECT_THAT(r.err, Not(HasSubstr("internal error")));
}

// ---------------------------------------------------------------------------------------------------------------------
// Ctrl-C during a prefill
// ---------------------------------------------------------------------------------------------------------------------

namespace {

std::vector<int> some_tokens(int n, int salt) {
    std::vector<int> t(n);
    for (int i = 0; i < n; ++i) t[i] = 3 + (i * 37 + salt * 11) % 500;
    return t;
}

std::unique_ptr<Backend> demo_backend(int capacity) {
    QuestSettings q;
    q.page_size = 4;
    q.budget = 12;  // K = 3 pages: the decode steps below select pages by their metadata
    q.dense_layers = 1;
    return make_cpu_backend(open_model_folder(test::demo_model_dir()), q, capacity);
}

}  // namespace

// An interrupted prefill leaves the backend exactly as before the call: the same position, and (since the
// interrupted call started in the middle of a page) the same page metadata, so what follows gives the logits of a
// backend that was never interrupted, Quest selection included.
TEST(Interrupt, PrefillUndonePartWayLeavesNoTrace) {
    const auto first = some_tokens(5, 1), second = some_tokens(30, 2);
    auto fresh = demo_backend(64);
    fresh->prefill(first);
    fresh->prefill(second);
    std::vector<std::vector<float>> want;
    for (int t : {7, 8, 9}) {
        const auto l = fresh->decode(t);
        want.emplace_back(l.begin(), l.end());
    }

    for (int stop_at : {1, 3}) {  // before any layer ran, and after two of the four
        auto b = demo_backend(64);
        b->prefill(first);
        int checks = 0;
        b->set_interrupt([&] { return ++checks >= stop_at; });
        try {
            b->prefill(second);
            FAIL() << "expected Interrupted";
        } catch (const Interrupted& e) {
            EXPECT_THAT(e.what(), HasSubstr("prefill interrupted"));
            EXPECT_THAT(e.what(), HasSubstr("the cache holds the 5 tokens it held before"));
        }
        EXPECT_EQ(b->position(), 5);
        b->set_interrupt({});
        b->prefill(second);
        for (size_t i = 0; i < want.size(); ++i) {
            const auto l = b->decode(7 + static_cast<int>(i));
            ASSERT_EQ(std::vector<float>(l.begin(), l.end()), want[i]) << "stop_at " << stop_at << ", step " << i;
        }
    }
}

TEST(Interrupt, DecodeStepsAreNotInterrupted) {
    auto b = demo_backend(16);
    b->prefill(some_tokens(3, 3));
    b->set_interrupt([] { return true; });
    EXPECT_NO_THROW(b->decode(5));  // one token: the step is short, Ctrl-C is seen between tokens instead
    EXPECT_EQ(b->position(), 4);
}

namespace {

// A `quest` process with a pipe to its stdin; stdout and stderr go to files.
struct Child {
    pid_t pid = -1;
    int in = -1;
    std::filesystem::path out, err;

    bool exited(int& code, int timeout_ms) {
        for (int waited = 0; waited <= timeout_ms; waited += 10) {
            int status = 0;
            if (::waitpid(pid, &status, WNOHANG) == pid) {
                code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
                return true;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        return false;
    }
    void send(const std::string& s) const { ASSERT_EQ(::write(in, s.data(), s.size()), ssize_t(s.size())); }
};

Child spawn_quest(const std::vector<std::string>& args, const std::filesystem::path& dir) {
    Child c;
    c.out = dir / "out";
    c.err = dir / "err";
    int p[2];
    if (::pipe(p) != 0) return c;
    c.pid = ::fork();
    if (c.pid == 0) {
        ::dup2(p[0], 0);
        ::close(p[0]);
        ::close(p[1]);
        const int o = ::open(c.out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        const int e = ::open(c.err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        ::dup2(o, 1);
        ::dup2(e, 2);
        std::vector<char*> argv = {const_cast<char*>(QUEST_BINARY)};
        for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
        argv.push_back(nullptr);
        ::execv(QUEST_BINARY, argv.data());
        ::_exit(127);
    }
    ::close(p[0]);
    c.in = p[1];
    return c;
}

bool wait_for(const std::filesystem::path& file, const std::vector<std::string>& any, int timeout_ms) {
    for (int waited = 0; waited <= timeout_ms; waited += 10) {
        const std::string text = slurp(file);
        for (const auto& s : any)
            if (text.find(s) != std::string::npos) return true;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
}

}  // namespace

// Ctrl-C (a scripted SIGINT) while chat prefills a long message: the answer stops, the REPL goes on, the
// conversation is as before that message (the next answer starts from an empty context), and the process ends
// normally at the end of its input.
TEST(Interrupt, ChatSurvivesCtrlCDuringAPrefill) {
    const auto dir = test::temp_dir("interrupt_chat");
    Child c = spawn_quest({"chat", "-m", test::demo_model_dir().string(), "-n", "1", "--temp", "0"}, dir);
    ASSERT_GT(c.pid, 0);
    ASSERT_TRUE(wait_for(c.err, {"chat with"}, 60000)) << slurp(c.err);
    std::string long_line;
    while (long_line.size() < 7000) long_line += "the little fox ran into the old woods and found a tree ";
    c.send(long_line + "\n");
    bool stopped = false;
    for (int i = 0; i < 12000 && !stopped; ++i) {  // Ctrl-C every 5 ms until the answer reports it stopped
        ::kill(c.pid, SIGINT);
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
        const std::string err = slurp(c.err);
        stopped = err.find("(interrupted") != std::string::npos || err.find("(stopped)") != std::string::npos;
        int code = 0;
        if (!stopped && c.exited(code, 0)) FAIL() << "quest chat exited (" << code << "): " << slurp(c.err);
    }
    ASSERT_TRUE(stopped) << slurp(c.err);
    c.send("hello\n/stats\n");
    ::close(c.in);
    int code = -1;
    if (!c.exited(code, 120000)) {
        ::kill(c.pid, SIGKILL);
        FAIL() << "quest chat did not finish: " << slurp(c.err);
    }
    const std::string err = slurp(c.err);
    EXPECT_EQ(code, 0) << err;
    EXPECT_THAT(err, HasSubstr("last answer: prefill"));
    EXPECT_THAT(err, Not(HasSubstr("internal error")));
    if (err.find("(interrupted: this message was not added to the conversation)") != std::string::npos) {
        // The long message is gone: "hello" was the first turn (BOS + a few tokens; the context reports them).
        const size_t at = err.find("context ", err.find("last answer: prefill"));
        ASSERT_NE(at, std::string::npos) << err;
        EXPECT_LT(std::stoi(err.substr(at + 8)), 32) << err;
    }
}

// ---------------------------------------------------------------------------------------------------------------------
// Output files: never partial, no temporary left
// ---------------------------------------------------------------------------------------------------------------------

namespace {
std::vector<std::string> listing(const std::filesystem::path& dir) {
    std::vector<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(dir)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
}
}  // namespace

TEST(AtomicFile, InvisibleUntilCommittedAndNothingLeftWithoutCommit) {
    const auto dir = test::temp_dir("atomic_basic");
    {
        AtomicFile f(dir / "a.json");
        f.write("{\"x\": 1}\n");
        EXPECT_TRUE(listing(dir).empty());  // not even a temporary name
    }  // destroyed without commit
    EXPECT_TRUE(listing(dir).empty());
    std::ofstream(dir / "b.csv") << "old";
    write_file_atomic(dir / "b.csv", "new contents");
    EXPECT_EQ(slurp(dir / "b.csv"), "new contents");
    EXPECT_EQ(listing(dir), std::vector<std::string>{"b.csv"});
    try {
        write_file_atomic(dir / "no/such/folder/c.json", "x");
        FAIL() << "expected an InputError";
    } catch (const InputError& e) {
        EXPECT_THAT(e.what(), HasSubstr("no/such/folder/c.json: cannot create"));
    }
    copy_file_atomic(dir / "b.csv", dir / "d.csv");
    EXPECT_EQ(slurp(dir / "d.csv"), "new contents");
}

// A writer killed in the middle of a large safetensors file (SIGKILL: no handler, no cleanup) leaves nothing:
// neither a partial model.safetensors nor a temporary.
TEST(AtomicFile, KilledWriterLeavesNoPartialFile) {
    const auto dir = test::temp_dir("atomic_kill");
    std::ofstream(dir / "model.safetensors") << "previous complete file";
    const pid_t pid = ::fork();
    if (pid == 0) {
        std::vector<float> big(size_t(64) << 20, 1.0f);  // 256 MiB
        const TensorToWrite t{"w", DType::F32, {static_cast<int64_t>(big.size())},
                              std::as_bytes(std::span<const float>(big))};
        for (int i = 0; i < 1000; ++i) write_safetensors(dir / "model.safetensors", std::span(&t, 1));
        ::_exit(0);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    EXPECT_EQ(listing(dir), std::vector<std::string>{"model.safetensors"});
    // Either the previous file or a complete new one, never a partial one.
    const std::string head = slurp(dir / "model.safetensors").substr(0, 22);
    if (head != "previous complete file") {
        EXPECT_NO_THROW(SafeTensorsFile::open(dir / "model.safetensors"));
    }
}

// ---------------------------------------------------------------------------------------------------------------------
// quest soak (the long-decode check the GPU machine runs at 100K+ tokens, here at small sizes on the CPU)
// ---------------------------------------------------------------------------------------------------------------------

TEST(Soak, BucketsAreLoggedAndEveryLogitChecked) {
    const auto dir = test::temp_dir("soak_csv");
    const RunResult r = run_quest("soak -m " + demo() + " --backend cpu -c 300 --tokens 150 --prompt-tokens 8 "
                                  "--bucket 64 --budget 32 --page-size 8 --csv '" + (dir / "s.csv").string() + "'");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_THAT(r.err, HasSubstr("positions       8-     71: p50 "));
    EXPECT_THAT(r.err, HasSubstr("bytes model"));
    EXPECT_THAT(r.err, HasSubstr("soak: 150 decode steps, positions 8 to 158"));
    EXPECT_THAT(r.err, HasSubstr("every logit finite"));
    std::ifstream csv(dir / "s.csv");
    std::vector<std::string> lines;
    for (std::string l; std::getline(csv, l);) lines.push_back(l);
    ASSERT_EQ(lines.size(), 4u);  // header + 64 + 64 + 22 steps
    EXPECT_THAT(lines[0], HasSubstr("first_position,last_position,steps,p50_ms"));
    EXPECT_THAT(lines[3], ::testing::StartsWith("136,157,22,"));
}

// On a small model the context fills up: the soak stops there with a clear message (not an error).
TEST(Soak, StopsWithAClearMessageWhenTheContextIsFull) {
    const RunResult r = run_quest("soak -m " + demo() + " --backend cpu -c 48 --tokens 1000 --prompt-tokens 4 "
                                  "--bucket 16 --full-attention");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_THAT(r.err, HasSubstr("stopped: the context is full (48 tokens) after 44 decode steps; raise it with -c"));
    EXPECT_THAT(r.err, HasSubstr("full attention"));
}

// A model whose final norm holds a NaN: the soak reports the first non-finite logit and fails (exit 1).
TEST(Soak, NonFiniteLogitsFailWithTheStepAndPosition) {
    const auto dir = test::temp_dir("soak_nan");
    const ModelConfig c = parse_model_config(R"({"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
        "num_attention_heads": 2, "vocab_size": 64, "max_position_embeddings": 128})", "inline");
    write_random_llama(dir, c, {3, DType::F32});
    std::streamoff at = 0;
    {
        const auto f = SafeTensorsFile::open(dir / "model.safetensors");
        const TensorInfo* t = f->find("model.norm.weight");
        ASSERT_NE(t, nullptr);
        at = static_cast<std::streamoff>(t->begin) + 4;  // its second element, within the data area
    }
    std::fstream io(dir / "model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    uint64_t header_len = 0;
    io.read(reinterpret_cast<char*>(&header_len), 8);
    const float nan = std::nanf("");
    io.seekp(static_cast<std::streamoff>(8 + header_len) + at);
    io.write(reinterpret_cast<const char*>(&nan), 4);
    io.close();
    const RunResult r = run_quest("soak -m '" + dir.string() + "' --backend cpu -c 32 --tokens 10 --prompt-tokens 2");
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_THAT(r.err, HasSubstr("FAILED: non-finite logit after decode step 0 (position 1): logits["));
}

TEST(Soak, BadArgumentsExitTwo) {
    RunResult r = run_quest("soak -m " + demo() + " --tokens 0");
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_THAT(r.err, HasSubstr("--tokens must be >= 1"));
    r = run_quest("soak -m " + demo() + " -c 8 --prompt-tokens 20");
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_THAT(r.err, HasSubstr("--prompt-tokens 20 exceeds the context"));
}
