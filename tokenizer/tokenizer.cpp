#include "tokenizer/tokenizer.h"

#include <utility>

#include "kernels/common/error.h"
#include "tokenizer/bpe.h"
#include "tokenizer/sentencepiece.h"
#include "tokenizer/utf8.h"

namespace quest {

namespace {

// Python's str.isspace(), which str.strip() uses.
bool is_python_space(int32_t cp) {
    return (cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x20) || cp == 0x85 || cp == 0xa0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 || cp == 0x202f || cp == 0x205f ||
           cp == 0x3000;
}

// Python's str.strip() on UTF-8 text (invalid bytes count as non-space).
std::string_view python_strip(std::string_view s) {
    size_t begin = s.size(), end = 0;
    for (size_t i = 0, len = 0; i < s.size(); i += len) {
        if (is_python_space(utf8::decode(s, i, len))) continue;
        if (begin == s.size()) begin = i;
        end = i + len;
    }
    return begin < end ? s.substr(begin, end - begin) : std::string_view{};
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------------------
// Factory
// ---------------------------------------------------------------------------------------------------------------------

std::filesystem::path tokenizer_file_in(const std::filesystem::path& model_dir) {
    std::error_code ec;
    const auto json = model_dir / "tokenizer.json";
    if (std::filesystem::exists(json, ec)) return json;
    return model_dir / "tokenizer.model";
}

std::unique_ptr<Tokenizer> load_tokenizer(const std::filesystem::path& model_dir) {
    std::error_code ec;
    const auto json = model_dir / "tokenizer.json";
    const auto model = model_dir / "tokenizer.model";
    if (std::filesystem::exists(json, ec)) return std::make_unique<BpeTokenizer>(BpeTokenizer::from_json_file(json));
    if (std::filesystem::exists(model, ec)) return std::make_unique<SentencePieceTokenizer>(model);
    throw InputError("model folder " + model_dir.string() +
                     " has no tokenizer (expected tokenizer.json (Hugging Face BPE) or tokenizer.model "
                     "(SentencePiece))");
}

// ---------------------------------------------------------------------------------------------------------------------
// StreamingDecoder
// ---------------------------------------------------------------------------------------------------------------------

StreamingDecoder::StreamingDecoder(const Tokenizer& tok) : impl_(tok.make_stream()) {}
std::string StreamingDecoder::push(int id) { return impl_->push(id); }
std::string StreamingDecoder::flush() { return impl_->flush(); }
void StreamingDecoder::reset() { impl_->reset(); }

// ---------------------------------------------------------------------------------------------------------------------
// Chat template
// ---------------------------------------------------------------------------------------------------------------------

std::vector<int> apply_llama2_chat_template(const Tokenizer& tok, std::span<const ChatMessage> messages) {
    using Role = ChatMessage::Role;
    auto role_name = [](Role r) -> std::string {
        switch (r) {
        case Role::System: return "system";
        case Role::User: return "user";
        case Role::Assistant: return "assistant";
        }
        return "unknown";
    };
    if (tok.bos_id() < 0 || tok.eos_id() < 0)
        throw InputError("chat template: the tokenizer defines no BOS or EOS token, both are needed");

    // Dialog after merging a leading system message into the first user message.
    std::vector<std::string> contents;
    size_t first = 0;
    std::string system_prefix;
    if (!messages.empty() && messages[0].role == Role::System) {
        if (messages.size() < 2)
            throw InputError("chat messages: a system message must be followed by a user message");
        system_prefix = "<<SYS>>\n" + messages[0].content + "\n<</SYS>>\n\n";
        first = 1;
    }
    if (first == messages.size())
        throw InputError("chat messages: empty conversation, expected at least one user message");
    for (size_t i = first; i < messages.size(); ++i) {
        const Role expected = (i - first) % 2 == 0 ? Role::User : Role::Assistant;
        if (messages[i].role != expected)
            throw InputError("chat messages: message " + std::to_string(i) + " has role " +
                             role_name(messages[i].role) + ", expected " + role_name(expected) +
                             " (an optional first system message, then user and assistant alternating)");
        contents.push_back(i == first ? system_prefix + messages[i].content : messages[i].content);
    }
    if (contents.size() % 2 == 0)
        throw InputError("chat messages: the last message has role assistant, expected user");

    std::vector<int> ids;
    auto append = [&](const std::string& text, bool eos) {
        const auto part = tok.encode(text, true);
        ids.insert(ids.end(), part.begin(), part.end());
        if (eos) ids.push_back(tok.eos_id());
    };
    for (size_t i = 0; i + 1 < contents.size(); i += 2)
        append("[INST] " + std::string(python_strip(contents[i])) + " [/INST] " +
                   std::string(python_strip(contents[i + 1])) + " ",
               true);
    append("[INST] " + std::string(python_strip(contents.back())) + " [/INST]", false);
    return ids;
}

}  // namespace quest
