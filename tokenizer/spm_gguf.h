#pragma once
// SentencePiece BPE over a GGUF "llama" vocabulary (tokenizer.ggml.model "llama": Llama-2, Mistral v0.1-v0.3,
// TinyLlama), without libsentencepiece: the pieces, scores and token types that convert_hf_to_gguf.py copies out of
// tokenizer.model. It encodes and decodes as SentencePiece does with the model the vocabulary came from:
//
//   normalizer (identity rule, the one of the Llama family): each byte that is not valid UTF-8 becomes U+FFFD; with
//     remove_extra_whitespaces, leading and trailing spaces are dropped and runs of spaces become one; with
//     add_space_prefix (SentencePiece's add_dummy_prefix) a non-empty text gets a leading space; every ' ' becomes
//     U+2581 ("▁"). Only U+0020 is a space here, as in SentencePiece.
//   BPE (sentencepiece bpe_model.cc): the text splits into characters, user-defined pieces (longest first) kept
//     whole and never merged; the adjacent pair whose concatenation is a normal, user-defined or unused piece with
//     the highest score merges first (ties: the leftmost pair); a final piece that is unused is split back into the
//     pieces it was merged from. Control, unknown and byte pieces are never merge results.
//   unknown pieces: with byte tokens in the vocabulary, each byte of an unknown piece becomes its <0xNN> token
//     (byte fallback); without any, a run of unknown pieces becomes one unknown token.
//   decode (SentencePiece's DecodeIds, tokenizer/spm_decode.h): control tokens vanish, byte tokens are grouped into
//     UTF-8 (U+FFFD per bad byte), "▁" becomes ' ', the first piece's leading space is dropped.
//
// Where llama.cpp (llm_tokenizer_spm) differs from SentencePiece and this follows SentencePiece: llama.cpp merges
// into any piece of the vocabulary (control and byte pieces too), byte-falls-back bad UTF-8 bytes instead of encoding
// U+FFFD, ignores remove_extra_whitespaces for SPM vocabularies, splits user-defined pieces out of the raw text (and
// adds a space prefix after them), and decodes the unknown token as U+2585; SentencePiece's unknown surface is not in
// the GGUF, so its default " \u2047 " is used.
//
// transformers' GGUF-to-tokenizers conversion (tools/check_spm_gguf_hf.py) differs from SentencePiece on a text that
// starts with a space: its Metaspace pre-tokenizer (prepend_scheme "first") adds no "▁" there, so one space is lost
// (139 of the 2,019 corpus lines, for Llama-2's vocabulary and the demo one); and it ignores
// remove_extra_whitespaces (stories260K: 319 lines). llama.cpp prepends the space as SentencePiece does, and also
// ignores remove_extra_whitespaces for SPM vocabularies. Decoded text agrees on every line for all three.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/spm_decode.h"
#include "tokenizer/tokenizer.h"

namespace quest {

// GGUF token types (llama.cpp's llama_token_type / gguf-py's TokenType).
enum class GgufTokenType : int32_t { Normal = 1, Unknown = 2, Control = 3, UserDefined = 4, Unused = 5, Byte = 6 };

// A GGUF "llama" vocabulary, as read from the tokenizer.ggml.* keys (model/io/gguf_model.cpp: gguf_tokenizer).
struct SpmVocab {
    std::filesystem::path file;      // the GGUF file, named in error messages
    std::vector<std::string> tokens;  // tokenizer.ggml.tokens: the piece of each id
    std::vector<float> scores;        // tokenizer.ggml.scores
    std::vector<int32_t> types;       // tokenizer.ggml.token_type
    int bos = -1;                     // tokenizer.ggml.bos_token_id (-1: absent)
    int eos = -1;                     // tokenizer.ggml.eos_token_id
    int unk = -1;                     // tokenizer.ggml.unknown_token_id (-1: absent; the type-2 token is used)
    bool add_bos = true;              // tokenizer.ggml.add_bos_token (llama.cpp's default for SPM: true)
    bool add_eos = false;             // tokenizer.ggml.add_eos_token (default false)
    bool add_space_prefix = true;     // tokenizer.ggml.add_space_prefix (default true)
    bool remove_extra_ws = false;     // tokenizer.ggml.remove_extra_whitespaces (default false, as Llama-2's model)
};

class SpmGgufTokenizer final : public Tokenizer {
public:
    // Validates the vocabulary; InputError naming the file and the key at fault: scores or token_type count not
    // the tokens count, a token type outside 1..6, no unknown token (or unknown_token_id naming another type), two
    // tokens with one piece, a byte token not of the form <0xNN> or repeating a byte, byte tokens present but not
    // all 256 of them.
    explicit SpmGgufTokenizer(SpmVocab vocab);

    // Token ids of `text`; with add_bos, BOS first when add_bos_token and EOS last when add_eos_token (InputError
    // when the id is absent from the file).
    std::vector<int> encode(std::string_view text, bool add_bos = true) const override;
    std::string decode(std::span<const int> ids) const override;
    std::string token_bytes(int id) const override;
    std::string piece(int id) const override;
    int vocab_size() const override { return static_cast<int>(v_.tokens.size()); }
    int bos_id() const override { return v_.bos; }
    int eos_id() const override { return v_.eos; }
    std::vector<int> end_of_turn_ids() const override;  // [EOS] (none without one)
    bool is_control(int id) const override;
    bool is_byte(int id) const override;
    std::optional<int> token_id(std::string_view piece) const override;
    const std::filesystem::path& file() const override { return v_.file; }
    std::unique_ptr<TokenStream> make_stream() const override { return make_spm_stream(dec_, v_.file); }

    // The vocabulary as read, the unknown id resolved (tokenizer/spm_write.h writes it as a tokenizer.model).
    const SpmVocab& vocab() const { return v_; }

    // The normalized text (with "▁") that the BPE runs over, for tests and diagnostics.
    std::string normalize(std::string_view text) const;

private:
    struct StringHash {
        using is_transparent = void;
        size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
    };
    using IdMap = std::unordered_map<std::string, int, StringHash, std::equal_to<>>;

    void check_id(int id) const { dec_.check_id(id, v_.file); }
    void encode_normalized(std::string_view normalized, std::vector<int>& out) const;

    SpmVocab v_;
    SpmDecodeTable dec_;
    IdMap mergeable_;                     // normal, user-defined and unused pieces (SentencePiece's pieces_)
    IdMap reserved_;                      // control, unknown and byte pieces
    std::vector<std::string> user_defined_;  // user-defined pieces, longest first
    std::vector<int> byte_token_;         // [256] id of <0xNN>; empty without byte tokens (no byte fallback)
};

}  // namespace quest
