// libFuzzer target: SafeTensorsFile::open on arbitrary bytes.
//
// Any input must either be rejected with InputError or give tensors that satisfy what the header validation
// promises (checked here against the raw input, so that a wrong acceptance is a finding too, not only a crash):
// every tensor lies inside the data area, its byte length is numel x dtype size, no two tensors overlap, and data()
// points at the tensor's bytes. Float tensors are also converted to fp32 (the conversion reads every byte).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "kernels/common/error.h"
#include "model/io/safetensors.h"

using namespace quest;

#define FUZZ_CHECK(cond) QUEST_FUZZ_CHECK("fuzz_safetensors", cond)

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const auto path = fuzz::scratch_dir("safetensors") / "model.safetensors";
    fuzz::write_bytes(path, std::string_view(reinterpret_cast<const char*>(data), size));
    std::unique_ptr<SafeTensorsFile> f;
    try {
        f = SafeTensorsFile::open(path);
    } catch (const InputError&) {
        return 0;
    }
    // Accepted: the file holds the 8-byte length and the header.
    FUZZ_CHECK(size >= 8);
    uint64_t header_len = 0;
    for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | data[i];
    FUZZ_CHECK(header_len <= size - 8);
    const uint64_t data_size = size - 8 - header_len;
    const uint8_t* area = data + 8 + header_len;

    std::vector<const TensorInfo*> by_begin;
    for (const TensorInfo& t : f->tensors()) {
        FUZZ_CHECK(!t.name.empty());
        FUZZ_CHECK(f->find(t.name) == &t);
        FUZZ_CHECK(t.begin <= t.end && t.end <= data_size);
        FUZZ_CHECK(static_cast<uint64_t>(t.numel()) * dtype_size(t.dtype) == t.nbytes());
        FUZZ_CHECK(std::memcmp(f->data(t), area + t.begin, t.nbytes()) == 0);
        if (dtype_is_float(t.dtype) && t.numel() > 0) {
            std::vector<float> out(static_cast<size_t>(t.numel()));
            convert_to_f32(t.dtype, f->data(t), out.data(), out.size());
        }
        (void)shape_to_string(t.shape);
        if (t.nbytes() > 0) by_begin.push_back(&t);
    }
    std::sort(by_begin.begin(), by_begin.end(), [](auto* a, auto* b) { return a->begin < b->begin; });
    for (size_t i = 1; i < by_begin.size(); ++i) FUZZ_CHECK(by_begin[i]->begin >= by_begin[i - 1]->end);
    return 0;
}
