#pragma once
// Where a model lives: a Hugging Face folder (config.json, safetensors, tokenizer.json / tokenizer.model) or one
// GGUF file (llama.cpp's format: config, tokenizer and weights in the file). `-m` of every subcommand goes through
// open_model_folder, which decides which one it is; the accessors below answer for both.
#include <filesystem>
#include <memory>
#include <string>

#include "model/core/config.h"
#include "model/io/gguf.h"
#include "model/io/weights.h"
#include "tokenizer/tokenizer.h"

namespace quest {

struct ModelFolder {
    std::filesystem::path dir;  // the folder; for a GGUF model, the .gguf file itself
    ModelConfig config;
    std::shared_ptr<const GgufFile> gguf = nullptr;  // the mapped file when -m named a GGUF file, else null

    bool is_gguf() const { return gguf != nullptr; }
    // The file the config was read from (named in messages): config.json, or the .gguf file.
    std::filesystem::path config_file() const { return is_gguf() ? dir : dir / "config.json"; }
    // The tokenizer file load_model_tokenizer reads: tokenizer.json when present, else tokenizer.model; the .gguf.
    std::filesystem::path tokenizer_file() const { return is_gguf() ? dir : tokenizer_file_in(dir); }
};
// A folder: checks it exists and parses its config.json. A regular file: a GGUF file (mapped and validated, the
// config from its metadata: gguf_model_config). InputError naming the path otherwise.
ModelFolder open_model_folder(const std::filesystem::path& path);
// `-m` of bench and soak: with random_weights, a config.json, a folder holding one or a GGUF file (only the config
// is read; dir stays empty), else open_model_folder.
ModelFolder open_model_or_config(const std::filesystem::path& path, bool random_weights);

// The model's tokenizer: load_tokenizer(dir) for a folder, the GGUF vocabulary (gguf_tokenizer) for a GGUF file.
std::unique_ptr<Tokenizer> load_model_tokenizer(const ModelFolder& model);
// The chat template the model ships (tokenizer_config.json's chat_template, the GGUF's tokenizer.chat_template);
// "" when it has none.
std::string model_chat_template(const ModelFolder& model);

// Every tensor the config describes is there, by name (before any memory plan): check_checkpoint_matches_config
// for a folder, gguf_check_tensors_present for a GGUF file.
void check_model_tensors(const ModelFolder& model);
// Every Llama weight in fp32 (the CPU backend): from the safetensors folder or dequantized from the GGUF file.
LlamaWeightsF32 load_model_weights_f32(const ModelFolder& model);

// Pairs a tokenizer with the model it feeds: more pieces than config.json's vocab_size is an InputError naming both
// files (ids past the embedding table); fewer is allowed (padded vocabularies, e.g. 32000 pieces for 32064 rows)
// and said once on stderr. `tokenizer_file` and `config_file` name the files in the messages.
void check_tokenizer_vocab(int tokenizer_pieces, const ModelConfig& config, const std::filesystem::path& tokenizer_file,
                           const std::filesystem::path& config_file);
// The same for a model's tokenizer and config.
template <class Tok>
void check_tokenizer_vocab(const Tok& tok, const ModelFolder& model) {
    check_tokenizer_vocab(tok.vocab_size(), model.config, model.tokenizer_file(), model.config_file());
}

}  // namespace quest
