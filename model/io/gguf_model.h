#pragma once
// Llama-family models in GGUF files (llama.cpp's convert_hf_to_gguf.py): the metadata mapped onto ModelConfig, the
// tensor names mapped to Hugging Face's, and the Q/K row permutation of the converter undone, so that a tensor
// fetched by its HF name equals the one in the original HF checkpoint (up to the file's quantization).
//
// Metadata read ({arch} = general.architecture: "llama" or "mistral" -> LlamaForCausalLM, "qwen2" ->
// Qwen2ForCausalLM with its q/k/v biases blk.N.attn_{q,k,v}.bias; llama.cpp writes Mistral models as "llama"):
//   {arch}.embedding_length -> hidden_size           {arch}.feed_forward_length -> intermediate_size
//   {arch}.block_count -> num_layers                 {arch}.context_length -> max_position_embeddings
//   {arch}.attention.head_count -> num_heads         {arch}.attention.head_count_kv -> num_kv_heads (default heads)
//   {arch}.attention.key_length -> head_dim (default embedding_length / head_count; value_length must equal it)
//   {arch}.rope.dimension_count must equal head_dim (partial rotary embeddings are not supported)
//   {arch}.attention.layer_norm_rms_epsilon -> rms_norm_eps   {arch}.rope.freq_base -> rope_theta (default 10000)
//   {arch}.rope.scaling.type none|linear|yarn, .factor, .original_context_length, .yarn_beta_fast/slow -> rope
//   {arch}.vocab_size, else the length of tokenizer.ggml.tokens, else token_embd.weight's rows -> vocab_size
//   tokenizer.ggml.bos_token_id / eos_token_id -> bos / eos; tie_word_embeddings when output.weight is absent.
//   {arch}.attention.sliding_window (llama.cpp writes none for these architectures) -> MistralForCausalLM with that
//   window on every layer (llama, mistral); refused for qwen2 (its windowed layers are not in the file).
// Float metadata is float32 in GGUF: each is read back as the shortest decimal that rounds to that float (1e-05,
// not 9.99999974737875e-06), which is the decimal the converter was given. A file with rope_freqs.weight (Llama 3
// frequency factors, which do not give back the rope_scaling parameters) or longrope scaling is refused. The
// result passes the same checks as a config.json (parse_model_config).
//
// Tensor names (GGUF -> HF): token_embd.weight -> model.embed_tokens.weight, output_norm.weight -> model.norm.weight,
// output.weight -> lm_head.weight, blk.N.{attn_norm, attn_q, attn_k, attn_v, attn_output, ffn_norm, ffn_gate,
// ffn_up, ffn_down}.weight -> model.layers.N.{input_layernorm, self_attn.q_proj, self_attn.k_proj, self_attn.v_proj,
// self_attn.o_proj, post_attention_layernorm, mlp.gate_proj, mlp.up_proj, mlp.down_proj}.weight.
//
// Q/K permutation: HF's rotary embedding pairs dimension i of a head with i + head_dim/2 ("rotate_half"); llama.cpp
// pairs 2i with 2i+1. The converter (LlamaModel.permute) therefore reorders the rows of q_proj (n = num_heads) and
// k_proj (n = num_kv_heads): viewing the rows as [n][2][head_dim/2], it swaps the last two axes, so
//     GGUF row h*head_dim + 2*i + a  =  HF row h*head_dim + a*head_dim/2 + i      (a in {0, 1}, i < head_dim/2).
// Fetching q_proj / k_proj by HF name applies the inverse. Qwen2 is not permuted (llama.cpp's Qwen2Model keeps HF's
// rows: its graph rotates NEOX-style, as rotate_half).
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "model/core/config.h"
#include "model/io/gguf.h"
#include "model/io/gguf_quants.h"
#include "model/io/weights.h"
#include "tokenizer/bpe.h"
#include "tokenizer/tokenizer.h"

namespace quest {

// The Llama hyper-parameters of a GGUF file (see above). InputError naming the file and the key at fault.
ModelConfig gguf_model_config(const GgufFile& f);

// Name mapping; nullopt for a name outside the Llama set above.
std::optional<std::string> gguf_name_from_hf(const std::string& hf_name);
std::optional<std::string> hf_name_from_gguf(const std::string& gguf_name);

// For a q_proj / k_proj with n_head heads of `rows / n_head` rows: order[hf_row] = the GGUF row holding it.
// std::invalid_argument unless rows is a multiple of 2 * n_head.
std::vector<int> gguf_unpermute_rows(int rows, int n_head);
// The heads to un-permute a tensor with: num_heads for q_proj, num_kv_heads for k_proj, 0 (none) otherwise.
int gguf_permuted_heads(const std::string& hf_name, const ModelConfig& c);

// The tensor `hf_name` as fp32, row-major with exactly `expected_shape` (outermost first, HF's), dequantized and
// with the Q/K permutation undone. InputError naming the file and the tensor when it is missing ("not found"), its
// shape differs ("shape mismatch: Expected [..], Actual [..]", Actual in HF order), or its type cannot be
// dequantized.
std::vector<float> gguf_load_tensor_f32(const GgufFile& f, const ModelConfig& c, const std::string& hf_name,
                                        std::span<const int64_t> expected_shape);

// Every Llama weight as fp32, like load_llama_weights_f32 (model/weights.h) does for a safetensors folder.
LlamaWeightsF32 load_llama_weights_f32_gguf(const GgufFile& f, const ModelConfig& c);

// A Q4_0 / Q4_1 linear layer `hf_name` [rows][cols] converted exactly to quest-int4 (group 32), rows un-permuted
// for q_proj / k_proj; see int4_from_gguf_q4 for when it is exact (matrix empty otherwise). InputError when the
// tensor is missing, has another shape, or is not Q4_0 / Q4_1.
Int4FromGguf gguf_load_linear_int4(const GgufFile& f, const ModelConfig& c, const std::string& hf_name, int rows,
                                   int cols);

}  // namespace quest

namespace quest {

// The tokenizer of a GGUF file from its tokenizer.ggml.* metadata, chosen by tokenizer.ggml.model:
//   "llama" (SentencePiece: tokens, scores, token_type, bos/eos/unknown ids, add_bos_token, add_eos_token,
//     add_space_prefix, remove_extra_whitespaces) through SpmGgufTokenizer (tokenizer/spm_gguf.h); scores and
//     token_type are required;
//   "gpt2" (byte-level BPE: tokens, merges, token_type, bos/eos ids, pre) through BpeTokenizer::from_gguf_vocab.
// A file without tokenizer.ggml.model, another model, or a malformed vocabulary is an InputError naming the file
// and the key.
std::unique_ptr<Tokenizer> gguf_tokenizer(const GgufFile& f);

// The file holds what the config describes, from the tensor names alone (the counterpart of
// check_checkpoint_matches_config for safetensors): token_embd, each layer's two norms, output_norm. Run before
// any memory plan. InputError naming the file and the first missing tensor.
void gguf_check_tensors_present(const GgufFile& f, const ModelConfig& c);

// tokenizer.chat_template, "" when absent.
std::string gguf_chat_template(const GgufFile& f);

// The file's tokenizer as a Hugging Face folder holds it: tokenizer.json from the byte-level BPE vocabulary (the
// pre-tokenizer regexes of tokenizer.ggml.pre written out as Split steps) and tokenizer_config.json with BOS, EOS
// and the chat template, so that load_tokenizer on the folder gives the ids gguf_tokenizer gives. The InputErrors
// of gguf_tokenizer when the file has no vocabulary this engine reads.
TokenizerJsonFiles gguf_tokenizer_json(const GgufFile& f, const ModelConfig& c);

// The file's tokenizer as the files of a Hugging Face folder, name and content: for a byte-level BPE vocabulary
// tokenizer.json and tokenizer_config.json (gguf_tokenizer_json); for a SentencePiece one tokenizer.model
// (tokenizer/spm_write.h) and tokenizer_config.json (BOS, EOS, the chat template). The InputErrors of gguf_tokenizer;
// and for a SentencePiece vocabulary with add_bos_token false or add_eos_token true, an InputError naming the key
// (a tokenizer.model folder adds BOS and no EOS, so its ids would differ).
std::vector<std::pair<std::string, std::string>> gguf_tokenizer_files(const GgufFile& f, const ModelConfig& c);

}  // namespace quest
