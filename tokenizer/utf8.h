#pragma once
// UTF-8 helpers shared by the tokenizers (internal to tokenizer/): strict decoding as Unicode table 3-7 defines it
// (no overlongs, surrogates or code points above U+10FFFF), and encoding.
#include <cstdint>
#include <string>
#include <string_view>

namespace quest::utf8 {

inline constexpr std::string_view kReplacement = "\xef\xbf\xbd";  // U+FFFD

// Length of the well-formed sequence starting with lead byte `b`, 0 if `b` cannot start one.
inline int length(uint8_t b) {
    if (b < 0x80) return 1;
    if (b >= 0xc2 && b <= 0xdf) return 2;
    if (b >= 0xe0 && b <= 0xef) return 3;
    if (b >= 0xf0 && b <= 0xf4) return 4;
    return 0;
}

// Whether `b` may be byte `index` (>= 1) of a sequence starting with `lead`.
inline bool continues(uint8_t lead, int index, uint8_t b) {
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
inline int32_t decode(std::string_view s, size_t i, size_t& len) {
    const auto lead = static_cast<uint8_t>(s[i]);
    const int n = length(lead);
    len = 1;
    if (n == 0 || i + n > s.size()) return -1;
    for (int k = 1; k < n; ++k)
        if (!continues(lead, k, static_cast<uint8_t>(s[i + k]))) return -1;
    int32_t cp = n == 1 ? lead : lead & (0x7f >> n);
    for (int k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<uint8_t>(s[i + k]) & 0x3f);
    len = n;
    return cp;
}

inline void append(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
        out += char(cp);
    } else if (cp < 0x800) {
        out += char(0xc0 | (cp >> 6));
        out += char(0x80 | (cp & 0x3f));
    } else if (cp < 0x10000) {
        out += char(0xe0 | (cp >> 12));
        out += char(0x80 | ((cp >> 6) & 0x3f));
        out += char(0x80 | (cp & 0x3f));
    } else {
        out += char(0xf0 | (cp >> 18));
        out += char(0x80 | ((cp >> 12) & 0x3f));
        out += char(0x80 | ((cp >> 6) & 0x3f));
        out += char(0x80 | (cp & 0x3f));
    }
}

// Length of the maximal subpart at `s[i]` (Unicode's "substitution of maximal subparts", which Rust's
// String::from_utf8_lossy follows): the longest prefix of a well-formed sequence found there, at least 1 byte.
// Sets `complete` when that prefix is a whole character.
inline size_t maximal_subpart(std::string_view s, size_t i, bool& complete) {
    const auto lead = static_cast<uint8_t>(s[i]);
    const int n = length(lead);
    complete = false;
    if (n == 0) return 1;
    size_t have = 1;
    while (static_cast<int>(have) < n && i + have < s.size() &&
           continues(lead, static_cast<int>(have), static_cast<uint8_t>(s[i + have])))
        ++have;
    complete = static_cast<int>(have) == n;
    return have;
}

// `s` with every maximal invalid subpart replaced by one U+FFFD, as Rust's String::from_utf8_lossy does.
inline std::string lossy(std::string_view s) {
    std::string out;
    out.reserve(s.size());
    for (size_t i = 0; i < s.size();) {
        bool complete = false;
        const size_t n = maximal_subpart(s, i, complete);
        if (complete) out.append(s.substr(i, n));
        else out += kReplacement;
        i += n;
    }
    return out;
}

inline bool valid(std::string_view s) {
    for (size_t i = 0, len = 0; i < s.size(); i += len)
        if (decode(s, i, len) < 0) return false;
    return true;
}

// The byte of a byte-fallback piece "<0xNN>" (SentencePiece and BPE vocabularies); false for any other piece.
inline bool parse_byte_piece(std::string_view piece, uint8_t& out) {
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

}  // namespace quest::utf8
