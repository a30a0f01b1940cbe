#pragma once
// Byte-level BPE tokenizer with the semantics of Hugging Face `tokenizers` (the Rust library) for the families
// GPT-2, SmolLM2, Qwen2 and Llama-3: added tokens split out first (longest match first), a pre-tokenizer pipeline
// (Split by a PCRE2 regex or a string, Digits, ByteLevel), BPE merges by rank (ignore_merges, byte_fallback, unk),
// a post-processor deciding what is added around a text, and the ByteLevel / ByteFallback decoders. Built from a
// tokenizer.json (tokenizer/tokenizer_json.cpp) or from the tokenizer.ggml.* arrays of a GGUF file.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace quest {

// A compiled PCRE2 pattern (UTF + Unicode properties), shared between copies; matching is thread-safe.
class BpeRegex {
public:
    // Throws InputError naming `where` with PCRE2's message when the pattern does not compile.
    BpeRegex(const std::string& pattern, const std::string& where);
    // Match state reused across find_all calls of one thread (any BpeRegex may use it).
    struct Scratch {
        Scratch();
        ~Scratch();
        Scratch(const Scratch&) = delete;
        Scratch& operator=(const Scratch&) = delete;
        void* md;  // pcre2_match_data
    };
    // Byte ranges [begin, end) of the successive non-overlapping matches in `text` (valid UTF-8).
    std::vector<std::pair<size_t, size_t>> find_all(std::string_view text) const;
    std::vector<std::pair<size_t, size_t>> find_all(std::string_view text, Scratch& scratch) const;
    const std::string& pattern() const { return pattern_; }

private:
    struct Code;
    std::string pattern_;
    std::shared_ptr<const Code> code_;
};

// How a Split pre-tokenizer treats its matches (Hugging Face's SplitDelimiterBehavior).
enum class SplitBehavior : uint8_t { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

// One step of the pre-tokenizer pipeline; each step splits every piece the previous steps produced.
struct BpePreStep {
    enum class Kind : uint8_t { Split, ByteLevel, Digits };
    Kind kind = Kind::Split;
    // Split: a regex (or, when regex is empty, the literal `literal`); Digits: the regex \p{N}.
    std::shared_ptr<const BpeRegex> regex;
    std::string literal;
    SplitBehavior behavior = SplitBehavior::Isolated;
    bool invert = false;             // Split: the pieces between matches are the delimiters
    bool add_prefix_space = false;   // ByteLevel: prepend ' ' to a piece that does not start with one
    bool use_regex = true;           // ByteLevel: split with the GPT-2 pattern before mapping bytes to chars
    bool individual_digits = false;  // Digits: every digit alone (else runs of digits)
};

// A token matched verbatim in the text before pre-tokenization (tokenizer.json "added_tokens").
struct BpeAddedToken {
    std::string content;
    int id = -1;
    bool special = false;     // vanishes in decode; is_control()
    bool lstrip = false;      // the match swallows the whitespace on its left
    bool rstrip = false;      // ... and on its right
    bool normalized = false;  // matched in the normalized text (else in the raw text)
};

// Everything a BpeTokenizer is made of, as read from tokenizer.json or a GGUF vocabulary.
struct BpeData {
    std::filesystem::path file;                            // named in error messages
    std::vector<std::string> vocab;                        // [n] model piece of each id ("" where only an added token)
    std::vector<std::pair<std::string, std::string>> merges;  // [m] merge pairs, rank = index
    std::vector<BpeAddedToken> added;                      // [k]
    bool nfc = false;                                      // normalizer NFC
    std::vector<BpePreStep> pre;                           // pre-tokenizer pipeline, in order
    std::string unk_token;                                 // "" when none
    std::string continuing_subword_prefix;                 // prepended to every non-first char of a word
    std::string end_of_word_suffix;                        // appended to the last char of a word
    bool fuse_unk = false;
    bool byte_fallback = false;  // a char not in the vocab becomes its <0xNN> byte pieces
    bool ignore_merges = false;  // a pre-token that is itself in the vocab is one token
    enum class Decoder : uint8_t { ByteLevel, ByteFallback };
    Decoder decoder = Decoder::ByteLevel;
    std::vector<int> prefix_ids;  // added before a text by encode(add_bos=true) (post-processor, add_bos_token)
    std::vector<int> suffix_ids;  // added after it
    int bos = -1;
    int eos = -1;
    std::vector<int> end_of_turn;  // eos and the end-of-turn specials present (<|eot_id|>, <|im_end|>, ...)
};

// Parses a tokenizer.json (and a tokenizer_config.json next to it, when present) into BpeData. InputError naming
// the file and the expectation for anything malformed or outside what this tokenizer implements.
BpeData parse_tokenizer_json(std::string_view json, const std::filesystem::path& file,
                             std::string_view tokenizer_config_json = {});

// The inverse of parse_tokenizer_json: a Hugging Face tokenizer.json and the tokenizer_config.json beside it
// (bos_token, eos_token, the chat template when non-empty) that parse back into a tokenizer giving the same ids,
// decoding, special tokens, BOS / EOS and end-of-turn ids as `d`. Hugging Face `tokenizers` reads the same file.
// A vocabulary that a tokenizer.json cannot hold (one piece under two ids: model.vocab maps pieces to ids) is an
// InputError naming d.file, the piece and both ids.
struct TokenizerJsonFiles {
    std::string tokenizer_json;
    std::string tokenizer_config_json;
};
TokenizerJsonFiles write_tokenizer_json(const BpeData& d, const std::string& chat_template = {},
                                        int model_max_length = 0);

class BpeTokenizer final : public Tokenizer {
public:
    explicit BpeTokenizer(BpeData data);

    // Reads `file` (tokenizer.json) and tokenizer_config.json from the same folder when it exists.
    static BpeTokenizer from_json_file(const std::filesystem::path& file);

    // From the tokenizer.ggml.* arrays of a GGUF file (tokenizer.ggml.model "gpt2"): tokens[i] is the byte-level
    // piece of id i, merges are "a b" strings in rank order, token_types are GGUF's (1 normal, 2 unknown, 3 control,
    // 4 user-defined, 5 unused, 6 byte; control and user-defined tokens are matched verbatim in the text, control
    // ones are special), bos/eos -1 when absent. `pre` is tokenizer.ggml.pre, which picks the split regexes as
    // llama.cpp does: "gpt2"/"gpt-2", "smollm", "llama-bpe"/"llama3", "qwen2"; another name is an InputError.
    // Like llama.cpp it applies no normalizer (Qwen2's tokenizer.json has NFC) and adds BOS only for Llama-3.
    // `where` names the source in error messages.
    static BpeTokenizer from_gguf_vocab(std::span<const std::string> tokens, std::span<const std::string> merges,
                                        std::span<const int32_t> token_types, int bos, int eos,
                                        const std::string& pre, const std::filesystem::path& where = "GGUF vocabulary");

    std::vector<int> encode(std::string_view text, bool add_bos = true) const override;
    std::string decode(std::span<const int> ids) const override;
    std::string token_bytes(int id) const override;
    std::string piece(int id) const override;
    int vocab_size() const override { return static_cast<int>(pieces_.size()); }
    int bos_id() const override { return d_.bos; }
    int eos_id() const override { return d_.eos; }
    std::vector<int> end_of_turn_ids() const override { return d_.end_of_turn; }
    bool is_control(int id) const override;
    bool is_byte(int id) const override;
    std::optional<int> token_id(std::string_view piece) const override;
    const std::filesystem::path& file() const override { return d_.file; }
    // Byte-level decoding: bytes are held until they form a character, a maximal invalid subpart becomes one
    // U+FFFD as soon as it is known (Rust's from_utf8_lossy over the whole text). ByteFallback decoding: a run of
    // <0xNN> pieces is held until it ends (a non-byte token or flush), then emitted as text when it is valid UTF-8,
    // else as one U+FFFD per byte (Hugging Face's ByteFallback decoder).
    std::unique_ptr<TokenStream> make_stream() const override;

    // What the tokenizer was built from (write_tokenizer_json turns it back into a tokenizer.json).
    const BpeData& data() const { return d_; }

    // The pre-tokens of `text` (already normalized; no added-token splitting), for tests and diagnostics.
    std::vector<std::string> pre_tokenize(std::string_view text) const;

private:
    friend class BpeStream;
    struct StringHash {
        using is_transparent = void;
        size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
    };
    struct Merge {
        int rank;
        int id;  // the merged piece
    };

    void check_id(int id) const;
    void encode_word(std::string_view word, std::vector<int>& out) const;  // BPE model over one pre-token
    // The ids of pre-tokens already merged in this encode() call (the same word recurs a lot in a long text).
    using WordCache = std::unordered_map<std::string, std::vector<int>, StringHash, std::equal_to<>>;
    // Pre-tokenizer + BPE over normalized text, through `cache`.
    void encode_segment(std::string_view text, std::vector<int>& out, WordCache& cache) const;
    int model_id(std::string_view piece) const;                             // -1 when absent

    BpeData d_;
    std::vector<std::string> pieces_;   // [n] piece() of each id (an added token's content where it has one)
    std::vector<std::string> bytes_;    // [n] token_bytes() of each id
    std::vector<uint8_t> special_;      // [n] 1 for a special added token
    std::vector<int16_t> byte_of_;      // [n] NN of a <0xNN> model piece, -1 otherwise
    std::unordered_map<std::string, int, StringHash, std::equal_to<>> model_ids_;  // model vocab piece -> id
    std::unordered_map<std::string, int, StringHash, std::equal_to<>> all_ids_;    // added contents, then pieces
    std::unordered_map<uint64_t, Merge> merges_;  // (left id << 32 | right id) -> rank and merged id
    std::vector<int> byte_piece_;                 // [256] id of <0xNN>, -1 when absent
    int unk_id_ = -1;
};

}  // namespace quest
