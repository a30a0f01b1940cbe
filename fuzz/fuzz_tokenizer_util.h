#pragma once
// What the tokenizer fuzz targets do with a tokenizer that loaded: look up every id (the first 4,096), decode them
// all at once, and stream them one by one.
#include <string>
#include <utility>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace quest::fuzz {

// {decode of all ids, the same ids through a StreamingDecoder} over ids 0 .. min(vocab, 4096) - 1, after piece,
// token_bytes, is_control and is_byte of each.
inline std::pair<std::string, std::string> decode_all_ids(const Tokenizer& tok) {
    const int n = tok.vocab_size();
    std::vector<int> all;
    for (int id = 0; id < n && id < 4096; ++id) {
        all.push_back(id);
        (void)tok.piece(id);
        (void)tok.token_bytes(id);
        (void)tok.is_control(id);
        (void)tok.is_byte(id);
    }
    std::string text = tok.decode(all);
    StreamingDecoder stream(tok);
    std::string streamed;
    for (int id : all) streamed += stream.push(id);
    streamed += stream.flush();
    return {std::move(text), std::move(streamed)};
}

}  // namespace quest::fuzz
