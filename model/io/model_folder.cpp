#include "model/io/model_folder.h"

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

}  // namespace quest
