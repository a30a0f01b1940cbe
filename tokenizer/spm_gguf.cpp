#include "tokenizer/spm_gguf.h"

#include <algorithm>
#include <cstdio>
#include <queue>
#include <utility>

#include "kernels/common/error.h"
#include "tokenizer/utf8.h"

namespace quest {

namespace {

constexpr std::string_view kSpaceSymbol = "\xe2\x96\x81";  // U+2581
// SentencePiece's default unk_surface (trainer_spec), which the GGUF does not carry.
constexpr std::string_view kUnkSurface = " \xe2\x81\x87 ";

std::string replace_space_symbol(std::string_view s) {
    std::string out;
    out.reserve(s.size());
    for (size_t i = 0; i < s.size();) {
        if (s.substr(i, kSpaceSymbol.size()) == kSpaceSymbol) {
            out += ' ';
            i += kSpaceSymbol.size();
        } else {
            out += s[i++];
        }
    }
    return out;
}

}  // namespace

SpmGgufTokenizer::SpmGgufTokenizer(SpmVocab vocab) : v_(std::move(vocab)) {
    const std::string& name = v_.file.string();
    const size_t n = v_.tokens.size();
    auto fail = [&](const std::string& key, const std::string& what) {
        throw InputError(name + ": key '" + key + "': " + what);
    };
    if (n == 0) fail("tokenizer.ggml.tokens", "empty (expected the vocabulary)");
    if (v_.scores.size() != n)
        fail("tokenizer.ggml.scores", std::to_string(v_.scores.size()) + " scores for " + std::to_string(n) +
                                          " tokens (expected one score per token)");
    if (v_.types.size() != n)
        fail("tokenizer.ggml.token_type", std::to_string(v_.types.size()) + " types for " + std::to_string(n) +
                                              " tokens (expected one type per token)");

    dec_.strip_first_ws = v_.add_space_prefix || v_.remove_extra_ws;
    dec_.remove_extra_ws = v_.remove_extra_ws;
    dec_.kind.resize(n);
    dec_.bytes.resize(n);
    dec_.leading_ws.resize(n);
    std::vector<int> byte_token(256, -1);
    int n_byte = 0, unk = -1;
    using Kind = SpmDecodeTable::Kind;
    for (size_t i = 0; i < n; ++i) {
        const int id = static_cast<int>(i);
        const std::string& p = v_.tokens[i];
        const int32_t t = v_.types[i];
        if (t < 1 || t > 6)
            fail("tokenizer.ggml.token_type", "token " + std::to_string(id) + " has type " + std::to_string(t) +
                                                  " (expected 1 normal, 2 unknown, 3 control, 4 user-defined, "
                                                  "5 unused or 6 byte)");
        const auto type = static_cast<GgufTokenType>(t);
        const bool mergeable = type == GgufTokenType::Normal || type == GgufTokenType::UserDefined ||
                               type == GgufTokenType::Unused;
        if (p.empty() && type != GgufTokenType::Control)
            fail("tokenizer.ggml.tokens", "token " + std::to_string(id) + " is empty (expected a piece)");
        IdMap& map = mergeable ? mergeable_ : reserved_;
        if (const auto [it, fresh] = map.emplace(p, id); !fresh)
            fail("tokenizer.ggml.tokens", "token " + std::to_string(id) + " \"" + p + "\" repeats token " +
                                              std::to_string(it->second) + " (expected distinct pieces)");
        switch (type) {
        case GgufTokenType::Unknown:
            if (unk < 0) unk = id;
            dec_.kind[i] = Kind::Unknown;
            dec_.bytes[i] = kUnkSurface;
            break;
        case GgufTokenType::Control: dec_.kind[i] = Kind::Control; break;
        case GgufTokenType::Byte: {
            uint8_t b = 0;
            if (!utf8::parse_byte_piece(p, b))
                fail("tokenizer.ggml.tokens", "byte token " + std::to_string(id) + " is \"" + p +
                                                  "\" (expected the form <0xNN>)");
            if (byte_token[b] >= 0)
                fail("tokenizer.ggml.tokens", "byte token " + std::to_string(id) + " \"" + p + "\" repeats token " +
                                                  std::to_string(byte_token[b]));
            byte_token[b] = id;
            ++n_byte;
            dec_.kind[i] = Kind::Byte;
            dec_.bytes[i] = std::string(1, static_cast<char>(b));
            break;
        }
        default:
            dec_.kind[i] = Kind::Normal;
            dec_.bytes[i] = replace_space_symbol(p);
            dec_.leading_ws[i] = p.starts_with(kSpaceSymbol);
            if (type == GgufTokenType::UserDefined) user_defined_.push_back(p);
            break;
        }
    }
    if (v_.unk >= 0) {
        if (static_cast<size_t>(v_.unk) >= n || dec_.kind[v_.unk] != Kind::Unknown)
            fail("tokenizer.ggml.unknown_token_id",
                 "id " + std::to_string(v_.unk) + " is not a token of type 2 (unknown)");
        unk = v_.unk;
    }
    if (unk < 0)
        fail("tokenizer.ggml.token_type", "no token of type 2 (unknown) (a SentencePiece vocabulary has one: the "
                                          "token of a piece outside the vocabulary)");
    v_.unk = unk;
    if (n_byte > 0 && n_byte < 256) {
        int missing = 0;
        while (byte_token[missing] >= 0) ++missing;
        char buf[16];
        std::snprintf(buf, sizeof buf, "<0x%02X>", missing);
        fail("tokenizer.ggml.tokens", "byte token " + std::string(buf) + " missing (the vocabulary has " +
                                          std::to_string(n_byte) + " byte tokens, type 6; byte fallback needs all 256)");
    }
    if (n_byte == 256) byte_token_ = std::move(byte_token);
    std::sort(user_defined_.begin(), user_defined_.end(),
              [](const std::string& a, const std::string& b) { return a.size() > b.size(); });
}

// SentencePiece's Normalizer::Normalize with the identity rule (no character map).
std::string SpmGgufTokenizer::normalize(std::string_view text) const {
    std::string out;
    size_t i = 0;
    if (v_.remove_extra_ws)
        while (i < text.size() && text[i] == ' ') ++i;
    if (i == text.size()) return out;
    out.reserve((text.size() - i) * 3 + 3);
    if (v_.add_space_prefix) out += kSpaceSymbol;
    bool prev_space = v_.remove_extra_ws;
    for (size_t len = 0; i < text.size(); i += len) {
        const int32_t cp = utf8::decode(text, i, len);
        if (cp < 0) {
            out += utf8::kReplacement;  // one per malformed byte (len is 1)
            prev_space = false;
            continue;
        }
        if (cp == ' ') {
            if (prev_space) continue;
            out += kSpaceSymbol;
            prev_space = v_.remove_extra_ws;
            continue;
        }
        out.append(text.substr(i, len));
        prev_space = false;
    }
    if (v_.remove_extra_ws)
        while (out.size() >= kSpaceSymbol.size() && std::string_view(out).ends_with(kSpaceSymbol))
            out.resize(out.size() - kSpaceSymbol.size());
    return out;
}

// sentencepiece bpe_model.cc (Model::SampleEncode without dropout) and the unknown / byte-fallback handling of
// SentencePieceProcessor::Encode.
void SpmGgufTokenizer::encode_normalized(std::string_view text, std::vector<int>& out) const {
    struct Symbol {
        int prev, next;
        bool freeze;
        std::string_view piece;
    };
    struct Pair {
        int left, right;
        float score;
        size_t size;
    };
    auto worse = [](const Pair& a, const Pair& b) {
        return a.score < b.score || (a.score == b.score && a.left > b.left);
    };
    std::priority_queue<Pair, std::vector<Pair>, decltype(worse)> agenda(worse);
    std::vector<Symbol> symbols;
    symbols.reserve(text.size());
    std::unordered_map<std::string_view, std::pair<std::string_view, std::string_view>> rev_merge;

    for (size_t pos = 0; pos < text.size();) {
        size_t len = 0;
        bool freeze = false;
        for (const std::string& u : user_defined_)
            if (text.substr(pos).starts_with(u)) {
                len = u.size();
                freeze = true;
                break;
            }
        if (!freeze) len = std::min<size_t>(std::max(utf8::length(static_cast<uint8_t>(text[pos])), 1),
                                            text.size() - pos);
        const int index = static_cast<int>(symbols.size());
        symbols.push_back({index - 1, pos + len == text.size() ? -1 : index + 1, freeze, text.substr(pos, len)});
        pos += len;
    }
    if (symbols.empty()) return;

    auto try_pair = [&](int left, int right) {
        if (left < 0 || right < 0 || symbols[left].freeze || symbols[right].freeze) return;
        const std::string_view merged(symbols[left].piece.data(),
                                      symbols[left].piece.size() + symbols[right].piece.size());
        const auto it = mergeable_.find(merged);
        if (it == mergeable_.end()) return;
        agenda.push({left, right, v_.scores[it->second], merged.size()});
        if (v_.types[it->second] == static_cast<int32_t>(GgufTokenType::Unused))
            rev_merge[merged] = {symbols[left].piece, symbols[right].piece};
    };
    for (int i = 1; i < static_cast<int>(symbols.size()); ++i) try_pair(i - 1, i);

    while (!agenda.empty()) {
        const Pair top = agenda.top();
        agenda.pop();
        Symbol& l = symbols[top.left];
        Symbol& r = symbols[top.right];
        if (l.piece.empty() || r.piece.empty() || l.piece.size() + r.piece.size() != top.size) continue;
        l.piece = std::string_view(l.piece.data(), l.piece.size() + r.piece.size());
        l.next = r.next;
        if (r.next >= 0) symbols[r.next].prev = top.left;
        r.piece = {};
        try_pair(l.prev, top.left);
        try_pair(top.left, l.next);
    }

    bool last_unk = false;  // the previous output token is an unknown one this call produced
    auto emit = [&](std::string_view w, int id) {
        if (id != v_.unk) {
            out.push_back(id);
            last_unk = false;
        } else if (!byte_token_.empty()) {
            for (char c : w) out.push_back(byte_token_[static_cast<uint8_t>(c)]);
            last_unk = false;
        } else if (!last_unk) {  // a run of unknown pieces is one unknown token
            out.push_back(id);
            last_unk = true;
        }
    };
    auto resegment = [&](auto&& self, std::string_view w) -> void {
        if (const auto it = mergeable_.find(w); it != mergeable_.end()) {
            const auto rm = rev_merge.find(w);
            if (v_.types[it->second] != static_cast<int32_t>(GgufTokenType::Unused) || rm == rev_merge.end()) {
                emit(w, it->second);
                return;
            }
            self(self, rm->second.first);
            self(self, rm->second.second);
            return;
        }
        const auto it = reserved_.find(w);
        emit(w, it != reserved_.end() ? it->second : v_.unk);
    };
    for (int i = 0; i != -1; i = symbols[i].next) resegment(resegment, symbols[i].piece);
}

std::vector<int> SpmGgufTokenizer::encode(std::string_view text, bool add_bos) const {
    std::vector<int> ids;
    if (add_bos && v_.add_bos) {
        if (v_.bos < 0)
            throw InputError(v_.file.string() + ": key 'tokenizer.ggml.bos_token_id': missing, but add_bos_token "
                                                "asks for a BOS token");
        ids.push_back(v_.bos);
    }
    const std::string normalized = normalize(text);
    encode_normalized(normalized, ids);
    if (add_bos && v_.add_eos) {
        if (v_.eos < 0)
            throw InputError(v_.file.string() + ": key 'tokenizer.ggml.eos_token_id': missing, but add_eos_token "
                                                "asks for an EOS token");
        ids.push_back(v_.eos);
    }
    return ids;
}

std::string SpmGgufTokenizer::decode(std::span<const int> ids) const {
    return spm_decode(dec_, v_.file, std::vector<int>(ids.begin(), ids.end()));
}

std::string SpmGgufTokenizer::token_bytes(int id) const {
    check_id(id);
    return dec_.bytes[id];
}

std::string SpmGgufTokenizer::piece(int id) const {
    check_id(id);
    return v_.tokens[id];
}

std::vector<int> SpmGgufTokenizer::end_of_turn_ids() const {
    if (v_.eos < 0) return {};
    return {v_.eos};
}

bool SpmGgufTokenizer::is_control(int id) const {
    check_id(id);
    return dec_.kind[id] == SpmDecodeTable::Kind::Control;
}

bool SpmGgufTokenizer::is_byte(int id) const {
    check_id(id);
    return dec_.kind[id] == SpmDecodeTable::Kind::Byte;
}

std::optional<int> SpmGgufTokenizer::token_id(std::string_view piece) const {
    if (const auto it = mergeable_.find(piece); it != mergeable_.end()) return it->second;
    if (const auto it = reserved_.find(piece); it != reserved_.end()) return it->second;
    return std::nullopt;
}

}  // namespace quest
