#pragma once
// SentencePiece's decoder, replayed token by token (internal to tokenizer/): shared by the tokenizer that loads a
// tokenizer.model through libsentencepiece (tokenizer/sentencepiece.h) and the one that reads a GGUF "llama"
// vocabulary (tokenizer/spm_gguf.h), so that both stream text the same way.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace quest {

// Per-id tables of a SentencePiece vocabulary, built at load, so that streaming needs no lookup per token.
struct SpmDecodeTable {
    enum class Kind : uint8_t { Normal, Control, Unknown, Byte };
    std::vector<Kind> kind;            // [n] Normal also covers user-defined and unused pieces (decoded as text)
    std::vector<std::string> bytes;    // [n] raw bytes of each id: U+2581 -> ' ', <0xNN> -> NN, control -> "",
                                       //     unknown -> the unknown surface
    std::vector<uint8_t> leading_ws;   // [n] 1 when a normal piece starts with U+2581 (its bytes then with ' ')
    bool strip_first_ws = true;        // normalizer add_dummy_prefix || remove_extra_whitespaces
    bool remove_extra_ws = true;       // normalizer remove_extra_whitespaces
    int size() const { return static_cast<int>(kind.size()); }
    // InputError unless 0 <= id < size(), naming `file`.
    void check_id(int id, const std::filesystem::path& file) const;
};

// Replays SentencePieceProcessor::Decode one token at a time (which leading U+2581 is dropped, byte pieces grouped
// until the next non-byte token). A byte that can no longer start or continue a valid character (a lone
// continuation byte, a lead byte followed by a non-continuation byte, an overlong or surrogate prefix, a non-byte
// token arriving in the middle of a character) is emitted at once as U+FFFD, one per bad byte, exactly where
// SentencePiece puts its U+FFFD. `table` and `file` (named in errors) must outlive the stream.
std::unique_ptr<TokenStream> make_spm_stream(const SpmDecodeTable& table, const std::filesystem::path& file);

// The whole text of `ids` through a fresh stream (push each id, then flush): SentencePiece's DecodeIds.
std::string spm_decode(const SpmDecodeTable& table, const std::filesystem::path& file, const std::vector<int>& ids);

}  // namespace quest
