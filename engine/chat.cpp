#include "engine/chat.h"

#include <algorithm>

#include "kernels/common/error.h"

namespace quest {

ChatFormat detect_chat_format(std::string_view t, bool* unknown) {
    if (unknown) *unknown = false;
    if (t.empty()) return ChatFormat::Plain;
    if (t.find("<|im_start|>") != std::string_view::npos) return ChatFormat::ChatML;
    if (t.find("<|start_header_id|>") != std::string_view::npos) return ChatFormat::Llama3;
    if (t.find("[INST]") != std::string_view::npos) return ChatFormat::Llama2;
    if (unknown) *unknown = true;
    return ChatFormat::Plain;
}

std::optional<ChatFormat> parse_chat_format(const std::string& name) {
    if (name == "auto") return std::nullopt;
    if (name == "llama2") return ChatFormat::Llama2;
    if (name == "chatml") return ChatFormat::ChatML;
    if (name == "llama3") return ChatFormat::Llama3;
    if (name == "plain") return ChatFormat::Plain;
    throw InputError("--format: expected auto, llama2, chatml, llama3 or plain, got '" + name + "'");
}

const char* chat_format_label(ChatFormat f) {
    switch (f) {
    case ChatFormat::Llama2: return "Llama-2 chat";
    case ChatFormat::ChatML: return "ChatML";
    case ChatFormat::Llama3: return "Llama-3 chat";
    case ChatFormat::Plain: return "plain continuation";
    }
    return "?";
}

std::string chat_template_default_system(std::string_view t) {
    // ChatML templates that add a system message when the conversation has none write it as one literal:
    // {{ '<|im_start|>system\nYou are a helpful ...<|im_end|>\n' }} (SmolLM2, Qwen2).
    const std::string_view open = "'<|im_start|>system\n";
    const size_t at = t.find(open);
    if (at == std::string_view::npos) return {};
    const size_t begin = at + open.size();
    const size_t end = t.find("<|im_end|>", begin);
    if (end == std::string_view::npos) return {};
    const std::string_view text = t.substr(begin, end - begin);
    if (text.find_first_of("'{}") != std::string_view::npos) return {};  // not a plain literal
    return std::string(text);
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
    : backend_(backend), tok_(tok), sampler_(sampler), format_(format), system_(std::move(system)),
      end_of_turn_(tok.end_of_turn_ids()) {
    for (int id : backend_.config().eos_token_ids)
        if (std::find(end_of_turn_.begin(), end_of_turn_.end(), id) == end_of_turn_.end()) end_of_turn_.push_back(id);
    // The format's own tokens exist before the first message (an InputError now, not in the middle of a turn).
    if (format_ == ChatFormat::ChatML) (void)turn_tokens("");
    if (format_ == ChatFormat::Llama3) (void)turn_tokens("");
}

void ChatSession::reset() {
    backend_.reset();
    turns_ = 0;
    pending_ = -1;
    last_ = {};
}

bool ChatSession::ends_turn(int token) const {
    return std::find(end_of_turn_.begin(), end_of_turn_.end(), token) != end_of_turn_.end();
}

std::vector<int> ChatSession::special(const char* piece) const {
    const auto id = tok_.token_id(piece);
    if (!id)
        throw InputError(tok_.file().string() + ": the " + chat_format_label(format_) + " format needs the token " +
                         piece + ", which the vocabulary lacks (--format plain continues the text instead)");
    return {*id};
}

namespace {
// Jinja's trim: leading and trailing whitespace.
std::string trim(const std::string& s) {
    const char* ws = " \t\n\r\f\v";
    const size_t b = s.find_first_not_of(ws);
    if (b == std::string::npos) return {};
    return s.substr(b, s.find_last_not_of(ws) - b + 1);
}
}  // namespace

std::vector<int> ChatSession::turn_tokens(const std::string& user) const {
    std::vector<int> out;
    auto add = [&](const std::vector<int>& ids) { out.insert(out.end(), ids.begin(), ids.end()); };
    // The previous answer's last token was sampled but never fed. In ChatML and Llama-3 an answer is closed by the
    // format's own end token (an answer cut short, or ended by another end-of-turn token such as <|endoftext|>, gets
    // it here, as the template writes the history).
    const bool pending_is_text = pending_ >= 0 && !ends_turn(pending_);
    switch (format_) {
    case ChatFormat::Plain: {
        if (pending_ >= 0) out.push_back(pending_);
        add(tok_.encode(turns_ == 0 ? user : "\n" + user, /*add_bos=*/turns_ == 0));
        return out;
    }
    case ChatFormat::Llama2: {
        if (pending_ >= 0) out.push_back(pending_);
        // An answer cut short gets its EOS here.
        if (turns_ > 0 && pending_ != tok_.eos_id()) out.push_back(tok_.eos_id());
        std::vector<ChatMessage> msgs;
        if (turns_ == 0 && !system_.empty()) msgs.push_back({ChatMessage::Role::System, system_});
        msgs.push_back({ChatMessage::Role::User, user});
        add(apply_llama2_chat_template(tok_, msgs));  // [BOS] [INST] ... [/INST]
        return out;
    }
    case ChatFormat::ChatML: {
        // <|im_start|>{role}\n{content}<|im_end|>\n per message, then <|im_start|>assistant\n. The text between
        // two special tokens is encoded alone, as the tokenizer splits them out of the rendered template.
        const std::vector<int> im_start = special("<|im_start|>"), im_end = special("<|im_end|>");
        if (turns_ > 0) {
            if (pending_is_text) out.push_back(pending_);
            add(im_end);
            add(text("\n"));
        }
        auto message = [&](const std::string& role, const std::string& content) {
            add(im_start);
            add(text(role + "\n" + content));
            add(im_end);
            add(text("\n"));
        };
        if (turns_ == 0 && !system_.empty()) message("system", system_);
        message("user", user);
        add(im_start);
        add(text("assistant\n"));
        return out;
    }
    case ChatFormat::Llama3: {
        // <|begin_of_text|>, then <|start_header_id|>{role}<|end_header_id|>\n\n{content | trim}<|eot_id|> per
        // message, then <|start_header_id|>assistant<|end_header_id|>\n\n (Meta's template).
        const std::vector<int> sh = special("<|start_header_id|>"), eh = special("<|end_header_id|>"),
                               eot = special("<|eot_id|>");
        if (turns_ == 0) {
            add(special("<|begin_of_text|>"));
        } else {
            if (pending_is_text) out.push_back(pending_);
            add(eot);
        }
        auto header = [&](const std::string& role) {
            add(sh);
            add(text(role));
            add(eh);
        };
        auto message = [&](const std::string& role, const std::string& content) {
            header(role);
            add(text("\n\n" + trim(content)));
            add(eot);
        };
        if (turns_ == 0 && !system_.empty()) message("system", system_);
        message("user", user);
        header("assistant");
        add(text("\n\n"));
        return out;
    }
    }
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
    last_ = generate(
        backend_, sampler_, prompt, max_tokens,
        [&](int token) {
            if (stop && stop->load()) return false;
            if (!ends_turn(token)) on_text(stream.push(token));
            return true;
        },
        /*stop_at_eos=*/true, end_of_turn_);
    on_text(stream.flush());
    pending_ = last_.tokens.empty() ? -1 : last_.tokens.back();
    ++turns_;
    return last_;
}

}  // namespace quest
