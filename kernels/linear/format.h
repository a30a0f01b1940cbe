#pragma once
// The weight-format seam, host side: how one linear matrix is stored (a format tag and its parameter), what the user
// asks for, and a matrix on the host on its way to a device. Each format is one file, kernels/linear/format_<name>.cpp,
// that defines its LinearFormatOps (kernels/linear/linear.h: device bytes, upload, the decode GEMVs and their fused
// epilogues, the prefill GEMM) and one line in the registry (kernels/linear/linear.cpp). Plain C++: the model loaders
// (model/io) and the memory plan use it without CUDA.
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kernels/common/dtype.h"
#include "kernels/linear/quant.h"

namespace quest {

enum class LinearFormat : uint8_t {
    F16,   // fp16 [rows][cols]
    Int4,  // quest-int4 v1 (kernels/linear/quant.h), the codes of each row in the device layout (int4_layout.h)
};
inline constexpr LinearFormat kLinearFormats[] = {LinearFormat::F16, LinearFormat::Int4};
const char* linear_format_name(LinearFormat f);  // "fp16", "int4"

// One matrix's storage: its format and the format's parameter.
struct LinearStorage {
    LinearFormat format = LinearFormat::F16;
    int group = 0;  // Int4: input columns per scale (int4_group_valid, dividing cols); 0 for F16

    static LinearStorage f16() { return {}; }
    static LinearStorage int4(int g) { return {LinearFormat::Int4, g}; }
    bool is_f16() const { return format == LinearFormat::F16; }
    bool operator==(const LinearStorage&) const = default;
    std::string describe() const;  // "fp16", "int4 g128"
};

// Whether a rows x cols matrix can be held in `storage` (int4: a valid group dividing cols).
bool linear_storage_holds(const LinearStorage& storage, int64_t rows, int64_t cols);

// What the caller asks of the linear layers: as the checkpoint holds them (float layers in FP16, 4-bit layers in int4
// with their own group), or a format: FP16 for every layer (4-bit layers dequantized), another format for the float
// layers where it holds them (converted on load: int4 by round-to-nearest; random weights drawn in it), 4-bit layers
// keeping their own storage.
struct WeightRequest {
    bool stored = true;
    LinearFormat format = LinearFormat::F16;  // when !stored
    int group = kInt4DefaultGroup;            // the format's parameter (int4: columns per scale)

    LinearStorage target() const { return format == LinearFormat::F16 ? LinearStorage::f16() : LinearStorage{format, group}; }
    static WeightRequest as_stored() { return {}; }
    static WeightRequest f16() { return {false, LinearFormat::F16}; }
    static WeightRequest int4(int g) { return {false, LinearFormat::Int4, g}; }
};

// The storage of one fused device matrix made of parts (q|k|v, gate|up) with `cols` input columns, given how the
// checkpoint stores each part (F16 for any float tensor; int4 with group 0 for 4-bit storage the int4 format cannot
// take as it is): one quantized storage shared by every part stays as it is unless FP16 is asked; all parts float and
// a format asked that holds the matrix: that format; otherwise (parts stored differently) FP16.
LinearStorage choose_linear_storage(const WeightRequest& request, std::span<const LinearStorage> parts, int64_t rows,
                                    int64_t cols);

// A matrix (or the rows of one part of a fused matrix) on the host: as a checkpoint holds it, or converted to the
// storage a device matrix needs (LinearFormatOps::convert).
struct HostLinear {
    LinearStorage storage;
    int64_t rows = 0, cols = 0;
    // F16 storage: float values of `dtype` (F32, F16 or BF16): `mapped_bytes` straight from a mapped file, or `owned`
    // (fp32) when they were dequantized or converted on the host; data() is whichever holds them.
    DType dtype = DType::F32;
    const void* mapped_bytes = nullptr;
    std::vector<float> owned;
    Int4Matrix int4;  // Int4 storage (the quest-int4 v1 layout; the upload permutes it into the device layout)

    static HostLinear floats(std::vector<float> w, int64_t rows, int64_t cols);
    static HostLinear mapped(DType dtype, const void* bytes, int64_t rows, int64_t cols);
    static HostLinear quantized(Int4Matrix m);
    const void* data() const { return mapped_bytes ? mapped_bytes : owned.data(); }
    size_t float_bytes() const { return static_cast<size_t>(rows * cols) * dtype_size(dtype); }
};

}  // namespace quest
