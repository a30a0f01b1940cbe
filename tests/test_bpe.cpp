// Byte-level BPE (tokenizer/bpe.h) against Hugging Face `tokenizers`: tools/make_tokenizer_fixtures.py trains one
// small tokenizer.json per family shape and records what the Rust library makes of every line of a 2,000-line
// corpus (ids, decode) and of random id sequences (decode). Every line must match exactly. Plus the errors for
// malformed files, and the GGUF-vocabulary constructor.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/common/error.h"
#include "model/io/gguf.h"
#include "model/io/gguf_model.h"
#include "test_util.h"
#include "tokenizer/bpe.h"
#include "tokenizer/nfc.h"
#include "tokenizer/tokenizer.h"

namespace {

using quest::test::is_valid_utf8;
using quest::BpeTokenizer;
using quest::InputError;
using quest::StreamingDecoder;
using quest::Tokenizer;
using nlohmann::json;

std::filesystem::path fixtures() { return quest::test::source_dir() / "tests/fixtures/tokenizer/bpe"; }

std::vector<std::string> read_lines(const std::filesystem::path& p) {
    std::ifstream in(p, std::ios::binary);
    EXPECT_TRUE(in) << "cannot read " << p;
    std::vector<std::string> lines;
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    return lines;
}

std::vector<std::string> corpus() {
    std::vector<std::string> out;
    for (const auto& l : read_lines(fixtures() / "corpus.jsonl")) out.push_back(json::parse(l).get<std::string>());
    return out;
}

std::vector<int> parse_ids(std::string_view s) {
    std::vector<int> ids;
    std::istringstream in{std::string(s)};
    for (int id; in >> id;) ids.push_back(id);
    return ids;
}

std::string ids_text(const std::vector<int>& ids) {
    std::string s;
    for (int id : ids) {
        if (!s.empty()) s += ' ';
        s += std::to_string(id);
    }
    return s;
}

// Streams `ids` one at a time: every piece must be valid UTF-8, and the pieces with flush() must equal decode().
void expect_stream_equals_decode(const Tokenizer& tok, const std::vector<int>& ids, const std::string& what) {
    StreamingDecoder stream(tok);
    std::string text;
    for (int id : ids) {
        const std::string piece = stream.push(id);
        EXPECT_TRUE(is_valid_utf8(piece)) << what << ": push(" << id << ") gave invalid UTF-8";
        text += piece;
    }
    const std::string tail = stream.flush();
    EXPECT_TRUE(is_valid_utf8(tail)) << what << ": flush gave invalid UTF-8";
    text += tail;
    EXPECT_EQ(text, tok.decode(ids)) << what << ": ids " << ids_text(ids);
}

// The corpus lines against `name`.ids / .decode; returns the number of mismatching lines (the first few printed).
// With `only_nfc_stable`, lines that NFC changes are left out; lines containing `skip_if` (when not empty) too.
int check_corpus(const Tokenizer& tok, const std::string& name, bool only_nfc_stable = false,
                 const std::string& skip_if = {}) {
    const auto lines = corpus();
    const auto ids = read_lines(fixtures() / (name + ".ids"));
    const auto dec = read_lines(fixtures() / (name + ".decode"));
    EXPECT_EQ(ids.size(), lines.size());
    EXPECT_EQ(dec.size(), lines.size());
    int bad = 0;
    for (size_t i = 0; i < lines.size() && i < ids.size() && i < dec.size(); ++i) {
        if (only_nfc_stable && quest::to_nfc(lines[i]) != lines[i]) continue;
        if (!skip_if.empty() && lines[i].find(skip_if) != std::string::npos) continue;
        const std::vector<int> want = parse_ids(ids[i]);
        const std::vector<int> got = tok.encode(lines[i], /*add_bos=*/true);
        const std::string want_text = dec[i] == "=" ? lines[i] : json::parse(dec[i]).get<std::string>();
        const std::string got_text = tok.decode(want);
        if (got != want || got_text != want_text) {
            if (++bad <= 5)
                ADD_FAILURE() << name << " line " << i << " " << json(lines[i]).dump() << "\n  want " << ids[i]
                              << "\n  got  " << ids_text(got) << "\n  decode want " << json(want_text).dump()
                              << "\n  decode got  " << json(got_text).dump();
        }
        expect_stream_equals_decode(tok, want, name + " line " + std::to_string(i));
    }
    return bad;
}

class BpeFamily : public ::testing::TestWithParam<std::string> {};

TEST_P(BpeFamily, EveryCorpusLineEncodesAndDecodesAsHuggingFace) {
    const auto tok = quest::load_tokenizer(fixtures() / GetParam());
    ASSERT_NE(dynamic_cast<const BpeTokenizer*>(tok.get()), nullptr) << "tokenizer.json must give the BPE";
    EXPECT_EQ(check_corpus(*tok, GetParam()), 0);
}

TEST_P(BpeFamily, RandomIdSequencesDecodeAsHuggingFace) {
    const auto tok = quest::load_tokenizer(fixtures() / GetParam());
    int bad = 0;
    for (const auto& line : read_lines(fixtures() / (GetParam() + ".random"))) {
        const size_t tab = line.find('\t');
        ASSERT_NE(tab, std::string::npos);
        const std::vector<int> ids = parse_ids(line.substr(0, tab));
        const std::string want = json::parse(line.substr(tab + 1)).get<std::string>();
        const std::string got = tok->decode(ids);
        if (got != want && ++bad <= 5)
            ADD_FAILURE() << GetParam() << " ids " << ids_text(ids) << "\n  want " << json(want).dump() << "\n  got  "
                          << json(got).dump();
        expect_stream_equals_decode(*tok, ids, GetParam() + " random");
    }
    EXPECT_EQ(bad, 0);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, BpeFamily,
                         ::testing::Values("gpt2", "gpt2-prefix", "llama3", "qwen2", "smollm2", "bytefallback"),
                         [](const auto& p) {
                             std::string name = p.param;
                             std::replace(name.begin(), name.end(), '-', '_');
                             return name;
                         });

// SmolLM2's GGUF: QUEST_SMOLLM2_GGUF, else where tools/fetch_smollm2.sh puts it; and the skip message without it.
std::filesystem::path smollm2_gguf() {
    const char* env = std::getenv("QUEST_SMOLLM2_GGUF");
    return env ? std::filesystem::path(env)
               : quest::test::source_dir() / "models" / "smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf";
}
std::string smollm2_absent(const std::filesystem::path& path) {
    return path.string() + " is absent (run tools/fetch_smollm2.sh, or set QUEST_SMOLLM2_GGUF to "
                           "SmolLM2-135M-Instruct.Q4_1.gguf)";
}

TEST(Bpe, NfcMatchesPythonUnicodedata) {
    // Combining marks of several classes (reordering), Hangul jamo (algorithmic composition), singletons and
    // composition exclusions, against Python's unicodedata.normalize("NFC").
    int bad = 0, n = 0;
    for (const auto& line : read_lines(fixtures() / "nfc_cases.jsonl")) {
        const json c = json::parse(line);
        const std::string in = c[0], want = c[1];
        const std::string got = quest::to_nfc(in);
        ++n;
        if (got != want && ++bad <= 5)
            ADD_FAILURE() << json(in).dump() << "\n  want " << json(want).dump() << "\n  got  " << json(got).dump();
    }
    EXPECT_GT(n, 500);
    EXPECT_EQ(bad, 0);
}

TEST(Bpe, Llama3AddsBeginOfTextAndKnowsItsTurnEnds) {
    const auto tok = quest::load_tokenizer(fixtures() / "llama3");
    const int bot = tok->token_id("<|begin_of_text|>").value();
    const int eot = tok->token_id("<|eot_id|>").value();
    EXPECT_EQ(tok->bos_id(), bot);
    EXPECT_EQ(tok->eos_id(), eot);  // tokenizer_config.json's eos_token
    EXPECT_EQ(tok->encode("", true), std::vector<int>{bot});
    EXPECT_TRUE(tok->encode("", false).empty());
    EXPECT_EQ(tok->encode("hi", true).front(), bot);
    EXPECT_NE(tok->encode("hi", false).front(), bot);
    const auto ends = tok->end_of_turn_ids();
    EXPECT_NE(std::find(ends.begin(), ends.end(), eot), ends.end());
    EXPECT_NE(std::find(ends.begin(), ends.end(), tok->token_id("<|end_of_text|>").value()), ends.end());
    EXPECT_TRUE(tok->is_control(eot));
    EXPECT_EQ(tok->token_bytes(eot), "");
    EXPECT_EQ(tok->piece(eot), "<|eot_id|>");
    EXPECT_FALSE(tok->token_id("<|no such token|>").has_value());
}

TEST(Bpe, QwenAndSmolAddNothingAndEndTurnsWithImEnd) {
    for (const char* name : {"qwen2", "smollm2"}) {
        const auto tok = quest::load_tokenizer(fixtures() / name);
        EXPECT_EQ(tok->bos_id(), -1) << name;
        EXPECT_EQ(tok->encode("hello", true), tok->encode("hello", false)) << name;
        EXPECT_TRUE(tok->encode("", true).empty()) << name;
        const int im_end = tok->token_id("<|im_end|>").value();
        const auto ends = tok->end_of_turn_ids();
        EXPECT_NE(std::find(ends.begin(), ends.end(), im_end), ends.end()) << name;
        EXPECT_EQ(tok->encode("<|im_end|>", false), std::vector<int>{im_end}) << name;
    }
    EXPECT_EQ(quest::load_tokenizer(fixtures() / "qwen2")->eos_id(),
              quest::load_tokenizer(fixtures() / "qwen2")->token_id("<|im_end|>").value());
}

TEST(Bpe, InvalidUtf8InputIsEncodedAsReplacementCharacters) {
    // Python's bytes.decode(errors="replace") gives one U+FFFD per maximal invalid subpart, as utf8::lossy does.
    const auto tok = quest::load_tokenizer(fixtures() / "gpt2");
    EXPECT_EQ(tok->encode("ab\xe2\x96 cd\xff", false), tok->encode("ab\xef\xbf\xbd cd\xef\xbf\xbd", false));
}

TEST(Bpe, StreamingHoldsSplitCharactersBack) {
    const auto tok = quest::load_tokenizer(fixtures() / "gpt2");
    // "€" is E2 82 AC; in a byte-level vocabulary each byte has its own piece.
    const int e2 = tok->token_id("\xc3\xa2").value();  // U+00E2 stands for byte E2
    const int x82 = tok->token_id("\xc4\xa4").value();  // U+0124 stands for byte 82
    const int xac = tok->token_id("\xc2\xac").value();  // U+00AC stands for byte AC
    StreamingDecoder s(*tok);
    EXPECT_EQ(s.push(e2), "");
    EXPECT_EQ(s.push(x82), "");
    EXPECT_EQ(s.push(xac), "\xe2\x82\xac");
    EXPECT_EQ(s.push(e2), "");
    EXPECT_EQ(s.push(tok->token_id("a").value()), "\xef\xbf\xbd" "a");  // E2 then 'a': one U+FFFD
    EXPECT_EQ(s.push(e2), "");
    EXPECT_EQ(s.flush(), "\xef\xbf\xbd");
    EXPECT_THROW(s.push(tok->vocab_size()), InputError);
    EXPECT_THROW(tok->decode(std::vector<int>{-1}), InputError);
}

TEST(Bpe, SplitAndDigitsPreTokenizersMatchHuggingFace) {
    // Every behavior, inverted or not, with string and regex patterns: the pieces Hugging Face's
    // pre_tokenize_str gives (tests/fixtures/tokenizer/bpe/split_cases.json).
    const json cases = json::parse(quest::test::slurp(fixtures() / "split_cases.json"));
    ASSERT_GT(cases.size(), 100u);
    const std::map<std::string, quest::SplitBehavior> behaviors = {
        {"removed", quest::SplitBehavior::Removed},
        {"isolated", quest::SplitBehavior::Isolated},
        {"merged_with_previous", quest::SplitBehavior::MergedWithPrevious},
        {"merged_with_next", quest::SplitBehavior::MergedWithNext},
        {"contiguous", quest::SplitBehavior::Contiguous}};
    for (const auto& c : cases) {
        const std::string kind = c[0], pattern = c[1], behavior = c[2], text = c[4];
        const bool flag = c[3];
        const std::vector<std::string> want = c[5];
        quest::BpeData d;
        d.file = "split-test";
        d.vocab = {"a"};
        quest::BpePreStep step;
        if (kind == "Digits") {
            step.kind = quest::BpePreStep::Kind::Digits;
            step.individual_digits = flag;
            step.regex = std::make_shared<quest::BpeRegex>(R"(\p{N})", "test");
        } else {
            step.kind = quest::BpePreStep::Kind::Split;
            if (kind == "Regex") step.regex = std::make_shared<quest::BpeRegex>(pattern, "test");
            else step.literal = pattern;
            step.behavior = behaviors.at(behavior);
            step.invert = flag;
        }
        d.pre.push_back(step);
        const BpeTokenizer tok(std::move(d));
        EXPECT_EQ(tok.pre_tokenize(text), want) << c.dump();
    }
}

// ---------------------------------------------------------------------------------------------------------------------
// GGUF vocabulary
// ---------------------------------------------------------------------------------------------------------------------

// tokens / merges / token types as a GGUF file carries them, made from a fixture's tokenizer.json.
struct GgufVocab {
    std::vector<std::string> tokens, merges;
    std::vector<int32_t> types;
    int bos = -1, eos = -1;
};

GgufVocab gguf_from_fixture(const std::string& name) {
    const auto file = fixtures() / name / "tokenizer.json";
    const quest::BpeData d = quest::parse_tokenizer_json(quest::test::slurp(file), file);
    GgufVocab g;
    g.tokens = d.vocab;
    g.types.assign(d.vocab.size(), 1);
    for (const auto& a : d.added) {
        g.tokens[a.id] = a.content;
        g.types[a.id] = a.special ? 3 : 4;
    }
    for (const auto& [a, b] : d.merges) g.merges.push_back(a + " " + b);
    g.bos = d.bos;
    g.eos = d.eos;
    return g;
}

TEST(BpeGguf, LlamaCppPreTokenizersMatchTheHuggingFaceFamilies) {
    // The same vocabulary through from_gguf_vocab with llama.cpp's regexes gives Hugging Face's ids. llama.cpp
    // applies no NFC, so for qwen2 only the lines NFC leaves as they are can agree.
    for (const auto& [name, pre] : std::vector<std::pair<std::string, std::string>>{
             {"gpt2", "gpt2"}, {"llama3", "llama-bpe"}, {"qwen2", "qwen2"}}) {
        const GgufVocab g = gguf_from_fixture(name);
        const BpeTokenizer tok = BpeTokenizer::from_gguf_vocab(g.tokens, g.merges, g.types, g.bos, g.eos, pre);
        EXPECT_EQ(check_corpus(tok, name, /*only_nfc_stable=*/name == "qwen2"), 0) << name << " as GGUF pre " << pre;
    }
    // SmolLM2's shape (Digits + ByteLevel with the GPT-2 regex) is llama.cpp's "smollm". The fixture's <tool> strips
    // the whitespace around it, which a GGUF user-defined token does not, so those lines are left out.
    const GgufVocab g = gguf_from_fixture("smollm2");
    const BpeTokenizer tok = BpeTokenizer::from_gguf_vocab(g.tokens, g.merges, g.types, g.bos, g.eos, "smollm");
    EXPECT_EQ(check_corpus(tok, "smollm2", false, "<tool>"), 0);
}

TEST(BpeGguf, UnknownPreIsAnInputErrorNamingIt) {
    const GgufVocab g = gguf_from_fixture("gpt2");
    try {
        (void)BpeTokenizer::from_gguf_vocab(g.tokens, g.merges, g.types, -1, -1, "mystery-pre", "model.gguf");
        FAIL() << "expected InputError";
    } catch (const InputError& e) {
        EXPECT_NE(std::string(e.what()).find("mystery-pre"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("model.gguf"), std::string::npos) << e.what();
    }
}

// tokenizer.ggml.{tokens, merges, token_type, bos_token_id, eos_token_id} of `gguf_file`, through the GGUF reader
// (model/io/gguf.h).
bool read_gguf_vocab(const std::filesystem::path& gguf_file, GgufVocab& out) {
    const auto f = quest::GgufFile::open(gguf_file);
    const quest::GgufArray* tokens = f->get_array("tokenizer.ggml.tokens");
    const quest::GgufArray* merges = f->get_array("tokenizer.ggml.merges");
    const quest::GgufArray* types = f->get_array("tokenizer.ggml.token_type");
    if (!tokens || !merges || !types || types->type != quest::GgufType::Int32) return false;
    out.tokens = tokens->strings;
    out.merges = merges->strings;
    out.types.resize(types->count);
    std::memcpy(out.types.data(), types->raw.data(), out.types.size() * 4);
    out.bos = static_cast<int>(f->get_uint("tokenizer.ggml.bos_token_id").value_or(uint64_t(-1)));
    out.eos = static_cast<int>(f->get_uint("tokenizer.ggml.eos_token_id").value_or(uint64_t(-1)));
    return true;
}

TEST(BpeGguf, SmolLM2VocabularyMatchesHuggingFace) {
    const std::filesystem::path path = smollm2_gguf();
    if (!std::filesystem::exists(path)) GTEST_SKIP() << smollm2_absent(path);
    GgufVocab g;
    ASSERT_TRUE(read_gguf_vocab(path, g)) << path << ": no tokenizer.ggml.{tokens, merges, token_type}";
    const BpeTokenizer tok = BpeTokenizer::from_gguf_vocab(g.tokens, g.merges, g.types, g.bos, g.eos, "smollm");
    EXPECT_EQ(check_corpus(tok, "smollm2-gguf"), 0);
}

// ---------------------------------------------------------------------------------------------------------------------
// Writing tokenizer.json (write_tokenizer_json; what `quest quantize` writes for a GGUF's vocabulary)
// ---------------------------------------------------------------------------------------------------------------------

// Writes `files` into a fresh folder `name` and loads it back with load_tokenizer.
std::unique_ptr<Tokenizer> load_written(const quest::TokenizerJsonFiles& files, const std::string& name) {
    const auto dir = quest::test::temp_dir("bpe_written_" + name);
    std::ofstream(dir / "tokenizer.json", std::ios::binary) << files.tokenizer_json;
    std::ofstream(dir / "tokenizer_config.json", std::ios::binary) << files.tokenizer_config_json;
    return quest::load_tokenizer(dir);
}

// The same ids for every corpus line (with and without what the tokenizer adds around a text), the same specials.
int count_differences(const Tokenizer& a, const Tokenizer& b) {
    quest::test::expect_same_specials(a, b);
    EXPECT_EQ(a.end_of_turn_ids(), b.end_of_turn_ids());
    for (int id = 0; id < std::min(a.vocab_size(), b.vocab_size()); ++id) {
        EXPECT_EQ(a.is_control(id), b.is_control(id)) << id;
        EXPECT_EQ(a.piece(id), b.piece(id)) << id;
    }
    int bad = 0;
    for (const auto& line : corpus())
        for (const bool add : {true, false})
            if (a.encode(line, add) != b.encode(line, add) && ++bad <= 5)
                ADD_FAILURE() << json(line).dump() << " add_bos " << add << "\n  " << ids_text(a.encode(line, add))
                              << "\n  " << ids_text(b.encode(line, add));
    return bad;
}

TEST(BpeWrite, EveryFamilyRoundTripsThroughTokenizerJson) {
    // Parsed, written back, parsed again: Hugging Face's ids and decode on every corpus line (the oracle of the
    // family tests), and the ids of the original load.
    for (const std::string name : {"gpt2", "gpt2-prefix", "llama3", "qwen2", "smollm2", "bytefallback"}) {
        SCOPED_TRACE(name);
        const auto original = quest::load_tokenizer(fixtures() / name);
        const auto* bpe = dynamic_cast<const BpeTokenizer*>(original.get());
        ASSERT_NE(bpe, nullptr);
        const auto written = load_written(quest::write_tokenizer_json(bpe->data(), "{{ chat }}"), name);
        EXPECT_EQ(check_corpus(*written, name), 0);
        EXPECT_EQ(count_differences(*original, *written), 0);
    }
}

TEST(BpeWrite, OnePieceUnderTwoIdsIsAnInputErrorNamingBoth) {
    const GgufVocab g = gguf_from_fixture("gpt2");
    std::vector<std::string> tokens = g.tokens;
    std::vector<int32_t> types = g.types;
    tokens.push_back(tokens[5]);  // a GGUF may hold one piece twice; a tokenizer.json cannot
    types.push_back(1);
    const int dup = static_cast<int>(tokens.size()) - 1;
    const BpeTokenizer tok = BpeTokenizer::from_gguf_vocab(tokens, g.merges, types, -1, -1, "gpt2", "dup.gguf");
    try {
        (void)quest::write_tokenizer_json(tok.data());
        FAIL() << "expected InputError";
    } catch (const InputError& e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find("dup.gguf"), std::string::npos) << msg;
        EXPECT_NE(msg.find("ids 5 and " + std::to_string(dup)), std::string::npos) << msg;
    }
}

TEST(BpeWrite, TinyGgufVocabularyAsTokenizerJsonGivesTheGgufIds) {
    // tests/fixtures/gguf/tiny_bpe.gguf carries the smollm2 fixture's vocabulary as convert_hf_to_gguf.py writes
    // it (pre "smollm"). Its tokenizer.json gives the GGUF tokenizer's ids on every line, and Hugging Face's (the
    // lines with <tool>, a user-defined token that strips whitespace in the fixture but not in a GGUF, left out).
    const auto file = quest::test::source_dir() / "tests/fixtures/gguf/tiny_bpe.gguf";
    const auto f = quest::GgufFile::open(file);
    const auto gguf_tok = quest::gguf_tokenizer(*f);
    const quest::TokenizerJsonFiles files = quest::gguf_tokenizer_json(*f, quest::gguf_model_config(*f));
    const auto written = load_written(files, "tiny_bpe");
    EXPECT_EQ(count_differences(*gguf_tok, *written), 0);
    EXPECT_EQ(check_corpus(*written, "smollm2", false, "<tool>"), 0);
    const json cfg = json::parse(files.tokenizer_config_json);
    EXPECT_EQ(cfg.at("chat_template").get<std::string>(), quest::gguf_chat_template(*f));
    EXPECT_EQ(cfg.at("eos_token").get<std::string>(), "<|im_end|>");
    EXPECT_EQ(cfg.at("bos_token").get<std::string>(), "<|im_start|>");
}

TEST(BpeWrite, SmolLM2GgufVocabularyAsTokenizerJsonMatchesHuggingFace) {
    const std::filesystem::path path = smollm2_gguf();
    if (!std::filesystem::exists(path)) GTEST_SKIP() << smollm2_absent(path);
    const auto f = quest::GgufFile::open(path);
    const auto gguf_tok = quest::gguf_tokenizer(*f);
    const auto written = load_written(quest::gguf_tokenizer_json(*f, quest::gguf_model_config(*f)), "smollm2_gguf");
    EXPECT_EQ(written->vocab_size(), 49152);
    EXPECT_EQ(check_corpus(*written, "smollm2-gguf"), 0);
    EXPECT_EQ(count_differences(*gguf_tok, *written), 0);
}

// ---------------------------------------------------------------------------------------------------------------------
// Bad input
// ---------------------------------------------------------------------------------------------------------------------

json fixture_json(const std::string& name) {
    return json::parse(quest::test::slurp(fixtures() / name / "tokenizer.json"));
}

// Writes `j` as <dir>/tokenizer.json and expects load_tokenizer to throw an InputError naming the file and
// containing `expect`.
void expect_bad(const std::string& test, const std::string& text, const std::string& expect) {
    const auto dir = quest::test::temp_dir("bpe_bad_" + test);
    const auto file = dir / "tokenizer.json";
    std::ofstream(file, std::ios::binary) << text;
    try {
        (void)quest::load_tokenizer(dir);
        ADD_FAILURE() << test << ": expected InputError containing \"" << expect << "\"";
    } catch (const InputError& e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find(file.string()), std::string::npos) << test << ": " << msg;
        EXPECT_NE(msg.find(expect), std::string::npos) << test << ": " << msg;
    }
    std::filesystem::remove_all(dir);
}

TEST(BpeErrors, MalformedFilesAreInputErrorsNamingTheFile) {
    const json good = fixture_json("llama3");
    auto with = [&](auto edit) {
        json j = good;
        edit(j);
        return j.dump();
    };
    expect_bad("notjson", "{\"model\": ", "not valid JSON");
    expect_bad("array", "[1, 2]", "expected a JSON object");
    expect_bad("nomodel", with([](json& j) { j.erase("model"); }), "no \"model\" section");
    expect_bad("wordpiece", with([](json& j) { j["model"]["type"] = "WordPiece"; }), "model.type is \"WordPiece\"");
    expect_bad("novocab", with([](json& j) { j["model"].erase("vocab"); }), "has no \"vocab\"");
    expect_bad("pretype", with([](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["type"] = "Whitespace"; }),
               "type \"Whitespace\" is not supported");
    expect_bad("normtype", with([](json& j) { j["normalizer"] = {{"type", "Lowercase"}}; }),
               "normalizer type \"Lowercase\"");
    expect_bad("dectype", with([](json& j) { j["decoder"] = {{"type", "WordPiece"}}; }),
               "decoder type \"WordPiece\" is not supported");
    expect_bad("nodecoder", with([](json& j) { j["decoder"] = nullptr; }), "no \"decoder\"");
    expect_bad("posttype", with([](json& j) { j["post_processor"] = {{"type", "Mystery"}}; }),
               "type \"Mystery\" is not supported");
    expect_bad("merge", with([](json& j) { j["model"]["merges"][3] = json::array({"zzzq", "t"}); }),
               "names \"zzzq\", which is not in the vocabulary");
    expect_bad("mergestr", with([](json& j) { j["model"]["merges"][3] = "nospace"; }),
               "expected two pieces separated by one space");
    expect_bad("dense", with([](json& j) { j["model"]["vocab"]["\xc4\xa0the"] = 99999; }), "not dense");
    expect_bad("dupid", with([](json& j) { j["model"]["vocab"]["extra-piece"] = 5; }), "is given to both");
    expect_bad("regex",
               with([](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed"; }),
               "invalid regex \"(unclosed\" (PCRE2: ");
    expect_bad("behavior", with([](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Sideways"; }),
               "expected Removed, Isolated");
    expect_bad("singleword", with([](json& j) { j["added_tokens"][0]["single_word"] = true; }),
               "single_word: true is not supported");
    expect_bad("bothdecoders",
               with([](json& j) {
                   j["decoder"] = {{"type", "Sequence"},
                                   {"decoders", json::array({{{"type", "ByteLevel"}}, {{"type", "ByteFallback"}}})}};
               }),
               "ByteLevel together with ByteFallback");
    expect_bad("unk", with([](json& j) { j["model"]["unk_token"] = "<nope>"; }), "unk_token \"<nope>\"");
    expect_bad("dropout", with([](json& j) { j["model"]["dropout"] = 0.1; }), "dropout is not supported");
}

TEST(BpeErrors, BadTokenizerConfigNamesTheConfigFile) {
    const auto dir = quest::test::temp_dir("bpe_bad_config");
    std::filesystem::copy_file(fixtures() / "llama3" / "tokenizer.json", dir / "tokenizer.json");
    std::ofstream(dir / "tokenizer_config.json") << R"({"eos_token": "<|no such|>"})";
    try {
        (void)quest::load_tokenizer(dir);
        ADD_FAILURE() << "expected InputError";
    } catch (const InputError& e) {
        EXPECT_NE(std::string(e.what()).find((dir / "tokenizer_config.json").string()), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("<|no such|>"), std::string::npos) << e.what();
    }
    std::filesystem::remove_all(dir);
}

TEST(BpeErrors, FolderWithoutTokenizerNamesBothFiles) {
    const auto dir = quest::test::temp_dir("bpe_no_tokenizer");
    try {
        (void)quest::load_tokenizer(dir);
        ADD_FAILURE() << "expected InputError";
    } catch (const InputError& e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find(dir.string()), std::string::npos) << msg;
        EXPECT_NE(msg.find("tokenizer.json"), std::string::npos) << msg;
        EXPECT_NE(msg.find("tokenizer.model"), std::string::npos) << msg;
    }
    EXPECT_EQ(quest::tokenizer_file_in(dir), dir / "tokenizer.model");
    std::filesystem::remove_all(dir);
}

TEST(Bpe, FactoryPicksSentencePieceForTokenizerModel) {
    const auto dir = quest::test::temp_dir("bpe_factory_sp");
    std::filesystem::copy_file(quest::test::source_dir() / "tests/fixtures/tokenizer/demo-512.model",
                               dir / "tokenizer.model");
    const auto tok = quest::load_tokenizer(dir);
    EXPECT_EQ(dynamic_cast<const BpeTokenizer*>(tok.get()), nullptr);
    EXPECT_EQ(tok->vocab_size(), 512);
    EXPECT_EQ(quest::tokenizer_file_in(dir), dir / "tokenizer.model");
    std::filesystem::remove_all(dir);
}

}  // namespace

namespace {

// The engine end to end on a BPE folder: make-model copies a tokenizer.json (and its tokenizer_config.json), and
// generate streams valid UTF-8 from it.
TEST(BpeCli, GenerateWithATokenizerJsonFolder) {
    const auto dir = quest::test::temp_dir("bpe_cli");
    json cfg = json::parse(quest::test::slurp(quest::test::source_dir() / "configs/demo-random-model.json"));
    const auto tok = quest::load_tokenizer(fixtures() / "llama3");
    cfg["vocab_size"] = tok->vocab_size();
    cfg["bos_token_id"] = tok->bos_id();
    cfg["eos_token_id"] = tok->eos_id();
    std::ofstream(dir / "config.json") << cfg.dump();
    const auto model = dir / "model";
    auto made = quest::test::run_quest("make-model --config '" + (dir / "config.json").string() + "' --out '" +
                                           model.string() + "' --tokenizer '" +
                                           (fixtures() / "llama3/tokenizer.json").string() + "' --seed 3",
                                       "bpe_cli_make");
    ASSERT_EQ(made.exit_code, 0) << made.err;
    EXPECT_TRUE(std::filesystem::exists(model / "tokenizer.json"));
    EXPECT_TRUE(std::filesystem::exists(model / "tokenizer_config.json"));
    EXPECT_FALSE(std::filesystem::exists(model / "tokenizer.model"));
    auto gen = quest::test::run_quest("generate -m '" + model.string() +
                                          "' -p 'Hello, 世界! <|eot_id|> the' -n 16 --temp 0 --seed 1",
                                      "bpe_cli_generate");
    ASSERT_EQ(gen.exit_code, 0) << gen.err;
    EXPECT_TRUE(is_valid_utf8(gen.out));
    const size_t prompt_tokens = tok->encode("Hello, 世界! <|eot_id|> the", true).size();
    EXPECT_NE(gen.err.find("prefill: " + std::to_string(prompt_tokens) + " tokens"), std::string::npos) << gen.err;
    std::filesystem::remove_all(dir);
}

}  // namespace
