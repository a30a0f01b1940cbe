#pragma once
// One tensor-parallel rank's view of a checkpoint (model/core/tensor_parallel.h): a WeightSource whose tensors are
// the rank's slices, named and shaped as the tensors of its shard model (TpRank::shard). A device loader given it
// loads the shard as it would load a whole model of that config:
//   q_proj, k_proj, v_proj, gate_proj, up_proj (and the q/k/v biases)  rows of the rank's heads / KV heads / ffn
//   o_proj, down_proj                                                  columns of the rank's heads / ffn
//   embedding, lm_head                                                 rows of the rank's vocabulary
//   norms                                                              whole
// Float tensors stay in their file's dtype where the slice is whole rows (a mapped file's bytes), else are read to
// fp32. An int4 layer stays int4 where the slice keeps whole groups (rows always; columns when the group divides
// both ends), else is given dequantized, as a source gives 4-bit values the int4 format cannot take.
#include <memory>

#include "model/core/tensor_parallel.h"
#include "model/io/weight_source.h"

namespace quest {

// `full` must outlive the result; `model` is full's config, `rank` one of make_tp_plan(model, ...)'s ranks.
std::unique_ptr<WeightSource> shard_weight_source(const WeightSource& full, const ModelConfig& model,
                                                  const TpRank& rank);

}  // namespace quest
