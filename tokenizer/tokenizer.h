#pragma once
// The tokenizer seam of the engine: an interface with two implementations, SentencePiece (tokenizer.model of
// Llama-2-style checkpoints, tokenizer/sentencepiece.h) and byte-level BPE (Hugging Face tokenizer.json of GPT-2,
// SmolLM2, Qwen2 and Llama-3 checkpoints, or a GGUF vocabulary; tokenizer/bpe.h); the factory that picks one for a
// model folder; streaming detokenization that never emits half a UTF-8 character; and the Llama-2 chat template
// ([INST], <<SYS>>) as Meta's reference code builds it.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace quest {

// Incremental detokenization state of one tokenizer kind (see StreamingDecoder).
class TokenStream {
public:
    virtual ~TokenStream() = default;
    virtual std::string push(int id) = 0;
    virtual std::string flush() = 0;
    virtual void reset() = 0;
};

class Tokenizer {
public:
    virtual ~Tokenizer() = default;

    // Token ids of `text`. add_bos: add what the tokenizer adds around a text (SentencePiece: BOS, an InputError
    // when the model has none; BPE: what its post-processor adds, e.g. <|begin_of_text|> for Llama-3, nothing for
    // Qwen2). Bytes of `text` that are not valid UTF-8 are encoded as U+FFFD (each byte for SentencePiece, each
    // maximal invalid subpart for BPE, as Python's decode(errors="replace") would hand them to the tokenizer).
    virtual std::vector<int> encode(std::string_view text, bool add_bos = true) const = 0;
    // Text of `ids` as the reference library decodes it (SentencePiece's DecodeIds; Hugging Face's
    // decode(ids, skip_special_tokens=True)): control / special tokens vanish, invalid UTF-8 becomes U+FFFD.
    // Throws InputError for an id outside [0, vocab_size()).
    virtual std::string decode(std::span<const int> ids) const = 0;

    // The raw bytes one token contributes to a stream ("" for control / special tokens). This and the accessors
    // below throw InputError for an id outside [0, vocab_size()).
    virtual std::string token_bytes(int id) const = 0;
    virtual std::string piece(int id) const = 0;  // the piece as stored ("▁the", "Ġthe", "<0x0A>", "<s>")

    virtual int vocab_size() const = 0;
    virtual int bos_id() const = 0;  // -1 when there is none
    virtual int eos_id() const = 0;  // -1 when there is none
    // Tokens that end an assistant turn: EOS and, where the vocabulary has them, <|eot_id|>, <|im_end|>, ...
    virtual std::vector<int> end_of_turn_ids() const = 0;
    virtual bool is_control(int id) const = 0;  // SentencePiece control piece; BPE special added token
    virtual bool is_byte(int id) const = 0;     // a <0xNN> byte piece
    // Id of a piece given verbatim (e.g. "<|im_start|>"), nullopt when the vocabulary has no such piece.
    virtual std::optional<int> token_id(std::string_view piece) const = 0;
    // The file the tokenizer was read from (named in error messages); for a GGUF vocabulary, its description.
    virtual const std::filesystem::path& file() const = 0;

    // A fresh incremental decoder over this tokenizer (which must outlive it); StreamingDecoder wraps it.
    virtual std::unique_ptr<TokenStream> make_stream() const = 0;

protected:
    Tokenizer() = default;
    Tokenizer(const Tokenizer&) = default;
    Tokenizer(Tokenizer&&) noexcept = default;
    Tokenizer& operator=(const Tokenizer&) = default;
    Tokenizer& operator=(Tokenizer&&) noexcept = default;
};

// The tokenizer of a model folder: tokenizer.json (Hugging Face, byte-level BPE) when present, else
// tokenizer.model (SentencePiece); InputError naming the folder and both files when it has neither.
std::unique_ptr<Tokenizer> load_tokenizer(const std::filesystem::path& model_dir);
// The file load_tokenizer reads in `model_dir`: tokenizer.json if it exists, else tokenizer.model (which may not
// exist either).
std::filesystem::path tokenizer_file_in(const std::filesystem::path& model_dir);

// Turns a stream of token ids into text pieces. Bytes are held back until they form complete UTF-8 characters,
// so every string returned by push() is valid UTF-8, and the concatenation of all push() results and flush()
// equals Tokenizer::decode() of the same ids, invalid byte sequences included (see each implementation for how it
// replays its reference decoder). The Tokenizer must outlive the decoder.
class StreamingDecoder {
public:
    explicit StreamingDecoder(const Tokenizer& tok);
    // Text completed by token `id` (often "", e.g. for BOS or the first bytes of a character). Throws InputError
    // for an id outside [0, vocab_size()).
    std::string push(int id);
    // Emits what is held back; bytes that do not form a valid character become U+FFFD. The text goes on: later
    // push() calls continue it (call reset() to start a new one).
    std::string flush();
    // Starts a new text (for SentencePiece the next piece's leading space is dropped again, as for the first piece
    // of a decode). Held-back bytes are discarded; flush() first to get them.
    void reset();

private:
    std::unique_ptr<TokenStream> impl_;
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
