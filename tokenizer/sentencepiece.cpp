#include "tokenizer/sentencepiece.h"

#include <exception>
#include <utility>

#include <sentencepiece_processor.h>

#include "kernels/common/error.h"
#include "tokenizer/spm_decode.h"
#include "tokenizer/utf8.h"

namespace quest {

namespace {

constexpr std::string_view kSpaceSymbol = "\xe2\x96\x81";  // U+2581, SentencePiece's escaped space
using Kind = SpmDecodeTable::Kind;

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

    if (!read_normalizer_flags(sp_->serialized_model_proto(), dec_.strip_first_ws, dec_.remove_extra_ws))
        throw InputError(name + ": malformed normalizer_spec in the model protobuf");
    dec_.strip_first_ws = dec_.strip_first_ws || dec_.remove_extra_ws;

    const int n = sp_->GetPieceSize();
    if (n <= 0) throw InputError(name + " has an empty vocabulary");
    dec_.kind.resize(n);
    dec_.bytes.resize(n);
    dec_.leading_ws.resize(n);
    for (int id = 0; id < n; ++id) {
        const std::string& p = sp_->IdToPiece(id);
        if (sp_->IsControl(id)) {
            dec_.kind[id] = Kind::Control;
        } else if (sp_->IsUnknown(id)) {
            dec_.kind[id] = Kind::Unknown;
            dec_.bytes[id] = sp_->DecodeIds({id});  // the unk_surface of the trainer spec, " \u2047 " by default
        } else if (sp_->IsByte(id)) {
            dec_.kind[id] = Kind::Byte;
            uint8_t b = 0;
            if (!utf8::parse_byte_piece(p, b))
                throw InputError(name + ": byte piece " + std::to_string(id) + " is \"" + p +
                                 "\", expected the form <0xNN>");
            dec_.bytes[id] = std::string(1, static_cast<char>(b));
        } else {
            dec_.kind[id] = Kind::Normal;
            dec_.bytes[id] = replace_all(p, kSpaceSymbol, " ");
            dec_.leading_ws[id] = p.starts_with(kSpaceSymbol);
        }
    }
}

SentencePieceTokenizer::~SentencePieceTokenizer() = default;
SentencePieceTokenizer::SentencePieceTokenizer(SentencePieceTokenizer&&) noexcept = default;
SentencePieceTokenizer& SentencePieceTokenizer::operator=(SentencePieceTokenizer&&) noexcept = default;

void SentencePieceTokenizer::check_id(int id) const { dec_.check_id(id, file_); }

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
    return dec_.bytes[id];
}

std::string SentencePieceTokenizer::piece(int id) const {
    check_id(id);
    return sp_->IdToPiece(id);
}

int SentencePieceTokenizer::vocab_size() const { return dec_.size(); }
int SentencePieceTokenizer::bos_id() const { return sp_->bos_id(); }
int SentencePieceTokenizer::eos_id() const { return sp_->eos_id(); }

bool SentencePieceTokenizer::is_control(int id) const {
    check_id(id);
    return dec_.kind[id] == Kind::Control;
}

bool SentencePieceTokenizer::is_byte(int id) const {
    check_id(id);
    return dec_.kind[id] == Kind::Byte;
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

std::unique_ptr<TokenStream> SentencePieceTokenizer::make_stream() const { return make_spm_stream(dec_, file_); }

}  // namespace quest
