#pragma once
// Where a model lives: its folder and its parsed config.
#include <filesystem>

#include "model/core/config.h"

namespace quest {

// A model folder: config.json, safetensors weights, tokenizer.model.
struct ModelFolder {
    std::filesystem::path dir;
    ModelConfig config;
    std::filesystem::path tokenizer_file() const { return dir / "tokenizer.model"; }
};
// Checks the folder exists and parses its config.json (InputError naming the path otherwise).
ModelFolder open_model_folder(const std::filesystem::path& dir);
// `-m` of bench and soak: with random_weights, a config.json or a folder holding one (only the config is read; dir
// stays empty), else open_model_folder.
ModelFolder open_model_or_config(const std::filesystem::path& path, bool random_weights);

}  // namespace quest
