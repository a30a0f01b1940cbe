// SentencePiece vocabularies in GGUF files (tokenizer.ggml.model "llama", tokenizer/spm_gguf.h). The oracle is
// libsentencepiece on the tokenizer.model the vocabulary was converted from (SentencePieceTokenizer): identical ids
// for every line of the tokenizer corpus (tests/fixtures/tokenizer/bpe/corpus.jsonl) and for edge cases, identical
// decoded text, and streaming that never emits half a UTF-8 character.
//
// Vocabularies: the committed tests/fixtures/gguf/spm_demo.gguf (demo-512.model written by gguf-py in
// tools/make_gguf_fixtures.py, as convert_hf_to_gguf.py writes a Llama vocabulary); stories260K's and the Llama-2
// tokenizer.model from ../shared, converted at test time (VocabGguf below: the converter's fields, byte by byte) and
// skipped, saying so, when ../shared is absent; and the stories260K model as a GGUF that
// `tools/make_gguf_fixtures.py --shared build/gguf-shared` writes (skipped, saying so, when it has not been run).
// The tokenizer.model that quantize writes from such a GGUF (tokenizer/spm_write.h) has the same oracle: loaded by
// libsentencepiece, it gives the ids and text of the tokenizer.model the vocabulary came from.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <sentencepiece_processor.h>

#include "kernels/common/error.h"
#include "model/io/gguf.h"
#include "model/io/gguf_model.h"
#include "model/io/model_folder.h"
#include "test_util.h"
#include "tokenizer/sentencepiece.h"
#include "tokenizer/spm_gguf.h"
#include "tokenizer/spm_write.h"
#include "tokenizer/utf8.h"

namespace quest {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;

fs::path demo_model() { return test::source_dir() / "tests/fixtures/tokenizer/demo-512.model"; }
fs::path demo_gguf() { return test::source_dir() / "tests/fixtures/gguf/spm_demo.gguf"; }
fs::path stories_model() { return test::shared_dir() / "models/stories260K/tokenizer.model"; }
fs::path llama2_model() { return test::shared_dir() / "models/llama2-tokenizer/tokenizer.model"; }
// Written by `tools/make_gguf_fixtures.py --shared build/gguf-shared` (QUEST_GGUF_SHARED_DIR overrides).
fs::path gguf_shared_dir() {
    if (const char* env = std::getenv("QUEST_GGUF_SHARED_DIR")) return env;
    return test::source_dir() / "build/gguf-shared";
}

#define REQUIRE_GGUF_SHARED(p)                                                                                      \
    if (!fs::exists(p))                                                                                             \
    GTEST_SKIP() << "SKIPPED: " << (p) << " is absent (run tools/make_gguf_fixtures.py --shared build/gguf-shared, " \
                 << "which needs ../shared)"

std::vector<std::string> corpus() {
    std::ifstream in(test::source_dir() / "tests/fixtures/tokenizer/bpe/corpus.jsonl");
    std::vector<std::string> out;
    for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line).get<std::string>());
    EXPECT_GE(out.size(), 2000u);
    return out;
}

// Texts that exercise the normalizer and the byte fallback beyond the corpus (invalid UTF-8 included).
const std::vector<std::string>& edge_texts() {
    static const std::vector<std::string> t = {
        "", " ", "  ", "\n", "a", " a", "a ", "  a  b  ", "a\tb\n\nc", "multiple     inner    spaces",
        "<s> and </s> and <unk> written out", "<0x41> as text", "\xe2\x96\x81 the space symbol itself",
        "\xff", "a\xffz", "\xc3", "\xc3(", "\xed\xa0\x80 surrogate", "\xf0\x9f\x98 truncated emoji", "\xe0\x80\xaf",
        "\xf4\x90\x80\x80 above U+10FFFF", "\xef\xbf\xbd replacement", "\xf0\x9f\xa6\x99\xf0\x9f\x98\x80",
        "\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e", "caf\xc3\xa9 na\xc3\xafve", "1234567890", "x\x01y\x7f",
    };
    return t;
}

// ---------------------------------------------------------------------------------------------------------------------
// A vocabulary-only GGUF built byte by byte (no GGUF writer, so that every field can be made wrong)
// ---------------------------------------------------------------------------------------------------------------------

struct VocabGguf {
    std::vector<std::string> tokens;
    std::vector<float> scores;
    std::vector<int32_t> types;
    int bos = 1, eos = 2;
    std::optional<int> unk;
    std::optional<bool> add_space_prefix, remove_extra_ws, add_bos, add_eos;
    std::string model = "llama";
    bool with_scores = true, with_types = true;

    // The fields convert_hf_to_gguf.py writes for a SentencePiece model (_create_vocab_sentencepiece).
    static VocabGguf from_model(const fs::path& model_file, bool add_dummy_prefix, bool remove_extra_ws) {
        sentencepiece::SentencePieceProcessor sp;
        EXPECT_TRUE(sp.Load(model_file.string()).ok()) << model_file;
        VocabGguf v;
        for (int i = 0; i < sp.GetPieceSize(); ++i) {
            int32_t t = 1;
            if (sp.IsUnknown(i)) t = 2;
            else if (sp.IsControl(i)) t = 3;
            else if (sp.IsUnused(i)) t = 5;
            else if (sp.IsByte(i)) t = 6;
            v.tokens.push_back(sp.IdToPiece(i));
            v.scores.push_back(sp.GetScore(i));
            v.types.push_back(t);
        }
        v.bos = sp.bos_id();
        v.eos = sp.eos_id();
        v.add_space_prefix = add_dummy_prefix;
        v.remove_extra_ws = remove_extra_ws;
        return v;
    }

    std::string bytes() const {
        std::string b = "GGUF";
        auto u32 = [&](uint32_t x) { b.append(reinterpret_cast<const char*>(&x), 4); };
        auto u64 = [&](uint64_t x) { b.append(reinterpret_cast<const char*>(&x), 8); };
        auto str = [&](const std::string& s) { u64(s.size()), b += s; };
        std::vector<std::function<void()>> kv;
        kv.push_back([&] { str("tokenizer.ggml.model"), u32(8), str(model); });
        kv.push_back([&] {
            str("tokenizer.ggml.tokens"), u32(9), u32(8), u64(tokens.size());
            for (const auto& t : tokens) str(t);
        });
        if (with_scores)
            kv.push_back([&] {
                str("tokenizer.ggml.scores"), u32(9), u32(6), u64(scores.size());
                for (float s : scores) b.append(reinterpret_cast<const char*>(&s), 4);
            });
        if (with_types)
            kv.push_back([&] {
                str("tokenizer.ggml.token_type"), u32(9), u32(5), u64(types.size());
                for (int32_t t : types) b.append(reinterpret_cast<const char*>(&t), 4);
            });
        if (bos >= 0) kv.push_back([&] { str("tokenizer.ggml.bos_token_id"), u32(4), u32(bos); });
        if (eos >= 0) kv.push_back([&] { str("tokenizer.ggml.eos_token_id"), u32(4), u32(eos); });
        if (unk) kv.push_back([&] { str("tokenizer.ggml.unknown_token_id"), u32(4), u32(*unk); });
        if (add_space_prefix)
            kv.push_back([&] { str("tokenizer.ggml.add_space_prefix"), u32(7), b.push_back(*add_space_prefix); });
        if (remove_extra_ws)
            kv.push_back([&] { str("tokenizer.ggml.remove_extra_whitespaces"), u32(7), b.push_back(*remove_extra_ws); });
        if (add_bos) kv.push_back([&] { str("tokenizer.ggml.add_bos_token"), u32(7), b.push_back(*add_bos); });
        if (add_eos) kv.push_back([&] { str("tokenizer.ggml.add_eos_token"), u32(7), b.push_back(*add_eos); });
        u32(3);
        u64(0);  // tensors
        u64(kv.size());
        for (auto& f : kv) f();
        while (b.size() % 32) b.push_back('\0');
        return b;
    }

    std::unique_ptr<Tokenizer> tokenizer(const std::string& name = "vocab.gguf") const {
        const std::string b = bytes();
        const auto f = GgufFile::from_memory({reinterpret_cast<const std::byte*>(b.data()), b.size()}, name);
        return gguf_tokenizer(*f);
    }
};

// ---------------------------------------------------------------------------------------------------------------------
// Against libsentencepiece
// ---------------------------------------------------------------------------------------------------------------------

// Streams `ids`; every piece must be valid UTF-8. Returns the concatenated text.
std::string stream(const Tokenizer& tok, const std::vector<int>& ids) {
    StreamingDecoder dec(tok);
    std::string text;
    for (int id : ids) {
        const std::string part = dec.push(id);
        EXPECT_TRUE(utf8::valid(part)) << "push(" << id << ") emitted half a character";
        text += part;
    }
    const std::string rest = dec.flush();
    EXPECT_TRUE(utf8::valid(rest));
    return text + rest;
}

// Every corpus line and edge text: ids, decode and streaming equal to SentencePiece's; then random id sequences
// (byte pieces often, to cut characters) decode and stream as SentencePiece decodes them. Returns the mismatches.
// `unk`: the unknown token, left out of the random sequences and of token_bytes when `same_unk_surface` is false
// (the model's unk_surface is not in the GGUF).
int compare_with_sentencepiece(const Tokenizer& tok, const SentencePieceTokenizer& sp, int random_sequences,
                               bool same_unk_surface = true) {
    const int unk = same_unk_surface ? -1 : 0;
    EXPECT_EQ(tok.vocab_size(), sp.vocab_size());
    EXPECT_EQ(tok.bos_id(), sp.bos_id());
    EXPECT_EQ(tok.eos_id(), sp.eos_id());
    for (int id = 0; id < sp.vocab_size(); ++id) {
        EXPECT_EQ(tok.piece(id), sp.piece(id)) << id;
        EXPECT_EQ(tok.is_control(id), sp.is_control(id)) << id;
        EXPECT_EQ(tok.is_byte(id), sp.is_byte(id)) << id;
        EXPECT_EQ(tok.token_id(sp.piece(id)), sp.token_id(sp.piece(id))) << id;
        if (id != unk) {
            EXPECT_EQ(tok.token_bytes(id), sp.token_bytes(id)) << id;
        }
    }
    int bad = 0;
    std::vector<std::string> texts = corpus();
    texts.insert(texts.end(), edge_texts().begin(), edge_texts().end());
    size_t n_ids = 0;
    for (size_t i = 0; i < texts.size(); ++i) {
        const auto want = sp.encode(texts[i], true);
        const auto got = tok.encode(texts[i], true);
        n_ids += got.size();
        const std::string dec = sp.decode(want);
        if (got != want || tok.decode(got) != dec || stream(tok, got) != dec) {
            if (++bad <= 5)
                ADD_FAILURE() << "line " << i << " " << nlohmann::json(texts[i]).dump(-1, ' ', false,
                                                                                       nlohmann::json::error_handler_t::replace)
                              << ": " << ::testing::PrintToString(got) << " vs sentencepiece "
                              << ::testing::PrintToString(want);
        }
    }
    std::mt19937 rng(20250125);
    std::vector<int> bytes;
    for (int id = 0; id < sp.vocab_size(); ++id)
        if (sp.is_byte(id)) bytes.push_back(id);
    for (int s = 0; s < random_sequences; ++s) {
        std::vector<int> ids(1 + rng() % 12);
        for (int& id : ids)
            do {
                id = !bytes.empty() && rng() % 2 ? bytes[rng() % bytes.size()] : static_cast<int>(rng() % sp.vocab_size());
            } while (id == unk);
        const std::string want = sp.decode(ids);
        if (tok.decode(ids) != want || stream(tok, ids) != want)
            if (++bad <= 10) ADD_FAILURE() << "random ids " << ::testing::PrintToString(ids);
    }
    std::printf("[ spm gguf ] %zu texts (%zu ids) and %d random id sequences against sentencepiece: %d mismatches\n",
                texts.size(), n_ids, random_sequences, bad);
    return bad;
}

TEST(SpmGguf, DemoVocabularyEncodesAndDecodesAsSentencePiece) {
    const auto f = GgufFile::open(demo_gguf());
    const auto tok = gguf_tokenizer(*f);
    ASSERT_NE(dynamic_cast<const SpmGgufTokenizer*>(tok.get()), nullptr);
    EXPECT_EQ(tok->file(), demo_gguf());
    EXPECT_EQ(compare_with_sentencepiece(*tok, SentencePieceTokenizer(demo_model()), 3000), 0);
    // encode(add_bos=false) is the same without BOS; EOS ends a turn.
    EXPECT_EQ(tok->encode("Hello world", false), SentencePieceTokenizer(demo_model()).encode("Hello world", false));
    EXPECT_EQ(tok->end_of_turn_ids(), std::vector<int>{2});
}

TEST(SpmGguf, Stories260KVocabularyRemovesExtraWhitespaceAsSentencePiece) {
    QUEST_REQUIRE_PATH(stories_model());
    const auto tok = VocabGguf::from_model(stories_model(), true, true).tokenizer();
    const SentencePieceTokenizer sp(stories_model());
    EXPECT_EQ(compare_with_sentencepiece(*tok, sp, 3000, /*same_unk_surface=*/false), 0);
    // Its unk_surface is the 14 characters " \342\201\207 " (an escaping slip of llama2.c's trainer call), which the
    // GGUF does not carry: <unk> decodes to SentencePiece's default surface instead.
    ASSERT_EQ(sp.decode(std::vector<int>{0}), " \\342\\201\\207 ");
    EXPECT_EQ(tok->decode(std::vector<int>{0}), " \xe2\x81\x87 ");
    // Without the key the GGUF says nothing about it: spaces are kept, as llama.cpp keeps them.
    auto v = VocabGguf::from_model(stories_model(), true, true);
    v.remove_extra_ws.reset();
    EXPECT_NE(v.tokenizer()->encode("a  b"), SentencePieceTokenizer(stories_model()).encode("a  b"));
}

TEST(SpmGguf, Llama2VocabularyEncodesAndDecodesAsSentencePiece) {
    QUEST_REQUIRE_PATH(llama2_model());
    const auto tok = VocabGguf::from_model(llama2_model(), true, false).tokenizer();
    EXPECT_EQ(compare_with_sentencepiece(*tok, SentencePieceTokenizer(llama2_model()), 3000), 0);
}

// The gguf-py file of the Llama-2 vocabulary (when written) equals the one built here.
TEST(SpmGguf, Llama2VocabularyWrittenByGgufPy) {
    const fs::path p = gguf_shared_dir() / "llama2-vocab.gguf";
    REQUIRE_GGUF_SHARED(p);
    QUEST_REQUIRE_PATH(llama2_model());
    const auto tok = gguf_tokenizer(*GgufFile::open(p));
    const SentencePieceTokenizer sp(llama2_model());
    for (const auto& text : corpus()) ASSERT_EQ(tok->encode(text), sp.encode(text)) << text;
}

// ---------------------------------------------------------------------------------------------------------------------
// Vocabulary variants SentencePiece allows: no byte fallback, user-defined and unused pieces
// ---------------------------------------------------------------------------------------------------------------------

VocabGguf demo_vocab() { return VocabGguf::from_model(demo_model(), true, false); }

// Without byte tokens a run of unknown characters is one unknown token (SentencePieceProcessor::Encode merges
// them when byte fallback is off); decoding it gives SentencePiece's default unknown surface.
TEST(SpmGguf, WithoutByteTokensARunOfUnknownCharactersIsOneUnknownToken) {
    VocabGguf v = demo_vocab();
    for (auto& t : v.types)
        if (t == 6) t = 5;  // the <0xNN> pieces become unused ones: never produced by a merge
    const auto tok = v.tokenizer();
    const std::vector<int> ids = tok->encode("a\xe6\x97\xa5\xe6\x9c\xac a", false);  // "a日本 a"
    // "▁a" | 日 本 (no piece: one <unk>) | "▁a": merges never cross an unknown character.
    std::vector<int> want = SentencePieceTokenizer(demo_model()).encode("a", false);
    const std::vector<int> a = want;
    want.push_back(0);
    want.insert(want.end(), a.begin(), a.end());
    EXPECT_EQ(ids, want);
    EXPECT_EQ(tok->decode(ids), "a \xe2\x81\x87  a");
}

// A user-defined piece is matched whole in the normalized text and never merged further; an unused piece used as
// a merge step is split back into the pieces it came from.
TEST(SpmGguf, UserDefinedPiecesStayWholeAndUnusedPiecesAreSplitBack) {
    VocabGguf v = demo_vocab();
    const SentencePieceTokenizer sp(demo_model());
    // A user-defined piece "QQ" (replacing the last piece of the vocabulary): "aQQQb" keeps "QQ" whole.
    v.tokens.back() = "QQ";
    v.types.back() = 4;
    v.scores.back() = 0;
    const int qq = static_cast<int>(v.tokens.size()) - 1;
    auto tok = v.tokenizer();
    const auto t = tok->encode("aQQQb", false);
    EXPECT_EQ(std::count(t.begin(), t.end(), qq), 1) << ::testing::PrintToString(t);
    EXPECT_EQ(tok->decode(t), "aQQQb");
    EXPECT_EQ(std::find(t.begin(), t.end(), qq) - t.begin(), static_cast<long>(sp.encode("a", false).size()));
    // "▁the" made unused: it is still the best merge, then split into what it was merged from.
    VocabGguf u = demo_vocab();
    const auto it = std::find(u.tokens.begin(), u.tokens.end(), "\xe2\x96\x81the");
    ASSERT_NE(it, u.tokens.end());
    u.types[it - u.tokens.begin()] = 5;
    const auto split = u.tokenizer()->encode("the", false);
    EXPECT_GE(split.size(), 2u);
    EXPECT_EQ(sp.decode(split), "the");
    for (int id : split) EXPECT_NE(id, it - u.tokens.begin());
}

// ---------------------------------------------------------------------------------------------------------------------
// Bad vocabularies: one line naming the file and the key
// ---------------------------------------------------------------------------------------------------------------------

std::string error_of(const VocabGguf& v) {
    try {
        (void)v.tokenizer("bad.gguf");
    } catch (const InputError& e) {
        return e.what();
    }
    ADD_FAILURE() << "expected an InputError";
    return "";
}

void expect_error(const VocabGguf& v, const std::string& key, const std::string& what) {
    const std::string e = error_of(v);
    EXPECT_THAT(e, HasSubstr("bad.gguf: key '" + key + "'")) << e;
    EXPECT_THAT(e, HasSubstr(what)) << e;
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;
}

TEST(SpmGguf, BadVocabulariesAreOneLineNamingTheFileAndTheKey) {
    VocabGguf v = demo_vocab();
    v.scores.pop_back();
    expect_error(v, "tokenizer.ggml.scores", "511 scores for 512 tokens");
    v = demo_vocab();
    v.types.push_back(1);
    expect_error(v, "tokenizer.ggml.token_type", "513 types for 512 tokens");
    v = demo_vocab();
    v.types[300] = 7;
    expect_error(v, "tokenizer.ggml.token_type", "token 300 has type 7");
    v = demo_vocab();
    v.types[300] = 0;
    expect_error(v, "tokenizer.ggml.token_type", "token 300 has type 0");
    v = demo_vocab();
    v.types[0] = 3;  // <unk> made a control token: no unknown token left
    expect_error(v, "tokenizer.ggml.token_type", "no token of type 2 (unknown)");
    v = demo_vocab();
    v.types[3 + 0x41] = 1;  // <0x41> made a normal piece: 255 byte tokens
    expect_error(v, "tokenizer.ggml.tokens", "byte token <0x41> missing");
    v = demo_vocab();
    v.tokens[3 + 0x41] = "<0xZZ>";
    expect_error(v, "tokenizer.ggml.tokens", "byte token 68 is \"<0xZZ>\"");
    v = demo_vocab();
    v.tokens[400] = v.tokens[401];
    expect_error(v, "tokenizer.ggml.tokens", "token 401");
    v = demo_vocab();
    v.unk = 1;
    expect_error(v, "tokenizer.ggml.unknown_token_id", "id 1 is not a token of type 2");
    v = demo_vocab();
    v.with_scores = false;
    expect_error(v, "tokenizer.ggml.scores", "missing");
    v = demo_vocab();
    v.with_types = false;
    expect_error(v, "tokenizer.ggml.token_type", "missing");
    v = demo_vocab();
    v.model = "t5";
    EXPECT_THAT(error_of(v), HasSubstr("bad.gguf: tokenizer.ggml.model 't5' is not supported"));
    // A missing BOS is said when encoding asks for it.
    v = demo_vocab();
    v.bos = -1;
    const auto tok = v.tokenizer("bad.gguf");
    EXPECT_EQ(tok->encode("hi", false), SentencePieceTokenizer(demo_model()).encode("hi", false));
    try {
        (void)tok->encode("hi", true);
        ADD_FAILURE() << "expected an InputError";
    } catch (const InputError& e) {
        EXPECT_THAT(e.what(), HasSubstr("bad.gguf: key 'tokenizer.ggml.bos_token_id': missing"));
    }
    EXPECT_THROW((void)tok->decode(std::vector<int>{512}), InputError);
}

// ---------------------------------------------------------------------------------------------------------------------
// End to end: `quest generate -m model.gguf` gives the text of the same model as a Hugging Face folder
// ---------------------------------------------------------------------------------------------------------------------

test::RunResult generate(const fs::path& model, const std::string& prompt, int n) {
    return test::run_quest("generate -m '" + model.string() + "' -p '" + prompt + "' -n " + std::to_string(n) +
                               " --temp 0",
                           "spm_gguf_generate");
}

TEST(SpmGgufE2e, DemoGgufGeneratesTheTextOfItsHfFolder) {
    const auto dir = test::temp_dir("spm_demo_hf");
    const auto src = test::source_dir() / "tests/fixtures/gguf/spm_demo_hf";
    for (const char* f : {"config.json", "model.safetensors"}) fs::copy_file(src / f, dir / f);
    fs::copy_file(demo_model(), dir / "tokenizer.model");
    for (const std::string prompt : {"Once upon a time", "", "  two  spaces, caf\xc3\xa9 and \xe6\x97\xa5"}) {
        SCOPED_TRACE(prompt);
        const auto g = generate(demo_gguf(), prompt, 24);
        const auto h = generate(dir, prompt, 24);
        ASSERT_EQ(g.exit_code, 0) << g.err;
        ASSERT_EQ(h.exit_code, 0) << h.err;
        EXPECT_EQ(g.out, h.out);
        EXPECT_GT(g.out.size(), prompt.size());
    }
    const auto t = test::run_quest("tokenize -m '" + demo_gguf().string() + "' -p 'Once upon a time' --ids", "spm_tok");
    ASSERT_EQ(t.exit_code, 0) << t.err;
    const auto want = SentencePieceTokenizer(demo_model()).encode("Once upon a time");
    std::string ids = "[";
    for (int id : want) ids += (ids.size() > 1 ? ", " : "") + std::to_string(id);
    EXPECT_EQ(t.out, ids + "]\n");
}

TEST(SpmGgufE2e, Stories260KGgufGeneratesTheLilyTextOfItsFolder) {
    const fs::path gguf = gguf_shared_dir() / "stories260K.gguf";
    REQUIRE_GGUF_SHARED(gguf);
    const fs::path folder = test::shared_dir() / "models/stories260K";
    QUEST_REQUIRE_PATH(folder);
    const auto g = generate(gguf, "", 60);
    const auto h = generate(folder, "", 60);
    ASSERT_EQ(g.exit_code, 0) << g.err;
    ASSERT_EQ(h.exit_code, 0) << h.err;
    EXPECT_EQ(g.out, h.out);
    EXPECT_THAT(g.out, ::testing::StartsWith("Once upon a time, there was a little girl named Lily."));
    const auto g2 = generate(gguf, "Once upon a time,  Lily", 40);
    const auto h2 = generate(folder, "Once upon a time,  Lily", 40);
    ASSERT_EQ(g2.exit_code, 0) << g2.err;
    EXPECT_EQ(g2.out, h2.out);
    std::printf("stories260K.gguf: %s", g.out.c_str());
}

// ---------------------------------------------------------------------------------------------------------------------
// The vocabulary written back as tokenizer.model (quantize of a SentencePiece GGUF)
// ---------------------------------------------------------------------------------------------------------------------

// Pieces, types, BOS/EOS, then ids and decoded text of every corpus line and edge text equal to the original
// model's. Returns the mismatching texts.
int compare_models(const SentencePieceTokenizer& written, const SentencePieceTokenizer& original) {
    test::expect_same_specials(written, original);
    for (int id = 0; id < std::min(written.vocab_size(), original.vocab_size()); ++id) {
        EXPECT_EQ(written.piece(id), original.piece(id)) << id;
        EXPECT_EQ(written.is_control(id), original.is_control(id)) << id;
        EXPECT_EQ(written.is_byte(id), original.is_byte(id)) << id;
    }
    std::vector<std::string> texts = corpus();
    texts.insert(texts.end(), edge_texts().begin(), edge_texts().end());
    int bad = 0;
    size_t n_ids = 0;
    for (size_t i = 0; i < texts.size(); ++i) {
        const auto want = original.encode(texts[i], true);
        const auto got = written.encode(texts[i], true);
        n_ids += got.size();
        if (got != want || written.decode(got) != original.decode(want))
            if (++bad <= 5)
                ADD_FAILURE() << "line " << i << ": " << ::testing::PrintToString(got) << " vs the original model's "
                              << ::testing::PrintToString(want);
    }
    std::printf("[ spm write ] %zu texts (%zu ids) through the written tokenizer.model: %d mismatches\n", texts.size(),
                n_ids, bad);
    return bad;
}

fs::path quantize_demo(const std::string& name) {
    const auto out = test::temp_dir(name) / "q";
    const auto r = test::run_quest("quantize -m '" + demo_gguf().string() + "' -o '" + out.string() + "' --group 32",
                                   name + "_run");
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_THAT(r.err, Not(HasSubstr("no tokenizer")));
    return out;
}

TEST(SpmWrite, QuantizedDemoGgufFolderHasTheTokenizerModelOfItsVocabulary) {
    const fs::path out = quantize_demo("spm_write_demo");
    ASSERT_TRUE(fs::exists(out / "tokenizer.model"));
    EXPECT_FALSE(fs::exists(out / "tokenizer.json"));
    EXPECT_EQ(compare_models(SentencePieceTokenizer(out / "tokenizer.model"), SentencePieceTokenizer(demo_model())), 0);
    // The folder's tokenizer is that file, and tokenizer_config.json names BOS and EOS.
    const ModelFolder q = open_model_folder(out);
    const auto tok = load_model_tokenizer(q);
    EXPECT_NE(dynamic_cast<const SentencePieceTokenizer*>(tok.get()), nullptr);
    const auto cfg = nlohmann::json::parse(test::slurp(out / "tokenizer_config.json"));
    EXPECT_EQ(cfg["bos_token"], "<s>");
    EXPECT_EQ(cfg["eos_token"], "</s>");
    EXPECT_EQ(cfg["add_bos_token"], true);
}

// The vocabulary of a GGUF read back by SpmGgufTokenizer, written as a tokenizer.model into a fresh folder `name`.
fs::path write_back(const VocabGguf& vocab, const std::string& name) {
    const auto tok = vocab.tokenizer();
    const auto* spm = dynamic_cast<const SpmGgufTokenizer*>(tok.get());
    EXPECT_NE(spm, nullptr);
    const fs::path file = test::temp_dir(name) / "tokenizer.model";
    if (spm) std::ofstream(file, std::ios::binary) << spm_model_proto(spm->vocab());
    return file;
}

// Llama-2's vocabulary (32000 pieces, byte fallback, no extra-whitespace removal) through a GGUF built at test time.
TEST(SpmWrite, Llama2VocabularyWrittenBackGivesTheIdsOfItsTokenizerModel) {
    QUEST_REQUIRE_PATH(llama2_model());
    const fs::path file = write_back(VocabGguf::from_model(llama2_model(), true, false), "spm_write_llama2");
    EXPECT_EQ(compare_models(SentencePieceTokenizer(file), SentencePieceTokenizer(llama2_model())), 0);
}

// stories260K's vocabulary removes extra whitespace and has no byte tokens: the written model does the same. Its
// unk_surface is not in the GGUF (the written model has SentencePiece's default), so only the ids are compared.
TEST(SpmWrite, Stories260KVocabularyWrittenBackGivesTheIdsOfItsTokenizerModel) {
    QUEST_REQUIRE_PATH(stories_model());
    const fs::path file = write_back(VocabGguf::from_model(stories_model(), true, true), "spm_write_stories");
    const SentencePieceTokenizer written(file), original(stories_model());
    int bad = 0;
    std::vector<std::string> texts = corpus();
    texts.insert(texts.end(), edge_texts().begin(), edge_texts().end());
    for (const std::string& t : texts) bad += written.encode(t, true) != original.encode(t, true);
    EXPECT_EQ(bad, 0);
}

// A vocabulary that a tokenizer.model folder would tokenize differently (no BOS added, or EOS added) gets no
// tokenizer files, and the error names the key.
TEST(SpmWrite, VocabularyWithoutBosOrWithEosIsRefusedNamingTheKey) {
    for (const bool eos : {false, true}) {
        VocabGguf v = VocabGguf::from_model(demo_model(), true, false);
        (eos ? v.add_eos : v.add_bos) = eos;
        const std::string b = v.bytes();
        const auto f = GgufFile::from_memory({reinterpret_cast<const std::byte*>(b.data()), b.size()}, "v.gguf");
        try {
            gguf_tokenizer_files(*f, ModelConfig{});
            ADD_FAILURE() << "no error";
        } catch (const InputError& e) {
            EXPECT_THAT(e.what(), HasSubstr(eos ? "key 'tokenizer.ggml.add_eos_token': true"
                                                : "key 'tokenizer.ggml.add_bos_token': false"));
        }
    }
}

// generate on the quantized folder runs the written tokenizer.model: the same text as the same folder with the
// original demo-512.model, and the prompt's ids those of the GGUF.
TEST(SpmWriteE2e, QuantizedDemoFolderGeneratesWithTheWrittenTokenizer) {
    const fs::path out = quantize_demo("spm_write_e2e");
    const auto ref = test::temp_dir("spm_write_e2e_ref");
    for (const char* f : {"config.json", "model.safetensors", "tokenizer_config.json"}) fs::copy_file(out / f, ref / f);
    fs::copy_file(demo_model(), ref / "tokenizer.model");
    for (const std::string prompt : {"Once upon a time", "", "  two  spaces, caf\xc3\xa9 and \xe6\x97\xa5"}) {
        SCOPED_TRACE(prompt);
        const auto q = generate(out, prompt, 24);
        const auto r = generate(ref, prompt, 24);
        ASSERT_EQ(q.exit_code, 0) << q.err;
        ASSERT_EQ(r.exit_code, 0) << r.err;
        EXPECT_EQ(q.out, r.out);
        EXPECT_GT(q.out.size(), prompt.size());
        const auto tq = test::run_quest("tokenize -m '" + out.string() + "' -p '" + prompt + "' --ids", "spm_w_tok");
        const auto tg = test::run_quest("tokenize -m '" + demo_gguf().string() + "' -p '" + prompt + "' --ids",
                                        "spm_w_tok_g");
        ASSERT_EQ(tq.exit_code, 0) << tq.err;
        EXPECT_EQ(tq.out, tg.out);
    }
}

}  // namespace
}  // namespace quest
