#!/bin/sh
# Quest on a real model: SmolLM2-135M-Instruct (tools/fetch_smollm2.sh) on the pass-key and multi-key retrieval sets
# at 2K / 4K / 8K, full attention and Quest budgets, the question fed token by token through the decode path.
#
# The sets come from tools/make_retrieval_data.py eval-set with SmolLM2's tokenizer: the tokenizer.json that
# `quest quantize` writes from the GGUF (read here by Hugging Face tokenizers, which gives the GGUF's ids). passkey
# --filler engine is, token for token, the prompt of `quest eval passkey` (engine/eval.cpp make_passkey_prompt);
# multikey hides 8 "The code for the <colour> <object> is NNNN." facts in story filler. Prompts are plain
# continuation, without SmolLM2's ChatML template (the question ends in "... is" and the answer's digits are
# greedy-decoded). One file per context (jsonl rows are per configuration). `quest eval jsonl` prefills each prompt
# once and decodes every budget from a copy of its cache (CPU backend; CUDA prefills per budget).
#
#   tools/smollm2_retrieval.sh                       CPU backend, 1 prompt per context and task
#   SAMPLES=20 BACKEND=cuda tools/smollm2_retrieval.sh
# Environment: BUILD (build), BACKEND (cpu), SAMPLES (prompts per context and task, 1), CONTEXTS (2048,4096,8192),
# BUDGETS (full,64,256,1024), TASKS (passkey multikey), OUT (models/smollm2/retrieval), PY (a python3 with
# tokenizers, numpy and sentencepiece; /work/venv-torch/bin/python when it exists). The multikey set at 8192 is made at
# 8150 tokens (below).
set -eu
cd "$(dirname "$0")/.."
build=${BUILD:-build}
backend=${BACKEND:-cpu}
samples=${SAMPLES:-1}
contexts=${CONTEXTS:-2048,4096,8192}
budgets=${BUDGETS:-full,64,256,1024}
tasks=${TASKS:-passkey multikey}
out=${OUT:-models/smollm2/retrieval}
py=${PY:-$( [ -x /work/venv-torch/bin/python ] && echo /work/venv-torch/bin/python || echo python3 )}
gguf=models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
[ -s "$gguf" ] || { echo "error: $gguf is absent (run tools/fetch_smollm2.sh)" >&2; exit 2; }
mkdir -p "$out"
tok=${TOKENIZER_DIR:-models/smollm2/int4-g64-rtn}  # any folder quantize wrote from the GGUF
[ -s "$tok/tokenizer.json" ] || nice "$build/quest" quantize -m "$gguf" -o "$tok" --group 64 >/dev/null 2>&1
for task in $tasks; do
  for c in $(echo "$contexts" | tr ',' ' '); do
    # A multikey prompt of 8,192 tokens needs 8,194 positions with its question and answer, past SmolLM2's 8,192: 8K
    # is made at 8,150 tokens (prefill, question and answer then fit).
    [ "$task" = multikey ] && [ "$c" = 8192 ] && c=8150
    set_file=$out/$task-$c-n$samples.jsonl
    filler=mixed; [ "$task" = passkey ] && filler=engine
    [ -s "$set_file" ] || nice "$py" tools/make_retrieval_data.py eval-set --task "$task" --filler "$filler" \
        --keys 8 --contexts "$c" --samples "$samples" --tokenizer "$tok/tokenizer.json" --out "$set_file"
    echo "== $task $c ($samples prompts, $backend)"
    nice "$build/quest" eval jsonl -m "$gguf" --set "$set_file" --budgets "$budgets" --backend "$backend" \
        --json "$out/$task-$c-n$samples-$backend.json"
  done
done
