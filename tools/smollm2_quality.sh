#!/bin/sh
# FP16 vs 4-bit on a real model: SmolLM2-135M-Instruct (tools/fetch_smollm2.sh), perplexity and KL divergence on a
# real English text, scored token by token through the decode path (`quest eval ppl`, full attention), for
#   (1) the GGUF's Q4_1 weights dequantized (the reference: fp32 on the CPU backend, FP16 on CUDA)
#   (2) quest int4 round-to-nearest (`quest quantize` of the dequantized weights) at group 128 and 64: SmolLM2's
#       hidden size 576 is not a multiple of 128, so at g128 only down_proj (input 1536) is quantized and the other
#       six matrices of each layer stay FP16; g64 quantizes all 210
#   (3) quest int4 g64 with the AWQ option (calibrated on another text)
#   (4) quest int4 g32 round-to-nearest: Q4_1's own blocks (32 wide) re-expressed with a zero point, the closest
#       int4 form of them (Q4_1 -> int4 is exact for no SmolLM2 matrix: its min is not a multiple of its scale;
#       test_gguf GgufSmolLM2.OpensMapsAndDequantizesEveryTensor prints the count, run below)
# (2)-(4) run in the same process as (1) (`--compare`): each row's KL is from (1)'s distribution, token for token.
#
#   tools/smollm2_quality.sh                  CPU backend, build/ (nice'd)
#   BACKEND=cuda BUILD=build tools/smollm2_quality.sh
# Environment: TEXT (default /usr/share/common-licenses/GPL-3, on every Debian machine), CALIB (AWQ calibration,
# default /usr/share/common-licenses/Apache-2.0: not the scored text), WINDOW (tokens prefilled, unscored; 512),
# MAX_TOKENS (window + scored tokens; 2560), CALIB_TOKENS (1024), OUT (folder for the int4 copies; models/smollm2), JSON (rows as JSON).
set -eu
cd "$(dirname "$0")/.."
build=${BUILD:-build}
backend=${BACKEND:-cpu}
gguf=models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
text=${TEXT:-/usr/share/common-licenses/GPL-3}
calib=${CALIB:-/usr/share/common-licenses/Apache-2.0}
window=${WINDOW:-512}
max_tokens=${MAX_TOKENS:-2560}
out=${OUT:-models/smollm2}
json=${JSON:-$out/quality-$backend.json}
[ -s "$gguf" ] || { echo "error: $gguf is absent (run tools/fetch_smollm2.sh)" >&2; exit 2; }
[ -s "$text" ] || { echo "error: TEXT=$text is absent (name another real English text)" >&2; exit 2; }
q=nice
[ -x "$build/tests/quest_tests" ] && $q "$build/tests/quest_tests" --gtest_filter='GgufSmolLM2.OpensMapsAndDequantizesEveryTensor' \
    | grep 'SmolLM2 Q4_1' || true
calib_tokens=${CALIB_TOKENS:-1024}
for g in 128 64 32; do
  [ -d "$out/int4-g$g-rtn" ] || $q "$build/quest" quantize -m "$gguf" -o "$out/int4-g$g-rtn" --group $g
done
[ -d "$out/int4-g64-awq" ] || $q "$build/quest" quantize -m "$gguf" -o "$out/int4-g64-awq" --group 64 \
    --awq-calib "$calib" --calib-tokens "$calib_tokens"
$q "$build/quest" eval ppl -m "$gguf" \
    --compare "$out/int4-g128-rtn,$out/int4-g64-rtn,$out/int4-g64-awq,$out/int4-g32-rtn" \
    --text "$text" --window "$window" --max-tokens "$max_tokens" --budgets full --backend "$backend" --json "$json"
