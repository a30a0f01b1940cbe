#include "tokenizer/spm_write.h"

#include <cstdint>
#include <cstring>

namespace quest {

namespace {

// Protobuf wire format: a key is (field << 3) | wire type; varints little-endian base 128; an int32 below zero is
// its 64-bit sign extension (ten bytes); floats fixed32 little-endian; strings and messages length-delimited.
enum Wire : uint32_t { kVarint = 0, kFixed32 = 5, kLen = 2 };

void varint(std::string& out, uint64_t x) {
    while (x >= 0x80) {
        out.push_back(static_cast<char>((x & 0x7f) | 0x80));
        x >>= 7;
    }
    out.push_back(static_cast<char>(x));
}

void key(std::string& out, uint32_t field, Wire w) { varint(out, (uint64_t{field} << 3) | w); }

void put_int(std::string& out, uint32_t field, int64_t v) {
    key(out, field, kVarint);
    varint(out, static_cast<uint64_t>(v));
}

void put_bool(std::string& out, uint32_t field, bool v) { put_int(out, field, v ? 1 : 0); }

void put_float(std::string& out, uint32_t field, float v) {
    key(out, field, kFixed32);
    uint32_t bits;
    std::memcpy(&bits, &v, 4);
    for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((bits >> (8 * i)) & 0xff));
}

void put_bytes(std::string& out, uint32_t field, const std::string& s) {
    key(out, field, kLen);
    varint(out, s.size());
    out += s;
}

// sentencepiece_model.proto field numbers.
namespace model_proto { constexpr uint32_t kPieces = 1, kTrainerSpec = 2, kNormalizerSpec = 3; }
namespace piece_msg { constexpr uint32_t kPiece = 1, kScore = 2, kType = 3; }
namespace trainer {
constexpr uint32_t kModelType = 3, kVocabSize = 4, kByteFallback = 35, kUnkId = 40, kBosId = 41, kEosId = 42,
                   kPadId = 43, kUnkPiece = 45, kBosPiece = 46, kEosPiece = 47;
constexpr int kBpe = 2;  // TrainerSpec.ModelType.BPE
}  // namespace trainer
namespace normalizer {
constexpr uint32_t kName = 1, kAddDummyPrefix = 3, kRemoveExtraWhitespaces = 4, kEscapeWhitespaces = 5;
}

}  // namespace

std::string spm_model_proto(const SpmVocab& v) {
    std::string out;
    int n_byte = 0;
    for (size_t i = 0; i < v.tokens.size(); ++i) {
        std::string p;
        put_bytes(p, piece_msg::kPiece, v.tokens[i]);
        put_float(p, piece_msg::kScore, v.scores[i]);
        put_int(p, piece_msg::kType, v.types[i]);
        put_bytes(out, model_proto::kPieces, p);
        n_byte += v.types[i] == static_cast<int32_t>(GgufTokenType::Byte);
    }
    std::string t;
    put_int(t, trainer::kModelType, trainer::kBpe);
    put_int(t, trainer::kVocabSize, static_cast<int64_t>(v.tokens.size()));
    put_bool(t, trainer::kByteFallback, n_byte == 256);
    put_int(t, trainer::kUnkId, v.unk);
    put_int(t, trainer::kBosId, v.bos);
    put_int(t, trainer::kEosId, v.eos);
    put_int(t, trainer::kPadId, -1);
    // SentencePieceProcessor finds unk/bos/eos by these pieces, not by the ids.
    if (v.unk >= 0) put_bytes(t, trainer::kUnkPiece, v.tokens[v.unk]);
    if (v.bos >= 0) put_bytes(t, trainer::kBosPiece, v.tokens[v.bos]);
    if (v.eos >= 0) put_bytes(t, trainer::kEosPiece, v.tokens[v.eos]);
    put_bytes(out, model_proto::kTrainerSpec, t);
    std::string n;
    put_bytes(n, normalizer::kName, "identity");
    put_bool(n, normalizer::kAddDummyPrefix, v.add_space_prefix);
    put_bool(n, normalizer::kRemoveExtraWhitespaces, v.remove_extra_ws);
    put_bool(n, normalizer::kEscapeWhitespaces, true);
    put_bytes(out, model_proto::kNormalizerSpec, n);
    return out;
}

}  // namespace quest
