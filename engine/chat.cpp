#include "engine/chat.h"

#include <fstream>
#include <nlohmann/json.hpp>

#include "kernels/common/error.h"

namespace quest {

ChatFormat detect_chat_format(const std::filesystem::path& model_dir) {
    std::ifstream in(model_dir / "tokenizer_config.json");
    if (!in) return ChatFormat::Plain;
    try {
        const auto j = nlohmann::json::parse(in);
        if (j.contains("chat_template") && j["chat_template"].is_string() &&
            j["chat_template"].get<std::string>().find("[INST]") != std::string::npos)
            return ChatFormat::Llama2;
    } catch (const nlohmann::json::exception&) {
        throw InputError((model_dir / "tokenizer_config.json").string() + ": not valid JSON");
    }
    return ChatFormat::Plain;
}

ChatCommand parse_chat_command(const std::string& line) {
    if (line.empty() || line[0] != '/' || line.rfind("//", 0) == 0) return ChatCommand::Text;
    if (line == "/quit" || line == "/exit") return ChatCommand::Quit;
    if (line == "/reset") return ChatCommand::Reset;
    if (line == "/stats") return ChatCommand::Stats;
    if (line == "/help") return ChatCommand::Help;
    return ChatCommand::Unknown;
}

std::string chat_help() {
    return "/reset  start a new conversation\n"
           "/stats  timings of the last answer\n"
           "/help   this list\n"
           "/quit   leave (also /exit, Ctrl-D)\n"
           "//text  send text that starts with '/'\n";
}

ChatSession::ChatSession(Backend& backend, const Tokenizer& tok, Sampler& sampler, ChatFormat format,
                         std::string system)
    : backend_(backend), tok_(tok), sampler_(sampler), format_(format), system_(std::move(system)) {}

void ChatSession::reset() {
    backend_.reset();
    turns_ = 0;
    pending_ = -1;
    last_ = {};
}

std::vector<int> ChatSession::turn_tokens(const std::string& user) const {
    std::vector<int> out;
    // The previous answer's last token was sampled but never fed; an answer cut short gets its EOS here.
    if (pending_ >= 0) out.push_back(pending_);
    if (format_ == ChatFormat::Plain) {
        const auto ids = tok_.encode(turns_ == 0 ? user : "\n" + user, /*add_bos=*/turns_ == 0);
        out.insert(out.end(), ids.begin(), ids.end());
        return out;
    }
    if (turns_ > 0 && pending_ != tok_.eos_id()) out.push_back(tok_.eos_id());
    std::vector<ChatMessage> msgs;
    if (turns_ == 0 && !system_.empty()) msgs.push_back({ChatMessage::Role::System, system_});
    msgs.push_back({ChatMessage::Role::User, user});
    const auto ids = apply_llama2_chat_template(tok_, msgs);  // [BOS] [INST] ... [/INST]
    out.insert(out.end(), ids.begin(), ids.end());
    return out;
}

GenerateResult ChatSession::answer(const std::string& user, int max_tokens,
                                   const std::function<void(const std::string&)>& on_text,
                                   const std::atomic<bool>* stop) {
    const std::vector<int> prompt = turn_tokens(user);
    if (backend_.position() + static_cast<int>(prompt.size()) >= backend_.capacity())
        throw ResourceError("the conversation no longer fits in the context (" + std::to_string(backend_.capacity()) +
                            " tokens): /reset to start a new one");
    StreamingDecoder stream(tok_);
    last_ = generate(backend_, sampler_, prompt, max_tokens, [&](int token) {
        if (stop && stop->load()) return false;
        if (!backend_.config().is_eos(token)) on_text(stream.push(token));
        return true;
    });
    on_text(stream.flush());
    pending_ = last_.tokens.empty() ? -1 : last_.tokens.back();
    ++turns_;
    return last_;
}

}  // namespace quest
