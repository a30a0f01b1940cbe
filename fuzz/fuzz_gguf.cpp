// libFuzzer target: GgufFile::from_memory on arbitrary bytes, then everything a caller does with an accepted file:
// dequantize every tensor of a supported type, convert Q4_0 / Q4_1 matrices to int4, map the Llama metadata and
// load the Llama weights; build the tokenizer of its vocabulary and run it (encode, decode, stream).
//
// Any input must either be rejected with InputError or give tensors that satisfy what the validation promises
// (checked here, so that a wrong acceptance is a finding too, not only a crash): every tensor's bytes lie inside the
// input, start at an aligned offset of the data section, hold nbytes = numel / block x block bytes, and no two
// tensors overlap.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "kernels/common/error.h"
#include "model/io/gguf.h"
#include "model/io/gguf_model.h"
#include "model/io/gguf_quants.h"
#include "tokenizer/tokenizer.h"

using namespace quest;

#define FUZZ_CHECK(cond) QUEST_FUZZ_CHECK("fuzz_gguf", cond)

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    std::unique_ptr<GgufFile> f;
    try {
        f = GgufFile::from_memory({reinterpret_cast<const std::byte*>(data), size}, "fuzz.gguf");
    } catch (const InputError&) {
        return 0;
    }
    FUZZ_CHECK(size >= 24);
    FUZZ_CHECK(f->version() == 2 || f->version() == 3);
    const uint32_t align = f->alignment();
    FUZZ_CHECK(align != 0 && (align & (align - 1)) == 0);
    // The data section starts aligned, or at the end of a file whose tensors are all empty.
    FUZZ_CHECK(f->data_offset() <= size);
    FUZZ_CHECK(f->data_offset() % align == 0 || f->data_offset() == size);
    std::vector<const GgufTensorInfo*> by_offset;
    for (const GgufTensorInfo& t : f->tensors()) {
        FUZZ_CHECK(f->find(t.name) == &t);
        FUZZ_CHECK(t.ne.size() <= 4);
        const GgmlTypeTraits* tr = ggml_type_traits(uint32_t(t.type));
        FUZZ_CHECK(tr != nullptr);
        FUZZ_CHECK(t.offset % align == 0);
        FUZZ_CHECK(t.cols() % tr->block == 0);
        FUZZ_CHECK(t.nbytes == uint64_t(t.numel) / uint64_t(tr->block) * uint64_t(tr->bytes));
        FUZZ_CHECK(f->data_offset() + t.offset + t.nbytes <= size);
        if (t.nbytes > 0) by_offset.push_back(&t);
        if (gguf_dequantize_supported(t.type)) {
            const std::vector<float> v = dequantize_tensor(*f, t);
            FUZZ_CHECK(int64_t(v.size()) == t.numel);
        } else {
            try {
                dequantize_tensor(*f, t);
                FUZZ_CHECK(false);
            } catch (const InputError&) {
            }
        }
        if ((t.type == GgmlType::Q4_0 || t.type == GgmlType::Q4_1) && t.cols() > 0 && t.rows() > 0 &&
            t.rows() < (1 << 20) && t.cols() < (1 << 20)) {
            const Int4FromGguf r = int4_from_gguf_q4(t.type, f->bytes(t).data(), int(t.rows()), int(t.cols()));
            FUZZ_CHECK(r.matrix.has_value() == (r.inexact_blocks == 0));
            if (t.type == GgmlType::Q4_0) FUZZ_CHECK(r.inexact_blocks == 0);
        }
    }
    std::sort(by_offset.begin(), by_offset.end(), [](auto* a, auto* b) { return a->offset < b->offset; });
    for (size_t i = 1; i < by_offset.size(); ++i)
        FUZZ_CHECK(by_offset[i]->offset >= by_offset[i - 1]->offset + by_offset[i - 1]->nbytes);

    try {
        const ModelConfig c = gguf_model_config(*f);
        (void)load_llama_weights_f32_gguf(*f, c);
    } catch (const InputError&) {
    }
    try {
        const auto tok = gguf_tokenizer(*f);
        const std::string text(reinterpret_cast<const char*>(data), std::min<size_t>(size, 64));
        for (const std::string& t : {std::string("Hello  world\n\xe6\x97\xa5 \xff"), text}) {
            std::vector<int> ids;
            try {
                ids = tok->encode(t, true);
            } catch (const InputError&) {  // no BOS / EOS id where add_bos_token / add_eos_token ask for one
                ids = tok->encode(t, false);
            }
            for (int id : ids) FUZZ_CHECK(id >= 0 && id < tok->vocab_size());
            StreamingDecoder dec(*tok);
            std::string streamed;
            for (int id : ids) streamed += dec.push(id);
            streamed += dec.flush();
            FUZZ_CHECK(streamed == tok->decode(ids));
        }
    } catch (const InputError&) {
    }
    return 0;
}
