#include "model/io/model_folder.h"

#include <atomic>
#include <cstdio>

#include "kernels/common/error.h"

namespace quest {

ModelFolder open_model_folder(const std::filesystem::path& dir) {
    if (!std::filesystem::is_directory(dir))
        throw InputError("model folder '" + dir.string() + "' does not exist (expected a Hugging Face Llama folder)");
    const auto config_file = dir / "config.json";
    if (!std::filesystem::exists(config_file))
        throw InputError(config_file.string() + ": missing (expected the model's Hugging Face config.json)");
    return ModelFolder{dir, load_model_config(config_file)};
}

ModelFolder open_model_or_config(const std::filesystem::path& path, bool random_weights) {
    if (!random_weights) return open_model_folder(path);
    ModelFolder m;
    m.config = load_model_config(std::filesystem::is_directory(path) ? path / "config.json" : path);
    return m;
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
