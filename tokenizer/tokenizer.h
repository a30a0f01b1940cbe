#pragma once
// SentencePiece tokenizer (tokenizer.model of Llama-2-style checkpoints): encoding with BOS, decoding with
// byte-fallback pieces, streaming detokenization that never emits half a UTF-8 character, and the Llama-2 chat
// template ([INST], <<SYS>>) as Meta's reference code builds it.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace quest {

class Tokenizer {
public:
    // Loads tokenizer.model. Throws InputError naming the file when it is missing or not a SentencePiece model.
    explicit Tokenizer(const std::filesystem::path& model_file);
    ~Tokenizer();
    Tokenizer(Tokenizer&&) noexcept;
    Tokenizer& operator=(Tokenizer&&) noexcept;

    // Token ids of `text`, with BOS first when add_bos. An empty text gives [BOS] (or nothing without BOS).
    // Bytes of `text` that are not valid UTF-8 are encoded as U+FFFD each (SentencePiece's normalizer does this).
    std::vector<int> encode(std::string_view text, bool add_bos = true) const;
    // Text of `ids` exactly as SentencePiece decodes it (control tokens vanish, byte pieces become bytes, the
    // dummy-prefix space of the first piece is dropped, byte pieces that do not form valid UTF-8 become U+FFFD
    // each). Throws InputError for an id outside [0, vocab_size()).
    std::string decode(std::span<const int> ids) const;

    // The raw bytes one token contributes to a stream: U+2581 becomes ' ', <0xNN> becomes the byte NN, control
    // tokens (BOS/EOS/...) give "", unknown gives the SentencePiece unknown surface. No space stripping.
    // This and the accessors below throw InputError for an id outside [0, vocab_size()).
    std::string token_bytes(int id) const;
    std::string piece(int id) const;  // the piece as stored in the model ("▁the", "<0x0A>", "<s>")

    int vocab_size() const;
    int bos_id() const;
    int eos_id() const;
    bool is_control(int id) const;
    bool is_byte(int id) const;

private:
    friend class StreamingDecoder;
    enum class Kind : uint8_t { Normal, Control, Unknown, Byte };

    void check_id(int id) const;  // InputError unless 0 <= id < vocab_size()

    std::filesystem::path file_;  // named in error messages
    std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
    // Per-id tables built at load, so that streaming needs no SentencePiece call per token.
    std::vector<Kind> kind_;
    std::vector<std::string> bytes_;     // token_bytes() of each id
    std::vector<uint8_t> leading_ws_;    // 1 when the piece starts with U+2581 (its bytes then start with ' ')
    bool strip_first_ws_ = true;         // normalizer add_dummy_prefix || remove_extra_whitespaces
    bool remove_extra_ws_ = true;        // normalizer remove_extra_whitespaces
};

// Turns a stream of token ids into text pieces. Bytes are held back until they form complete UTF-8 characters,
// so every string returned by push() is valid UTF-8. The concatenation of all push() results and flush() equals
// Tokenizer::decode() of the same ids, for invalid byte sequences too: it replays SentencePiece's decoder state
// (which leading U+2581 is dropped, byte pieces grouped until the next non-byte token). A byte that can no longer
// start or continue a valid character (a lone continuation byte, a lead byte followed by a non-continuation byte,
// an overlong or surrogate prefix, a non-byte token arriving in the middle of a character) is emitted at once as
// U+FFFD, one per bad byte, exactly where SentencePiece puts its U+FFFD. The one difference: models whose
// tokenizer.model carries a denormalization rule (none of the Llama family does) get that rule applied by decode()
// but not here. The Tokenizer must outlive the decoder.
class StreamingDecoder {
public:
    explicit StreamingDecoder(const Tokenizer& tok);
    // Text completed by token `id` (often "", e.g. for BOS or the first bytes of a character). Throws InputError
    // for an id outside [0, vocab_size()).
    std::string push(int id);
    // Emits what is held back; bytes that do not form a valid character become U+FFFD each. The text goes on:
    // later push() calls continue it (call reset() to start a new one).
    std::string flush();
    // Starts a new text (the next piece's leading space is dropped again, as for the first piece of a decode).
    // Held-back bytes are discarded; flush() first to get them.
    void reset();

private:
    std::string drain();  // emits the complete and the known-bad characters at the front of pending_

    const Tokenizer* tok_;
    std::string pending_;       // bytes of an incomplete UTF-8 character (at most 3)
    bool at_start_ = true;      // SentencePiece's is_bos_ws: the next text piece may lose its leading U+2581
    bool bos_ws_seen_ = false;  // the last non-byte piece had its leading U+2581 dropped
    bool emitted_ = false;      // some text has been returned since the start
};

struct ChatMessage {
    enum class Role { System, User, Assistant };
    Role role;
    std::string content;
};

// Llama-2 chat format, as Meta's reference `chat_completion` builds it:
//   [BOS] "[INST] <<SYS>>\n{system}\n<</SYS>>\n\n{user} [/INST]" " {answer} " [EOS] [BOS] "[INST] {user} [/INST]" ...
// An optional first System message is merged into the first user turn. User and answer contents are stripped of
// leading and trailing whitespace as Python's str.strip() does; like Meta's code this strips the merged
// system+user content as a whole, so the system text and the leading whitespace of that first user message are
// kept. Messages must alternate user/assistant and end with a user message; otherwise InputError.
std::vector<int> apply_llama2_chat_template(const Tokenizer& tok, std::span<const ChatMessage> messages);

}  // namespace quest
