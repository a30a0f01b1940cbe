#pragma once
// A conversation over one backend: the KV cache keeps the whole dialogue, and each turn prefills only the tokens
// the cache does not hold yet. Chat models use the Llama-2 format ([INST] ... [/INST], <<SYS>>, BOS/EOS around each
// exchange, as Meta's reference builds it); base models continue the text as typed.
#include <atomic>
#include <functional>
#include <string>
#include <vector>

#include "model/core/backend.h"
#include "engine/generate.h"
#include "engine/sampler.h"
#include "tokenizer/tokenizer.h"

namespace quest {

enum class ChatFormat { Llama2, Plain };

// Llama2 when the folder's tokenizer_config.json carries a chat template with [INST], Plain otherwise.
ChatFormat detect_chat_format(const std::filesystem::path& model_dir);

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

private:
    std::vector<int> turn_tokens(const std::string& user) const;

    Backend& backend_;
    const Tokenizer& tok_;
    Sampler& sampler_;
    ChatFormat format_;
    std::string system_;
    int turns_ = 0;
    int pending_ = -1;  // the last answer's final token: sampled but not yet in the cache
    GenerateResult last_;
};

}  // namespace quest
