#include "model/io/shard_source.h"

#include <map>
#include <stdexcept>

#include "kernels/common/dtype.h"
#include "kernels/common/error.h"
#include "kernels/linear/quant.h"
#include "model/io/quantize.h"
#include "model/io/weights.h"

namespace quest {

namespace {

// Rows [b, e) of h.
HostLinear slice_rows(HostLinear h, int64_t b, int64_t e) {
    if (!h.storage.is_f16()) {
        const Int4Matrix& m = h.int4;
        Int4Matrix s;
        s.rows = static_cast<int>(e - b);
        s.cols = m.cols;
        s.group = m.group;
        const size_t w = m.words(), g = m.groups();
        s.qweight.assign(m.qweight.begin() + b * w, m.qweight.begin() + e * w);
        s.scales.assign(m.scales.begin() + b * g, m.scales.begin() + e * g);
        s.zeros.assign(m.zeros.begin() + b * g, m.zeros.begin() + e * g);
        return HostLinear::quantized(std::move(s));
    }
    const size_t row_bytes = static_cast<size_t>(h.cols) * dtype_size(h.dtype);
    if (h.mapped_bytes)
        return HostLinear::mapped(h.dtype, static_cast<const char*>(h.mapped_bytes) + b * row_bytes, e - b, h.cols);
    return HostLinear::floats({h.owned.begin() + b * h.cols, h.owned.begin() + e * h.cols}, e - b, h.cols);
}

// Columns [b, e) of h: int4 kept when the group divides b and e, else fp32.
HostLinear slice_cols(const HostLinear& h, int64_t b, int64_t e) {
    const int64_t n = e - b;
    if (!h.storage.is_f16()) {
        const Int4Matrix& m = h.int4;
        if (b % m.group == 0 && e % m.group == 0) {
            Int4Matrix s;
            s.rows = m.rows;
            s.cols = static_cast<int>(n);
            s.group = m.group;
            // Words hold 8 consecutive columns and the group is a multiple of 8: whole words and whole groups.
            for (int r = 0; r < m.rows; ++r) {
                const size_t w = static_cast<size_t>(r) * m.words(), g = static_cast<size_t>(r) * m.groups();
                s.qweight.insert(s.qweight.end(), m.qweight.begin() + w + b / 8, m.qweight.begin() + w + e / 8);
                s.scales.insert(s.scales.end(), m.scales.begin() + g + b / m.group, m.scales.begin() + g + e / m.group);
                s.zeros.insert(s.zeros.end(), m.zeros.begin() + g + b / m.group, m.zeros.begin() + g + e / m.group);
            }
            return HostLinear::quantized(std::move(s));
        }
        const std::vector<float> all = dequantize_int4(m);
        std::vector<float> out;
        out.reserve(static_cast<size_t>(m.rows) * n);
        for (int r = 0; r < m.rows; ++r)
            out.insert(out.end(), all.begin() + r * int64_t(m.cols) + b, all.begin() + r * int64_t(m.cols) + e);
        return HostLinear::floats(std::move(out), m.rows, n);
    }
    std::vector<float> out(static_cast<size_t>(h.rows) * n);
    const size_t es = dtype_size(h.dtype);
    const char* src = static_cast<const char*>(h.data());
    for (int64_t r = 0; r < h.rows; ++r)
        convert_to_f32(h.dtype, src + (r * h.cols + b) * es, out.data() + r * n, static_cast<size_t>(n));
    return HostLinear::floats(std::move(out), h.rows, n);
}

class ShardSource final : public WeightSource {
public:
    ShardSource(const WeightSource& full, const ModelConfig& model, const TpRank& rank)
        : full_(full), model_(model), rank_(rank) {
        const int64_t D = model.head_dim;
        const Cut q{false, rank.heads.begin * D, rank.heads.end() * D};
        const Cut kv{false, rank.kv_heads.begin * D, rank.kv_heads.end() * D};
        const Cut ffn{false, rank.ffn.begin, rank.ffn.end()};
        // llama_linear_specs order: q, k, v (rows), o (columns), gate, up (rows), down (columns).
        const Cut cuts[7] = {q, kv, kv, {true, q.b, q.e}, ffn, ffn, {true, ffn.b, ffn.e}};
        for (int l = 0; l < model.num_layers; ++l) {
            const auto specs = llama_linear_specs(model, l);
            for (int i = 0; i < 7; ++i) parts_[specs[i].prefix] = {specs[i], cuts[i]};
            for (const char* p : {"q_proj", "k_proj", "v_proj"})
                biases_[LlamaTensorNames::layer(l, "self_attn.") + p + ".bias"] = p[0] == 'q' ? q : kv;
        }
    }

    HostLinear tensor(const std::string& name, std::span<const int64_t> shape) const override {
        using N = LlamaTensorNames;
        if (name == N::embed() || name == N::lm_head()) {
            const int64_t full_shape[] = {model_.vocab_size, model_.hidden_size};
            expect_shape(name, shape, {rank_.vocab.count, model_.hidden_size});
            return slice_rows(full_.tensor(name, full_shape), rank_.vocab.begin, rank_.vocab.end());
        }
        if (const auto it = biases_.find(name); it != biases_.end()) {
            const int64_t full_shape[] = {name.find("q_proj") != std::string::npos ? model_.q_dim() : model_.kv_dim()};
            expect_shape(name, shape, {it->second.e - it->second.b});
            return slice_cols(full_.tensor(name, full_shape), it->second.b, it->second.e);
        }
        return full_.tensor(name, shape);  // replicated: norms
    }

    LinearStorage stored(const LinearSpec& part) const override {
        const Part& p = find(part);
        const LinearStorage s = full_.stored(p.full);
        if (!s.is_f16() && s.group && p.cut.columns && (p.cut.b % s.group || p.cut.e % s.group))
            return LinearStorage::int4(0);  // the slice splits groups: given dequantized
        return s;
    }

    HostLinear linear(const LinearSpec& part) const override {
        const Part& p = find(part);
        HostLinear h = full_.linear(p.full);
        return p.cut.columns ? slice_cols(h, p.cut.b, p.cut.e) : slice_rows(std::move(h), p.cut.b, p.cut.e);
    }

    std::string describe() const override {
        return full_.describe() + " (tensor-parallel rank " + std::to_string(rank_.rank) + ")";
    }

private:
    struct Cut {
        bool columns = false;  // a column range (o, down, biases as rows of one), else a row range
        int64_t b = 0, e = 0;
    };
    struct Part {
        LinearSpec full;
        Cut cut;
    };
    const Part& find(const LinearSpec& part) const {
        const auto it = parts_.find(part.prefix);
        if (it == parts_.end()) throw std::logic_error("shard_weight_source: no linear layer '" + part.prefix + "'");
        const Cut& c = it->second.cut;
        const int64_t rows = c.columns ? it->second.full.rows : c.e - c.b;
        const int64_t cols = c.columns ? c.e - c.b : it->second.full.cols;
        if (part.rows != rows || part.cols != cols)
            throw std::logic_error("shard_weight_source: '" + part.prefix + "' asked as [" + std::to_string(part.rows) +
                                   "][" + std::to_string(part.cols) + "], the shard holds [" + std::to_string(rows) +
                                   "][" + std::to_string(cols) + "]");
        return it->second;
    }
    static void expect_shape(const std::string& name, std::span<const int64_t> got, std::vector<int64_t> want) {
        if (!std::equal(got.begin(), got.end(), want.begin(), want.end()))
            throw std::logic_error("shard_weight_source: tensor '" + name + "' asked in a shape the shard does not hold");
    }

    const WeightSource& full_;
    ModelConfig model_;
    TpRank rank_;
    std::map<std::string, Part> parts_;
    std::map<std::string, Cut> biases_;
};

}  // namespace

std::unique_ptr<WeightSource> shard_weight_source(const WeightSource& full, const ModelConfig& model,
                                                  const TpRank& rank) {
    return std::make_unique<ShardSource>(full, model, rank);
}

}  // namespace quest
