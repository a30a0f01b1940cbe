#include "model/core/config.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "kernels/common/error.h"
#include "kernels/common/names.h"
#include "model/core/json_object.h"
#include "model/core/rope.h"

namespace quest {

using nlohmann::json;

std::string_view rope_type_name(RopeType t) {
    switch (t) {
        case RopeType::Default: return "default";
        case RopeType::Linear: return "linear";
        case RopeType::Dynamic: return "dynamic";
        case RopeType::Yarn: return "yarn";
        case RopeType::Llama3: return "llama3";
    }
    return "?";
}

std::string_view architecture_name(Architecture a) {
    switch (a) {
        case Architecture::Llama: return "LlamaForCausalLM";
        case Architecture::Mistral: return "MistralForCausalLM";
        case Architecture::Qwen2: return "Qwen2ForCausalLM";
    }
    return "?";
}

namespace {
constexpr Architecture kArchitectures[] = {Architecture::Llama, Architecture::Mistral, Architecture::Qwen2};
constexpr const char* kModelTypes[] = {"llama", "mistral", "qwen2"};  // config.json model_type, in the same order

bool architecture_from_name(const std::string& name, Architecture& out) {
    return value_from_name(name, kArchitectures, architecture_name, out);
}
bool architecture_from_model_type(const std::string& type, Architecture& out) {
    for (size_t i = 0; i < std::size(kModelTypes); ++i)
        if (type == kModelTypes[i]) {
            out = kArchitectures[i];
            return true;
        }
    return false;
}
}  // namespace

std::string supported_architectures() {
    std::string s;
    for (Architecture a : kArchitectures) s += (s.empty() ? "" : ", ") + std::string(architecture_name(a));
    return s;
}

bool ModelConfig::is_eos(int token) const {
    return std::find(eos_token_ids.begin(), eos_token_ids.end(), token) != eos_token_ids.end();
}

void check_context(const ModelConfig& c, int64_t positions, const std::string& what, const std::string& source) {
    if (positions <= c.max_context()) return;
    throw InputError(what + " exceeds the model's maximum context of " + std::to_string(c.max_context()) +
                     " tokens (max_position_embeddings in " + source + ")");
}

namespace {

// Reads typed fields of one JSON object and reports errors as "<source>: field '<prefix><name>': ...".
class Fields {
public:
    Fields(const json& obj, std::string source, std::string prefix)
        : obj_(obj), source_(std::move(source)), prefix_(std::move(prefix)) {}

    [[noreturn]] void fail(const std::string& name, const std::string& what) const {
        throw InputError(source_ + ": field '" + prefix_ + name + "': " + what);
    }
    bool has(const std::string& name) const { return obj_.contains(name) && !obj_.at(name).is_null(); }

    long long integer(const std::string& name) const {
        if (!has(name)) fail(name, "missing (expected an integer)");
        const json& v = obj_.at(name);
        // An unsigned value beyond the int64 range would wrap to a negative number: report it as it was written.
        if (v.is_number_unsigned() && v.get<unsigned long long>() > (1ULL << 62)) fail(name, "out of range: " + v.dump());
        if (v.is_number_integer()) return v.get<long long>();
        if (v.is_number_float()) {  // some writers emit 4096.0
            const double d = v.get<double>();
            if (std::floor(d) == d && std::abs(d) < 9e15) return static_cast<long long>(d);
        }
        fail(name, "expected an integer, got " + v.dump());
    }
    // A dimension in 1..max (the sane range of a Llama model: a larger value is a typo or a hostile file, and
    // would size allocations before the checkpoint is read).
    int dimension(const std::string& name, int max) const {
        const long long v = integer(name);
        if (v < 1 || v > max)
            fail(name, "expected an integer in 1.." + std::to_string(max) + ", got " + std::to_string(v));
        return static_cast<int>(v);
    }
    int dimension_or(const std::string& name, int max, int def) const { return has(name) ? dimension(name, max) : def; }

    double number(const std::string& name) const {
        if (!has(name)) fail(name, "missing (expected a number)");
        const json& v = obj_.at(name);
        if (!v.is_number()) fail(name, "expected a number, got " + v.dump());
        const double d = v.get<double>();
        if (!std::isfinite(d)) fail(name, "expected a finite number");
        return d;
    }
    double number_or(const std::string& name, double def) const { return has(name) ? number(name) : def; }
    std::optional<double> optional_number(const std::string& name) const {
        if (!has(name)) return std::nullopt;
        return number(name);
    }
    std::string string(const std::string& name) const {
        const json& v = obj_.at(name);
        if (!v.is_string()) fail(name, "expected a string, got " + v.dump());
        return v.get<std::string>();
    }
    bool boolean_or(const std::string& name, bool def) const {
        if (!has(name)) return def;
        const json& v = obj_.at(name);
        if (!v.is_boolean()) fail(name, "expected true or false, got " + v.dump());
        return v.get<bool>();
    }

private:
    const json& obj_;
    std::string source_;
    std::string prefix_;
};

RopeType parse_rope_type(const Fields& f, const std::string& field, const std::string& name) {
    if (name == "default" || name == "none") return RopeType::Default;
    if (name == "linear") return RopeType::Linear;
    if (name == "dynamic") return RopeType::Dynamic;
    if (name == "yarn") return RopeType::Yarn;
    if (name == "llama3") return RopeType::Llama3;
    f.fail(field, "unsupported rope type '" + name + "' (expected one of: default, linear, dynamic, yarn, llama3)");
}

std::string top_number_text(double v) { return json(v).dump(); }

// rope_scaling (Llama-2 era) or rope_parameters (transformers 5): the same keys, `type` or `rope_type`.
void parse_rope(const json& root, const std::string& source, ModelConfig& c) {
    const Fields top(root, source, "");
    c.rope_theta = top.number_or("rope_theta", 10000.0);
    // theta <= 1 gives no usable rotation (every frequency >= 1 rad/token, and yarn divides by log(theta)).
    if (c.rope_theta <= 1) top.fail("rope_theta", "expected a number > 1, got " + top_number_text(c.rope_theta));

    // transformers treats rope_scaling as the rope parameters when both are present.
    std::string key;
    if (top.has("rope_scaling")) key = "rope_scaling";
    else if (top.has("rope_parameters")) key = "rope_parameters";
    if (key.empty()) return;
    const json& rs = root.at(key);
    if (!rs.is_object()) top.fail(key, "expected an object, got " + rs.dump());
    const Fields f(rs, source, key + ".");

    std::string type_field = f.has("rope_type") ? "rope_type" : (f.has("type") ? "type" : "");
    const std::string type_name = type_field.empty() ? "default" : f.string(type_field);
    RopeScaling& r = c.rope;
    r.type = parse_rope_type(f, type_field.empty() ? "rope_type" : type_field, type_name);
    if (f.has("rope_theta")) c.rope_theta = f.number("rope_theta");
    if (c.rope_theta <= 1) f.fail("rope_theta", "expected a number > 1, got " + top_number_text(c.rope_theta));
    if (f.has("partial_rotary_factor") && f.number("partial_rotary_factor") != 1.0)
        f.fail("partial_rotary_factor", "partial rotary embeddings are not supported by Llama (expected 1.0)");

    auto factor_at_least_1 = [&]() {
        const double factor = f.number("factor");
        if (factor < 1.0) f.fail("factor", "expected a number >= 1, got " + std::to_string(factor));
        return factor;
    };
    switch (r.type) {
        case RopeType::Default: break;
        case RopeType::Linear:
        case RopeType::Dynamic: r.factor = factor_at_least_1(); break;
        case RopeType::Yarn: {
            r.factor = factor_at_least_1();
            r.original_max_position_embeddings =
                f.dimension_or("original_max_position_embeddings", kMaxPositions, c.max_position_embeddings);
            r.beta_fast = f.number_or("beta_fast", 32.0);
            r.beta_slow = f.number_or("beta_slow", 1.0);
            if (r.beta_fast == 0) r.beta_fast = 32.0;  // transformers: `get("beta_fast") or 32`
            if (r.beta_slow == 0) r.beta_slow = 1.0;
            // Rotation counts: yarn takes their logarithm.
            if (r.beta_fast < 0) f.fail("beta_fast", "expected a positive number");
            if (r.beta_slow < 0) f.fail("beta_slow", "expected a positive number");
            r.attention_factor = f.optional_number("attention_factor");
            if (r.attention_factor && *r.attention_factor < 0) f.fail("attention_factor", "expected a number >= 0");
            r.mscale = f.optional_number("mscale");
            r.mscale_all_dim = f.optional_number("mscale_all_dim");
            r.truncate = f.boolean_or("truncate", true);
            break;
        }
        case RopeType::Llama3: {
            r.factor = factor_at_least_1();
            r.low_freq_factor = f.number("low_freq_factor");
            r.high_freq_factor = f.number("high_freq_factor");
            if (!(r.high_freq_factor > r.low_freq_factor))
                f.fail("high_freq_factor", "expected high_freq_factor > low_freq_factor");
            r.original_max_position_embeddings =
                f.dimension_or("original_max_position_embeddings", kMaxPositions, c.max_position_embeddings);
            break;
        }
    }
}

// The window of each layer, as transformers 5 derives it. Mistral (MistralConfig, MistralModel): sliding_window
// (null: none) on every layer; layer_types is ignored. Qwen2 (Qwen2Config.__post_init__): sliding_window only with
// use_sliding_window (default false; sliding_window defaults to 4096), on the layers of layer_types that say
// "sliding_attention", or without layer_types on the layers i >= max_window_layers (default 28). Llama has none.
void parse_sliding_window(const json& root, const Fields& f, ModelConfig& c) {
    c.sliding_window = 0;
    c.window_layers.clear();
    if (c.architecture == Architecture::Llama) return;
    auto window_value = [&](int def) -> int {
        if (!root.contains("sliding_window")) return def;
        if (root.at("sliding_window").is_null()) return 0;
        return f.dimension("sliding_window", kMaxPositions);
    };
    if (c.architecture == Architecture::Mistral) {
        c.sliding_window = window_value(4096);
        c.window_layers.assign(c.num_layers, true);
    } else {
        const bool use = f.boolean_or("use_sliding_window", false);
        const int window = use ? window_value(4096) : 0;
        std::vector<bool> sliding(c.num_layers, false);
        if (f.has("layer_types")) {
            const json& t = root.at("layer_types");
            if (!t.is_array() || t.size() != static_cast<size_t>(c.num_layers))
                f.fail("layer_types", "expected an array of num_hidden_layers (" + std::to_string(c.num_layers) +
                                          ") strings, got " + t.dump());
            for (size_t i = 0; i < t.size(); ++i) {
                const std::string v = t[i].is_string() ? t[i].get<std::string>() : t[i].dump();
                if (v != "full_attention" && v != "sliding_attention")
                    f.fail("layer_types", "entry " + std::to_string(i) + " is '" + v +
                                              "' (expected full_attention or sliding_attention)");
                sliding[i] = v == "sliding_attention";
            }
            const bool any = std::find(sliding.begin(), sliding.end(), true) != sliding.end();
            if (any && window == 0)  // transformers raises at the first forward: the sliding layers have no window
                f.fail("layer_types", "names sliding_attention layers, but there is no window (sliding_window null or "
                                      "use_sliding_window false)");
        } else if (window > 0) {
            const long long first = f.has("max_window_layers") ? f.integer("max_window_layers") : 28;
            if (first < 0) f.fail("max_window_layers", "expected an integer >= 0, got " + std::to_string(first));
            for (int i = 0; i < c.num_layers; ++i) sliding[i] = i >= first;
        }
        c.sliding_window = window;
        c.window_layers = std::move(sliding);
    }
    // No layer slides: the same model as without a window.
    if (c.sliding_window == 0 || std::find(c.window_layers.begin(), c.window_layers.end(), true) == c.window_layers.end()) {
        c.sliding_window = 0;
        c.window_layers.clear();
    }
}

// Every accepted config must give finite rotary frequencies and scaling at every length the engine uses (the
// parameters are checked one by one above; this catches their combinations, e.g. a yarn ramp or a llama3 blend
// that overflows fp32). Dynamic NTK depends on the length: checked at the model's maximum and at the largest int.
void check_rope_frequencies(const ModelConfig& c, const std::string& source) {
    const std::string field = c.rope.type == RopeType::Default ? "rope_theta" : "rope_scaling";
    for (int len : {1, c.max_position_embeddings, std::numeric_limits<int>::max()}) {
        if (len != 1 && !rope_depends_on_length(c)) break;
        const RopeFrequencies f = rope_frequencies(c, len);
        bool finite = std::isfinite(f.attention_scaling);
        for (float v : f.inv_freq) finite = finite && std::isfinite(v);
        if (!finite)
            throw InputError(source + ": field '" + field + "': the " + std::string(rope_type_name(c.rope.type)) +
                             " rotary parameters give non-finite frequencies (at length " + std::to_string(len) + ")");
    }
}

}  // namespace

ModelConfig parse_model_config(const std::string& json_text, const std::string& source) {
    const json root = parse_json_object(json_text, source, "a JSON object at the top level");
    const Fields f(root, source, "");

    // Architecture: architectures[0] (what transformers instantiates) or, without that list, model_type.
    ModelConfig c;
    if (f.has("architectures")) {
        const json& a = root.at("architectures");
        std::string names;
        if (a.is_array())
            for (const auto& n : a) names += (names.empty() ? "" : ", ") + n.dump();
        else
            names = a.dump();
        if (!a.is_array() || a.empty() || !a[0].is_string() || !architecture_from_name(a[0].get<std::string>(), c.architecture))
            f.fail("architectures", "unsupported architecture [" + names + "] (supported: " + supported_architectures() + ")");
    }
    if (f.has("model_type")) {
        const std::string t = f.string("model_type");
        Architecture from_type;
        if (!architecture_from_model_type(t, from_type))
            f.fail("model_type", "unsupported model type '" + t + "' (supported: llama, mistral, qwen2)");
        if (f.has("architectures") && from_type != c.architecture)
            f.fail("model_type", "'" + t + "' contradicts architectures [\"" +
                                     std::string(architecture_name(c.architecture)) + "\"]");
        c.architecture = from_type;
    }
    if (f.has("hidden_act") && f.string("hidden_act") != "silu")
        f.fail("hidden_act", "unsupported activation '" + f.string("hidden_act") + "' (expected silu)");
    if (c.architecture == Architecture::Llama) {  // Mistral and Qwen2 have no such options (transformers ignores them)
        if (f.boolean_or("attention_bias", false))
            f.fail("attention_bias", "attention biases are not supported for LlamaForCausalLM");
        if (f.boolean_or("mlp_bias", false)) f.fail("mlp_bias", "MLP biases are not supported");
    }
    c.qkv_bias = c.architecture == Architecture::Qwen2;  // Qwen2Attention: q/k/v with bias=True, o_proj without

    c.hidden_size = f.dimension("hidden_size", kMaxHiddenSize);
    c.intermediate_size = f.dimension("intermediate_size", kMaxIntermediateSize);
    c.num_layers = f.dimension("num_hidden_layers", kMaxLayers);
    c.num_heads = f.dimension("num_attention_heads", kMaxHeads);
    c.num_kv_heads = f.dimension_or("num_key_value_heads", kMaxHeads, c.num_heads);
    c.vocab_size = f.dimension("vocab_size", kMaxVocabSize);
    c.max_position_embeddings = f.dimension_or("max_position_embeddings", kMaxPositions, 2048);
    if (c.num_heads % c.num_kv_heads != 0)
        f.fail("num_key_value_heads", "num_attention_heads (" + std::to_string(c.num_heads) +
                                          ") must be a multiple of num_key_value_heads (" +
                                          std::to_string(c.num_kv_heads) + ")");
    if (f.has("head_dim")) {
        c.head_dim = f.dimension("head_dim", kMaxHeadDim);
    } else {
        if (c.hidden_size % c.num_heads != 0)
            f.fail("hidden_size", "must be a multiple of num_attention_heads when head_dim is absent");
        c.head_dim = c.hidden_size / c.num_heads;
        if (c.head_dim > kMaxHeadDim)
            f.fail("hidden_size", "hidden_size / num_attention_heads = " + std::to_string(c.head_dim) +
                                      " exceeds the head_dim limit of " + std::to_string(kMaxHeadDim));
    }
    if (c.head_dim % 2 != 0) f.fail("head_dim", "must be even for rotary embeddings, got " + std::to_string(c.head_dim));
    // q_dim() and kv_dim() are ints: the projection widths must fit (2^30, like every single dimension).
    if (int64_t(c.num_heads) * c.head_dim > (int64_t(1) << 30))
        f.fail("head_dim", "num_attention_heads x head_dim = " + std::to_string(int64_t(c.num_heads) * c.head_dim) +
                               " exceeds 2^30");
    c.rms_norm_eps = f.number_or("rms_norm_eps", 1e-6);
    if (c.rms_norm_eps <= 0) f.fail("rms_norm_eps", "expected a positive number");
    c.tie_word_embeddings = f.boolean_or("tie_word_embeddings", false);

    // Token ids are checked against the vocabulary before they are narrowed to int (4294967298 must not become 2).
    auto token_id = [&](const char* field, long long id) {
        if (id < 0 || id >= c.vocab_size)
            f.fail(field, "id " + std::to_string(id) + " outside the vocabulary of " + std::to_string(c.vocab_size));
        return static_cast<int>(id);
    };
    if (f.has("bos_token_id")) c.bos_token_id = token_id("bos_token_id", f.integer("bos_token_id"));
    else token_id("bos_token_id", c.bos_token_id);
    if (f.has("eos_token_id")) {
        const json& e = root.at("eos_token_id");
        c.eos_token_ids.clear();
        if (e.is_array()) {
            for (const auto& v : e) {
                if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<unsigned long long>() > (1ULL << 62)))
                    f.fail("eos_token_id", "expected integers, got " + e.dump());
                c.eos_token_ids.push_back(token_id("eos_token_id", v.get<long long>()));
            }
        } else {
            c.eos_token_ids.push_back(token_id("eos_token_id", f.integer("eos_token_id")));
        }
    } else {
        for (int id : c.eos_token_ids) token_id("eos_token_id", id);
    }

    // transformers 5 writes "dtype", earlier versions "torch_dtype".
    for (const char* key : {"dtype", "torch_dtype"}) {
        if (!f.has(key)) continue;
        const std::string d = f.string(key);
        if (d == "float32") c.torch_dtype = DType::F32;
        else if (d == "float16") c.torch_dtype = DType::F16;
        else if (d == "bfloat16") c.torch_dtype = DType::BF16;
        else f.fail(key, "unsupported dtype '" + d + "' (expected float32, float16 or bfloat16)");
        break;
    }

    parse_sliding_window(root, f, c);
    parse_rope(root, source, c);
    check_rope_frequencies(c, source);
    return c;
}

ModelConfig load_model_config(const std::filesystem::path& config_json) {
    std::ifstream in(config_json, std::ios::binary);
    if (!in) throw InputError(config_json.string() + ": cannot open (expected a Hugging Face config.json)");
    std::stringstream ss;
    ss << in.rdbuf();
    return parse_model_config(ss.str(), config_json.string());
}

std::string model_config_to_json(const ModelConfig& c) {
    json j;
    j["architectures"] = {std::string(architecture_name(c.architecture))};
    j["model_type"] = kModelTypes[static_cast<int>(c.architecture)];
    j["hidden_size"] = c.hidden_size;
    j["intermediate_size"] = c.intermediate_size;
    j["num_hidden_layers"] = c.num_layers;
    j["num_attention_heads"] = c.num_heads;
    j["num_key_value_heads"] = c.num_kv_heads;
    j["head_dim"] = c.head_dim;
    j["hidden_act"] = "silu";
    j["rms_norm_eps"] = c.rms_norm_eps;
    j["rope_theta"] = c.rope_theta;
    j["max_position_embeddings"] = c.max_position_embeddings;
    j["vocab_size"] = c.vocab_size;
    j["tie_word_embeddings"] = c.tie_word_embeddings;
    j["bos_token_id"] = c.bos_token_id;
    if (c.eos_token_ids.size() == 1) j["eos_token_id"] = c.eos_token_ids[0];
    else j["eos_token_id"] = c.eos_token_ids;
    if (c.architecture == Architecture::Mistral) {
        j["sliding_window"] = c.sliding_window > 0 ? json(c.sliding_window) : json(nullptr);
    } else if (c.architecture == Architecture::Qwen2) {
        j["use_sliding_window"] = c.sliding_window > 0;
        j["sliding_window"] = c.sliding_window > 0 ? json(c.sliding_window) : json(nullptr);
        json types = json::array();
        for (int l = 0; l < c.num_layers; ++l)
            types.push_back(c.attention_window(l) > 0 ? "sliding_attention" : "full_attention");
        j["layer_types"] = types;
    }
    j["torch_dtype"] = c.torch_dtype == DType::F16 ? "float16" : c.torch_dtype == DType::BF16 ? "bfloat16" : "float32";
    const RopeScaling& r = c.rope;
    if (r.type != RopeType::Default) {
        json s;
        s["rope_type"] = std::string(rope_type_name(r.type));
        s["factor"] = r.factor;
        if (r.type == RopeType::Yarn || r.type == RopeType::Llama3)
            s["original_max_position_embeddings"] = r.original_max_position_embeddings;
        if (r.type == RopeType::Yarn) {
            s["beta_fast"] = r.beta_fast;
            s["beta_slow"] = r.beta_slow;
            if (r.attention_factor) s["attention_factor"] = *r.attention_factor;
            if (r.mscale) s["mscale"] = *r.mscale;
            if (r.mscale_all_dim) s["mscale_all_dim"] = *r.mscale_all_dim;
            if (!r.truncate) s["truncate"] = false;
        }
        if (r.type == RopeType::Llama3) {
            s["low_freq_factor"] = r.low_freq_factor;
            s["high_freq_factor"] = r.high_freq_factor;
        }
        j["rope_scaling"] = s;
    }
    return j.dump(2) + "\n";
}

}  // namespace quest
