#include "model/io/model_folder.h"

#include <atomic>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "kernels/common/error.h"
#include "model/io/gguf_model.h"

namespace quest {

namespace {

// A regular file named by -m: a GGUF file, or a clear refusal (config.json, a .safetensors, ...).
ModelFolder open_gguf(const std::filesystem::path& path) {
    if (path.extension() != ".gguf") {
        char magic[4] = {};
        std::ifstream in(path, std::ios::binary);
        in.read(magic, 4);
        if (!in || std::string(magic, 4) != "GGUF")
            throw InputError("'" + path.string() + "' is a file but not a GGUF file (expected a Hugging Face Llama "
                             "folder or a .gguf file)");
    }
    std::shared_ptr<const GgufFile> f = GgufFile::open(path);
    ModelConfig config = gguf_model_config(*f);
    return ModelFolder{path, std::move(config), std::move(f)};
}

}  // namespace

ModelFolder open_model_folder(const std::filesystem::path& path) {
    std::error_code ec;
    if (std::filesystem::is_regular_file(path, ec)) return open_gguf(path);
    if (!std::filesystem::is_directory(path, ec))
        throw InputError("model folder '" + path.string() +
                         "' does not exist (expected a Hugging Face Llama folder or a .gguf file)");
    const auto config_file = path / "config.json";
    if (!std::filesystem::exists(config_file))
        throw InputError(config_file.string() + ": missing (expected the model's Hugging Face config.json)");
    return ModelFolder{path, load_model_config(config_file), nullptr};
}

ModelFolder open_model_or_config(const std::filesystem::path& path, bool random_weights) {
    if (!random_weights) return open_model_folder(path);
    ModelFolder m;
    std::error_code ec;
    if (std::filesystem::is_regular_file(path, ec) && path.extension() == ".gguf") {
        m.config = gguf_model_config(*GgufFile::open(path));
        return m;
    }
    m.config = load_model_config(std::filesystem::is_directory(path) ? path / "config.json" : path);
    return m;
}

std::unique_ptr<Tokenizer> load_model_tokenizer(const ModelFolder& model) {
    if (model.is_gguf()) return gguf_tokenizer(*model.gguf);
    return load_tokenizer(model.dir);
}

std::string model_chat_template(const ModelFolder& model) {
    if (model.is_gguf()) return gguf_chat_template(*model.gguf);
    const auto file = model.dir / "tokenizer_config.json";
    std::ifstream in(file);
    if (!in) return {};
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception&) {
        throw InputError(file.string() + ": not valid JSON");
    }
    if (!j.is_object() || !j.contains("chat_template")) return {};
    const auto& t = j["chat_template"];
    if (t.is_string()) return t.get<std::string>();
    // A list of named templates ({"name": "default", "template": ...}): the default one.
    if (t.is_array())
        for (const auto& e : t)
            if (e.is_object() && e.value("name", "") == "default" && e.contains("template") && e["template"].is_string())
                return e["template"].get<std::string>();
    return {};
}

void check_model_tensors(const ModelFolder& model) {
    if (model.is_gguf()) return gguf_check_tensors_present(*model.gguf, model.config);
    check_checkpoint_matches_config(ModelFiles(model.dir), model.config, model.config_file());
}

LlamaWeightsF32 load_model_weights_f32(const ModelFolder& model) {
    if (model.is_gguf()) return load_llama_weights_f32_gguf(*model.gguf, model.config);
    return load_llama_weights_f32(ModelFiles(model.dir), model.config);
}

void check_tokenizer_vocab(int pieces, const ModelConfig& config, const std::filesystem::path& tokenizer_file,
                           const std::filesystem::path& config_file) {
    if (pieces > config.vocab_size)
        throw InputError(tokenizer_file.string() + ": " + std::to_string(pieces) + " pieces, more than vocab_size " +
                         std::to_string(config.vocab_size) + " in " + config_file.string() +
                         " (token ids past the embedding table; expected the model's own tokenizer)");
    static std::atomic<bool> said{false};
    if (pieces < config.vocab_size && !said.exchange(true))
        std::fprintf(stderr, "note: %s has %d pieces, %s vocab_size %d: ids %d..%d are padding (no piece)\n",
                     tokenizer_file.string().c_str(), pieces, config_file.string().c_str(), config.vocab_size, pieces,
                     config.vocab_size - 1);
}

}  // namespace quest
