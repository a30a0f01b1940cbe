#pragma once
// A checkpoint's tensors as a device loader takes them (the read side of the weight-format seam,
// kernels/linear/format.h): a float tensor by name, and each linear part (llama_linear_specs) in the storage the
// checkpoint gives it. One loader (model/cuda/weights.cpp) serves every source; a new checkpoint format is one
// implementation here.
#include <memory>
#include <span>
#include <string>

#include "kernels/linear/format.h"
#include "model/io/model_folder.h"
#include "model/io/quantize.h"

namespace quest {

class WeightSource {
public:
    virtual ~WeightSource() = default;
    // A float tensor (norm, embedding, lm_head) with exactly `shape` ([n] is 1 row of n): the file's F32 / F16 /
    // BF16 bytes where it holds them, else dequantized to fp32. InputError naming the file and tensor otherwise.
    virtual HostLinear tensor(const std::string& name, std::span<const int64_t> shape) const = 0;
    // How the checkpoint stores a linear part: F16 for a float tensor; int4 with its group where it holds 4-bit
    // values the int4 format takes as they are; int4 with group 0 for 4-bit values it cannot (linear() dequantizes
    // them).
    virtual LinearStorage stored(const LinearSpec& part) const = 0;
    // The part: int4 when stored(part) is int4 with a group, float values otherwise.
    virtual HostLinear linear(const LinearSpec& part) const = 0;
    virtual std::string describe() const = 0;  // the file or folder, for messages
};

// The safetensors folder (float, quest-int4 or AutoAWQ layers) or the GGUF file of a model.
std::unique_ptr<WeightSource> open_weight_source(const ModelFolder& model);

}  // namespace quest
