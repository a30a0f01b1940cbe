#include "tokenizer/tokenizer.h"

#include <exception>
#include <utility>

#include <sentencepiece_processor.h>

#include "kernels/common/error.h"

namespace quest {

namespace {

constexpr std::string_view kSpaceSymbol = "\xe2\x96\x81";  // U+2581, SentencePiece's escaped space
constexpr std::string_view kReplacement = "\xef\xbf\xbd";  // U+FFFD

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

// ---------------------------------------------------------------------------------------------------------------------
// UTF-8
// ---------------------------------------------------------------------------------------------------------------------

// Length of the well-formed UTF-8 sequence (Unicode table 3-7) starting with lead byte `b`, 0 if `b` cannot start
// one. This is exactly what SentencePiece's DecodeUTF8 accepts: no overlongs, surrogates or code points > U+10FFFF.
int utf8_length(uint8_t b) {
    if (b < 0x80) return 1;
    if (b >= 0xc2 && b <= 0xdf) return 2;
    if (b >= 0xe0 && b <= 0xef) return 3;
    if (b >= 0xf0 && b <= 0xf4) return 4;
    return 0;
}

// Whether `b` may be byte `index` (>= 1) of a sequence starting with `lead`.
bool utf8_continues(uint8_t lead, int index, uint8_t b) {
    uint8_t lo = 0x80, hi = 0xbf;
    if (index == 1) {
        if (lead == 0xe0) lo = 0xa0;       // overlong below U+0800
        else if (lead == 0xed) hi = 0x9f;  // surrogates U+D800..U+DFFF
        else if (lead == 0xf0) lo = 0x90;  // overlong below U+10000
        else if (lead == 0xf4) hi = 0x8f;  // above U+10FFFF
    }
    return b >= lo && b <= hi;
}

// Decodes the code point at `s[i]`, setting `len`; -1 (with len 1) for a byte that does not start a valid sequence.
int32_t utf8_decode(std::string_view s, size_t i, size_t& len) {
    const auto lead = static_cast<uint8_t>(s[i]);
    const int n = utf8_length(lead);
    len = 1;
    if (n == 0 || i + n > s.size()) return -1;
    for (int k = 1; k < n; ++k)
        if (!utf8_continues(lead, k, static_cast<uint8_t>(s[i + k]))) return -1;
    int32_t cp = n == 1 ? lead : lead & (0x7f >> n);
    for (int k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<uint8_t>(s[i + k]) & 0x3f);
    len = n;
    return cp;
}

// Python's str.isspace(), which str.strip() uses.
bool is_python_space(int32_t cp) {
    return (cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x20) || cp == 0x85 || cp == 0xa0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 || cp == 0x202f || cp == 0x205f ||
           cp == 0x3000;
}

// Python's str.strip() on UTF-8 text (invalid bytes count as non-space).
std::string_view python_strip(std::string_view s) {
    size_t begin = s.size(), end = 0;
    for (size_t i = 0, len = 0; i < s.size(); i += len) {
        if (is_python_space(utf8_decode(s, i, len))) continue;
        if (begin == s.size()) begin = i;
        end = i + len;
    }
    return begin < end ? s.substr(begin, end - begin) : std::string_view{};
}

// The byte of a "<0xNN>" piece.
bool parse_byte_piece(std::string_view piece, uint8_t& out) {
    if (piece.size() != 6 || piece.substr(0, 3) != "<0x" || piece[5] != '>') return false;
    int value = 0;
    for (char c : piece.substr(3, 2)) {
        int digit = -1;
        if (c >= '0' && c <= '9') digit = c - '0';
        else if (c >= 'A' && c <= 'F') digit = c - 'A' + 10;
        else if (c >= 'a' && c <= 'f') digit = c - 'a' + 10;
        if (digit < 0) return false;
        value = value * 16 + digit;
    }
    out = static_cast<uint8_t>(value);
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
// Tokenizer
// ---------------------------------------------------------------------------------------------------------------------

Tokenizer::Tokenizer(const std::filesystem::path& model_file)
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
            if (!parse_byte_piece(p, b))
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

Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

void Tokenizer::check_id(int id) const {
    if (id < 0 || id >= vocab_size())
        throw InputError("token id " + std::to_string(id) + " is out of range for tokenizer file " + file_.string() +
                         " (expected 0 <= id < " + std::to_string(vocab_size()) + ")");
}

std::vector<int> Tokenizer::encode(std::string_view text, bool add_bos) const {
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

std::string Tokenizer::decode(std::span<const int> ids) const {
    for (int id : ids) check_id(id);
    std::string text;
    const auto status = sp_->Decode(std::vector<int>(ids.begin(), ids.end()), &text);
    if (!status.ok())
        throw InputError("could not decode ids with tokenizer " + file_.string() + ": " + status.ToString());
    return text;
}

std::string Tokenizer::token_bytes(int id) const {
    check_id(id);
    return bytes_[id];
}

std::string Tokenizer::piece(int id) const {
    check_id(id);
    return sp_->IdToPiece(id);
}

int Tokenizer::vocab_size() const { return static_cast<int>(kind_.size()); }
int Tokenizer::bos_id() const { return sp_->bos_id(); }
int Tokenizer::eos_id() const { return sp_->eos_id(); }

bool Tokenizer::is_control(int id) const {
    check_id(id);
    return kind_[id] == Kind::Control;
}

bool Tokenizer::is_byte(int id) const {
    check_id(id);
    return kind_[id] == Kind::Byte;
}

// ---------------------------------------------------------------------------------------------------------------------
// StreamingDecoder: replays SentencePieceProcessor::Decode (sentencepiece_processor.cc) one token at a time.
// SentencePiece collects runs of byte pieces and converts each run at its end, one U+FFFD per byte that does not
// start a valid character; here the valid characters and the bytes known to be bad leave as soon as they are known,
// which gives the same text. For each non-byte piece it first sets is_bos_ws = false when the previous non-byte
// piece dropped a leading U+2581 or some text has been produced, then drops the leading U+2581 of a normal piece
// while is_bos_ws holds (when the normalizer adds a dummy prefix or removes extra whitespace).
// ---------------------------------------------------------------------------------------------------------------------

StreamingDecoder::StreamingDecoder(const Tokenizer& tok) : tok_(&tok) {}

std::string StreamingDecoder::drain() {
    std::string out;
    size_t i = 0;
    while (i < pending_.size()) {
        const auto lead = static_cast<uint8_t>(pending_[i]);
        const int n = utf8_length(lead);
        bool bad = n == 0;
        int have = 1;
        for (; !bad && have < n && i + have < pending_.size(); ++have)
            bad = !utf8_continues(lead, have, static_cast<uint8_t>(pending_[i + have]));
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

std::string StreamingDecoder::push(int id) {
    tok_->check_id(id);
    const auto kind = tok_->kind_[id];
    if (kind == Tokenizer::Kind::Byte) {
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
    if (kind == Tokenizer::Kind::Normal && at_start_ && tok_->strip_first_ws_ && tok_->leading_ws_[id]) {
        text.remove_prefix(1);  // the ' ' that came from the leading U+2581
        // With remove_extra_whitespaces SentencePiece keeps looking for a leading space until text appears.
        dropped_ws = !tok_->remove_extra_ws_;
    }
    bos_ws_seen_ = dropped_ws;
    out += text;
    emitted_ = emitted_ || !out.empty();
    return out;
}

std::string StreamingDecoder::flush() {
    std::string out;
    for (size_t k = 0; k < pending_.size(); ++k) out += kReplacement;
    pending_.clear();
    emitted_ = emitted_ || !out.empty();
    return out;
}

void StreamingDecoder::reset() {
    pending_.clear();
    at_start_ = true;
    bos_ws_seen_ = false;
    emitted_ = false;
}

// ---------------------------------------------------------------------------------------------------------------------
// Chat template
// ---------------------------------------------------------------------------------------------------------------------

std::vector<int> apply_llama2_chat_template(const Tokenizer& tok, std::span<const ChatMessage> messages) {
    using Role = ChatMessage::Role;
    auto role_name = [](Role r) -> std::string {
        switch (r) {
        case Role::System: return "system";
        case Role::User: return "user";
        case Role::Assistant: return "assistant";
        }
        return "unknown";
    };
    if (tok.bos_id() < 0 || tok.eos_id() < 0)
        throw InputError("chat template: the tokenizer defines no BOS or EOS token, both are needed");

    // Dialog after merging a leading system message into the first user message.
    std::vector<std::string> contents;
    size_t first = 0;
    std::string system_prefix;
    if (!messages.empty() && messages[0].role == Role::System) {
        if (messages.size() < 2)
            throw InputError("chat messages: a system message must be followed by a user message");
        system_prefix = "<<SYS>>\n" + messages[0].content + "\n<</SYS>>\n\n";
        first = 1;
    }
    if (first == messages.size())
        throw InputError("chat messages: empty conversation, expected at least one user message");
    for (size_t i = first; i < messages.size(); ++i) {
        const Role expected = (i - first) % 2 == 0 ? Role::User : Role::Assistant;
        if (messages[i].role != expected)
            throw InputError("chat messages: message " + std::to_string(i) + " has role " +
                             role_name(messages[i].role) + ", expected " + role_name(expected) +
                             " (an optional first system message, then user and assistant alternating)");
        contents.push_back(i == first ? system_prefix + messages[i].content : messages[i].content);
    }
    if (contents.size() % 2 == 0)
        throw InputError("chat messages: the last message has role assistant, expected user");

    std::vector<int> ids;
    auto append = [&](const std::string& text, bool eos) {
        const auto part = tok.encode(text, true);
        ids.insert(ids.end(), part.begin(), part.end());
        if (eos) ids.push_back(tok.eos_id());
    };
    for (size_t i = 0; i + 1 < contents.size(); i += 2)
        append("[INST] " + std::string(python_strip(contents[i])) + " [/INST] " +
                   std::string(python_strip(contents[i + 1])) + " ",
               true);
    append("[INST] " + std::string(python_strip(contents.back())) + " [/INST]", false);
    return ids;
}

}  // namespace quest
