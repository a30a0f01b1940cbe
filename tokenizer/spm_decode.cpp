#include "tokenizer/spm_decode.h"

#include <string_view>

#include "kernels/common/error.h"
#include "tokenizer/utf8.h"

namespace quest {

using utf8::kReplacement;

void SpmDecodeTable::check_id(int id, const std::filesystem::path& file) const {
    if (id < 0 || id >= size())
        throw InputError("token id " + std::to_string(id) + " is out of range for tokenizer file " + file.string() +
                         " (expected 0 <= id < " + std::to_string(size()) + ")");
}

namespace {

// SentencePiece collects runs of byte pieces and converts each run at its end, one U+FFFD per byte that does not
// start a valid character; here the valid characters and the bytes known to be bad leave as soon as they are known,
// which gives the same text. For each non-byte piece it first sets is_bos_ws = false when the previous non-byte
// piece dropped a leading U+2581 or some text has been produced, then drops the leading U+2581 of a normal piece
// while is_bos_ws holds (when the normalizer adds a dummy prefix or removes extra whitespace).
class SpmStream final : public TokenStream {
public:
    SpmStream(const SpmDecodeTable& t, const std::filesystem::path& file) : t_(&t), file_(&file) {}
    std::string push(int id) override;
    std::string flush() override;
    void reset() override;

private:
    std::string drain();  // emits the complete and the known-bad characters at the front of pending_

    const SpmDecodeTable* t_;
    const std::filesystem::path* file_;
    std::string pending_;       // bytes of an incomplete UTF-8 character (at most 3)
    bool at_start_ = true;      // SentencePiece's is_bos_ws: the next text piece may lose its leading U+2581
    bool bos_ws_seen_ = false;  // the last non-byte piece had its leading U+2581 dropped
    bool emitted_ = false;      // some text has been returned since the start
};

std::string SpmStream::drain() {
    std::string out;
    size_t i = 0;
    while (i < pending_.size()) {
        const auto lead = static_cast<uint8_t>(pending_[i]);
        const int n = utf8::length(lead);
        bool bad = n == 0;
        int have = 1;
        for (; !bad && have < n && i + have < pending_.size(); ++have)
            bad = !utf8::continues(lead, have, static_cast<uint8_t>(pending_[i + have]));
        if (bad) {  // the byte at i can never start a valid character; what follows it is looked at afresh
            out += kReplacement;
            ++i;
        } else if (have == n) {
            out.append(pending_, i, n);
            i += n;
        } else {
            break;  // a proper prefix of a valid character: wait for more bytes
        }
    }
    pending_.erase(0, i);
    return out;
}

std::string SpmStream::push(int id) {
    t_->check_id(id, *file_);
    using Kind = SpmDecodeTable::Kind;
    const Kind kind = t_->kind[id];
    if (kind == Kind::Byte) {
        pending_ += t_->bytes[id];
        std::string out = drain();
        emitted_ = emitted_ || !out.empty();
        return out;
    }

    // A non-byte token ends the run of byte pieces: a held-back prefix will never complete.
    std::string out;
    for (size_t k = 0; k < pending_.size(); ++k) out += kReplacement;
    pending_.clear();
    emitted_ = emitted_ || !out.empty();
    if (bos_ws_seen_ || emitted_) at_start_ = false;

    bool dropped_ws = false;
    std::string_view text = t_->bytes[id];  // "" for control tokens, the unk surface for unknown ones
    if (kind == Kind::Normal && at_start_ && t_->strip_first_ws && t_->leading_ws[id]) {
        text.remove_prefix(1);  // the ' ' that came from the leading U+2581
        // With remove_extra_whitespaces SentencePiece keeps looking for a leading space until text appears.
        dropped_ws = !t_->remove_extra_ws;
    }
    bos_ws_seen_ = dropped_ws;
    out += text;
    emitted_ = emitted_ || !out.empty();
    return out;
}

std::string SpmStream::flush() {
    std::string out;
    for (size_t k = 0; k < pending_.size(); ++k) out += kReplacement;
    pending_.clear();
    emitted_ = emitted_ || !out.empty();
    return out;
}

void SpmStream::reset() {
    pending_.clear();
    at_start_ = true;
    bos_ws_seen_ = false;
    emitted_ = false;
}

}  // namespace

std::unique_ptr<TokenStream> make_spm_stream(const SpmDecodeTable& table, const std::filesystem::path& file) {
    return std::make_unique<SpmStream>(table, file);
}

std::string spm_decode(const SpmDecodeTable& table, const std::filesystem::path& file, const std::vector<int>& ids) {
    for (int id : ids) table.check_id(id, file);
    SpmStream s(table, file);
    std::string text;
    for (int id : ids) text += s.push(id);
    return text + s.flush();
}

}  // namespace quest
