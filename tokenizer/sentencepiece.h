#pragma once
// SentencePiece tokenizer (tokenizer.model of Llama-2-style checkpoints): encoding with BOS, decoding with
// byte-fallback pieces, and streaming detokenization that replays SentencePiece's decoder.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/spm_decode.h"
#include "tokenizer/tokenizer.h"

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace quest {

class SentencePieceTokenizer final : public Tokenizer {
public:
    // Loads tokenizer.model. Throws InputError naming the file when it is missing or not a SentencePiece model.
    explicit SentencePieceTokenizer(const std::filesystem::path& model_file);
    ~SentencePieceTokenizer() override;
    SentencePieceTokenizer(SentencePieceTokenizer&&) noexcept;
    SentencePieceTokenizer& operator=(SentencePieceTokenizer&&) noexcept;

    // Token ids of `text`, with BOS first when add_bos. An empty text gives [BOS] (or nothing without BOS).
    // Bytes of `text` that are not valid UTF-8 are encoded as U+FFFD each (SentencePiece's normalizer does this).
    std::vector<int> encode(std::string_view text, bool add_bos = true) const override;
    // Text of `ids` exactly as SentencePiece decodes it (control tokens vanish, byte pieces become bytes, the
    // dummy-prefix space of the first piece is dropped, byte pieces that do not form valid UTF-8 become U+FFFD
    // each). Throws InputError for an id outside [0, vocab_size()).
    std::string decode(std::span<const int> ids) const override;

    // The raw bytes one token contributes to a stream: U+2581 becomes ' ', <0xNN> becomes the byte NN, control
    // tokens (BOS/EOS/...) give "", unknown gives the SentencePiece unknown surface. No space stripping.
    // This and the accessors below throw InputError for an id outside [0, vocab_size()).
    std::string token_bytes(int id) const override;
    std::string piece(int id) const override;  // the piece as stored in the model ("▁the", "<0x0A>", "<s>")

    int vocab_size() const override;
    int bos_id() const override;
    int eos_id() const override;
    std::vector<int> end_of_turn_ids() const override;  // [EOS] (none when the model has no EOS)
    bool is_control(int id) const override;
    bool is_byte(int id) const override;
    std::optional<int> token_id(std::string_view piece) const override;
    const std::filesystem::path& file() const override { return file_; }

    // Replays SentencePiece's decoder state (which leading U+2581 is dropped, byte pieces grouped until the next
    // non-byte token). A byte that can no longer start or continue a valid character (a lone continuation byte, a
    // lead byte followed by a non-continuation byte, an overlong or surrogate prefix, a non-byte token arriving in
    // the middle of a character) is emitted at once as U+FFFD, one per bad byte, exactly where SentencePiece puts
    // its U+FFFD. The one difference: models whose tokenizer.model carries a denormalization rule (none of the
    // Llama family does) get that rule applied by decode() but not here.
    std::unique_ptr<TokenStream> make_stream() const override;

private:
    void check_id(int id) const;  // InputError unless 0 <= id < vocab_size()

    std::filesystem::path file_;  // named in error messages
    std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
    SpmDecodeTable dec_;  // per-id tables built at load, so that streaming needs no SentencePiece call per token
};

}  // namespace quest
