#include "model/io/quantize.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unistd.h>

#include "kernels/common/basic_ops.h"
#include "model/io/atomic_file.h"
#include "model/io/gguf_model.h"
#include "kernels/common/error.h"
#include "model/cpu/llama_cpu.h"
#include "model/io/model_folder.h"
#include "model/io/weights.h"
#include "tokenizer/tokenizer.h"

namespace quest {

using nlohmann::json;

// ---------------------------------------------------------------------------------------------------------------------
// quantization_config
// ---------------------------------------------------------------------------------------------------------------------

std::string QuantizationInfo::describe() const {
    switch (method) {
        case Method::None: return "fp16";
        case Method::QuestInt4: return "quest-int4 g" + std::to_string(group);
        case Method::Awq: return "awq g" + std::to_string(group);
    }
    return "?";
}

namespace {

std::string lower(std::string s) {
    for (char& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    return s;
}

json read_json(const std::filesystem::path& p) {
    std::ifstream in(p, std::ios::binary);
    if (!in) throw InputError(p.string() + ": cannot open");
    try {
        return json::parse(in);
    } catch (const json::exception& e) {
        throw InputError(p.string() + ": not valid JSON (" + e.what() + ")");
    }
}

// Field access with errors "<file>: field 'quantization_config.<name>': ...".
struct QFields {
    const json& obj;
    std::string file, prefix;
    [[noreturn]] void fail(const std::string& name, const std::string& what) const {
        throw InputError(file + ": field '" + prefix + name + "': " + what);
    }
    bool has(const std::string& name) const { return obj.contains(name) && !obj.at(name).is_null(); }
    long long integer(const std::string& name) const {
        const json& v = obj.at(name);
        if (!v.is_number_integer()) fail(name, "expected an integer, got " + v.dump());
        return v.get<long long>();
    }
    std::string string(const std::string& name) const {
        const json& v = obj.at(name);
        if (!v.is_string()) fail(name, "expected a string, got " + v.dump());
        return v.get<std::string>();
    }
    bool boolean(const std::string& name) const {
        const json& v = obj.at(name);
        if (!v.is_boolean()) fail(name, "expected true or false, got " + v.dump());
        return v.get<bool>();
    }
};

int parse_group(const QFields& f, const std::string& name) {
    if (!f.has(name)) f.fail(name, "missing (expected the group size)");
    const long long g = f.integer(name);
    if (g == -1) return 0;  // AWQ: one group per row
    if (g < 8 || g > (1 << 20)) f.fail(name, "expected a positive group size, got " + std::to_string(g));
    return static_cast<int>(g);
}

}  // namespace

QuantizationInfo read_quantization_info(const std::filesystem::path& dir) {
    QuantizationInfo info;
    const auto config = dir / "config.json";
    if (std::filesystem::exists(config)) {
        const json root = read_json(config);
        if (root.is_object() && root.contains("quantization_config") && !root["quantization_config"].is_null()) {
            const json& q = root["quantization_config"];
            if (!q.is_object())
                throw InputError(config.string() + ": field 'quantization_config': expected an object");
            const QFields f{q, config.string(), "quantization_config."};
            if (!f.has("quant_method")) f.fail("quant_method", "missing");
            const std::string method = lower(f.string("quant_method"));
            if (method == kQuestInt4Method) {
                info.method = QuantizationInfo::Method::QuestInt4;
            } else if (method == "awq") {
                info.method = QuantizationInfo::Method::Awq;
            } else {
                f.fail("quant_method", "unsupported quantization '" + method +
                                           "' (this engine reads awq (GEMM) and quest-int4 checkpoints)");
            }
            const char* bits_key = f.has("bits") ? "bits" : "w_bit";
            if (!f.has(bits_key)) f.fail("bits", "missing (expected 4)");
            if (f.integer(bits_key) != 4)
                f.fail(bits_key, "only 4-bit weights are supported, got " + std::to_string(f.integer(bits_key)));
            if (f.has("zero_point") && !f.boolean("zero_point"))
                f.fail("zero_point", "only zero-point (asymmetric) 4-bit weights are supported");
            info.group = parse_group(f, f.has("group_size") ? "group_size" : "q_group_size");
            if (info.method == QuantizationInfo::Method::Awq) {
                const std::string version = f.has("version") ? lower(f.string("version")) : "gemm";
                if (version != "gemm")
                    f.fail("version", "unsupported AWQ version '" + version + "' (expected gemm)");
            } else {
                if (f.has("layout") && f.string("layout") != kQuestInt4Layout)
                    f.fail("layout", "unknown layout '" + f.string("layout") + "' (expected " + kQuestInt4Layout + ")");
                if (f.has("layout_version") && f.integer("layout_version") != kQuestInt4LayoutVersion)
                    f.fail("layout_version", "unsupported layout version " +
                                                 std::to_string(f.integer("layout_version")) + " (expected " +
                                                 std::to_string(kQuestInt4LayoutVersion) + ")");
                if (!int4_group_valid(info.group))
                    f.fail("group_size", "expected a power of two >= 32, got " + std::to_string(info.group));
            }
            return info;
        }
    }
    const auto legacy = dir / "quant_config.json";  // AutoAWQ before transformers integration
    if (std::filesystem::exists(legacy)) {
        const json q = read_json(legacy);
        if (!q.is_object()) throw InputError(legacy.string() + ": expected a JSON object");
        const QFields f{q, legacy.string(), ""};
        info.method = QuantizationInfo::Method::Awq;
        const char* bits_key = f.has("w_bit") ? "w_bit" : "bits";
        if (!f.has(bits_key) || f.integer(bits_key) != 4) f.fail(bits_key, "only 4-bit weights are supported");
        if (f.has("zero_point") && !f.boolean("zero_point")) f.fail("zero_point", "only zero-point weights are supported");
        info.group = parse_group(f, f.has("q_group_size") ? "q_group_size" : "group_size");
        const std::string version = f.has("version") ? lower(f.string("version")) : "gemm";
        if (version != "gemm") f.fail("version", "unsupported AWQ version '" + version + "' (expected gemm)");
    }
    return info;
}

// ---------------------------------------------------------------------------------------------------------------------
// Reading linear layers
// ---------------------------------------------------------------------------------------------------------------------

namespace {

template <typename T>
std::vector<T> copy_tensor(const TensorRef& t, DType expected, const std::string& name) {
    if (t.info->dtype != expected)
        throw InputError(t.file->path().string() + ": tensor '" + name + "': dtype mismatch: Expected " +
                         std::string(dtype_name(expected)) + ", Actual " + std::string(dtype_name(t.info->dtype)));
    std::vector<T> v(static_cast<size_t>(t.info->numel()));
    std::memcpy(v.data(), t.data(), t.info->nbytes());
    return v;
}

const TensorRef get_shaped(const ModelFiles& files, const std::string& name, std::initializer_list<int64_t> shape) {
    return files.get(name, std::span<const int64_t>(shape.begin(), shape.size()));
}

// Second dimension of a 2-D tensor (0 when it is not 2-D).
int64_t dim(const TensorRef& t, int i) { return t.info->shape.size() == 2 ? t.info->shape[i] : 0; }

}  // namespace

LinearReader::LinearReader(const ModelFiles& files, QuantizationInfo info) : files_(files), info_(info) {}

LinearInfo LinearReader::inspect(const std::string& prefix, int64_t rows, int64_t cols) const {
    LinearInfo li;
    if (files_.find(prefix + ".weight")) return li;
    const auto fail_group = [&](const TensorRef& t, const std::string& name, const std::string& expected) {
        throw InputError(t.file->path().string() + ": tensor '" + name + "': shape " + shape_to_string(t.info->shape) +
                         " does not give a group size for a " + std::to_string(rows) + " x " + std::to_string(cols) +
                         " layer (expected " + expected + ")");
    };
    // The group size from the scales tensor `name`: dimension rows_dim holds the rows, the other the groups.
    const auto group_from_scales = [&](const std::string& name, int rows_dim, const std::string& expected) {
        const auto s = files_.find(name);
        if (!s) throw InputError("tensor '" + name + "' not found in " + files_.dir().string());
        const int64_t groups = dim(*s, 1 - rows_dim);
        if (dim(*s, rows_dim) != rows || groups <= 0 || cols % groups != 0) fail_group(*s, name, expected);
        return static_cast<int>(cols / groups);
    };
    if (info_.method == QuantizationInfo::Method::QuestInt4 && files_.find(prefix + ".q4_weight")) {
        li.storage = LinearInfo::Storage::Int4;
        li.group = group_from_scales(prefix + ".q4_scales", 0, "[out, in / G]");
    } else if (info_.method == QuantizationInfo::Method::Awq && files_.find(prefix + ".qweight")) {
        li.storage = LinearInfo::Storage::Awq;
        li.group = group_from_scales(prefix + ".scales", 1, "[in / G, out]");
    } else {
        const int64_t shape[] = {rows, cols};
        files_.get(prefix + ".weight", shape);  // throws the usual "not found" message
    }
    if (info_.group > 0 && li.group != info_.group)
        throw InputError("tensor '" + prefix + "': group size " + std::to_string(li.group) + " from its shapes, but " +
                         "config.json says group_size " + std::to_string(info_.group));
    return li;
}

Int4Matrix LinearReader::load_int4(const std::string& prefix, int64_t rows, int64_t cols) const {
    const LinearInfo li = inspect(prefix, rows, cols);
    const int G = li.group;
    if (li.storage == LinearInfo::Storage::Int4) {
        if (!int4_quantizable(static_cast<int>(cols), G))
            throw InputError("tensor '" + prefix + "': group size " + std::to_string(G) + " is not valid for " +
                             std::to_string(cols) + " input columns");
        Int4Matrix m;
        m.rows = static_cast<int>(rows);
        m.cols = static_cast<int>(cols);
        m.group = G;
        const std::string qn = prefix + ".q4_weight", sn = prefix + ".q4_scales", zn = prefix + ".q4_zeros";
        const auto q = copy_tensor<int32_t>(get_shaped(files_, qn, {rows, cols / 8}), DType::I32, qn);
        m.qweight.assign(q.begin(), q.end());
        m.scales = copy_tensor<uint16_t>(get_shaped(files_, sn, {rows, cols / G}), DType::F16, sn);
        const TensorRef zt = get_shaped(files_, zn, {rows, cols / G});
        m.zeros = copy_tensor<uint8_t>(zt, DType::U8, zn);
        for (uint8_t z : m.zeros)
            if (z > 15)
                throw InputError(zt.file->path().string() + ": tensor '" + zn + "': zero point " + std::to_string(z) +
                                 " outside 0..15");
        return m;
    }
    if (li.storage == LinearInfo::Storage::Awq) {
        if (rows % 8 != 0 || !int4_quantizable(static_cast<int>(cols), G))
            throw InputError("tensor '" + prefix + "': AWQ group size " + std::to_string(G) + " for " +
                             std::to_string(rows) + " x " + std::to_string(cols) +
                             " cannot be held by the quest-int4 layout (it needs a power of two >= 32)");
        const std::string qn = prefix + ".qweight", zn = prefix + ".qzeros", sn = prefix + ".scales";
        const auto q = copy_tensor<int32_t>(get_shaped(files_, qn, {cols, rows / 8}), DType::I32, qn);
        const auto z = copy_tensor<int32_t>(get_shaped(files_, zn, {cols / G, rows / 8}), DType::I32, zn);
        const auto s = copy_tensor<uint16_t>(get_shaped(files_, sn, {cols / G, rows}), DType::F16, sn);
        return int4_from_awq(q.data(), z.data(), s.data(), static_cast<int>(cols), static_cast<int>(rows), G);
    }
    throw InputError("tensor '" + prefix + "': stored in floating point, not 4-bit");
}

std::vector<float> LinearReader::load_f32(const std::string& prefix, int64_t rows, int64_t cols) const {
    const LinearInfo li = inspect(prefix, rows, cols);
    if (li.storage == LinearInfo::Storage::Float) {
        const int64_t shape[] = {rows, cols};
        return load_tensor_f32(files_, prefix + ".weight", shape);
    }
    if (li.storage == LinearInfo::Storage::Awq && (!int4_quantizable(static_cast<int>(cols), li.group) || rows % 8)) {
        // An AWQ group the quest-int4 layout cannot hold (e.g. one group per row of 11008): dequantize directly.
        const int G = li.group;
        const std::string qn = prefix + ".qweight", zn = prefix + ".qzeros", sn = prefix + ".scales";
        if (rows % 8) throw InputError("tensor '" + qn + "': out_features " + std::to_string(rows) + " % 8 != 0");
        const auto q = copy_tensor<int32_t>(get_shaped(files_, qn, {cols, rows / 8}), DType::I32, qn);
        const auto z = copy_tensor<int32_t>(get_shaped(files_, zn, {cols / G, rows / 8}), DType::I32, zn);
        const auto s = copy_tensor<uint16_t>(get_shaped(files_, sn, {cols / G, rows}), DType::F16, sn);
        std::vector<float> w(static_cast<size_t>(rows * cols));
        for (int64_t k = 0; k < cols; ++k)
            for (int64_t n = 0; n < rows; ++n) {
                const int slot = kInt4Slot[n % 8];
                const uint32_t qw = static_cast<uint32_t>(q[k * (rows / 8) + n / 8]);
                const uint32_t zw = static_cast<uint32_t>(z[(k / G) * (rows / 8) + n / 8]);
                const int code = static_cast<int>((qw >> (4 * slot)) & 15u), zero = static_cast<int>((zw >> (4 * slot)) & 15u);
                w[n * cols + k] = static_cast<float>(code - zero) * half_to_float(s[(k / G) * rows + n]);
            }
        return w;
    }
    return dequantize_int4(load_int4(prefix, rows, cols));
}

std::vector<LinearSpec> llama_linear_specs(const ModelConfig& c, int l) {
    const int64_t h = c.hidden_size, q = c.q_dim(), kv = c.kv_dim(), f = c.intermediate_size;
    auto p = [&](const char* name) { return LlamaTensorNames::layer(l, name); };
    return {{p("self_attn.q_proj"), q, h}, {p("self_attn.k_proj"), kv, h}, {p("self_attn.v_proj"), kv, h},
            {p("self_attn.o_proj"), h, q}, {p("mlp.gate_proj"), f, h},    {p("mlp.up_proj"), f, h},
            {p("mlp.down_proj"), h, f}};
}

namespace {

// The 7 linear weights of a layer, in llama_linear_specs order.
std::vector<std::vector<float>*> layer_linears(LayerWeightsF32& L) {
    return {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down};
}

}  // namespace

int fake_quantize_llama_weights(LlamaWeightsF32& w, int group, int threads) {
    int n = 0;
    for (int l = 0; l < w.config.num_layers; ++l) {
        const auto specs = llama_linear_specs(w.config, l);
        const auto mats = layer_linears(w.layers[l]);
        for (size_t i = 0; i < specs.size(); ++i) {
            if (!int4_quantizable(static_cast<int>(specs[i].cols), group)) continue;
            const Int4Matrix m = quantize_int4(mats[i]->data(), static_cast<int>(specs[i].rows),
                                               static_cast<int>(specs[i].cols), group, nullptr, threads);
            dequantize_int4(m, mats[i]->data());
            ++n;
        }
    }
    return n;
}

// ---------------------------------------------------------------------------------------------------------------------
// Activation-aware scaling
// ---------------------------------------------------------------------------------------------------------------------

namespace {

// Output error of replacing W by Q(W diag(s)) diag(s)^-1 on the inputs X [n][cols]: ||X (W' - W)^T||^2.
double scaled_quant_loss(const std::vector<float>& W, int rows, int cols, int group, const std::vector<float>& s,
                         const std::vector<float>& X, int n, int threads) {
    const Int4Matrix m = quantize_int4(W.data(), rows, cols, group, s.data(), threads);
    std::vector<float> E = dequantize_int4(m);
    for (int r = 0; r < rows; ++r)
        for (int c = 0; c < cols; ++c) {
            float& e = E[static_cast<size_t>(r) * cols + c];
            e = e / s[c] - W[static_cast<size_t>(r) * cols + c];
        }
    std::vector<float> Y(static_cast<size_t>(n) * rows);
    matmul_ref(Y.data(), E.data(), X.data(), n, rows, cols, threads);
    double loss = 0;
    for (float y : Y) loss += double(y) * y;
    return loss;
}

}  // namespace

AwqStats apply_awq_scaling(LlamaWeightsF32& w, std::span<const int> tokens, int group, int threads) {
    const ModelConfig& c = w.config;
    AwqStats stats;
    stats.calib_tokens = static_cast<int>(tokens.size());
    if (tokens.empty()) throw InputError("--awq-calib: the calibration text has no tokens");
    // The loss uses at most this many calibration tokens (evenly spaced): the search is 20 quantizations and
    // products per site.
    constexpr int kLossTokens = 128;
    const int n = static_cast<int>(tokens.size());
    std::vector<int> pick;
    for (int i = 0; i < std::min(n, kLossTokens); ++i) pick.push_back(static_cast<int>(int64_t(i) * n / std::min(n, kLossTokens)));

    // Inputs of every site of every layer, from one full-precision forward pass.
    struct SiteInputs {
        std::vector<float> x;  // [n][cols]
        int cols = 0;
    };
    std::vector<std::array<SiteInputs, 4>> inputs(c.num_layers);
    {
        QuestSettings q;
        q.full_attention = true;
        // Borrow the weights (not modified before the forward is done).
        std::shared_ptr<const LlamaWeightsF32> view(&w, [](const LlamaWeightsF32*) {});
        CpuLlama model(view, q, n);
        model.set_activation_observer([&](int layer, LinearSite site, const float* x, int t, int cols) {
            SiteInputs& s = inputs[layer][static_cast<int>(site)];
            s.cols = cols;
            s.x.assign(x, x + static_cast<size_t>(t) * cols);
        });
        model.prefill(tokens);
    }

    const int D = c.head_dim, gq = c.group_size();
    for (int l = 0; l < c.num_layers; ++l) {
        LayerWeightsF32& L = w.layers[l];
        struct Site {
            LinearSite site;
            std::vector<std::vector<float>*> mats;
            std::vector<int> rows;
        };
        const int H = c.hidden_size, F = c.intermediate_size, Q = c.q_dim(), KV = c.kv_dim();
        const Site sites[] = {{LinearSite::Qkv, {&L.wq, &L.wk, &L.wv}, {Q, KV, KV}},
                              {LinearSite::O, {&L.wo}, {H}},
                              {LinearSite::GateUp, {&L.w_gate, &L.w_up}, {F, F}},
                              {LinearSite::Down, {&L.w_down}, {H}}};
        for (const Site& site : sites) {
            const SiteInputs& in = inputs[l][static_cast<int>(site.site)];
            const int cols = in.cols;
            if (cols == 0 || !int4_quantizable(cols, group)) continue;
            std::vector<float> X(pick.size() * static_cast<size_t>(cols));
            for (size_t i = 0; i < pick.size(); ++i)
                std::copy_n(&in.x[static_cast<size_t>(pick[i]) * cols], cols, &X[i * cols]);
            std::vector<double> mean(cols, 0.0);
            for (int t = 0; t < n; ++t)
                for (int k = 0; k < cols; ++k) mean[k] += std::abs(in.x[static_cast<size_t>(t) * cols + k]);
            for (double& m : mean) m /= n;
            if (site.site == LinearSite::O && gq > 1) {
                // One scale per KV channel: v_proj rows carry it, and each feeds the G query heads of its group.
                for (int kvh = 0; kvh < c.num_kv_heads; ++kvh)
                    for (int d = 0; d < D; ++d) {
                        double m = 0;
                        for (int h = kvh * gq; h < (kvh + 1) * gq; ++h) m += mean[h * D + d];
                        for (int h = kvh * gq; h < (kvh + 1) * gq; ++h) mean[h * D + d] = m / gq;
                    }
            }
            double best_loss = 0, rtn_loss = 0;
            std::vector<float> best(cols, 1.0f);
            for (int step = 0; step < 20; ++step) {
                const double alpha = step / 20.0;
                std::vector<float> s(cols);
                float smax = 0, smin = INFINITY;
                for (int k = 0; k < cols; ++k) {
                    s[k] = static_cast<float>(std::pow(std::max(mean[k], 1e-4), alpha));
                    smax = std::max(smax, s[k]);
                    smin = std::min(smin, s[k]);
                }
                const float norm = std::sqrt(smax * smin);
                for (float& v : s) v /= norm;
                double loss = 0;
                for (size_t i = 0; i < site.mats.size(); ++i)
                    loss += scaled_quant_loss(*site.mats[i], site.rows[i], cols, group, s, X,
                                              static_cast<int>(pick.size()), threads);
                if (step == 0) rtn_loss = best_loss = loss;
                if (loss < best_loss) {
                    best_loss = loss;
                    best = s;
                }
            }
            stats.loss_rtn += rtn_loss;
            stats.loss_awq += best_loss;
            if (best_loss >= rtn_loss) continue;
            ++stats.sites_scaled;
            // W <- W diag(s); the previous op divides its output by s.
            for (size_t i = 0; i < site.mats.size(); ++i)
                for (int r = 0; r < site.rows[i]; ++r)
                    for (int k = 0; k < cols; ++k) (*site.mats[i])[static_cast<size_t>(r) * cols + k] *= best[k];
            switch (site.site) {
                case LinearSite::Qkv:
                    for (int k = 0; k < cols; ++k) L.attn_norm[k] /= best[k];
                    break;
                case LinearSite::GateUp:
                    for (int k = 0; k < cols; ++k) L.mlp_norm[k] /= best[k];
                    break;
                case LinearSite::Down:
                    for (int k = 0; k < cols; ++k)
                        for (int j = 0; j < H; ++j) L.w_up[static_cast<size_t>(k) * H + j] /= best[k];
                    break;
                case LinearSite::O:
                    for (int kvh = 0; kvh < c.num_kv_heads; ++kvh)
                        for (int d = 0; d < D; ++d) {
                            const float sv = best[kvh * gq * D + d];
                            for (int j = 0; j < H; ++j) L.wv[static_cast<size_t>(kvh * D + d) * H + j] /= sv;
                        }
                    break;
            }
        }
    }
    return stats;
}

// ---------------------------------------------------------------------------------------------------------------------
// Writing
// ---------------------------------------------------------------------------------------------------------------------

std::string QuantizeSummary::text() const {
    std::ostringstream o;
    char buf[256];
    o << "quantized " << quantized << " of " << quantized + kept_fp16.size() << " linear layers to int4 (group "
      << group << ", " << (awq ? "activation-aware scaling" : "round-to-nearest") << ")\n";
    for (const std::string& k : kept_fp16) o << "kept in FP16: " << k << "\n";
    std::snprintf(buf, sizeof buf, "weight error ||W - Q(W)|| / ||W|| over the quantized layers: %.4f\n", weight_rel_err);
    o << buf;
    if (awq) {
        std::snprintf(buf, sizeof buf,
                      "AWQ: %d of the searched sites scaled on %d calibration tokens; calibration output error %.4g "
                      "(round-to-nearest %.4g, ratio %.3f)\n",
                      awq_stats.sites_scaled, awq_stats.calib_tokens, awq_stats.loss_awq, awq_stats.loss_rtn,
                      awq_stats.loss_rtn > 0 ? awq_stats.loss_awq / awq_stats.loss_rtn : 1.0);
        o << buf;
    }
    std::snprintf(buf, sizeof buf, "size: %.2f MB -> %.2f MB\n", bytes_in / 1e6, bytes_out / 1e6);
    o << buf;
    return o.str();
}

namespace {

struct TensorStore {
    std::vector<std::unique_ptr<std::vector<std::byte>>> storage;
    std::vector<TensorToWrite> tensors;

    template <typename T>
    void add(const std::string& name, DType dtype, std::vector<int64_t> shape, const std::vector<T>& values) {
        auto bytes = std::make_unique<std::vector<std::byte>>(values.size() * sizeof(T));
        std::memcpy(bytes->data(), values.data(), bytes->size());
        tensors.push_back({name, dtype, std::move(shape), *bytes});
        storage.push_back(std::move(bytes));
    }
    void add_f16(const std::string& name, std::vector<int64_t> shape, const std::vector<float>& v) {
        std::vector<uint16_t> h(v.size());
        for (size_t i = 0; i < v.size(); ++i) h[i] = float_to_half(std::clamp(v[i], -65504.0f, 65504.0f));
        add(name, DType::F16, std::move(shape), h);
    }
    void add_int4(const std::string& prefix, const Int4Matrix& m) {
        add(prefix + ".q4_weight", DType::I32, {m.rows, m.cols / 8}, m.qweight);
        add(prefix + ".q4_scales", DType::F16, {m.rows, m.groups()}, m.scales);
        add(prefix + ".q4_zeros", DType::U8, {m.rows, m.groups()}, m.zeros);
    }
};

size_t folder_safetensors_bytes(const std::filesystem::path& dir) {
    size_t n = 0;
    for (const auto& e : std::filesystem::directory_iterator(dir))
        if (e.is_regular_file() && e.path().extension() == ".safetensors" &&
            e.path().filename().string().rfind("reference", 0) != 0)
            n += e.file_size();
    return n;
}

std::string read_text(const std::filesystem::path& p) {
    std::ifstream in(p, std::ios::binary);
    if (!in) throw InputError(p.string() + ": cannot open");
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

// -o before any work: a folder (new or existing) whose nearest existing ancestor is a writable folder.
void check_output_folder(const std::filesystem::path& out) {
    namespace fs = std::filesystem;
    std::error_code ec;
    const fs::file_status st = fs::status(out, ec);
    if (fs::exists(st) && !fs::is_directory(st))
        throw InputError("-o " + out.string() + ": exists and is not a folder (expected a new or existing output folder)");
    fs::path probe = fs::exists(st) ? out : out.parent_path();
    if (probe.empty()) probe = ".";
    while (!fs::exists(probe, ec) && probe.has_parent_path() && probe.parent_path() != probe) probe = probe.parent_path();
    if (!fs::is_directory(probe, ec))
        throw InputError("-o " + out.string() + ": " + probe.string() + " is not a folder (expected a new or existing output folder)");
    if (::access(probe.c_str(), W_OK | X_OK) != 0)
        throw InputError("-o " + out.string() + ": " + probe.string() + " is not writable");
}

// A model whose every linear input dimension is below (or not a multiple of) the group would be "quantized" into an
// FP16 copy: refused before any work, naming the largest group that quantizes something.
void check_some_layer_quantizable(const ModelConfig& c, int group, const std::filesystem::path& config_file) {
    const auto specs = llama_linear_specs(c, 0);  // every layer has the same shapes
    std::vector<int64_t> dims;
    for (const LinearSpec& s : specs)
        if (int4_quantizable(static_cast<int>(s.cols), group)) return;
        else if (std::find(dims.begin(), dims.end(), s.cols) == dims.end()) dims.push_back(s.cols);
    std::string listed;
    for (int64_t d : dims) listed += (listed.empty() ? "" : ", ") + std::to_string(d);
    // The largest group that divides every input dimension, else the largest that divides one.
    std::string hint = "no power of two >= 32 divides any of them: this model cannot be stored in 4 bits";
    for (const bool all : {true, false}) {
        for (int g = group / 2; g >= 32; g /= 2) {
            int n = 0;
            for (const LinearSpec& s : specs) n += int4_quantizable(static_cast<int>(s.cols), g);
            if (n > 0 && (!all || n == static_cast<int>(specs.size()))) {
                hint = "try --group " + std::to_string(g) + " (" + std::to_string(n) + " of the " +
                       std::to_string(specs.size()) + " linear layers per block)";
                break;
            }
        }
        if (hint.rfind("try", 0) == 0) break;
    }
    throw InputError("--group " + std::to_string(group) + ": no linear layer of " + config_file.string() +
                     " can be quantized (input dimensions " + listed + " are not multiples of " +
                     std::to_string(group) + "); " + hint);
}

}  // namespace

QuantizeSummary quantize_model(const std::filesystem::path& in, const std::filesystem::path& out,
                               const QuantizeOptions& opts, const std::function<void(const std::string&)>& progress) {
    auto say = [&](const std::string& s) {
        if (progress) progress(s);
    };
    // A folder or a GGUF file (open_model_folder decides); a GGUF's tensors are dequantized to fp32 whole.
    const ModelFolder model = open_model_folder(in);
    std::error_code ec;
    if (std::filesystem::exists(out) && std::filesystem::equivalent(in, out, ec))
        throw InputError("-o: the output folder must differ from the input folder");
    check_output_folder(out);
    const ModelConfig& config = model.config;
    const QuantizationInfo info = model.is_gguf() ? QuantizationInfo{} : read_quantization_info(in);
    std::optional<ModelFiles> files_owner;
    if (!model.is_gguf()) files_owner.emplace(in);
    std::optional<LinearReader> reader_owner;
    if (!model.is_gguf()) reader_owner.emplace(*files_owner, info);
    const int group = opts.group != 0                                                         ? opts.group
                      : info.method != QuantizationInfo::Method::None && int4_group_valid(info.group) ? info.group
                                                                                               : kInt4DefaultGroup;
    if (!int4_group_valid(group))
        throw InputError("--group: expected a power of two >= 32 (e.g. 32, 64, 128), got " + std::to_string(group));
    check_some_layer_quantizable(config, group, model.config_file());

    QuantizeSummary sum;
    sum.group = group;
    sum.bytes_in = model.is_gguf() ? model.gguf->file_size() : folder_safetensors_bytes(in);

    // With calibration, the whole model in fp32 (scales are folded across layers); otherwise tensor by tensor.
    std::unique_ptr<LlamaWeightsF32> full;
    if (!opts.calib_file.empty()) {
        const auto tok_file = model.tokenizer_file();
        if (!std::filesystem::exists(tok_file))
            throw InputError(tok_file.string() + ": missing (--awq-calib tokenizes the calibration text with it; "
                             "expected tokenizer.json or tokenizer.model)");
        const auto tok = load_model_tokenizer(model);
        check_tokenizer_vocab(*tok, model);
        std::vector<int> ids = tok->encode(read_text(opts.calib_file), /*add_bos=*/true);
        const int limit = std::min(opts.calib_tokens, config.max_context());
        if (static_cast<int>(ids.size()) > limit) ids.resize(limit);
        if (ids.size() < 2) throw InputError(opts.calib_file.string() + ": the calibration text is empty");
        say("loading the model in fp32 for calibration");
        full = std::make_unique<LlamaWeightsF32>(load_model_weights_f32(model));
        say("searching activation-aware scales on " + std::to_string(ids.size()) + " calibration tokens");
        sum.awq = true;
        sum.awq_stats = apply_awq_scaling(*full, ids, group, opts.threads);
    }

    if (!full && model.is_gguf()) {
        say("dequantizing " + model.dir.string() + " to fp32");
        full = std::make_unique<LlamaWeightsF32>(load_model_weights_f32(model));
    }
    using N = LlamaTensorNames;
    const int64_t H = config.hidden_size, V = config.vocab_size;
    TensorStore store;
    auto vec1 = [&](const std::string& name) {
        const int64_t shape[] = {H};
        return load_tensor_f32(*files_owner, name, shape);
    };
    store.add_f16(N::embed(), {V, H}, full ? full->embed : [&] {
        const int64_t shape[] = {V, H};
        return load_tensor_f32(*files_owner, N::embed(), shape);
    }());
    double err_num = 0, err_den = 0;
    for (int l = 0; l < config.num_layers; ++l) {
        say("layer " + std::to_string(l + 1) + " of " + std::to_string(config.num_layers));
        store.add(N::layer(l, "input_layernorm.weight"), DType::F32, {H},
                  full ? full->layers[l].attn_norm : vec1(N::layer(l, "input_layernorm.weight")));
        const auto specs = llama_linear_specs(config, l);
        const auto mats = full ? layer_linears(full->layers[l]) : std::vector<std::vector<float>*>(7, nullptr);
        for (size_t i = 0; i < specs.size(); ++i) {
            const LinearSpec& s = specs[i];
            if (i == 4)  // the MLP norm sits between o_proj and gate_proj in file order
                store.add(N::layer(l, "post_attention_layernorm.weight"), DType::F32, {H},
                          full ? full->layers[l].mlp_norm : vec1(N::layer(l, "post_attention_layernorm.weight")));
            const LinearReader* reader = reader_owner ? &*reader_owner : nullptr;
            const LinearInfo li = full ? LinearInfo{} : reader->inspect(s.prefix, s.rows, s.cols);
            if (!full && li.int4() && li.group == group && int4_quantizable(static_cast<int>(s.cols), group) &&
                (li.storage == LinearInfo::Storage::Int4 || s.rows % 8 == 0)) {
                store.add_int4(s.prefix, reader->load_int4(s.prefix, s.rows, s.cols));  // exact copy
                ++sum.quantized;
                continue;
            }
            std::vector<float> loaded;
            if (!full) loaded = reader->load_f32(s.prefix, s.rows, s.cols);
            const std::vector<float>& W = full ? *mats[i] : loaded;
            if (int4_quantizable(static_cast<int>(s.cols), group)) {
                const Int4Matrix m = quantize_int4(W.data(), static_cast<int>(s.rows), static_cast<int>(s.cols),
                                                   group, nullptr, opts.threads);
                const double e = int4_relative_error(W.data(), m);
                double den = 0;
                for (float v : W) den += double(v) * v;
                err_num += e * e * den;
                err_den += den;
                store.add_int4(s.prefix, m);
                ++sum.quantized;
            } else {
                sum.kept_fp16.push_back(s.prefix + ": input dimension " + std::to_string(s.cols) +
                                        " is not a multiple of the group size " + std::to_string(group));
                store.add_f16(s.prefix + ".weight", {s.rows, s.cols}, W);
            }
        }
        if (config.qkv_bias)  // Qwen2's q/k/v biases stay fp32 (a bias is not a linear layer)
            for (const char* b : {"self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"}) {
                const int64_t n = b[10] == 'q' ? config.q_dim() : config.kv_dim();
                const LayerWeightsF32* L = full ? &full->layers[l] : nullptr;
                const std::vector<float>* have = !L ? nullptr : b[10] == 'q' ? &L->bq : b[10] == 'k' ? &L->bk : &L->bv;
                const int64_t shape[] = {n};
                store.add(N::layer(l, b), DType::F32, {n}, have ? *have : load_tensor_f32(*files_owner, N::layer(l, b), shape));
            }
    }
    store.add(N::final_norm(), DType::F32, {H}, full ? full->final_norm : vec1(N::final_norm()));
    if (!config.tie_word_embeddings) {
        const int64_t shape[] = {V, H};
        store.add_f16(N::lm_head(), {V, H}, full ? full->lm_head : load_tensor_f32(*files_owner, N::lm_head(), shape));
    }
    sum.weight_rel_err = err_den > 0 ? std::sqrt(err_num / err_den) : 0.0;

    std::filesystem::create_directories(out);
    write_safetensors(out / "model.safetensors", store.tensors,
                      {{"format", "pt"}, {"quantized_by", "quest quantize"}});
    ModelConfig oc = config;
    oc.torch_dtype = DType::F16;
    json cj = json::parse(model_config_to_json(oc));
    json kept = json::array();
    for (const std::string& k : sum.kept_fp16) kept.push_back(k.substr(0, k.find(':')));
    cj["quantization_config"] = {{"quant_method", kQuestInt4Method},
                                 {"bits", 4},
                                 {"group_size", group},
                                 {"zero_point", true},
                                 {"layout", kQuestInt4Layout},
                                 {"layout_version", kQuestInt4LayoutVersion},
                                 {"awq_scaled", sum.awq},
                                 {"modules_not_quantized", kept}};
    // Every output file is written whole or not at all (an interrupted quantize leaves no partial file).
    write_file_atomic(out / "config.json", cj.dump(2) + "\n");
    if (model.is_gguf()) {
        // The GGUF's vocabulary and chat template as a Hugging Face folder holds them: tokenizer.json for a
        // byte-level BPE vocabulary, tokenizer.model for a SentencePiece one, and tokenizer_config.json. A file
        // whose vocabulary this engine cannot read gives a folder without a tokenizer, said here.
        std::vector<std::pair<std::string, std::string>> files;
        try {
            files = gguf_tokenizer_files(*model.gguf, config);
        } catch (const InputError& e) {
            say("note: no tokenizer written to " + out.string() + " (" + e.what() +
                "): the output runs bench and soak, not text");
        }
        for (const auto& [name, content] : files) write_file_atomic(out / name, content);
    } else
        for (const char* name : {"tokenizer.model", "tokenizer_config.json", "special_tokens_map.json",
                                 "generation_config.json", "tokenizer.json"})
            if (std::filesystem::exists(in / name)) copy_file_atomic(in / name, out / name);
    sum.bytes_out = std::filesystem::file_size(out / "model.safetensors");
    return sum;
}

}  // namespace quest
