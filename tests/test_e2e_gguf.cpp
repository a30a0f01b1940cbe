// A GGUF file end to end: `-m file.gguf` through the CLI (generate, chat, tokenize) and the library (ModelFolder,
// the CPU backend), the chat formats (ChatML, Llama-3) chosen from the chat template. The SmolLM2 tests need
// models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf (tools/fetch_smollm2.sh) and skip, saying so, without it.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tests/fp16_weights.h"
#include "engine/chat.h"
#include "engine/sampler.h"
#include "kernels/common/dtype.h"
#include "kernels/common/error.h"
#include "model/cpu/llama_cpu.h"
#include "model/io/make_model.h"
#include "model/io/model_folder.h"
#include "smollm2_reference.h"
#include "test_util.h"
#include "tokenizer/bpe.h"

namespace quest {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;
using test::run_quest;
using test::RunResult;

fs::path gguf_fixture() { return test::source_dir() / "tests/fixtures/gguf/llama_gqa4.gguf"; }
fs::path smollm2() { return test::source_dir() / "models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"; }

#define REQUIRE_SMOLLM2()                                                                                         \
    if (!fs::exists(smollm2()))                                                                                   \
    GTEST_SKIP() << smollm2() << " is absent (run tools/fetch_smollm2.sh to fetch it)"

size_t count(const std::string& s, const std::string& what) {
    size_t n = 0;
    for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
    return n;
}

QuestSettings full_attention() {
    QuestSettings q;
    q.full_attention = true;
    return q;
}

// ---------------------------------------------------------------------------------------------------------------------
// The committed fixture (tokenizer.ggml.model "llama" with placeholder pieces and no scores)
// ---------------------------------------------------------------------------------------------------------------------

TEST(E2eGguf, FixtureOpensAsAModelAndRunsOnTheCpuBackendLikeItsHfFolder) {
    const ModelFolder g = open_model_folder(gguf_fixture());
    ASSERT_TRUE(g.is_gguf());
    EXPECT_EQ(g.config_file(), gguf_fixture());
    const ModelFolder hf = open_model_folder(test::source_dir() / "tests/fixtures/hf/f16_gqa4");
    EXPECT_FALSE(hf.is_gguf());
    EXPECT_EQ(g.config.num_layers, hf.config.num_layers);
    EXPECT_EQ(g.config.num_kv_heads, hf.config.num_kv_heads);
    EXPECT_EQ(g.config.vocab_size, hf.config.vocab_size);
    auto a = make_cpu_backend(g, full_attention(), 16);
    auto b = make_cpu_backend(hf, full_attention(), 16);
    const std::vector<int> prompt = {1, 5, 9, 3, 7};
    const auto la = a->prefill(prompt);
    const std::vector<float> first(la.begin(), la.end());
    const auto lb = b->prefill(prompt);
    ASSERT_EQ(first.size(), lb.size());
    for (size_t i = 0; i < first.size(); ++i) ASSERT_NEAR(first[i], lb[i], 1e-4f) << i;
    const auto da = a->decode(11);
    const std::vector<float> next(da.begin(), da.end());
    const auto db = b->decode(11);
    for (size_t i = 0; i < next.size(); ++i) ASSERT_NEAR(next[i], db[i], 1e-4f) << i;
}

// Its "llama" vocabulary has placeholder pieces and no scores: refused, naming the key.
TEST(E2eGguf, FixtureWithoutAUsableVocabularyIsOneErrorLineNamingTheFileAndTheKey) {
    for (const std::string sub : {"generate -p hi -n 2", "chat -n 2 < /dev/null", "tokenize -p hi"}) {
        SCOPED_TRACE(sub);
        const std::string verb = sub.substr(0, sub.find(' '));
        const RunResult r =
            run_quest(verb + " -m '" + gguf_fixture().string() + "'" + sub.substr(sub.find(' ')), "e2e_fixture");
        EXPECT_EQ(r.exit_code, 2);
        EXPECT_EQ(r.out, "");
        EXPECT_THAT(r.err, HasSubstr("error: " + gguf_fixture().string() + ": key 'tokenizer.ggml.scores': missing"));
        EXPECT_EQ(count(r.err, "\n"), 1u) << r.err;
    }
}

TEST(E2eGguf, BadModelPathsAreOneErrorLine) {
    const auto dir = test::temp_dir("e2e_bad");
    std::ofstream(dir / "notes.txt") << "hello";
    std::ofstream(dir / "broken.gguf") << "GGUF";
    for (const fs::path& p : {dir / "notes.txt", dir / "broken.gguf", dir / "missing.gguf"}) {
        SCOPED_TRACE(p);
        const RunResult r = run_quest("generate -m '" + p.string() + "' -p hi -n 2", "e2e_bad_run");
        EXPECT_EQ(r.exit_code, 2);
        EXPECT_THAT(r.err, HasSubstr("error: "));
        EXPECT_THAT(r.err, HasSubstr(p.string()));
        EXPECT_EQ(count(r.err, "\n"), 1u) << r.err;
    }
}

// quantize reads a GGUF too: the weights dequantized, then written in 4 bits. This fixture's vocabulary is not one
// the engine reads (placeholder SentencePiece pieces without scores): the folder gets no tokenizer, and quantize says
// why.
TEST(E2eGguf, QuantizeTakesAGgufFile) {
    const auto out = test::temp_dir("e2e_quantize") / "q";
    const RunResult r = run_quest("quantize -m '" + gguf_fixture().string() + "' -o '" + out.string() + "' --group 32",
                                  "e2e_quantize_run");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_THAT(r.err, HasSubstr("no tokenizer written"));
    EXPECT_THAT(r.err, HasSubstr("key 'tokenizer.ggml.scores': missing"));
    EXPECT_FALSE(fs::exists(out / "tokenizer.json"));
    EXPECT_FALSE(fs::exists(out / "tokenizer.model"));
    const ModelFolder q = open_model_folder(out);
    const ModelFolder g = open_model_folder(gguf_fixture());
    EXPECT_EQ(q.config.num_layers, g.config.num_layers);
    auto a = make_cpu_backend(q, full_attention(), 8);
    auto b = make_cpu_backend(g, full_attention(), 8);
    const std::vector<int> prompt = {1, 4, 2};
    const auto la = a->prefill(prompt);
    const std::vector<float> qa(la.begin(), la.end());
    const auto lb = b->prefill(prompt);
    double num = 0, den = 0;
    for (size_t i = 0; i < qa.size(); ++i) {
        num += double(qa[i] - lb[i]) * (qa[i] - lb[i]);
        den += double(lb[i]) * lb[i];
    }
    EXPECT_LT(std::sqrt(num / den), 0.3);  // int4 of the same weights, not another model
}

fs::path bpe_fixture() { return test::source_dir() / "tests/fixtures/gguf/tiny_bpe.gguf"; }

// The folder quantize writes from a GGUF with a byte-level BPE vocabulary is complete: config.json, the int4
// weights, tokenizer.json and tokenizer_config.json (BOS, EOS, the chat template); it loads and runs end to end.
TEST(E2eGguf, QuantizedFolderFromAGgufCarriesItsTokenizerAndChatTemplate) {
    const auto out = test::temp_dir("e2e_quantize_bpe") / "q";
    const RunResult r = run_quest("quantize -m '" + bpe_fixture().string() + "' -o '" + out.string() + "' --group 32",
                                  "e2e_quantize_bpe_run");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_THAT(r.err, Not(HasSubstr("no tokenizer")));
    for (const char* f : {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"})
        EXPECT_TRUE(fs::exists(out / f)) << f;
    const ModelFolder q = open_model_folder(out);
    const ModelFolder g = open_model_folder(bpe_fixture());
    EXPECT_EQ(q.config.eos_token_ids, g.config.eos_token_ids);
    EXPECT_EQ(q.config.bos_token_id, g.config.bos_token_id);
    EXPECT_EQ(model_chat_template(q), model_chat_template(g));
    EXPECT_EQ(detect_chat_format(model_chat_template(q)), ChatFormat::ChatML);
    const auto tq = load_model_tokenizer(q), tg = load_model_tokenizer(g);
    EXPECT_EQ(tq->vocab_size(), tg->vocab_size());
    EXPECT_EQ(tq->eos_id(), tg->eos_id());
    EXPECT_EQ(tq->end_of_turn_ids(), tg->end_of_turn_ids());
    for (const std::string text : {"Hello world, 12345!", "<|im_start|>user\nhi<|im_end|>\n", "  naïve\tcode()"})
        EXPECT_EQ(tq->encode(text, true), tg->encode(text, true)) << text;
    // Through the CLI: tokenize gives the GGUF's output, generate and chat run on the folder.
    const RunResult a = run_quest("tokenize -m '" + out.string() + "' -p 'The 42 cats'", "e2e_qbpe_tok");
    const RunResult b = run_quest("tokenize -m '" + bpe_fixture().string() + "' -p 'The 42 cats'", "e2e_qbpe_tok2");
    ASSERT_EQ(a.exit_code, 0) << a.err;
    EXPECT_EQ(a.out, b.out);
    const RunResult gen = run_quest("generate -m '" + out.string() + "' -p 'Once upon' -n 4 --temp 0", "e2e_qbpe_gen");
    EXPECT_EQ(gen.exit_code, 0) << gen.err;
    const auto dir = test::temp_dir("e2e_qbpe_chat_in");
    std::ofstream(dir / "in.txt") << "hi\n";
    const RunResult chat = run_quest("chat -m '" + out.string() + "' -n 4 --temp 0 -c 128 < '" +
                                         (dir / "in.txt").string() + "'",
                                     "e2e_qbpe_chat");
    EXPECT_EQ(chat.exit_code, 0) << chat.err;
    EXPECT_THAT(chat.err, HasSubstr("ChatML"));
}

// --awq-calib on a GGUF: the calibration text goes through the GGUF's tokenizer, the scales are searched on the
// dequantized weights, and the output is as complete as without calibration.
TEST(E2eGguf, AwqQuantizeFromAGgufCalibratesOnText) {
    const auto dir = test::temp_dir("e2e_quantize_awq");
    std::ofstream(dir / "calib.txt") << "The quick brown fox jumps over the lazy dog. 0123456789. "
                                        "def f(x): return x * 2\n你好，世界！ Some more words to calibrate on.\n";
    const RunResult r = run_quest("quantize -m '" + bpe_fixture().string() + "' -o '" + (dir / "q").string() +
                                      "' --group 32 --awq-calib '" + (dir / "calib.txt").string() + "'",
                                  "e2e_quantize_awq_run");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_THAT(r.err, HasSubstr("activation-aware scaling"));
    EXPECT_THAT(r.err, HasSubstr("calibration tokens"));
    const nlohmann::json cj = nlohmann::json::parse(test::slurp(dir / "q" / "config.json"));
    EXPECT_EQ(cj["quantization_config"]["awq_scaled"], true);
    EXPECT_TRUE(fs::exists(dir / "q" / "tokenizer.json"));
    const RunResult gen =
        run_quest("generate -m '" + (dir / "q").string() + "' -p 'Once upon' -n 4 --temp 0", "e2e_qawq_gen");
    EXPECT_EQ(gen.exit_code, 0) << gen.err;
}

// ---------------------------------------------------------------------------------------------------------------------
// Chat formats
// ---------------------------------------------------------------------------------------------------------------------

TEST(E2eGguf, ChatFormatFromTheTemplate) {
    bool unknown = true;
    EXPECT_EQ(detect_chat_format("", &unknown), ChatFormat::Plain);
    EXPECT_FALSE(unknown);
    EXPECT_EQ(detect_chat_format("{{'<|im_start|>' + message['role'] + '\n'}}", &unknown), ChatFormat::ChatML);
    EXPECT_EQ(detect_chat_format("{{ '<|start_header_id|>' + message['role'] }}", &unknown), ChatFormat::Llama3);
    EXPECT_EQ(detect_chat_format("{{ bos_token + '[INST] ' + content }}", &unknown), ChatFormat::Llama2);
    EXPECT_FALSE(unknown);
    EXPECT_EQ(detect_chat_format("{{ '<start_of_turn>' + role }}", &unknown), ChatFormat::Plain);
    EXPECT_TRUE(unknown);
    EXPECT_EQ(parse_chat_format("auto"), std::nullopt);
    EXPECT_EQ(parse_chat_format("chatml"), ChatFormat::ChatML);
    EXPECT_EQ(parse_chat_format("llama3"), ChatFormat::Llama3);
    EXPECT_THROW(parse_chat_format("jinja"), InputError);
    EXPECT_EQ(chat_template_default_system("{% if loop.first and messages[0]['role'] != 'system' %}{{ "
                                           "'<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}"),
              "You are a helpful assistant.");
    EXPECT_EQ(chat_template_default_system("{{'<|im_start|>' + message['role'] + '\n'}}"), "");
}

// A one-layer random-weight CPU backend over `vocab` ids (the chat formats' tests look at the turn tokens only).
std::unique_ptr<Backend> random_backend(int vocab, const std::string& name) {
    const auto dir = test::temp_dir(name);
    const ModelConfig c = parse_model_config(
        R"({"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4,
            "num_key_value_heads": 2, "max_position_embeddings": 256, "tie_word_embeddings": true, "vocab_size": )" +
            std::to_string(vocab) + "}",
        "inline");
    write_random_llama(dir, c, {3, DType::F32});
    return make_cpu_backend(open_model_folder(dir), full_attention(), 256);
}

std::vector<int> ids_of(const Tokenizer& tok, const std::string& rendered) { return tok.encode(rendered, false); }

// The turn tokens equal the tokenizer's ids of the template rendered as text (special tokens split out first).
TEST(E2eGguf, Llama3TurnsAreTheRenderedTemplate) {
    const auto file = test::source_dir() / "tests/fixtures/tokenizer/bpe/llama3/tokenizer.json";
    const BpeTokenizer tok = BpeTokenizer::from_json_file(file);
    auto backend = random_backend(tok.vocab_size(), "e2e_llama3");
    Sampler sampler(SamplerSettings{});
    ChatSession chat(*backend, tok, sampler, ChatFormat::Llama3, "Be brief.");
    EXPECT_EQ(chat.turn_tokens("  Hello there \n"),
              ids_of(tok, "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
                          "<|start_header_id|>user<|end_header_id|>\n\nHello there<|eot_id|>"
                          "<|start_header_id|>assistant<|end_header_id|>\n\n"));
}

TEST(E2eGguf, ChatMLTurnsAreTheRenderedTemplate) {
    const auto file = test::source_dir() / "tests/fixtures/tokenizer/bpe/smollm2/tokenizer.json";
    const BpeTokenizer tok = BpeTokenizer::from_json_file(file);
    auto backend = random_backend(tok.vocab_size(), "e2e_chatml");
    Sampler sampler(SamplerSettings{});
    ChatSession chat(*backend, tok, sampler, ChatFormat::ChatML, "You are kind.");
    EXPECT_EQ(chat.turn_tokens("Hi there"),
              ids_of(tok, "<|im_start|>system\nYou are kind.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n"
                          "<|im_start|>assistant\n"));
    // An answer, then the second turn: the answer closed by <|im_end|> (sampled, or added when cut short).
    (void)chat.answer("Hi", 3, [](const std::string&) {});
    const std::vector<int> second = chat.turn_tokens("More");
    const std::vector<int> tail = ids_of(tok, "<|im_end|>\n<|im_start|>user\nMore<|im_end|>\n<|im_start|>assistant\n");
    ASSERT_GE(second.size(), tail.size());
    EXPECT_EQ(std::vector<int>(second.end() - tail.size(), second.end()), tail);
}

// ---------------------------------------------------------------------------------------------------------------------
// SmolLM2-135M-Instruct (Q4_1): a real pretrained chat model
// ---------------------------------------------------------------------------------------------------------------------

TEST(E2eSmolLM2, GenerateContinuesSensibly) {
    REQUIRE_SMOLLM2();
    const RunResult r = run_quest("generate -m '" + smollm2().string() +
                                      "' -p 'The capital of France is' -n 16 --temp 0",
                                  "e2e_smol_gen");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_THAT(r.out, HasSubstr("Paris")) << r.out;
    std::printf("generate: %s%s", r.out.c_str(), r.err.substr(r.err.find("decode:")).c_str());
}

// `quest tokenize` gives the ids the BPE work checked against Hugging Face (tests/fixtures/tokenizer/bpe:
// smollm2-gguf.ids, one line of ids per corpus.jsonl line).
TEST(E2eSmolLM2, TokenizeMatchesTheCommittedIds) {
    REQUIRE_SMOLLM2();
    const auto dir = test::source_dir() / "tests/fixtures/tokenizer/bpe";
    std::ifstream corpus(dir / "corpus.jsonl"), ids(dir / "smollm2-gguf.ids");
    std::string text_line, ids_line;
    int checked = 0;
    for (int line = 0; line < 4 && std::getline(corpus, text_line) && std::getline(ids, ids_line); ++line) {
        const std::string text = nlohmann::json::parse(text_line).get<std::string>();
        if (text.find('\'') != std::string::npos || text.find('\n') != std::string::npos) continue;  // shell quoting
        std::string want = "[";
        std::istringstream in(ids_line);
        for (int id; in >> id;) want += (want.size() > 1 ? ", " : "") + std::to_string(id);
        want += "]\n";
        const RunResult r =
            run_quest("tokenize -m '" + smollm2().string() + "' -p '" + text + "' --ids", "e2e_smol_tok");
        ASSERT_EQ(r.exit_code, 0) << r.err;
        EXPECT_EQ(r.out, want) << text;
        ++checked;
    }
    EXPECT_GE(checked, 2);
    const RunResult r = run_quest("tokenize -m '" + smollm2().string() + "' -p 'Hello world'", "e2e_smol_tok");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out, " 19556 -> 'Hello'\n   905 -> ' world'\n");
}

TEST(E2eSmolLM2, ChatAnswersAndStopsAtImEnd) {
    REQUIRE_SMOLLM2();
    const auto dir = test::temp_dir("e2e_smol_chat_in");
    std::ofstream(dir / "in.txt") << "What is the capital of France?\n/stats\n";
    const RunResult r = run_quest("chat -m '" + smollm2().string() + "' -n 64 --temp 0 -c 512 < '" +
                                      (dir / "in.txt").string() + "'",
                                  "e2e_smol_chat");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_THAT(r.err, HasSubstr("ChatML"));
    EXPECT_THAT(r.out, HasSubstr("Paris")) << r.out;
    EXPECT_THAT(r.err, HasSubstr("stop eos")) << r.err;  // ended by <|im_end|>, not by -n
    EXPECT_THAT(r.out, Not(HasSubstr("im_start"))) << r.out;
    std::printf("chat: %s", r.out.c_str());

    // The same through the library: the answer's last token is <|im_end|>.
    const ModelFolder m = open_model_folder(smollm2());
    const auto tok = load_model_tokenizer(m);
    auto backend = make_cpu_backend(m, full_attention(), 512);
    SamplerSettings greedy;
    greedy.temperature = 0;
    Sampler sampler(greedy);
    ChatSession chat(*backend, *tok, sampler, detect_chat_format(model_chat_template(m)),
                     chat_template_default_system(model_chat_template(m)));
    std::string text;
    const GenerateResult g = chat.answer("Name a color.", 64, [&](const std::string& t) { text += t; });
    EXPECT_EQ(g.stop_reason, "eos");
    ASSERT_FALSE(g.tokens.empty());
    EXPECT_EQ(g.tokens.back(), tok->token_id("<|im_end|>").value());
    EXPECT_FALSE(text.empty());
}

// The real model through quantize: the int4 folder answers like the GGUF (its tokenizer and chat template written
// from the GGUF's metadata) and tokenizes identically.
TEST(E2eSmolLM2, QuantizedFolderChatsInChatML) {
    REQUIRE_SMOLLM2();
    const auto out = test::temp_dir("e2e_smol_quant") / "q";
    const RunResult q = run_quest("quantize -m '" + smollm2().string() + "' -o '" + out.string() + "'",
                                  "e2e_smol_quant_run");
    ASSERT_EQ(q.exit_code, 0) << q.err;
    const RunResult a = run_quest("tokenize -m '" + out.string() + "' -p 'Hello world'", "e2e_smolq_tok");
    ASSERT_EQ(a.exit_code, 0) << a.err;
    EXPECT_EQ(a.out, " 19556 -> 'Hello'\n   905 -> ' world'\n");
    const auto dir = test::temp_dir("e2e_smolq_chat_in");
    std::ofstream(dir / "in.txt") << "What is the capital of France?\n";
    const RunResult r = run_quest("chat -m '" + out.string() + "' -n 64 --temp 0 -c 512 < '" +
                                      (dir / "in.txt").string() + "'",
                                  "e2e_smolq_chat");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_THAT(r.err, HasSubstr("ChatML"));
    EXPECT_THAT(r.out, HasSubstr("Paris")) << r.out;
    EXPECT_THAT(r.out, Not(HasSubstr("im_start"))) << r.out;
    std::printf("chat (int4 folder): %s", r.out.c_str());
}

// The model against transformers reading the same GGUF in fp32 (tests/fixtures/smollm2, tools/make_smollm2_reference.py):
// the fixture's ids fed (not our tokenizer's), a 109-token ChatML prompt and 32 teacher-forced greedy steps. Both
// sides dequantize Q4_1 / Q8_0 exactly to fp32 and compute in fp32: the difference is summation order only. Measured:
// max |error| 8.4e-5 on logits of ~20 (4.4e-6 of the scale), log-sum-exp 6.2e-5, all 33 greedy tokens the same;
// checked at 1e-4 of the scale and 5e-4.
TEST(E2eSmolLM2, LogitsMatchTransformers) {
    REQUIRE_SMOLLM2();
    const test::SmolLM2Reference ref = test::load_smollm2_reference(test::source_dir());
    const ModelFolder m = open_model_folder(smollm2());
    auto backend = make_cpu_backend(m, full_attention(), ref.positions());
    const test::SmolLM2RunError e = test::expect_smollm2_parity(*backend, ref, 1e-4, 5e-4, "cpu");
    EXPECT_EQ(e.greedy_same, e.greedy_checked);
    EXPECT_EQ(e.greedy_checked, int(ref.decode_ids.size()) + 1);
}

// What FP16 storage of the weights alone does to the same comparison (the CUDA backend holds the dequantized weights
// in FP16: its test, CudaGguf.SmolLM2LogitsMatchTransformers, adds FP16 activations): the CPU backend on the weights
// rounded to fp16 (norms fp32, as on the GPU) against the fp32 reference: measured max |error| 0.15% of the logit scale
// (0.029), log-sum-exp 0.016, every greedy token the same; checked at 0.5% and 0.05 (the CUDA test allows 1%, 0.1).
TEST(E2eSmolLM2, Fp16RoundedWeightsStayNearTransformers) {
    REQUIRE_SMOLLM2();
    const test::SmolLM2Reference ref = test::load_smollm2_reference(test::source_dir());
    const ModelFolder m = open_model_folder(smollm2());
    auto w = std::make_shared<LlamaWeightsF32>(load_model_weights_f32(m));
    test::round_matrices_to_fp16(*w);
    CpuLlama backend(w, full_attention(), ref.positions());
    const test::SmolLM2RunError e = test::expect_smollm2_parity(backend, ref, 5e-3, 0.05, "cpu, fp16-rounded weights");
    EXPECT_EQ(e.greedy_same, e.greedy_checked);
    EXPECT_GT(e.max_abs, 1e-3);  // the rounding is there: this is not the fp32 run
}

// Our tokenizer (the GGUF's vocabulary and merges) gives transformers' ids of the fixture's prompt (its own
// GGUF-to-tokenizers conversion).
TEST(E2eSmolLM2, TokenizerGivesTransformersPromptIds) {
    REQUIRE_SMOLLM2();
    const test::SmolLM2Reference ref = test::load_smollm2_reference(test::source_dir());
    const auto tok = load_model_tokenizer(open_model_folder(smollm2()));
    EXPECT_EQ(tok->encode(ref.prompt, false), ref.prompt_ids);
}

}  // namespace
}  // namespace quest
