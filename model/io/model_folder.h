#pragma once
// Where a model lives: its folder and its parsed config.
#include <filesystem>

#include "model/core/config.h"
#include "tokenizer/tokenizer.h"

namespace quest {

// A model folder: config.json, safetensors weights, tokenizer.json or tokenizer.model.
struct ModelFolder {
    std::filesystem::path dir;
    ModelConfig config;
    // The tokenizer file load_tokenizer(dir) reads: tokenizer.json when present, else tokenizer.model.
    std::filesystem::path tokenizer_file() const { return tokenizer_file_in(dir); }
};
// Checks the folder exists and parses its config.json (InputError naming the path otherwise).
ModelFolder open_model_folder(const std::filesystem::path& dir);
// `-m` of bench and soak: with random_weights, a config.json or a folder holding one (only the config is read; dir
// stays empty), else open_model_folder.
ModelFolder open_model_or_config(const std::filesystem::path& path, bool random_weights);

// Pairs a tokenizer with the model it feeds: more pieces than config.json's vocab_size is an InputError naming both
// files (ids past the embedding table); fewer is allowed (padded vocabularies, e.g. 32000 pieces for 32064 rows)
// and said once on stderr. `tokenizer_file` and `config_file` name the files in the messages.
void check_tokenizer_vocab(int tokenizer_pieces, const ModelConfig& config, const std::filesystem::path& tokenizer_file,
                           const std::filesystem::path& config_file);
// The same for a model folder's tokenizer.model and config.json.
template <class Tok>
void check_tokenizer_vocab(const Tok& tok, const ModelFolder& model) {
    check_tokenizer_vocab(tok.vocab_size(), model.config, model.tokenizer_file(), model.dir / "config.json");
}

}  // namespace quest
