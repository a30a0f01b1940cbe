// libFuzzer target: parsing a Hugging Face tokenizer.json (tokenizer/tokenizer_json.cpp) from arbitrary bytes, then
// using the BPE it gives. A file that loads must encode, decode and stream every one of its ids without a crash;
// anything else must be an InputError naming the file.
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz/fuzz_tokenizer_util.h"
#include "kernels/common/error.h"
#include "tokenizer/bpe.h"

using namespace quest;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string_view json(reinterpret_cast<const char*>(data), size);
    try {
        const BpeTokenizer tok(parse_tokenizer_json(json, "fuzz/tokenizer.json"));
        const auto [text, streamed] = fuzz::decode_all_ids(tok);
        if (streamed != text) __builtin_trap();  // the stream must replay decode exactly
        for (const char* t : {"", "Once upon a time", "  two  spaces\n\ttab \xff\xfe bad utf-8 cafe\xcc\x81 123456",
                              "<|im_start|>user<|im_end|>"}) {
            const std::vector<int> ids = tok.encode(t, /*add_bos=*/true);
            (void)tok.decode(ids);
        }
    } catch (const InputError&) {
    }
    return 0;
}
