// Regressions: every bug the fuzzers (fuzz/) or the sanitizer builds found, and those found while writing the fuzz
// targets, each with the smallest input that showed it. The same inputs are in the fuzz corpus (fuzz/corpus/<target>/
// regress-*), so the fuzzers start from them too.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <string>

#include <sys/wait.h>

#include "model/core/backend.h"
#include "model/cpu/llama_cpu.h"
#include "model/core/memory.h"
#include "model/core/quest_settings.h"
#include "model/core/config.h"
#include "kernels/common/error.h"
#include "model/io/make_model.h"
#include "model/io/model_folder.h"
#include "model/core/rope.h"
#include "model/io/safetensors.h"
#include "model/io/weights.h"
#include "test_util.h"

using namespace quest;
using ::testing::HasSubstr;

namespace {

std::string config_error(const std::string& json) {
    try {
        parse_model_config(json, "config.json");
    } catch (const InputError& e) {
        return e.what();
    }
    return "(accepted)";
}

std::string settings_error(const std::string& json) {
    try {
        parse_quest_settings(json, "quest.json", default_quest_settings());
    } catch (const InputError& e) {
        return e.what();
    }
    return "(accepted)";
}

// A small valid config with `extra` fields appended (they override nothing: JSON keeps the last duplicate).
std::string small_config(const std::string& extra) {
    return R"({"hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
               "vocab_size": 16)" + (extra.empty() ? "" : ", " + extra) + "}";
}

}  // namespace

// fuzz_config (UBSan): num_attention_heads x head_dim overflowed int in ModelConfig::q_dim() (65536 x 65536). Both
// are now bounded at parse time (1024 each), so the product stays far below 2^30.
TEST(Regression, ConfigProjectionWidthOverflowIsRefused) {
    const std::string msg = config_error(
        R"({"hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 65536,
            "num_key_value_heads": 1, "head_dim": 65536, "vocab_size": 16})");
    EXPECT_THAT(msg, HasSubstr("config.json: field 'num_attention_heads': expected an integer in 1..1024, got 65536"));
    EXPECT_THAT(config_error(small_config(R"("head_dim": 65536)")),
                HasSubstr("field 'head_dim': expected an integer in 1..1024, got 65536"));
}

// fuzz_config (finite-frequency invariant): rope_theta = 1 made yarn divide by log(theta) = 0, giving NaN frequencies
// (then NaN logits). Now theta must exceed 1.
TEST(Regression, ConfigRopeThetaOneIsRefused) {
    EXPECT_THAT(config_error(small_config(R"("rope_theta": 1.0, "rope_scaling": {"type": "yarn", "factor": 2})")),
                HasSubstr("field 'rope_theta': expected a number > 1"));
    EXPECT_THAT(config_error(small_config(R"("rope_theta": 0.5)")), HasSubstr("field 'rope_theta'"));
}

// Found writing fuzz_config: a negative yarn beta (the log of a negative rotation count) gave NaN frequencies.
TEST(Regression, ConfigNegativeYarnBetaIsRefused) {
    EXPECT_THAT(config_error(small_config(R"("rope_scaling": {"type": "yarn", "factor": 2, "beta_fast": -3})")),
                HasSubstr("field 'rope_scaling.beta_fast': expected a positive number"));
    EXPECT_THAT(config_error(small_config(R"("rope_scaling": {"type": "yarn", "factor": 2, "beta_slow": -1})")),
                HasSubstr("field 'rope_scaling.beta_slow'"));
}

// Found writing fuzz_config: numbers that are finite one by one but not together: an attention factor beyond the fp32
// range (the cos/sin scale became inf), a yarn beta so small that its correction dimension overflows. Every accepted
// config now gives finite frequencies and scaling.
TEST(Regression, ConfigNonFiniteRopeFrequenciesAreRefused) {
    EXPECT_THAT(config_error(small_config(R"("rope_scaling": {"type": "yarn", "factor": 2, "attention_factor": 1e300})")),
                HasSubstr("field 'rope_scaling': the yarn rotary parameters give non-finite frequencies"));
    EXPECT_THAT(config_error(small_config(R"("rope_scaling": {"type": "yarn", "factor": 2, "beta_fast": 1e-320})")),
                HasSubstr("non-finite frequencies"));
    const ModelConfig ok = parse_model_config(small_config(R"("rope_scaling": {"type": "yarn", "factor": 4})"), "x");
    for (float f : rope_frequencies(ok, ok.max_context()).inv_freq) EXPECT_TRUE(std::isfinite(f));
}

// Found writing fuzz_config: token ids were narrowed to int before the vocabulary check, so bos_token_id 4294967297
// was accepted as 1 and an eos list entry 4294967298 as 2.
TEST(Regression, ConfigTokenIdsAreCheckedBeforeNarrowing) {
    EXPECT_THAT(config_error(small_config(R"("bos_token_id": 4294967297)")),
                HasSubstr("field 'bos_token_id': id 4294967297 outside the vocabulary of 16"));
    EXPECT_THAT(config_error(small_config(R"("eos_token_id": [2, 4294967298])")),
                HasSubstr("field 'eos_token_id': id 4294967298 outside the vocabulary"));
    EXPECT_THAT(config_error(small_config(R"("eos_token_id": 18446744073709551615)")),
                HasSubstr("field 'eos_token_id': out of range: 18446744073709551615"));
    EXPECT_THAT(config_error(small_config(R"("hidden_size": 18446744073709551615)")),
                HasSubstr("field 'hidden_size': out of range"));
}

// Found writing fuzz_quest_settings: integers were read with get<int>(), which wraps, so "budget": 4294967312 was
// accepted as a budget of 16 tokens.
TEST(Regression, QuestSettingsIntegersMustFitAnInt) {
    EXPECT_THAT(settings_error(R"({"budget": 4294967312})"),
                HasSubstr("quest.json: field 'budget': expected an integer between -2^31 and 2^31 - 1, got 4294967312"));
    EXPECT_THAT(settings_error(R"({"page_size": -4294967280})"), HasSubstr("field 'page_size'"));
    EXPECT_THAT(settings_error(R"({"dense_layers": 18446744073709551615})"), HasSubstr("field 'dense_layers'"));
    EXPECT_EQ(parse_quest_settings(R"({"budget": 2147483647})", "q", default_quest_settings()).budget, 2147483647);
}

// Found writing fuzz_model_folder: a config claiming 2^30 layers over a 1-layer checkpoint made the CPU loader
// allocate 2^30 layer records (over 200 GB) before the first layer tensor was looked up; then the memory plan refused
// it with a wrong hint (lower -c), and fuzz_config ran out of memory in llama_tensor_specs on 21,474,836 layers. Every
// dimension is now bounded at parse time, and a config claiming more layers than the checkpoint holds is refused
// naming the missing tensor and the file, before the memory plan.
TEST(Regression, AbsurdLayerCountIsRefusedAtParseTime) {
    const auto dir = test::temp_dir("reg_layers");
    ModelConfig c = parse_model_config(small_config(""), "inline");
    write_random_llama(dir, c, {1, DType::F16});
    std::ofstream(dir / "config.json") << small_config(R"("num_hidden_layers": 214748364)");
    try {
        open_model_folder(dir);
        FAIL() << "expected an InputError";
    } catch (const InputError& e) {
        EXPECT_THAT(e.what(), HasSubstr("config.json: field 'num_hidden_layers': expected an integer in 1..1024, got "
                                        "214748364"));
    }
}

TEST(Regression, MoreLayersInTheConfigThanInTheCheckpointNameTheMissingTensor) {
    const auto dir = test::temp_dir("reg_layers_6_5");
    ModelConfig c = parse_model_config(small_config(R"("num_hidden_layers": 5)"), "inline");
    write_random_llama(dir, c, {1, DType::F16});
    c.num_layers = 6;
    std::ofstream(dir / "config.json") << model_config_to_json(c);
    try {
        make_cpu_backend(open_model_folder(dir), default_quest_settings(), 16, /*memory_limit=*/1);  // plan: fails
        FAIL() << "expected an InputError";
    } catch (const InputError& e) {  // not the memory plan's ResourceError
        EXPECT_THAT(e.what(), HasSubstr("model.safetensors: tensor 'model.layers.5.input_layernorm.weight' not found, "
                                        "but "));
        EXPECT_THAT(e.what(), HasSubstr("config.json says num_hidden_layers 6 (the checkpoint has 5)"));
    }
}

// Found with the sanitizer build: the fp32 loader itself sized its layer list from the config before reading any
// layer, so any caller without the memory plan (quantize, eval) still allocated 2^30 records. It now grows the list
// as it reads, and fails at the first missing tensor.
TEST(Regression, LoaderGrowsTheLayerListAsItReads) {
    const auto dir = test::temp_dir("reg_loader_layers");
    ModelConfig c = parse_model_config(small_config(""), "inline");
    write_random_llama(dir, c, {1, DType::F32});
    c.num_layers = 1 << 30;
    try {
        load_llama_weights_f32(ModelFiles(dir), c);
        FAIL() << "expected an InputError";
    } catch (const InputError& e) {
        EXPECT_THAT(e.what(), HasSubstr("tensor 'model.layers.1.input_layernorm.weight' not found"));
    }
}

namespace {
int run_quest_exit(const std::string& args, std::string* err) {
    const auto dir = test::temp_dir("reg_cli");
    const std::string cmd = std::string("'") + QUEST_BINARY + "' " + args + " >/dev/null 2>'" + (dir / "err").string() + "'";
    const int status = std::system(cmd.c_str());
    std::ifstream in(dir / "err");
    *err = std::string(std::istreambuf_iterator<char>(in), {});
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}
}  // namespace

// Found with the sanitizer build (UBSan): `generate -n 2147483647` overflowed int adding the prompt length, and
// `bench --steps 2147483647` adding the context and warm-up.
TEST(Regression, HugeTokenCountsDoNotOverflow) {
    const auto dir = test::temp_dir("reg_huge_n");
    const ModelConfig c = parse_model_config(R"({"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
        "num_attention_heads": 2, "vocab_size": 512, "max_position_embeddings": 32})", "inline");
    write_random_llama(dir, c, {2, DType::F16});
    std::filesystem::copy_file(test::source_dir() / "tests/fixtures/tokenizer/demo-512.model", dir / "tokenizer.model");
    std::string err;
    EXPECT_EQ(run_quest_exit("generate -m '" + dir.string() + "' -p hi -n 2147483647 --temp 0", &err), 0) << err;
    EXPECT_THAT(err, HasSubstr("the context is full (32 tokens)"));
    EXPECT_EQ(run_quest_exit("bench -m '" + dir.string() + "' --contexts 8 --budgets full --steps 2147483647", &err), 2);
    EXPECT_THAT(err, HasSubstr("exceeds 2^30"));
}
