// libFuzzer target: loading a tokenizer.model (SentencePiece protobuf) from arbitrary bytes, then using it.
// A model that loads must encode, decode and stream every one of its ids without a crash, and build the Llama-2 chat
// template; anything else must be an InputError naming the file.
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz/fuzz_tokenizer_util.h"
#include "fuzz/fuzz_util.h"
#include "kernels/common/error.h"
#include "tokenizer/sentencepiece.h"
#include "tokenizer/tokenizer.h"

using namespace quest;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const auto path = fuzz::scratch_dir("tokenizer") / "tokenizer.model";
    fuzz::write_bytes(path, std::string_view(reinterpret_cast<const char*>(data), size));
    try {
        const SentencePieceTokenizer tok(path);
        (void)fuzz::decode_all_ids(tok);
        for (const char* text : {"", "Once upon a time", "  two  spaces\n\ttab \xff\xfe bad utf-8 \xe2\x96\x81"}) {
            try {
                const std::vector<int> ids = tok.encode(text, /*add_bos=*/true);
                (void)tok.decode(ids);
            } catch (const InputError&) {  // e.g. a model without BOS
            }
        }
        try {
            const std::vector<ChatMessage> msgs = {{ChatMessage::Role::System, "be brief"},
                                                   {ChatMessage::Role::User, "hello"}};
            (void)apply_llama2_chat_template(tok, msgs);
        } catch (const InputError&) {
        }
    } catch (const InputError&) {
    }
    return 0;
}
