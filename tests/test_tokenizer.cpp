// Tokenizer, StreamingDecoder and Llama-2 chat template. The expected ids were checked against the Python
// sentencepiece package and against a transcription of Meta's reference chat_completion; Tokenizer::decode is
// SentencePiece's own DecodeIds, so "== decode" below means "== what SentencePiece produces".
#include "tokenizer/sentencepiece.h"
#include "tokenizer/tokenizer.h"

#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "kernels/common/error.h"
#include "test_util.h"

namespace {

using quest::test::is_valid_utf8;
using quest::ChatMessage;
using quest::InputError;
using quest::StreamingDecoder;
using Tokenizer = quest::SentencePieceTokenizer;
using Role = ChatMessage::Role;

const std::string kFFFD = "\xef\xbf\xbd";

std::filesystem::path llama_model() { return quest::test::shared_dir() / "models/llama2-tokenizer/tokenizer.model"; }
std::filesystem::path stories_model() { return quest::test::shared_dir() / "models/stories260K/tokenizer.model"; }
std::filesystem::path demo_model() { return quest::test::source_dir() / "tests/fixtures/tokenizer/demo-512.model"; }

std::string utf8(char32_t cp) {
    std::string s;
    if (cp < 0x80) {
        s += char(cp);
    } else if (cp < 0x800) {
        s += char(0xc0 | (cp >> 6));
        s += char(0x80 | (cp & 0x3f));
    } else if (cp < 0x10000) {
        s += char(0xe0 | (cp >> 12));
        s += char(0x80 | ((cp >> 6) & 0x3f));
        s += char(0x80 | (cp & 0x3f));
    } else {
        s += char(0xf0 | (cp >> 18));
        s += char(0x80 | ((cp >> 12) & 0x3f));
        s += char(0x80 | ((cp >> 6) & 0x3f));
        s += char(0x80 | (cp & 0x3f));
    }
    return s;
}

// Id of the byte piece <0xNN> for every byte.
std::vector<int> byte_ids(const Tokenizer& tok) {
    std::vector<int> ids(256, -1);
    for (int id = 0; id < tok.vocab_size(); ++id)
        if (tok.is_byte(id)) ids[static_cast<uint8_t>(tok.token_bytes(id)[0])] = id;
    for (int b = 0; b < 256; ++b) EXPECT_GE(ids[b], 0) << "no byte piece for byte " << b;
    return ids;
}

std::vector<int> ids_of_bytes(const std::vector<int>& byte_id, std::string_view bytes) {
    std::vector<int> ids;
    for (char c : bytes) ids.push_back(byte_id[static_cast<uint8_t>(c)]);
    return ids;
}

// Streams `ids` one token at a time; checks that each push() result is valid UTF-8 and returns the whole text.
std::string stream(const Tokenizer& tok, const std::vector<int>& ids, std::vector<std::string>* parts = nullptr) {
    StreamingDecoder dec(tok);
    std::string text;
    for (int id : ids) {
        const std::string part = dec.push(id);
        EXPECT_TRUE(is_valid_utf8(part)) << "push(" << id << ") returned an incomplete/invalid UTF-8 sequence";
        if (parts) parts->push_back(part);
        text += part;
    }
    const std::string rest = dec.flush();
    EXPECT_TRUE(is_valid_utf8(rest));
    if (parts) parts->push_back(rest);
    return text + rest;
}

// Whether every maximal run of byte tokens forms valid UTF-8, i.e. decode() needs no U+FFFD for the byte pieces.
bool byte_runs_valid(const Tokenizer& tok, const std::vector<int>& ids) {
    std::string run;
    for (int id : ids) {
        if (tok.is_byte(id)) {
            run += tok.token_bytes(id);
            continue;
        }
        if (!is_valid_utf8(run)) return false;
        run.clear();
    }
    return is_valid_utf8(run);
}

const std::vector<std::string>& sample_texts() {
    static const std::vector<std::string> texts = {
        "Hello world",
        "The quick brown fox jumps over the lazy dog. 0123456789 !?@#$%^&*()[]{}<>",
        "line one\nline two\n\n  indented line three\n",
        "tabs\tand\ttabs\t\t",
        "  two leading spaces",
        "trailing spaces   ",
        "multiple     inner    spaces",
        " ",
        "\n",
        "emoji: \xf0\x9f\xa6\x99\xf0\x9f\x98\x80 and flags \xf0\x9f\x87\xab\xf0\x9f\x87\xb7",  // 🦙😀 🇫🇷
        "\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e\xe3\x81\xae\xe6\x96\x87\xe7\xab\xa0",  // 日本語の文章
        "\xe4\xb8\xad\xe6\x96\x87 mixed with English and \xed\x95\x9c\xea\xb5\xad\xec\x96\xb4",  // 中文 ... 한국어
        "caf\xc3\xa9 na\xc3\xafve \xe2\x82\xac 5 \xc2\xb1 \xce\xb1\xce\xb2\xce\xb3",  // café naïve € ± αβγ
        "rare: \xf0\x9f\x9c\x81 \xf0\x90\x8c\xb0 \xe1\x9a\xa0",  // 🜁 𐌰 ᚠ
        "\xef\xbf\xbd replacement char itself",
    };
    return texts;
}

// ---------------------------------------------------------------------------------------------------------------------
// Loading and errors
// ---------------------------------------------------------------------------------------------------------------------

void expect_load_error(const std::filesystem::path& path) {
    try {
        Tokenizer tok(path);
        ADD_FAILURE() << "no InputError for " << path;
    } catch (const InputError& e) {
        EXPECT_NE(std::string(e.what()).find(path.string()), std::string::npos) << e.what();
    }
}

TEST(Tokenizer, MissingFileThrowsNamingIt) {
    const auto dir = quest::test::temp_dir("tok_missing");
    expect_load_error(dir / "no_such_tokenizer.model");
    std::filesystem::remove_all(dir);
}

TEST(Tokenizer, GarbageFileThrowsNamingIt) {
    const auto dir = quest::test::temp_dir("tok_garbage");
    const auto garbage = dir / "garbage.model";
    std::ofstream(garbage, std::ios::binary) << "this is not a protobuf \xff\xfe\x01\x02 at all";
    expect_load_error(garbage);
    const auto empty = dir / "empty.model";
    std::ofstream(empty, std::ios::binary).flush();
    expect_load_error(empty);
    expect_load_error(dir);  // a directory
    std::filesystem::remove_all(dir);
}

TEST(Tokenizer, OutOfRangeIdsThrow) {
    QUEST_REQUIRE_PATH(demo_model());
    const Tokenizer tok(demo_model());
    const int n = tok.vocab_size();
    for (int bad : {-1, n, n + 1000, -2147483647 - 1}) {
        const std::vector<int> ids = {tok.bos_id(), bad};
        EXPECT_THROW(tok.decode(ids), InputError) << bad;
        EXPECT_THROW(tok.token_bytes(bad), InputError) << bad;
        EXPECT_THROW(tok.piece(bad), InputError) << bad;
        EXPECT_THROW(tok.is_control(bad), InputError) << bad;
        EXPECT_THROW(tok.is_byte(bad), InputError) << bad;
        StreamingDecoder dec(tok);
        EXPECT_THROW(dec.push(bad), InputError) << bad;
    }
    try {
        tok.token_bytes(n);
        ADD_FAILURE();
    } catch (const InputError& e) {
        EXPECT_NE(std::string(e.what()).find(std::to_string(n)), std::string::npos) << e.what();
    }
}

// ---------------------------------------------------------------------------------------------------------------------
// Encoding and decoding
// ---------------------------------------------------------------------------------------------------------------------

TEST(Tokenizer, LlamaKnownIds) {
    QUEST_REQUIRE_PATH(llama_model());
    const Tokenizer tok(llama_model());
    EXPECT_EQ(tok.vocab_size(), 32000);
    EXPECT_EQ(tok.bos_id(), 1);
    EXPECT_EQ(tok.eos_id(), 2);
    EXPECT_EQ(tok.encode("Hello world"), (std::vector<int>{1, 15043, 3186}));
    EXPECT_EQ(tok.encode("Hello world", false), (std::vector<int>{15043, 3186}));
    EXPECT_EQ(tok.encode("Hello, world!\n  Two  spaces"),
              (std::vector<int>{1, 15043, 29892, 3186, 29991, 13, 29871, 7803, 29871, 8162}));
    // 日本語 🦙: CJK characters have pieces; the llama falls back to four byte pieces.
    EXPECT_EQ(tok.encode("\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e \xf0\x9f\xa6\x99", false),
              (std::vector<int>{29871, 30325, 30346, 30968, 29871, 243, 162, 169, 156}));
}

TEST(Tokenizer, EmptyPromptIsBos) {
    QUEST_REQUIRE_PATH(demo_model());
    const Tokenizer tok(demo_model());
    EXPECT_EQ(tok.encode(""), std::vector<int>{tok.bos_id()});
    EXPECT_TRUE(tok.encode("", false).empty());
    EXPECT_EQ(tok.decode(std::vector<int>{}), "");
    EXPECT_EQ(tok.decode(std::vector<int>{tok.bos_id()}), "");
}

TEST(Tokenizer, LlamaPiecesAndBytes) {
    QUEST_REQUIRE_PATH(llama_model());
    const Tokenizer tok(llama_model());
    EXPECT_EQ(tok.piece(1), "<s>");
    EXPECT_EQ(tok.piece(2), "</s>");
    EXPECT_EQ(tok.piece(13), "<0x0A>");
    EXPECT_EQ(tok.piece(15043), "\xe2\x96\x81Hello");
    EXPECT_EQ(tok.token_bytes(1), "");
    EXPECT_EQ(tok.token_bytes(2), "");
    EXPECT_EQ(tok.token_bytes(13), "\n");
    EXPECT_EQ(tok.token_bytes(243), "\xf0");
    EXPECT_EQ(tok.token_bytes(15043), " Hello");
    EXPECT_EQ(tok.token_bytes(29871), " ");
    EXPECT_EQ(tok.token_bytes(0), " \xe2\x81\x87 ");  // unknown: " ⁇ "
    EXPECT_TRUE(tok.is_control(1));
    EXPECT_TRUE(tok.is_control(2));
    EXPECT_FALSE(tok.is_control(0));
    EXPECT_FALSE(tok.is_control(15043));
    EXPECT_TRUE(tok.is_byte(13));
    EXPECT_TRUE(tok.is_byte(258));
    EXPECT_FALSE(tok.is_byte(259));
    EXPECT_FALSE(tok.is_byte(1));
}

TEST(Tokenizer, LlamaRoundTrip) {
    QUEST_REQUIRE_PATH(llama_model());
    const Tokenizer tok(llama_model());
    for (const auto& text : sample_texts()) {
        EXPECT_EQ(tok.decode(tok.encode(text)), text);
        EXPECT_EQ(tok.decode(tok.encode(text, false)), text);
    }
    // The emoji really goes through byte fallback.
    const auto ids = tok.encode("\xf0\x9f\xa6\x99");
    int bytes = 0;
    for (int id : ids) bytes += tok.is_byte(id);
    EXPECT_EQ(bytes, 4);
}

TEST(Tokenizer, StoriesRoundTrip) {
    QUEST_REQUIRE_PATH(stories_model());
    const Tokenizer tok(stories_model());
    EXPECT_EQ(tok.vocab_size(), 512);
    const std::vector<std::string> exact = {
        "Once upon a time, there was a little girl named Lily.",
        "Hello world",
        "She said: \"I like cats!\" Then she ran away.",
        "emoji \xf0\x9f\xa6\x99 and \xe6\x97\xa5\xe6\x9c\xac and caf\xc3\xa9",
        "Z q X j 42 1999",
    };
    for (const auto& text : exact) EXPECT_EQ(tok.decode(tok.encode(text)), text);
    // Unlike Llama-2's, this tokenizer.model keeps SentencePiece's default remove_extra_whitespaces=true: leading,
    // trailing and repeated spaces are normalized away on encoding (the Python package gives the same).
    EXPECT_EQ(tok.decode(tok.encode("  two  spaces ")), "two spaces");
    EXPECT_EQ(tok.encode("  two  spaces "), (std::vector<int>{1, 259, 424, 414, 262, 427, 412, 331, 419}));
}

TEST(Tokenizer, DemoTokenizerRoundTrip) {
    QUEST_REQUIRE_PATH(demo_model());  // in the repository: tools/make_demo_tokenizer.py writes it
    const Tokenizer tok(demo_model());
    EXPECT_EQ(tok.vocab_size(), 512);
    EXPECT_EQ(tok.bos_id(), 1);
    EXPECT_EQ(tok.eos_id(), 2);
    EXPECT_EQ(tok.piece(0), "<unk>");
    EXPECT_TRUE(tok.is_byte(3));
    EXPECT_EQ(tok.token_bytes(3 + 0x41), "A");
    const std::string sentence = "Once upon a time, the little bear found 42 shiny stones.";
    const auto ids = tok.encode(sentence);
    EXPECT_EQ(ids.front(), 1);
    EXPECT_LT(ids.size(), sentence.size());  // it does merge characters
    EXPECT_EQ(tok.decode(ids), sentence);
    // Configured like Llama-2's: spaces are kept, other scripts go through byte fallback.
    for (const auto& text : sample_texts()) EXPECT_EQ(tok.decode(tok.encode(text)), text);
}

// ---------------------------------------------------------------------------------------------------------------------
// Streaming
// ---------------------------------------------------------------------------------------------------------------------

// The explicit streaming cases run on each Llama-style tokenizer at hand (add_dummy_prefix, spaces kept, byte
// fallback): the demo one in the repository always, Llama-2's when the shared models are there.
std::vector<std::filesystem::path> llama_style_models() {
    std::vector<std::filesystem::path> paths;
    for (const auto& path : {demo_model(), llama_model()})
        if (std::filesystem::exists(path)) paths.push_back(path);
    return paths;
}

int id_of(const Tokenizer& tok, std::string_view piece) {
    for (int id = 0; id < tok.vocab_size(); ++id)
        if (tok.piece(id) == piece) return id;
    ADD_FAILURE() << "no piece " << piece;
    return 0;
}

// The first-piece space rules of SentencePiece's decoder, spelled out.
TEST(StreamingDecoder, LeadingSpaceLikeSentencePiece) {
    for (const auto& path : llama_style_models()) {
        SCOPED_TRACE(path.string());
        const Tokenizer tok(path);
        const auto b = byte_ids(tok);
        const int bos = tok.bos_id(), eos = tok.eos_id(), unk = id_of(tok, "<unk>");
        const int ws = id_of(tok, "\xe2\x96\x81"), the = id_of(tok, "\xe2\x96\x81the"),
                  and_ = id_of(tok, "\xe2\x96\x81" "and"), comma = id_of(tok, ",");
        const std::vector<std::pair<std::vector<int>, std::string>> cases = {
            {{the, and_}, "the and"},
            {{bos, the, and_}, "the and"},  // BOS produces nothing and does not count as text
            {{bos, eos, bos, the}, "the"},
            {{ws, the}, " the"},  // a lone "▁" first takes the dropped space
            {{ws, ws, the}, "  the"},
            {{comma, the}, ", the"},              // a first piece without "▁" ends the start
            {{b['A'], the}, "A the"},             // so does text from byte pieces
            {{b[' '], the}, "  the"},             // a space byte is not a "▁": nothing dropped
            {{b[0xf0], the}, kFFFD + " the"},     // nor is U+FFFD from a bad byte
            {{unk, the}, " \xe2\x81\x87  the"},   // nor the unknown surface " ⁇ "
            {{bos, ws}, ""},
            {{}, ""},
        };
        for (const auto& [ids, expected] : cases) {
            EXPECT_EQ(tok.decode(ids), expected);  // documents SentencePiece's own behaviour
            EXPECT_EQ(stream(tok, ids), expected);
        }
    }
}

TEST(StreamingDecoder, ResetStartsNewText) {
    for (const auto& path : llama_style_models()) {
        SCOPED_TRACE(path.string());
        const Tokenizer tok(path);
        const int the = id_of(tok, "\xe2\x96\x81the"), f0 = byte_ids(tok)[0xf0];
        StreamingDecoder dec(tok);
        EXPECT_EQ(dec.push(tok.bos_id()), "");
        EXPECT_EQ(dec.push(the), "the");
        EXPECT_EQ(dec.push(the), " the");
        EXPECT_EQ(dec.push(f0), "");  // first byte of a 4-byte character, held back
        EXPECT_EQ(dec.flush(), kFFFD);
        EXPECT_EQ(dec.push(the), " the");  // flush() does not start a new text
        EXPECT_EQ(dec.push(f0), "");
        dec.reset();  // drops the held byte and starts a new text
        EXPECT_EQ(dec.flush(), "");
        EXPECT_EQ(dec.push(the), "the");
    }
}

TEST(StreamingDecoder, SplitMultiByteCharacters) {
    for (const auto& path : llama_style_models()) {
        SCOPED_TRACE(path.string());
        const Tokenizer tok(path);
        const auto b = byte_ids(tok);
        const int the = id_of(tok, "\xe2\x96\x81the");
        // " 🦙" as both tokenizers encode it: "▁" then four byte pieces; only the last byte completes the character.
        {
            const std::string llama = "\xf0\x9f\xa6\x99";
            const std::vector<int> ids = {tok.bos_id(), id_of(tok, "\xe2\x96\x81"), b[0xf0], b[0x9f], b[0xa6], b[0x99]};
            EXPECT_EQ(tok.encode(llama), ids);
            std::vector<std::string> parts;
            EXPECT_EQ(stream(tok, ids, &parts), llama);
            EXPECT_EQ(parts, (std::vector<std::string>{"", "", "", "", "", llama, ""}));
        }
        // Characters of 2, 3 and 4 bytes back to back, then text.
        {
            const std::string chars = "\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\xce\xb1";  // é € 😀 α
            auto ids = ids_of_bytes(b, chars);
            ids.push_back(the);
            std::vector<std::string> parts;
            EXPECT_EQ(stream(tok, ids, &parts), chars + " the");
            EXPECT_EQ(tok.decode(ids), chars + " the");
            const std::vector<std::string> expected = {
                "", "\xc3\xa9", "", "", "\xe2\x82\xac", "", "", "", "\xf0\x9f\x98\x80", "", "\xce\xb1", " the", ""};
            EXPECT_EQ(parts, expected);
        }
    }
}

// Bad byte sequences: U+FFFD per bad byte, emitted as soon as the byte is known to be bad, same text as decode().
TEST(StreamingDecoder, InvalidBytesLikeSentencePiece) {
    for (const auto& path : llama_style_models()) {
        SCOPED_TRACE(path.string());
        const Tokenizer tok(path);
        const auto b = byte_ids(tok);
        const int bos = tok.bos_id(), the = id_of(tok, "\xe2\x96\x81the");
        const std::string x = kFFFD;
        struct Case {
            std::vector<int> ids;
            std::vector<std::string> parts;  // push() results, then flush()
        };
        const std::vector<Case> cases = {
            {{b[0x80]}, {x, ""}},                                          // lone continuation byte
            {{b[0xff], b[0xc0], b[0xf5]}, {x, x, x, ""}},                  // never valid as a lead byte
            {{b[0xe4], b['A']}, {"", x + "A", ""}},                        // lead then non-continuation
            {{b[0xe4], b[0xb8]}, {"", "", x + x}},                         // truncated at the end
            {{b[0xe4], b[0xb8], the}, {"", "", x + x + " the", ""}},       // truncated by a text piece
            {{b[0xe4], bos, b[0xb8], b[0xad]}, {"", x, x, x, ""}},         // even a control token breaks it
            {{b[0xe0], b[0x80], b[0x80]}, {"", x + x, x, ""}},             // overlong
            {{b[0xed], b[0xa0], b[0x80]}, {"", x + x, x, ""}},             // surrogate
            {{b[0xf4], b[0x90]}, {"", x + x, ""}},                         // above U+10FFFF
            {{b[0xf0], b[0x9f], b[0xe4], b[0xb8], b[0xad]}, {"", "", x + x, "", "\xe4\xb8\xad", ""}},
        };
        for (const auto& c : cases) {
            std::vector<std::string> parts;
            const std::string text = stream(tok, c.ids, &parts);
            EXPECT_EQ(text, tok.decode(c.ids));
            EXPECT_EQ(parts, c.parts);
        }
    }
}

// Random id sequences, biased towards byte pieces, control tokens and "▁"-only pieces so that the start-of-text and
// byte-grouping rules are exercised; streaming must reproduce decode() for all of them, invalid bytes included.
void random_streaming_check(const Tokenizer& tok, uint32_t seed, int sequences) {
    std::mt19937 rng(seed);
    std::vector<int> bytes, controls, spaces, texts;  // spaces: "▁", "▁▁", ...
    for (int id = 0; id < tok.vocab_size(); ++id) {
        if (tok.is_byte(id)) bytes.push_back(id);
        else if (tok.is_control(id)) controls.push_back(id);
        else if (tok.token_bytes(id).find_first_not_of(' ') == std::string::npos) spaces.push_back(id);
        else texts.push_back(id);
    }
    ASSERT_FALSE(bytes.empty());
    ASSERT_FALSE(spaces.empty());
    ASSERT_FALSE(controls.empty());
    const auto byte_id = byte_ids(tok);
    auto pick = [&](const std::vector<int>& v) {
        return v[std::uniform_int_distribution<size_t>(0, v.size() - 1)(rng)];
    };
    const char32_t ranges[][2] = {{0x20, 0x7e}, {0xa0, 0x7ff}, {0x800, 0xd7ff}, {0xe000, 0xfffd}, {0x10000, 0x10ffff}};

    int valid = 0;
    for (int s = 0; s < sequences; ++s) {
        std::vector<int> ids;
        const int len = std::uniform_int_distribution<int>(0, 24)(rng);
        const bool clean = s % 2 == 0;  // half the sequences only hold whole characters in their byte runs
        while (static_cast<int>(ids.size()) < len) {
            const int r = std::uniform_int_distribution<int>(0, 99)(rng);
            if (r < 40) {
                if (clean) {
                    const auto& range = ranges[std::uniform_int_distribution<int>(0, 4)(rng)];
                    const char32_t cp = std::uniform_int_distribution<char32_t>(range[0], range[1])(rng);
                    for (int id : ids_of_bytes(byte_id, utf8(cp))) ids.push_back(id);
                } else {
                    ids.push_back(pick(bytes));
                }
            } else if (r < 50) {
                ids.push_back(pick(controls));
            } else if (r < 60) {
                ids.push_back(pick(spaces));
            } else if (r < 65) {
                int id = 0;
                do {
                    id = std::uniform_int_distribution<int>(0, tok.vocab_size() - 1)(rng);
                } while (clean && tok.is_byte(id));
                ids.push_back(id);
            } else {
                ids.push_back(pick(texts));
            }
        }
        const std::string expected = tok.decode(ids);
        const bool is_clean = byte_runs_valid(tok, ids);
        if (clean) {
            EXPECT_TRUE(is_clean);
        }
        valid += is_clean;
        std::string ids_text;
        for (int id : ids) ids_text += std::to_string(id) + " ";
        EXPECT_EQ(stream(tok, ids), expected) << "ids: " << ids_text;
        if (::testing::Test::HasFailure()) return;  // one reported sequence is enough
    }
    EXPECT_GE(valid, sequences / 2);
}

TEST(StreamingDecoder, RandomSequencesMatchDecodeLlama) {
    QUEST_REQUIRE_PATH(llama_model());
    random_streaming_check(Tokenizer(llama_model()), 20240611, 3000);
}

TEST(StreamingDecoder, RandomSequencesMatchDecodeStories) {
    QUEST_REQUIRE_PATH(stories_model());  // remove_extra_whitespaces=true: a different first-space rule
    random_streaming_check(Tokenizer(stories_model()), 7, 3000);
}

TEST(StreamingDecoder, RandomSequencesMatchDecodeDemo) {
    QUEST_REQUIRE_PATH(demo_model());
    random_streaming_check(Tokenizer(demo_model()), 99, 3000);
}

TEST(StreamingDecoder, EncodedTextsStreamBack) {
    for (const auto& path : {llama_model(), stories_model(), demo_model()}) {
        if (!std::filesystem::exists(path)) continue;
        const Tokenizer tok(path);
        for (const auto& text : sample_texts()) {
            const auto ids = tok.encode(text);
            EXPECT_EQ(stream(tok, ids), tok.decode(ids)) << path << ": " << text;
        }
    }
}

// ---------------------------------------------------------------------------------------------------------------------
// Chat template
// ---------------------------------------------------------------------------------------------------------------------

std::vector<int> concat(std::initializer_list<std::vector<int>> parts) {
    std::vector<int> out;
    for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
    return out;
}

TEST(ChatTemplate, SystemUserAssistantUserByHand) {
    QUEST_REQUIRE_PATH(demo_model());
    const Tokenizer tok(demo_model());
    const std::vector<ChatMessage> messages = {
        {Role::System, "You are a kind bear."},
        {Role::User, "  Tell me a story.\n"},
        {Role::Assistant, " Once upon a time there was a frog. "},
        {Role::User, "\tAnother one, please!  "},
    };
    const int bos = tok.bos_id(), eos = tok.eos_id();
    const auto expected = concat({
        {bos},
        // Meta strips the merged system+user content as a whole: the user's leading spaces stay.
        tok.encode("[INST] <<SYS>>\nYou are a kind bear.\n<</SYS>>\n\n  Tell me a story. [/INST] "
                   "Once upon a time there was a frog. ",
                   false),
        {eos, bos},
        tok.encode("[INST] Another one, please! [/INST]", false),
    });
    EXPECT_EQ(quest::apply_llama2_chat_template(tok, messages), expected);

    const std::vector<ChatMessage> single = {{Role::User, "Hi"}};
    EXPECT_EQ(quest::apply_llama2_chat_template(tok, single), concat({{bos}, tok.encode("[INST] Hi [/INST]", false)}));
}

TEST(ChatTemplate, LlamaKnownIds) {
    QUEST_REQUIRE_PATH(llama_model());
    const Tokenizer tok(llama_model());
    const std::vector<ChatMessage> single = {{Role::User, "Hi"}};
    EXPECT_EQ(quest::apply_llama2_chat_template(tok, single),
              (std::vector<int>{1, 518, 25580, 29962, 6324, 518, 29914, 25580, 29962}));
    // The system text keeps its own spaces (Meta strips the merged content as a whole); Python's str.strip() also
    // removes U+3000 and U+00A0.
    const std::vector<ChatMessage> messages = {
        {Role::System, " Be brief. "},
        {Role::User, "  What is 2+2?\n"},
        {Role::Assistant, " 4. "},
        {Role::User, "\xe3\x80\x80" "And 3+3?\xc2\xa0"},
    };
    EXPECT_EQ(quest::apply_llama2_chat_template(tok, messages),
              (std::vector<int>{1,     518,   25580, 29962, 3532,  14816, 29903, 6778,  13,    1522,  11473,
                                29889, 29871, 13,    29966, 829,   14816, 29903, 6778,  13,    13,    29871,
                                1724,  338,   29871, 29906, 29974, 29906, 29973, 518,   29914, 25580, 29962,
                                29871, 29946, 29889, 29871, 2,     1,     518,   25580, 29962, 1126,  29871,
                                29941, 29974, 29941, 29973, 518,   29914, 25580, 29962}));
}

TEST(ChatTemplate, BadRoleOrderThrows) {
    QUEST_REQUIRE_PATH(demo_model());
    const Tokenizer tok(demo_model());
    const std::vector<std::vector<ChatMessage>> bad = {
        {},
        {{Role::System, "s"}},
        {{Role::Assistant, "a"}},
        {{Role::User, "u"}, {Role::User, "u"}},
        {{Role::User, "u"}, {Role::Assistant, "a"}},
        {{Role::System, "s"}, {Role::Assistant, "a"}},
        {{Role::System, "s"}, {Role::System, "s"}, {Role::User, "u"}},
        {{Role::User, "u"}, {Role::System, "s"}},
        {{Role::User, "u"}, {Role::Assistant, "a"}, {Role::Assistant, "a"}},
    };
    for (const auto& messages : bad) EXPECT_THROW(quest::apply_llama2_chat_template(tok, messages), InputError);
}

}  // namespace
