#include "tokenizer/bpe.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <new>
#include <queue>
#include <utility>

#include "kernels/common/error.h"
#include "tokenizer/nfc.h"
#include "tokenizer/utf8.h"

namespace quest {

namespace {

// GPT-2's pre-tokenizer pattern (ByteLevel use_regex), as Hugging Face's ByteLevel pre-tokenizer writes it.
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// GPT-2's bytes_to_unicode: the printable bytes stand for themselves, the others for U+0100 upwards in byte order.
struct ByteLevelTable {
    uint16_t char_of[256];    // code point standing for each byte
    int16_t byte_of[0x144];   // inverse, -1 where no byte maps
    ByteLevelTable() {
        std::fill(std::begin(byte_of), std::end(byte_of), int16_t{-1});
        int next = 256;
        for (int b = 0; b < 256; ++b) {
            const bool printable = (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
            char_of[b] = static_cast<uint16_t>(printable ? b : next++);
            byte_of[char_of[b]] = static_cast<int16_t>(b);
        }
    }
};

const ByteLevelTable& byte_level() {
    static const ByteLevelTable table;  // constant data, built once
    return table;
}

std::string bytes_to_chars(std::string_view s) {
    std::string out;
    out.reserve(s.size() * 2);
    for (char c : s) utf8::append(out, byte_level().char_of[static_cast<uint8_t>(c)]);
    return out;
}

// The bytes a ByteLevel decoder makes of one token: each char mapped back to its byte, or the token's own UTF-8
// bytes when some char is not in the table (Hugging Face's ByteLevel::decode_chain).
std::string chars_to_bytes(std::string_view token) {
    std::string out;
    for (size_t i = 0, len = 0; i < token.size(); i += len) {
        const int32_t cp = utf8::decode(token, i, len);
        if (cp < 0 || cp >= 0x144 || byte_level().byte_of[cp] < 0) return std::string(token);
        out += static_cast<char>(byte_level().byte_of[cp]);
    }
    return out;
}

// Rust's char::is_whitespace (the White_Space property), used by lstrip / rstrip of added tokens.
bool is_rust_whitespace(int32_t cp) {
    return (cp >= 0x09 && cp <= 0x0d) || cp == 0x20 || cp == 0x85 || cp == 0xa0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 || cp == 0x202f || cp == 0x205f ||
           cp == 0x3000;
}


// The pieces of `text` after splitting at `matches` with `behavior` (Hugging Face's NormalizedString::split).
void split_pieces(std::string_view text, const std::vector<std::pair<size_t, size_t>>& matches, SplitBehavior behavior,
                  bool invert, std::vector<std::string>& out) {
    struct Part {
        size_t begin, end;
        bool match;
    };
    std::vector<Part> parts;
    size_t prev = 0;
    for (const auto& [b, e] : matches) {
        if (b == e) continue;
        if (prev < b) parts.push_back({prev, b, invert});
        parts.push_back({b, e, !invert});
        prev = e;
    }
    if (prev < text.size()) parts.push_back({prev, text.size(), invert});

    std::vector<std::pair<size_t, size_t>> pieces;
    bool previous_match = false;
    switch (behavior) {
    case SplitBehavior::Removed:
        for (const auto& p : parts)
            if (!p.match) pieces.emplace_back(p.begin, p.end);
        break;
    case SplitBehavior::Isolated:
        for (const auto& p : parts) pieces.emplace_back(p.begin, p.end);
        break;
    case SplitBehavior::MergedWithPrevious:
        for (const auto& p : parts) {
            if (p.match && !previous_match && !pieces.empty()) pieces.back().second = p.end;
            else pieces.emplace_back(p.begin, p.end);
            previous_match = p.match;
        }
        break;
    case SplitBehavior::MergedWithNext:
        for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
            if (it->match && !previous_match && !pieces.empty()) pieces.back().first = it->begin;
            else pieces.emplace_back(it->begin, it->end);
            previous_match = it->match;
        }
        std::reverse(pieces.begin(), pieces.end());
        break;
    case SplitBehavior::Contiguous:
        for (const auto& p : parts) {
            if (p.match == previous_match && !pieces.empty()) pieces.back().second = p.end;
            else pieces.emplace_back(p.begin, p.end);
            previous_match = p.match;
        }
        break;
    }
    for (const auto& [b, e] : pieces)
        if (b < e) out.emplace_back(text.substr(b, e - b));
}

std::vector<std::pair<size_t, size_t>> find_literal(std::string_view text, std::string_view literal) {
    std::vector<std::pair<size_t, size_t>> out;
    if (literal.empty()) return out;
    for (size_t pos = text.find(literal); pos != std::string_view::npos; pos = text.find(literal, pos + literal.size()))
        out.emplace_back(pos, pos + literal.size());
    return out;
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------------------
// BpeRegex
// ---------------------------------------------------------------------------------------------------------------------

struct BpeRegex::Code {
    pcre2_code* code = nullptr;
    ~Code() { pcre2_code_free(code); }
};

BpeRegex::BpeRegex(const std::string& pattern, const std::string& where) : pattern_(pattern) {
    int error = 0;
    PCRE2_SIZE offset = 0;
    auto code = std::make_shared<Code>();
    code->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), PCRE2_UTF | PCRE2_UCP,
                               &error, &offset, nullptr);
    if (!code->code) {
        PCRE2_UCHAR message[256];
        pcre2_get_error_message(error, message, sizeof message);
        throw InputError(where + ": invalid regex \"" + pattern + "\" (PCRE2: " +
                         reinterpret_cast<const char*>(message) + " at offset " + std::to_string(offset) + ")");
    }
    pcre2_jit_compile(code->code, PCRE2_JIT_COMPLETE);  // optional speed-up; the interpreter is used without it
    code_ = std::move(code);
}

BpeRegex::Scratch::Scratch() : md(pcre2_match_data_create(1, nullptr)) {
    if (!md) throw std::bad_alloc();
}

BpeRegex::Scratch::~Scratch() { pcre2_match_data_free(static_cast<pcre2_match_data*>(md)); }

std::vector<std::pair<size_t, size_t>> BpeRegex::find_all(std::string_view text) const {
    Scratch scratch;
    return find_all(text, scratch);
}

std::vector<std::pair<size_t, size_t>> BpeRegex::find_all(std::string_view text, Scratch& scratch) const {
    std::vector<std::pair<size_t, size_t>> out;
    auto* md = static_cast<pcre2_match_data*>(scratch.md);  // one pair is enough: only the whole match is read
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    size_t pos = 0;
    while (pos <= text.size()) {
        int rc = pcre2_match(code_->code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK, md, nullptr);
        if (rc < 0 && rc != PCRE2_ERROR_NOMATCH)  // the JIT's stack ran out: the interpreter works on the heap
            rc = pcre2_match(code_->code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md, nullptr);
        if (rc == PCRE2_ERROR_NOMATCH) break;  // the rest is one gap
        if (rc < 0) {
            PCRE2_UCHAR message[256];
            pcre2_get_error_message(rc, message, sizeof message);
            throw InputError("pre-tokenizer regex \"" + pattern_ + "\" failed on a text of " +
                             std::to_string(text.size()) + " bytes (PCRE2: " + reinterpret_cast<const char*>(message) +
                             ")");
        }
        const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
        const size_t b = ov[0], e = ov[1];
        if (e > b) {
            out.emplace_back(b, e);
            pos = e;
        } else {  // an empty match: step over one character
            if (b >= text.size()) break;
            size_t len = 1;
            utf8::decode(text, b, len);
            pos = b + len;
        }
    }
    return out;
}

// ---------------------------------------------------------------------------------------------------------------------
// BpeTokenizer
// ---------------------------------------------------------------------------------------------------------------------

BpeTokenizer::BpeTokenizer(BpeData data) : d_(std::move(data)) {
    const std::string name = "tokenizer file " + d_.file.string();
    const size_t n = d_.vocab.size();
    pieces_ = d_.vocab;
    special_.assign(n, 0);
    byte_of_.assign(n, -1);
    byte_piece_.assign(256, -1);
    model_ids_.reserve(n);
    all_ids_.reserve(n);
    merges_.reserve(d_.merges.size());
    for (size_t id = 0; id < n; ++id) {
        if (d_.vocab[id].empty()) continue;
        model_ids_.emplace(d_.vocab[id], static_cast<int>(id));
    }
    // Hugging Face looks byte pieces up as format!("<{b:#04X}>"), i.e. "<0x0A>": upper-case hex digits.
    for (int b = 0; b < 256; ++b) {
        static const char* hex = "0123456789ABCDEF";
        byte_piece_[b] = model_id(std::string("<0x") + hex[b >> 4] + hex[b & 15] + ">");
    }
    for (const auto& t : d_.added) {
        if (t.id < 0 || static_cast<size_t>(t.id) >= n)
            throw InputError(name + ": added token \"" + t.content + "\" has id " + std::to_string(t.id) +
                             ", expected 0 <= id < " + std::to_string(n));
        if (t.content.empty()) throw InputError(name + ": added token " + std::to_string(t.id) + " is empty");
        pieces_[t.id] = t.content;
        special_[t.id] = t.special;
    }
    for (size_t id = 0; id < n; ++id) {
        uint8_t b = 0;
        if (utf8::parse_byte_piece(pieces_[id], b)) byte_of_[id] = b;
    }
    for (const auto& t : d_.added) all_ids_.emplace(t.content, t.id);
    for (const auto& [piece, id] : model_ids_) all_ids_.emplace(piece, id);

    for (size_t rank = 0; rank < d_.merges.size(); ++rank) {
        const auto& [a, b] = d_.merges[rank];
        const int ia = model_id(a), ib = model_id(b);
        if (ia < 0 || ib < 0)
            throw InputError(name + ": merge " + std::to_string(rank) + " (\"" + a + "\" \"" + b + "\") names \"" +
                             (ia < 0 ? a : b) + "\", which is not in the vocabulary");
        const std::string merged = a + b.substr(std::min(b.size(), d_.continuing_subword_prefix.size()));
        const int im = model_id(merged);
        if (im < 0)
            throw InputError(name + ": merge " + std::to_string(rank) + " (\"" + a + "\" \"" + b + "\") makes \"" +
                             merged + "\", which is not in the vocabulary");
        merges_.insert_or_assign((uint64_t(uint32_t(ia)) << 32) | uint32_t(ib), Merge{static_cast<int>(rank), im});
    }
    if (!d_.unk_token.empty()) {
        unk_id_ = model_id(d_.unk_token);
        if (unk_id_ < 0) throw InputError(name + ": unk_token \"" + d_.unk_token + "\" is not in the vocabulary");
    }

    bytes_.resize(n);
    for (size_t id = 0; id < n; ++id) {
        if (special_[id]) continue;
        if (d_.decoder == BpeData::Decoder::ByteLevel) bytes_[id] = chars_to_bytes(pieces_[id]);
        else if (byte_of_[id] >= 0) bytes_[id] = std::string(1, char(byte_of_[id]));
        else bytes_[id] = pieces_[id];
    }
}

BpeTokenizer BpeTokenizer::from_json_file(const std::filesystem::path& file) {
    const std::string name = "tokenizer file " + file.string();
    auto read = [&](const std::filesystem::path& p, std::string& out) {
        std::ifstream in(p, std::ios::binary);
        if (!in) return false;
        out.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
        return !in.bad();
    };
    std::error_code ec;
    if (!std::filesystem::is_regular_file(file, ec))
        throw InputError(name + " does not exist or is not a file (expected a Hugging Face tokenizer.json)");
    std::string json, config;
    if (!read(file, json)) throw InputError(name + " could not be read");
    const auto config_file = file.parent_path() / "tokenizer_config.json";
    if (std::filesystem::is_regular_file(config_file, ec) && !read(config_file, config))
        throw InputError("tokenizer config " + config_file.string() + " could not be read");
    return BpeTokenizer(parse_tokenizer_json(json, file, config));
}

void BpeTokenizer::check_id(int id) const {
    if (id < 0 || id >= vocab_size())
        throw InputError("token id " + std::to_string(id) + " is out of range for tokenizer file " + d_.file.string() +
                         " (expected 0 <= id < " + std::to_string(vocab_size()) + ")");
}

int BpeTokenizer::model_id(std::string_view piece) const {
    const auto it = model_ids_.find(piece);
    return it == model_ids_.end() ? -1 : it->second;
}

std::string BpeTokenizer::token_bytes(int id) const {
    check_id(id);
    return bytes_[id];
}

std::string BpeTokenizer::piece(int id) const {
    check_id(id);
    return pieces_[id];
}

bool BpeTokenizer::is_control(int id) const {
    check_id(id);
    return special_[id] != 0;
}

bool BpeTokenizer::is_byte(int id) const {
    check_id(id);
    return byte_of_[id] >= 0;
}

std::optional<int> BpeTokenizer::token_id(std::string_view piece) const {
    const auto it = all_ids_.find(piece);
    if (it == all_ids_.end()) return std::nullopt;
    return it->second;
}

std::vector<std::string> BpeTokenizer::pre_tokenize(std::string_view text) const {
    std::vector<std::string> pieces{std::string(text)}, next;
    if (text.empty()) pieces.clear();
    static const BpeRegex gpt2(kGpt2Pattern, "GPT-2 pattern");  // constant, compiled once
    BpeRegex::Scratch scratch;
    for (const auto& step : d_.pre) {
        next.clear();
        for (const auto& p : pieces) {
            switch (step.kind) {
            case BpePreStep::Kind::Split:
                split_pieces(p, step.regex ? step.regex->find_all(p, scratch) : find_literal(p, step.literal),
                             step.behavior, step.invert, next);
                break;
            case BpePreStep::Kind::Digits:
                split_pieces(p, step.regex->find_all(p, scratch),
                             step.individual_digits ? SplitBehavior::Isolated : SplitBehavior::Contiguous, false, next);
                break;
            case BpePreStep::Kind::ByteLevel: {
                std::string s = step.add_prefix_space && !p.starts_with(' ') ? " " + p : p;
                std::vector<std::string> parts;
                if (step.use_regex) split_pieces(s, gpt2.find_all(s, scratch), SplitBehavior::Isolated, false, parts);
                else parts.push_back(std::move(s));
                for (const auto& part : parts) next.push_back(bytes_to_chars(part));
                break;
            }
            }
        }
        std::swap(pieces, next);
    }
    return pieces;
}

void BpeTokenizer::encode_word(std::string_view word, std::vector<int>& out) const {
    if (d_.ignore_merges) {
        const int id = model_id(word);
        if (id >= 0) {
            out.push_back(id);
            return;
        }
    }
    struct Sym {
        int id;
        int prev, next;
        size_t len;  // bytes of the word it covers; 0 once merged into its left neighbour
    };
    std::vector<Sym> syms;
    auto add = [&](int id, size_t len) {
        const int i = static_cast<int>(syms.size());
        syms.push_back({id, i - 1, -1, len});
        if (i > 0) syms[i - 1].next = i;
    };
    int unk = -1;  // a pending unknown (Hugging Face adds it when the next known char arrives)
    size_t unk_len = 0;
    std::string s;
    for (size_t i = 0, len = 0; i < word.size(); i += len) {
        utf8::decode(word, i, len);
        s.clear();
        if (i > 0) s += d_.continuing_subword_prefix;
        s.append(word.substr(i, len));
        if (i + len >= word.size()) s += d_.end_of_word_suffix;
        const int id = model_id(s);
        if (id >= 0) {
            if (unk >= 0) add(unk, unk_len), unk = -1;
            add(id, len);
            continue;
        }
        if (d_.byte_fallback) {
            bool all = true;
            for (char c : s) all = all && byte_piece_[static_cast<uint8_t>(c)] >= 0;
            if (all) {
                for (char c : s) add(byte_piece_[static_cast<uint8_t>(c)], 1);
                continue;
            }
        }
        if (unk_id_ >= 0) {
            if (unk >= 0 && d_.fuse_unk) {
                unk_len += len;
            } else {
                if (unk >= 0) add(unk, unk_len);
                unk = unk_id_;
                unk_len = len;
            }
        }
    }
    if (unk >= 0) add(unk, unk_len);

    struct Cand {
        int rank, pos, id;
        bool operator<(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }  // min-heap
    };
    auto find = [&](int a, int b) -> const Merge* {
        const auto it = merges_.find((uint64_t(uint32_t(a)) << 32) | uint32_t(b));
        return it == merges_.end() ? nullptr : &it->second;
    };
    std::priority_queue<Cand> queue;
    for (size_t i = 0; i + 1 < syms.size(); ++i)
        if (const Merge* m = find(syms[i].id, syms[i + 1].id)) queue.push({m->rank, static_cast<int>(i), m->id});
    while (!queue.empty()) {
        const Cand top = queue.top();
        queue.pop();
        Sym& left = syms[top.pos];
        if (left.len == 0 || left.next < 0) continue;
        Sym& right = syms[left.next];
        const Merge* m = find(left.id, right.id);
        if (!m || m->id != top.id) continue;  // a stale entry
        left.id = top.id;
        left.len += right.len;
        right.len = 0;
        left.next = right.next;
        if (left.next >= 0) syms[left.next].prev = top.pos;
        if (left.prev >= 0)
            if (const Merge* pm = find(syms[left.prev].id, left.id)) queue.push({pm->rank, left.prev, pm->id});
        if (left.next >= 0)
            if (const Merge* nm = find(left.id, syms[left.next].id)) queue.push({nm->rank, top.pos, nm->id});
    }
    for (const auto& sym : syms)
        if (sym.len > 0) out.push_back(sym.id);
}

void BpeTokenizer::encode_segment(std::string_view text, std::vector<int>& out, WordCache& cache) const {
    constexpr size_t kMaxCachedWord = 64;      // bytes; longer pre-tokens are rare and merged afresh
    constexpr size_t kMaxCacheEntries = 1 << 16;
    std::vector<int> ids;
    for (const auto& word : pre_tokenize(text)) {
        if (word.size() > kMaxCachedWord) {
            encode_word(word, out);
            continue;
        }
        const auto it = cache.find(word);
        if (it != cache.end()) {
            out.insert(out.end(), it->second.begin(), it->second.end());
            continue;
        }
        ids.clear();
        encode_word(word, ids);
        out.insert(out.end(), ids.begin(), ids.end());
        if (cache.size() < kMaxCacheEntries) cache.emplace(word, ids);
    }
}

namespace {

// A part of the text: an added token (id >= 0) or text still to be tokenized.
struct Segment {
    std::string text;
    int id = -1;
};

// Splits `text` on the added tokens of `tokens` (leftmost, then longest match; lstrip / rstrip as Hugging Face's
// AddedVocabulary::split_with_indices), appending to `out`.
void split_added(std::string_view text, const std::vector<const BpeAddedToken*>& tokens, std::vector<Segment>& out) {
    struct Match {
        size_t begin, end;
        const BpeAddedToken* token;
    };
    std::vector<Match> matches;
    bool first_byte[256] = {};  // bytes some token starts with: the other positions are skipped at once
    for (const auto* t : tokens) first_byte[static_cast<uint8_t>(t->content[0])] = true;
    for (size_t i = 0; i < text.size();) {
        if (!first_byte[static_cast<uint8_t>(text[i])]) {
            ++i;
            continue;
        }
        const BpeAddedToken* best = nullptr;
        for (const auto* t : tokens)  // sorted longest first
            if (text.compare(i, t->content.size(), t->content) == 0) {
                best = t;
                break;
            }
        if (best) {
            matches.push_back({i, i + best->content.size(), best});
            i += best->content.size();
        } else {
            ++i;
        }
    }
    size_t start_offset = 0;
    for (const auto& m : matches) {
        size_t start = m.begin, stop = m.end;
        if (m.token->lstrip) {
            size_t k = start;
            while (k > 0) {  // step back over whitespace characters
                size_t b = k - 1;
                while (b > 0 && (static_cast<uint8_t>(text[b]) & 0xc0) == 0x80) --b;
                size_t len = 0;
                if (!is_rust_whitespace(utf8::decode(text, b, len))) break;
                k = b;
            }
            start = std::max(k, start_offset);
        }
        if (m.token->rstrip) {
            size_t len = 0;
            while (stop < text.size() && is_rust_whitespace(utf8::decode(text, stop, len))) stop += len;
        }
        if (start_offset < start) out.push_back({std::string(text.substr(start_offset, start - start_offset)), -1});
        out.push_back({{}, m.token->id});
        start_offset = stop;
    }
    if (start_offset < text.size()) out.push_back({std::string(text.substr(start_offset)), -1});
}

}  // namespace

std::vector<int> BpeTokenizer::encode(std::string_view text, bool add_bos) const {
    std::vector<int> ids;
    if (add_bos) ids = d_.prefix_ids;
    const std::string valid = utf8::valid(text) ? std::string(text) : utf8::lossy(text);

    std::vector<const BpeAddedToken*> raw, normalized;
    for (const auto& t : d_.added) (t.normalized ? normalized : raw).push_back(&t);
    auto longest_first = [](const BpeAddedToken* a, const BpeAddedToken* b) {
        return a->content.size() > b->content.size();
    };
    std::stable_sort(raw.begin(), raw.end(), longest_first);
    std::stable_sort(normalized.begin(), normalized.end(), longest_first);

    std::vector<Segment> first, segments;
    split_added(valid, raw, first);
    for (auto& seg : first) {
        if (seg.id >= 0) segments.push_back(std::move(seg));
        else split_added(d_.nfc ? to_nfc(seg.text) : seg.text, normalized, segments);
    }
    WordCache cache;  // per call: no state shared between threads
    for (const auto& seg : segments) {
        if (seg.id >= 0) ids.push_back(seg.id);
        else encode_segment(seg.text, ids, cache);
    }
    ids.insert(ids.end(), d_.suffix_ids.begin(), d_.suffix_ids.end());
    return ids;
}

// ---------------------------------------------------------------------------------------------------------------------
// BpeStream
// ---------------------------------------------------------------------------------------------------------------------

class BpeStream final : public TokenStream {
public:
    explicit BpeStream(const BpeTokenizer& tok) : tok_(&tok) {}

    std::string push(int id) override {
        tok_->check_id(id);
        if (tok_->special_[id]) return {};
        if (tok_->d_.decoder == BpeData::Decoder::ByteFallback) {
            if (tok_->byte_of_[id] >= 0) {
                pending_ += tok_->bytes_[id];
                return {};
            }
            return end_run() + tok_->bytes_[id];
        }
        pending_ += tok_->bytes_[id];
        return drain();
    }

    std::string flush() override {
        if (tok_->d_.decoder == BpeData::Decoder::ByteFallback) return end_run();
        std::string out = utf8::lossy(pending_);  // a proper prefix of a character: one U+FFFD
        pending_.clear();
        return out;
    }

    void reset() override { pending_.clear(); }

private:
    // ByteLevel: emits the complete characters and the known-bad maximal subparts at the front of pending_.
    std::string drain() {
        std::string out;
        size_t i = 0;
        while (i < pending_.size()) {
            const auto lead = static_cast<uint8_t>(pending_[i]);
            const int n = utf8::length(lead);
            if (n == 0) {
                out += utf8::kReplacement;
                ++i;
                continue;
            }
            int have = 1;
            while (have < n && i + have < pending_.size() &&
                   utf8::continues(lead, have, static_cast<uint8_t>(pending_[i + have])))
                ++have;
            if (have == n) {
                out.append(pending_, i, n);
            } else if (i + have == pending_.size()) {
                break;  // a proper prefix of a character: wait for more bytes
            } else {
                out += utf8::kReplacement;
            }
            i += have;
        }
        pending_.erase(0, i);
        return out;
    }

    // ByteFallback: the run of byte pieces as text when it is valid UTF-8, else one U+FFFD per byte.
    std::string end_run() {
        std::string out;
        if (utf8::valid(pending_)) {
            out = pending_;
        } else {
            for (size_t k = 0; k < pending_.size(); ++k) out += utf8::kReplacement;
        }
        pending_.clear();
        return out;
    }

    const BpeTokenizer* tok_;
    std::string pending_;  // ByteLevel: an incomplete character (at most 3 bytes); ByteFallback: the byte run
};

std::unique_ptr<TokenStream> BpeTokenizer::make_stream() const { return std::make_unique<BpeStream>(*this); }

std::string BpeTokenizer::decode(std::span<const int> ids) const {
    for (int id : ids) check_id(id);
    BpeStream stream(*this);
    std::string text;
    for (int id : ids) text += stream.push(id);
    text += stream.flush();
    return text;
}

// ---------------------------------------------------------------------------------------------------------------------
// GGUF vocabulary
// ---------------------------------------------------------------------------------------------------------------------

namespace {

// llama.cpp's split regexes per tokenizer.ggml.pre (src/llama-vocab.cpp, llm_tokenizer_bpe). llama.cpp matches the
// GPT-2 string with a hand-written splitter (unicode_regex_split_custom_gpt2) that also has the trailing "\s+"
// alternative of the original Hugging Face pattern, so that alternative is written out here.
struct GgufPre {
    std::vector<std::string> regexes;
    bool ignore_merges = false;
    bool add_bos = false;  // what Hugging Face's tokenizer.json of the family adds
};

std::optional<GgufPre> gguf_pre(const std::string& pre) {
    const std::string gpt2 = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
    if (pre == "gpt2" || pre == "gpt-2") return GgufPre{{gpt2}};
    if (pre == "smollm") return GgufPre{{R"(\p{N})", gpt2}};
    if (pre == "llama-bpe" || pre == "llama3" || pre == "llama-v3")
        return GgufPre{{R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+)"
                        R"(|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"},
                       true, true};
    if (pre == "qwen2")
        return GgufPre{{R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+)"
                        R"(|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"}};
    return std::nullopt;
}

}  // namespace

BpeTokenizer BpeTokenizer::from_gguf_vocab(std::span<const std::string> tokens, std::span<const std::string> merges,
                                           std::span<const int32_t> token_types, int bos, int eos,
                                           const std::string& pre, const std::filesystem::path& where) {
    const std::string name = where.string();
    const auto rules = gguf_pre(pre);
    if (!rules)
        throw InputError(name + ": tokenizer.ggml.pre \"" + pre +
                         "\" is not supported (expected gpt2, smollm, llama-bpe / llama3 or qwen2)");
    if (tokens.empty()) throw InputError(name + ": tokenizer.ggml.tokens is empty");
    if (!token_types.empty() && token_types.size() != tokens.size())
        throw InputError(name + ": tokenizer.ggml.token_type has " + std::to_string(token_types.size()) +
                         " entries, expected one per token (" + std::to_string(tokens.size()) + ")");
    const int n = static_cast<int>(tokens.size());
    if (bos >= n || eos >= n)
        throw InputError(name + ": bos/eos id out of range (expected -1 or 0 <= id < " + std::to_string(n) + ")");
    BpeData d;
    d.file = where;
    d.vocab.assign(tokens.begin(), tokens.end());
    for (int id = 0; id < n; ++id) {
        const int type = token_types.empty() ? 1 : token_types[id];
        if (type == 3 || type == 4) d.added.push_back({tokens[id], id, type == 3, false, false, false});
    }
    for (size_t i = 0; i < merges.size(); ++i) {
        const std::string& s = merges[i];
        const size_t sp = s.find(' ');
        if (sp == std::string::npos || sp == 0 || sp + 1 >= s.size())
            throw InputError(name + ": tokenizer.ggml.merges[" + std::to_string(i) + "] is \"" + s +
                             "\", expected two pieces separated by a space");
        d.merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
    }
    for (const auto& re : rules->regexes) {
        BpePreStep step;
        step.kind = BpePreStep::Kind::Split;
        step.regex = std::make_shared<BpeRegex>(re, name + ": pre-tokenizer " + pre);
        step.behavior = SplitBehavior::Isolated;
        d.pre.push_back(std::move(step));
    }
    BpePreStep bl;
    bl.kind = BpePreStep::Kind::ByteLevel;
    bl.add_prefix_space = false;
    bl.use_regex = false;
    d.pre.push_back(std::move(bl));
    d.ignore_merges = rules->ignore_merges;
    d.decoder = BpeData::Decoder::ByteLevel;
    d.bos = bos;
    d.eos = eos;
    if (rules->add_bos && bos >= 0) d.prefix_ids = {bos};
    if (eos >= 0) d.end_of_turn.push_back(eos);
    for (const char* eot : {"<|eot_id|>", "<|eom_id|>", "<|im_end|>", "<|end_of_text|>", "<|endoftext|>"})
        for (const auto& a : d.added)
            if (a.content == eot && std::find(d.end_of_turn.begin(), d.end_of_turn.end(), a.id) == d.end_of_turn.end())
                d.end_of_turn.push_back(a.id);
    return BpeTokenizer(std::move(d));
}

}  // namespace quest
