#pragma once
// A conversation over one backend: the KV cache keeps the whole dialogue, and each turn prefills only the tokens
// the cache does not hold yet. Chat models use the format of their chat template: Llama-2 ([INST] ... [/INST],
// <<SYS>>, BOS/EOS around each exchange, as Meta's reference builds it), ChatML (<|im_start|>role\n...<|im_end|>\n:
// SmolLM2, Qwen2) or Llama-3 (<|start_header_id|>role<|end_header_id|>\n\n...<|eot_id|>); base models continue the
// text as typed. An answer ends at one of the tokenizer's end_of_turn_ids() (or the config's EOS).
#include <atomic>
#include <functional>
#include <optional>
#include <string_view>
#include <string>
#include <vector>

#include "model/core/backend.h"
#include "engine/generate.h"
#include "engine/sampler.h"
#include "tokenizer/tokenizer.h"

namespace quest {

enum class ChatFormat { Llama2, ChatML, Llama3, Plain };

// The format of a chat template's text, recognised by substrings (no Jinja): "<|im_start|>" ChatML,
// "<|start_header_id|>" Llama-3, "[INST]" Llama-2. An empty template is Plain (a base model); a template that is
// none of these is Plain too, with *unknown set (when given).
ChatFormat detect_chat_format(std::string_view chat_template, bool* unknown = nullptr);
// --format: auto (nullopt: detect), llama2, chatml, llama3 or plain; InputError otherwise.
std::optional<ChatFormat> parse_chat_format(const std::string& name);
const char* chat_format_label(ChatFormat f);  // "Llama-2 chat", "ChatML", "Llama-3 chat", "plain continuation"
// The system message a ChatML template adds when the conversation has none, when it is written as one literal
// ('<|im_start|>system\n...<|im_end|>', SmolLM2 and Qwen2 do); "" otherwise.
std::string chat_template_default_system(std::string_view chat_template);

// A REPL line: a command (a line starting with '/') or text for the model. "//text" sends "/text".
enum class ChatCommand { Text, Quit, Reset, Stats, Help, Unknown };
ChatCommand parse_chat_command(const std::string& line);
// What /help prints (one line per command).
std::string chat_help();

class ChatSession {
public:
    ChatSession(Backend& backend, const Tokenizer& tok, Sampler& sampler, ChatFormat format, std::string system = {});

    // Answers one user message, streaming text pieces to on_text; stops at EOS, max_tokens, a full context, or when
    // `stop` becomes true (Ctrl-C). Returns the generation result (timings, stop reason).
    GenerateResult answer(const std::string& user, int max_tokens, const std::function<void(const std::string&)>& on_text,
                          const std::atomic<bool>* stop = nullptr);
    void reset();
    const GenerateResult& last() const { return last_; }
    int turns() const { return turns_; }

    // The tokens one user message adds to the cache (the previous answer's last token first), exposed for tests.
    std::vector<int> turn_tokens(const std::string& user) const;

private:
    bool ends_turn(int token) const;
    std::vector<int> text(const std::string& s) const { return tok_.encode(s, /*add_bos=*/false); }
    std::vector<int> special(const char* piece) const;  // the id of a piece the format needs; InputError if absent

    Backend& backend_;
    const Tokenizer& tok_;
    Sampler& sampler_;
    ChatFormat format_;
    std::string system_;
    int turns_ = 0;
    int pending_ = -1;  // the last answer's final token: sampled but not yet in the cache
    GenerateResult last_;
    std::vector<int> end_of_turn_;  // the tokenizer's end_of_turn_ids() and the config's EOS ids
};

}  // namespace quest
