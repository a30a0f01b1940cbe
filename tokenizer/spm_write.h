#pragma once
// A GGUF "llama" vocabulary (tokenizer/spm_gguf.h) written back as a SentencePiece tokenizer.model: the ModelProto
// of sentencepiece_model.proto serialized by hand in the protobuf wire format (no protobuf library), so that
// libsentencepiece loading it encodes and decodes as SpmGgufTokenizer does.
//
//   pieces (field 1): piece, score, type of every token; the GGUF token types are SentencePiece's Type numbers.
//   trainer_spec (2): model_type BPE, vocab_size, byte_fallback (all 256 <0xNN> tokens present, as SpmGgufTokenizer
//     falls back to bytes exactly then), unk/bos/eos ids and pieces (pad_id -1: the GGUF's "llama" vocabulary
//     carries no padding piece SentencePiece would know). unk_surface stays SentencePiece's default, which is the
//     one SpmGgufTokenizer decodes (the GGUF does not carry it).
//   normalizer_spec (3): name "identity" without a character map, add_dummy_prefix = add_space_prefix,
//     remove_extra_whitespaces, escape_whitespaces true.
#include <string>

#include "tokenizer/spm_gguf.h"

namespace quest {

// The serialized ModelProto of `v` (v.unk resolved, as SpmGgufTokenizer::vocab() holds it).
std::string spm_model_proto(const SpmVocab& v);

}  // namespace quest
