// config.json parsing: every rope type in both spellings, and invalid configs rejected with the field named.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>

#include "model/core/config.h"
#include "kernels/common/error.h"
#include "model/core/rope.h"
#include "test_util.h"

using namespace quest;
using ::testing::HasSubstr;

namespace {

const char* kBase = R"({
  "architectures": ["LlamaForCausalLM"], "model_type": "llama",
  "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
  "num_attention_heads": 32, "num_key_value_heads": 32, "rms_norm_eps": 1e-05,
  "max_position_embeddings": 4096, "vocab_size": 32000, "bos_token_id": 1, "eos_token_id": 2,
  "tie_word_embeddings": false, "torch_dtype": "float16" %s })";

ModelConfig parse_with(const std::string& extra) {
    char buf[2048];
    std::snprintf(buf, sizeof buf, kBase, extra.c_str());
    return parse_model_config(buf, "config.json");
}

std::string parse_error(const std::string& extra) {
    try {
        parse_with(extra);
    } catch (const InputError& e) {
        return e.what();
    }
    return "(no error)";
}

}  // namespace

TEST(Config, Llama2Defaults) {
    const ModelConfig c = parse_with("");
    EXPECT_EQ(c.hidden_size, 4096);
    EXPECT_EQ(c.head_dim, 128);
    EXPECT_EQ(c.num_kv_heads, 32);
    EXPECT_EQ(c.torch_dtype, DType::F16);
    EXPECT_EQ(c.rope.type, RopeType::Default);
    EXPECT_DOUBLE_EQ(c.rope_theta, 10000.0);
    EXPECT_TRUE(c.is_eos(2));
    EXPECT_FALSE(c.is_eos(1));
}

TEST(Config, KvHeadsDefaultToHeadsAndHeadDimOverride) {
    const ModelConfig c = parse_model_config(
        R"({"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
            "head_dim": 128, "vocab_size": 256, "eos_token_id": [2, 7], "dtype": "bfloat16"})",
        "x.json");
    EXPECT_EQ(c.num_kv_heads, 2);
    EXPECT_EQ(c.head_dim, 128);
    EXPECT_EQ(c.q_dim(), 256);
    EXPECT_TRUE(c.is_eos(7));
    EXPECT_EQ(c.torch_dtype, DType::BF16);
}

TEST(Config, RopeLegacyAndTransformers5Spellings) {
    // Llama-2 era: rope_scaling with "type".
    ModelConfig a = parse_with(R"(, "rope_scaling": {"type": "linear", "factor": 8.0})");
    EXPECT_EQ(a.rope.type, RopeType::Linear);
    EXPECT_DOUBLE_EQ(a.rope.factor, 8.0);
    // transformers 5: rope_parameters with "rope_type" and rope_theta inside.
    ModelConfig b = parse_with(R"(, "rope_parameters": {"rope_type": "linear", "factor": 8.0, "rope_theta": 5e5})");
    EXPECT_EQ(b.rope.type, RopeType::Linear);
    EXPECT_DOUBLE_EQ(b.rope_theta, 5e5);
    ModelConfig d = parse_with(R"(, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6})");
    EXPECT_EQ(d.rope.type, RopeType::Default);
    EXPECT_DOUBLE_EQ(d.rope_theta, 1e6);
    ModelConfig n = parse_with(R"(, "rope_scaling": null)");
    EXPECT_EQ(n.rope.type, RopeType::Default);
}

TEST(Config, YarnAsPublishedForYarnLlama2) {
    const ModelConfig c = parse_with(
        R"(, "rope_scaling": {"factor": 32.0, "original_max_position_embeddings": 4096, "type": "yarn",
              "finetuned": true})");
    EXPECT_EQ(c.rope.type, RopeType::Yarn);
    EXPECT_DOUBLE_EQ(c.rope.factor, 32.0);
    EXPECT_EQ(c.rope.original_max_position_embeddings, 4096);
    EXPECT_DOUBLE_EQ(c.rope.beta_fast, 32.0);
    EXPECT_DOUBLE_EQ(c.rope.beta_slow, 1.0);
    const RopeFrequencies f = rope_frequencies(c, 1);
    EXPECT_NEAR(f.attention_scaling, 0.1 * std::log(32.0) + 1.0, 1e-6);
    // Highest frequency is extrapolated (unchanged), the lowest fully interpolated (divided by the factor).
    EXPECT_FLOAT_EQ(f.inv_freq.front(), 1.0f);
    const float lowest = 1.0f / std::pow(10000.0f, 126.0f / 128.0f);
    EXPECT_NEAR(f.inv_freq.back(), lowest / 32.0f, lowest * 1e-5);
}

TEST(Config, YarnOriginalMaxDefaultsToMaxPositions) {
    const ModelConfig c = parse_with(R"(, "rope_parameters": {"rope_type": "yarn", "factor": 4.0})");
    EXPECT_EQ(c.rope.original_max_position_embeddings, 4096);
}

TEST(Config, Llama3Frequencies) {
    const ModelConfig c = parse_with(
        R"(, "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
              "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}, "rope_theta": 500000.0)");
    EXPECT_EQ(c.rope.type, RopeType::Llama3);
    const RopeFrequencies f = rope_frequencies(c, 1);
    const float base0 = 1.0f;
    EXPECT_FLOAT_EQ(f.inv_freq[0], base0);  // wavelength 2pi < 8192/4: high frequency, unchanged
    const float lowest = 1.0f / std::pow(500000.0f, 126.0f / 128.0f);
    EXPECT_NEAR(f.inv_freq.back(), lowest / 8.0f, lowest * 1e-5);  // low frequency: divided by the factor
}

TEST(Config, DynamicDependsOnLength) {
    const ModelConfig c = parse_with(R"(, "rope_scaling": {"type": "dynamic", "factor": 2.0})");
    EXPECT_TRUE(rope_depends_on_length(c));
    const RopeFrequencies short_f = rope_frequencies(c, 100);
    const RopeFrequencies at_max = rope_frequencies(c, 4096);
    const RopeFrequencies longer = rope_frequencies(c, 8192);
    EXPECT_EQ(short_f.inv_freq, at_max.inv_freq);  // within the trained length nothing changes
    EXPECT_EQ(short_f.inv_freq[0], 1.0f);
    EXPECT_LT(longer.inv_freq[10], at_max.inv_freq[10]);  // base grows past it
    // base * (factor*L/max - (factor-1))^(d/(d-2)) with L = 2 max: base * 3^(128/126)
    const double base = 10000.0 * std::pow(3.0, 128.0 / 126.0);
    EXPECT_NEAR(longer.inv_freq[1], 1.0 / std::pow(base, 2.0 / 128.0), 1e-6);
}

TEST(Config, LinearDividesFrequencies) {
    const ModelConfig c = parse_with(R"(, "rope_scaling": {"type": "linear", "factor": 8.0})");
    const ModelConfig d = parse_with("");
    const RopeFrequencies a = rope_frequencies(c, 1), b = rope_frequencies(d, 1);
    for (size_t i = 0; i < a.inv_freq.size(); ++i) EXPECT_FLOAT_EQ(a.inv_freq[i], b.inv_freq[i] / 8.0f);
}

TEST(Config, InvalidConfigsNameTheField) {
    EXPECT_THAT(parse_error(R"(, "rope_scaling": {"type": "longrope", "factor": 2.0})"),
                HasSubstr("unsupported rope type 'longrope'"));
    EXPECT_THAT(parse_error(R"(, "rope_scaling": {"type": "linear"})"), HasSubstr("rope_scaling.factor"));
    EXPECT_THAT(parse_error(R"(, "rope_scaling": {"type": "linear", "factor": 0.5})"), HasSubstr(">= 1"));
    EXPECT_THAT(parse_error(R"(, "rope_scaling": {"type": "llama3", "factor": 8.0})"),
                HasSubstr("rope_scaling.low_freq_factor"));
    EXPECT_THAT(parse_error(R"(, "rope_scaling": "yes")"), HasSubstr("expected an object"));
    EXPECT_THAT(parse_error(R"(, "hidden_act": "gelu")"), HasSubstr("hidden_act"));
    EXPECT_THAT(parse_error(R"(, "attention_bias": true)"), HasSubstr("attention_bias"));
}

namespace {
std::string raw_error(const std::string& json) {
    try {
        parse_model_config(json, "bad/config.json");
    } catch (const InputError& e) {
        return e.what();
    }
    return "(no error)";
}
}  // namespace

TEST(Config, InvalidTopLevel) {
    const std::string ok =
        R"("hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 256)";
    EXPECT_THAT(raw_error("{\"architectures\": [\"GPT2LMHeadModel\"], " + ok + "}"),
                HasSubstr("bad/config.json: field 'architectures': unsupported architecture [\"GPT2LMHeadModel\"] "
                          "(supported: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM)"));
    EXPECT_THAT(raw_error("{\"model_type\": \"gpt2\", " + ok + "}"), HasSubstr("model_type"));
    EXPECT_THAT(raw_error("{not json"), HasSubstr("not valid JSON"));
    EXPECT_THAT(raw_error("[1, 2]"), HasSubstr("JSON object"));
    EXPECT_THAT(raw_error(R"({"intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 256})"),
                HasSubstr("'hidden_size': missing"));
    EXPECT_THAT(raw_error("{" + ok + R"(, "num_key_value_heads": 3})"), HasSubstr("multiple of num_key_value_heads"));
    EXPECT_THAT(raw_error("{" + ok + R"(, "hidden_size": -1})"), HasSubstr("expected an integer in 1..65536, got -1"));
    EXPECT_THAT(raw_error("{" + ok + R"(, "head_dim": 33})"), HasSubstr("even"));
    EXPECT_THAT(raw_error("{" + ok + R"(, "eos_token_id": 999})"), HasSubstr("outside the vocabulary"));
    EXPECT_THAT(raw_error("{" + ok + R"(, "torch_dtype": "int8"})"), HasSubstr("unsupported dtype"));
    EXPECT_THAT(raw_error("{" + ok + R"(, "num_hidden_layers": "two"})"), HasSubstr("expected an integer"));
    // The file name is part of every message.
    EXPECT_THAT(raw_error("{" + ok + R"(, "head_dim": 33})"), HasSubstr("bad/config.json"));
}

TEST(Config, RoundTripThroughJson) {
    const ModelConfig a = parse_with(
        R"(, "rope_scaling": {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 2048,
              "beta_fast": 16, "mscale": 1.0, "mscale_all_dim": 0.5})");
    const ModelConfig b = parse_model_config(model_config_to_json(a), "roundtrip");
    EXPECT_EQ(b.hidden_size, a.hidden_size);
    EXPECT_EQ(b.rope.type, RopeType::Yarn);
    EXPECT_EQ(b.rope.original_max_position_embeddings, 2048);
    EXPECT_DOUBLE_EQ(b.rope.beta_fast, 16.0);
    EXPECT_EQ(rope_frequencies(a, 1).inv_freq, rope_frequencies(b, 1).inv_freq);
    EXPECT_EQ(rope_frequencies(a, 1).attention_scaling, rope_frequencies(b, 1).attention_scaling);
}

// Every dimension has a sane range, checked at parse time (a larger value sized allocations before the checkpoint was
// read: 214,748,364 layers for a 5-layer file), naming the key and the range.
TEST(Config, DimensionsAreBoundedAtParseTime) {
    const std::string base = R"("hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "vocab_size": 256)";
    auto with = [&](const std::string& extra) { return raw_error("{" + base + ", " + extra + "}"); };
    EXPECT_THAT(with(R"("num_hidden_layers": 214748364)"),
                HasSubstr("field 'num_hidden_layers': expected an integer in 1..1024, got 214748364"));
    EXPECT_THAT(with(R"("hidden_size": 65537)"), HasSubstr("field 'hidden_size': expected an integer in 1..65536"));
    EXPECT_THAT(with(R"("num_attention_heads": 1025)"), HasSubstr("field 'num_attention_heads': expected an integer in 1..1024"));
    EXPECT_THAT(with(R"("num_key_value_heads": 2048)"), HasSubstr("field 'num_key_value_heads': expected an integer in 1..1024"));
    EXPECT_THAT(with(R"("vocab_size": 4194305)"), HasSubstr("field 'vocab_size': expected an integer in 1..4194304"));
    EXPECT_THAT(with(R"("intermediate_size": 1048577)"), HasSubstr("field 'intermediate_size': expected an integer in 1..1048576"));
    EXPECT_THAT(with(R"("head_dim": 1026)"), HasSubstr("field 'head_dim': expected an integer in 1..1024"));
    EXPECT_THAT(with(R"("max_position_embeddings": 16777217)"),
                HasSubstr("field 'max_position_embeddings': expected an integer in 1..16777216"));
    EXPECT_THAT(raw_error(R"({"hidden_size": 65536, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 32,
        "vocab_size": 256})"), HasSubstr("hidden_size / num_attention_heads = 2048 exceeds the head_dim limit of 1024"));
    // The limits themselves are accepted.
    EXPECT_EQ(raw_error(R"({"hidden_size": 65536, "intermediate_size": 1048576, "num_hidden_layers": 1024,
        "num_attention_heads": 1024, "num_key_value_heads": 1024, "head_dim": 1024, "vocab_size": 4194304,
        "max_position_embeddings": 16777216})"), "(no error)");
}

// ---------------------------------------------------------------- architectures

namespace {
const std::string kSmall =
    R"("hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4, "vocab_size": 256)";
ModelConfig parse_small(const std::string& fields) { return parse_model_config("{" + kSmall + ", " + fields + "}", "m/config.json"); }
std::string small_error(const std::string& fields) { return raw_error("{" + kSmall + ", " + fields + "}"); }
std::vector<int> windows(const ModelConfig& c) {
    std::vector<int> w;
    for (int l = 0; l < c.num_layers; ++l) w.push_back(c.attention_window(l));
    return w;
}
}  // namespace

TEST(Config, LlamaHasNoBiasesAndNoWindow) {
    const ModelConfig c = parse_small(R"("architectures": ["LlamaForCausalLM"], "sliding_window": 16)");
    EXPECT_EQ(c.architecture, Architecture::Llama);
    EXPECT_FALSE(c.qkv_bias);
    EXPECT_EQ(windows(c), (std::vector<int>{0, 0, 0, 0}));  // LlamaConfig has no sliding_window
    EXPECT_EQ(parse_small(R"("model_type": "llama")").architecture, Architecture::Llama);
}

// MistralConfig: sliding_window on every layer (default 4096, null: none); layer_types is ignored by MistralModel.
TEST(Config, MistralWindowOnEveryLayer) {
    const ModelConfig c = parse_small(R"("architectures": ["MistralForCausalLM"], "model_type": "mistral",
        "sliding_window": 24, "layer_types": ["full_attention", "full_attention", "full_attention", "full_attention"])");
    EXPECT_EQ(c.architecture, Architecture::Mistral);
    EXPECT_FALSE(c.qkv_bias);
    EXPECT_EQ(windows(c), (std::vector<int>{24, 24, 24, 24}));
    EXPECT_TRUE(c.window_matters(25));
    EXPECT_FALSE(c.window_matters(24));
    EXPECT_EQ(windows(parse_small(R"("architectures": ["MistralForCausalLM"])")),
              (std::vector<int>{4096, 4096, 4096, 4096}));
    EXPECT_EQ(windows(parse_small(R"("architectures": ["MistralForCausalLM"], "sliding_window": null)")),
              (std::vector<int>{0, 0, 0, 0}));
    EXPECT_EQ(parse_small(R"("model_type": "mistral", "sliding_window": 8)").architecture, Architecture::Mistral);
    EXPECT_THAT(small_error(R"("architectures": ["MistralForCausalLM"], "sliding_window": 0)"),
                HasSubstr("field 'sliding_window'"));
}

// Qwen2Config.__post_init__: sliding_window only with use_sliding_window; the windowed layers from layer_types, else
// i >= max_window_layers (default 28).
TEST(Config, Qwen2BiasesAndWindowedLayers) {
    ModelConfig c = parse_small(R"("architectures": ["Qwen2ForCausalLM"], "sliding_window": 32, "max_window_layers": 1)");
    EXPECT_EQ(c.architecture, Architecture::Qwen2);
    EXPECT_TRUE(c.qkv_bias);
    EXPECT_EQ(windows(c), (std::vector<int>{0, 0, 0, 0}));  // use_sliding_window defaults to false
    c = parse_small(R"("architectures": ["Qwen2ForCausalLM"], "use_sliding_window": true, "sliding_window": 32,
                       "max_window_layers": 2)");
    EXPECT_EQ(windows(c), (std::vector<int>{0, 0, 32, 32}));
    c = parse_small(R"("architectures": ["Qwen2ForCausalLM"], "use_sliding_window": true, "sliding_window": 32)");
    EXPECT_EQ(windows(c), (std::vector<int>{0, 0, 0, 0}));  // max_window_layers 28 >= 4 layers
    c = parse_small(R"("architectures": ["Qwen2ForCausalLM"], "use_sliding_window": true, "max_window_layers": 3)");
    EXPECT_EQ(windows(c), (std::vector<int>{0, 0, 0, 4096}));  // sliding_window defaults to 4096
    c = parse_small(R"("architectures": ["Qwen2ForCausalLM"], "use_sliding_window": true, "sliding_window": 16,
        "max_window_layers": 0,
        "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"])");
    EXPECT_EQ(windows(c), (std::vector<int>{16, 0, 16, 0}));  // layer_types wins over max_window_layers
    EXPECT_THAT(small_error(R"("architectures": ["Qwen2ForCausalLM"], "sliding_window": 16,
        "layer_types": ["sliding_attention", "full_attention", "full_attention", "full_attention"])"),
                HasSubstr("no window"));
    EXPECT_THAT(small_error(R"("architectures": ["Qwen2ForCausalLM"], "layer_types": ["full_attention"])"),
                HasSubstr("field 'layer_types'"));
    EXPECT_THAT(small_error(R"("architectures": ["Qwen2ForCausalLM"], "use_sliding_window": true,
        "layer_types": ["full_attention", "chunked_attention", "full_attention", "full_attention"])"),
                HasSubstr("chunked_attention"));
    // Biases are Qwen2's own: attention_bias stays a Llama error.
    EXPECT_THAT(small_error(R"("architectures": ["LlamaForCausalLM"], "attention_bias": true)"),
                HasSubstr("attention biases are not supported for LlamaForCausalLM"));
}

TEST(Config, ArchitectureAndModelTypeMustAgree) {
    EXPECT_THAT(small_error(R"("architectures": ["Qwen2ForCausalLM"], "model_type": "llama")"),
                HasSubstr("contradicts"));
    EXPECT_THAT(small_error(R"("model_type": "gpt2")"),
                HasSubstr("unsupported model type 'gpt2' (supported: llama, mistral, qwen2)"));
    EXPECT_THAT(small_error(R"("architectures": [])"), HasSubstr("unsupported architecture"));
    EXPECT_EQ(supported_architectures(), "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM");
}

TEST(Config, ArchitecturesRoundTripThroughJson) {
    for (const char* fields :
         {R"("architectures": ["MistralForCausalLM"], "sliding_window": 24)",
          R"("architectures": ["MistralForCausalLM"], "sliding_window": null)",
          R"("architectures": ["Qwen2ForCausalLM"], "use_sliding_window": true, "sliding_window": 8, "max_window_layers": 3)",
          R"("architectures": ["Qwen2ForCausalLM"])"}) {
        const ModelConfig a = parse_small(fields);
        const ModelConfig b = parse_model_config(model_config_to_json(a), "round-trip");
        EXPECT_EQ(a.architecture, b.architecture) << fields;
        EXPECT_EQ(a.qkv_bias, b.qkv_bias) << fields;
        EXPECT_EQ(windows(a), windows(b)) << fields;
    }
}
