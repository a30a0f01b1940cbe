#include "model/io/weight_source.h"

#include "kernels/common/error.h"
#include "model/io/gguf_model.h"
#include "model/io/safetensors.h"

namespace quest {

namespace {

int64_t rows_of(std::span<const int64_t> shape) { return shape.size() == 2 ? shape[0] : 1; }

// A Hugging Face folder: float tensors as mapped, 4-bit layers through LinearReader (quest-int4 or AutoAWQ GEMM).
class SafetensorsSource final : public WeightSource {
public:
    explicit SafetensorsSource(const std::filesystem::path& dir)
        : files_(dir), reader_(files_, read_quantization_info(dir)) {}

    HostLinear tensor(const std::string& name, std::span<const int64_t> shape) const override {
        const TensorRef t = files_.get(name, shape);
        const DType dt = t.info->dtype;
        if (!dtype_is_float(dt))
            throw InputError(t.file->path().string() + ": tensor '" + name +
                             "': dtype mismatch: Expected F32, F16 or BF16, Actual " + std::string(dtype_name(dt)));
        return HostLinear::mapped(dt, t.data(), rows_of(shape), shape.back());
    }

    LinearStorage stored(const LinearSpec& s) const override {
        const LinearInfo li = reader_.inspect(s.prefix, s.rows, s.cols);
        // AutoAWQ packs 8 output rows per word: the conversion needs rows % 8 == 0.
        const bool usable = li.int4() && int4_quantizable(static_cast<int>(s.cols), li.group) &&
                            (li.storage == LinearInfo::Storage::Int4 || s.rows % 8 == 0);
        return !li.int4() ? LinearStorage::f16() : LinearStorage::int4(usable ? li.group : 0);
    }

    HostLinear linear(const LinearSpec& s) const override {
        if (const LinearStorage st = stored(s); !st.is_f16())
            return st.group ? HostLinear::quantized(reader_.load_int4(s.prefix, s.rows, s.cols))
                            : HostLinear::floats(reader_.load_f32(s.prefix, s.rows, s.cols), s.rows, s.cols);
        const int64_t shape[] = {s.rows, s.cols};
        return tensor(s.prefix + ".weight", shape);
    }

    std::string describe() const override { return files_.dir().string(); }

private:
    ModelFiles files_;
    LinearReader reader_;
};

// A GGUF file: every tensor dequantized to fp32 with the Q/K row permutation undone (gguf_load_tensor_f32).
class GgufSource final : public WeightSource {
public:
    GgufSource(std::shared_ptr<const GgufFile> f, const ModelConfig& c) : f_(std::move(f)), c_(c) {}

    HostLinear tensor(const std::string& name, std::span<const int64_t> shape) const override {
        return HostLinear::floats(gguf_load_tensor_f32(*f_, c_, name, shape), rows_of(shape), shape.back());
    }
    LinearStorage stored(const LinearSpec&) const override { return LinearStorage::f16(); }
    HostLinear linear(const LinearSpec& s) const override {
        const int64_t shape[] = {s.rows, s.cols};
        return tensor(s.prefix + ".weight", shape);
    }
    std::string describe() const override { return f_->name(); }

private:
    std::shared_ptr<const GgufFile> f_;
    ModelConfig c_;
};

}  // namespace

std::unique_ptr<WeightSource> open_weight_source(const ModelFolder& model) {
    if (model.is_gguf()) return std::make_unique<GgufSource>(model.gguf, model.config);
    return std::make_unique<SafetensorsSource>(model.dir);
}

}  // namespace quest
