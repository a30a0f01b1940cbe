// Hardening: memory limits (--memory-limit, the CPU backend's host-memory plan), Ctrl-C during a prefill, output
// files that are never partial, and the soak mode (quest soak) at small sizes.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "engine/backend.h"
#include "engine/memory.h"
#include "model/config.h"
#include "model/error.h"
#include "model/make_model.h"
#include "model/safetensors.h"
#include "test_util.h"

using namespace quest;
using ::testing::AnyOf;
using ::testing::HasSubstr;
using ::testing::Not;

namespace {

struct RunResult {
    int exit_code;
    std::string out, err;
};

std::string slurp(const std::filesystem::path& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
}

// Runs the quest binary with `args` (shell-quoted), capturing stdout and stderr.
RunResult run_quest(const std::string& args, const std::string& name = "hardening_run") {
    const auto dir = test::temp_dir(name);
    const std::string cmd = std::string("'") + QUEST_BINARY + "' " + args + " >" + (dir / "out").string() + " 2>" +
                            (dir / "err").string();
    const int status = std::system(cmd.c_str());
    return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, slurp(dir / "out"), slurp(dir / "err")};
}

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
