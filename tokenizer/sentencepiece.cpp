#include "tokenizer/sentencepiece.h"

#include <exception>
#include <utility>

#include <sentencepiece_processor.h>

#include "kernels/common/error.h"
#include "tokenizer/utf8.h"

namespace quest {

namespace {

constexpr std::string_view kSpaceSymbol = "\xe2\x96\x81";  // U+2581, SentencePiece's escaped space
using utf8::kReplacement;

// ---------------------------------------------------------------------------------------------------------------------
// Minimal protobuf reader. The decoder's first-space rule depends on two NormalizerSpec flags, but Debian's
// libsentencepiece-dev ships no sentencepiece_model.pb.h, so ModelProto cannot be inspected through the C++ API;
// these few lines read the two fields from serialized_model_proto() instead.
// ---------------------------------------------------------------------------------------------------------------------

struct ProtoReader {
    std::string_view data;
    size_t pos = 0;

    bool done() const { return pos >= data.size(); }

    bool varint(uint64_t& out) {
        out = 0;
        for (int shift = 0; shift < 64; shift += 7) {
            if (pos >= data.size()) return false;
            const auto b = static_cast<uint8_t>(data[pos++]);
            out |= uint64_t(b & 0x7f) << shift;
            if (!(b & 0x80)) return true;
        }
        return false;
    }

    // Reads one field: its number, wire type, varint value (wire type 0) or payload (wire type 2).
    bool field(uint32_t& number, uint32_t& wire_type, uint64_t& value, std::string_view& payload) {
        uint64_t tag = 0;
        if (!varint(tag)) return false;
        number = static_cast<uint32_t>(tag >> 3);
        wire_type = static_cast<uint32_t>(tag & 7);
        switch (wire_type) {
        case 0: return varint(value);
        case 1: return skip(8);
        case 5: return skip(4);
        case 2: {
            uint64_t len = 0;
            if (!varint(len) || len > data.size() - pos) return false;
            payload = data.substr(pos, len);
            pos += len;
            return true;
        }
        default: return false;  // groups (3, 4) are not used by sentencepiece_model.proto
        }
    }

    bool skip(size_t n) {
        if (n > data.size() - pos) return false;
        pos += n;
        return true;
    }
};

// NormalizerSpec is field 3 of ModelProto; add_dummy_prefix (3) and remove_extra_whitespaces (4) default to true.
// A message field given several times is merged, so the last value of each flag wins.
bool read_normalizer_flags(std::string_view model_proto, bool& add_dummy_prefix, bool& remove_extra_ws) {
    add_dummy_prefix = true;
    remove_extra_ws = true;
    ProtoReader top{model_proto};
    while (!top.done()) {
        uint32_t number = 0, wire_type = 0;
        uint64_t value = 0;
        std::string_view payload;
        if (!top.field(number, wire_type, value, payload)) return false;
        if (number != 3 || wire_type != 2) continue;
        ProtoReader spec{payload};
        while (!spec.done()) {
            if (!spec.field(number, wire_type, value, payload)) return false;
            if (wire_type != 0) continue;
            if (number == 3) add_dummy_prefix = value != 0;
            if (number == 4) remove_extra_ws = value != 0;
        }
    }
    return true;
}


std::string replace_all(std::string_view s, std::string_view from, std::string_view to) {
    std::string out;
    out.reserve(s.size());
    for (size_t i = 0; i < s.size();) {
        if (s.substr(i, from.size()) == from) {
            out += to;
            i += from.size();
        } else {
            out += s[i++];
        }
    }
    return out;
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------------------
// SentencePieceTokenizer
// ---------------------------------------------------------------------------------------------------------------------

SentencePieceTokenizer::SentencePieceTokenizer(const std::filesystem::path& model_file)
    : file_(model_file), sp_(std::make_unique<sentencepiece::SentencePieceProcessor>()) {
    const std::string name = "tokenizer file " + model_file.string();
    std::error_code ec;
    if (!std::filesystem::exists(model_file, ec))
        throw InputError(name + " does not exist (expected a SentencePiece tokenizer.model)");
    if (std::filesystem::is_directory(model_file, ec))
        throw InputError(name + " is a directory (expected a SentencePiece tokenizer.model file)");

    sentencepiece::util::Status status;
    try {
        status = sp_->Load(model_file.string());
    } catch (const std::exception& e) {  // SentencePiece's file reader may throw std::ios_failure
        throw InputError(name + " could not be read: " + e.what());
    }
    if (!status.ok())
        throw InputError(name + " is not a valid SentencePiece model (" + status.ToString() + ")");

    if (!read_normalizer_flags(sp_->serialized_model_proto(), strip_first_ws_, remove_extra_ws_))
        throw InputError(name + ": malformed normalizer_spec in the model protobuf");
    strip_first_ws_ = strip_first_ws_ || remove_extra_ws_;

    const int n = sp_->GetPieceSize();
    if (n <= 0) throw InputError(name + " has an empty vocabulary");
    kind_.resize(n);
    bytes_.resize(n);
    leading_ws_.resize(n);
    for (int id = 0; id < n; ++id) {
        const std::string& p = sp_->IdToPiece(id);
        if (sp_->IsControl(id)) {
            kind_[id] = Kind::Control;
        } else if (sp_->IsUnknown(id)) {
            kind_[id] = Kind::Unknown;
            bytes_[id] = sp_->DecodeIds({id});  // the unk_surface of the trainer spec, " \u2047 " by default
        } else if (sp_->IsByte(id)) {
            kind_[id] = Kind::Byte;
            uint8_t b = 0;
            if (!utf8::parse_byte_piece(p, b))
                throw InputError(name + ": byte piece " + std::to_string(id) + " is \"" + p +
                                 "\", expected the form <0xNN>");
            bytes_[id] = std::string(1, static_cast<char>(b));
        } else {
            kind_[id] = Kind::Normal;
            bytes_[id] = replace_all(p, kSpaceSymbol, " ");
            leading_ws_[id] = p.starts_with(kSpaceSymbol);
        }
    }
}

SentencePieceTokenizer::~SentencePieceTokenizer() = default;
SentencePieceTokenizer::SentencePieceTokenizer(SentencePieceTokenizer&&) noexcept = default;
SentencePieceTokenizer& SentencePieceTokenizer::operator=(SentencePieceTokenizer&&) noexcept = default;

void SentencePieceTokenizer::check_id(int id) const {
    if (id < 0 || id >= vocab_size())
        throw InputError("token id " + std::to_string(id) + " is out of range for tokenizer file " + file_.string() +
                         " (expected 0 <= id < " + std::to_string(vocab_size()) + ")");
}

std::vector<int> SentencePieceTokenizer::encode(std::string_view text, bool add_bos) const {
    std::vector<int> ids;
    if (add_bos) {
        if (bos_id() < 0) throw InputError("tokenizer file " + file_.string() + " defines no BOS token");
        ids.push_back(bos_id());
    }
    if (text.empty()) return ids;
    std::vector<int> body;
    const auto status = sp_->Encode(text, &body);
    if (!status.ok())
        throw InputError("could not encode text with tokenizer " + file_.string() + ": " + status.ToString());
    ids.insert(ids.end(), body.begin(), body.end());
    return ids;
}

std::string SentencePieceTokenizer::decode(std::span<const int> ids) const {
    for (int id : ids) check_id(id);
    std::string text;
    const auto status = sp_->Decode(std::vector<int>(ids.begin(), ids.end()), &text);
    if (!status.ok())
        throw InputError("could not decode ids with tokenizer " + file_.string() + ": " + status.ToString());
    return text;
}

std::string SentencePieceTokenizer::token_bytes(int id) const {
    check_id(id);
    return bytes_[id];
}

std::string SentencePieceTokenizer::piece(int id) const {
    check_id(id);
    return sp_->IdToPiece(id);
}

int SentencePieceTokenizer::vocab_size() const { return static_cast<int>(kind_.size()); }
int SentencePieceTokenizer::bos_id() const { return sp_->bos_id(); }
int SentencePieceTokenizer::eos_id() const { return sp_->eos_id(); }

bool SentencePieceTokenizer::is_control(int id) const {
    check_id(id);
    return kind_[id] == Kind::Control;
}

bool SentencePieceTokenizer::is_byte(int id) const {
    check_id(id);
    return kind_[id] == Kind::Byte;
}

// ---------------------------------------------------------------------------------------------------------------------
// SentencePieceStream: replays SentencePieceProcessor::Decode (sentencepiece_processor.cc) one token at a time.
// SentencePiece collects runs of byte pieces and converts each run at its end, one U+FFFD per byte that does not
// start a valid character; here the valid characters and the bytes known to be bad leave as soon as they are known,
// which gives the same text. For each non-byte piece it first sets is_bos_ws = false when the previous non-byte
// piece dropped a leading U+2581 or some text has been produced, then drops the leading U+2581 of a normal piece
// while is_bos_ws holds (when the normalizer adds a dummy prefix or removes extra whitespace).
// ---------------------------------------------------------------------------------------------------------------------

class SentencePieceStream final : public TokenStream {
public:
    explicit SentencePieceStream(const SentencePieceTokenizer& tok);
    std::string push(int id) override;
    std::string flush() override;
    void reset() override;

private:
    std::string drain();  // emits the complete and the known-bad characters at the front of pending_

    const SentencePieceTokenizer* tok_;
    std::string pending_;       // bytes of an incomplete UTF-8 character (at most 3)
    bool at_start_ = true;      // SentencePiece's is_bos_ws: the next text piece may lose its leading U+2581
    bool bos_ws_seen_ = false;  // the last non-byte piece had its leading U+2581 dropped
    bool emitted_ = false;      // some text has been returned since the start
};

SentencePieceStream::SentencePieceStream(const SentencePieceTokenizer& tok) : tok_(&tok) {}

std::string SentencePieceStream::drain() {
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

std::string SentencePieceStream::push(int id) {
    tok_->check_id(id);
    const auto kind = tok_->kind_[id];
    if (kind == SentencePieceTokenizer::Kind::Byte) {
        pending_ += tok_->bytes_[id];
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
    std::string_view text = tok_->bytes_[id];  // "" for control tokens, the unk surface for unknown ones
    if (kind == SentencePieceTokenizer::Kind::Normal && at_start_ && tok_->strip_first_ws_ && tok_->leading_ws_[id]) {
        text.remove_prefix(1);  // the ' ' that came from the leading U+2581
        // With remove_extra_whitespaces SentencePiece keeps looking for a leading space until text appears.
        dropped_ws = !tok_->remove_extra_ws_;
    }
    bos_ws_seen_ = dropped_ws;
    out += text;
    emitted_ = emitted_ || !out.empty();
    return out;
}

std::string SentencePieceStream::flush() {
    std::string out;
    for (size_t k = 0; k < pending_.size(); ++k) out += kReplacement;
    pending_.clear();
    emitted_ = emitted_ || !out.empty();
    return out;
}

void SentencePieceStream::reset() {
    pending_.clear();
    at_start_ = true;
    bos_ws_seen_ = false;
    emitted_ = false;
}

std::vector<int> SentencePieceTokenizer::end_of_turn_ids() const {
    if (eos_id() < 0) return {};
    return {eos_id()};
}

std::optional<int> SentencePieceTokenizer::token_id(std::string_view piece) const {
    const int id = sp_->PieceToId(piece);
    // PieceToId answers the unknown id for a piece it does not know; only the unknown piece itself maps there.
    if (id < 0 || id >= vocab_size() || (sp_->IsUnknown(id) && sp_->IdToPiece(id) != piece)) return std::nullopt;
    return id;
}

std::unique_ptr<TokenStream> SentencePieceTokenizer::make_stream() const {
    return std::make_unique<SentencePieceStream>(*this);
}

}  // namespace quest
