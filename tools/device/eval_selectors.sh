#!/bin/bash
# Issue 26's tables on the GPU: the selectors at the default settings (2 dense layers, page 16, kv-sum) on the
# retrieval sets of .evalsets/ (tools/make_retrieval_data.py eval-set, made on the development machine and carried),
# for the trained demo model and SmolLM2-135M-Instruct (its GGUF at models/smollm2/, when there), then the 7B-shape
# step time of the selectors of BENCH_SELECTORS (default quest sparq sparq+m; "+m": --match-bytes) at 4K and 32K,
# B = 2048, alternated in this one call.
# Run on the GPU machine from the repository root (it sources tools/device/env.sh; the sets travel packed as
# .device-pack/evalsets.txz: `tar cf - .evalsets | xz > .device-pack/evalsets.txz` here). Writes
# $OUT/eval-*.{json,log} and $OUT/ab-selectors.txt; prints every table.
#   SETS="demo:demo-mk4k smol:smol-mk4k ..."   (model:set pairs; default: every set of .evalsets/ with its model)
#   POLICIES=quest,quest+int4+m,oracle,sparq,sparq+m  BUDGETS=full,64,256  ROUNDS=3  BENCH=1 (0: no step times,
#   only: no evals)
set -u
. "$(dirname "$0")/env.sh"
[ -d .evalsets ] || { [ -f .device-pack/evalsets.txz ] && xz -dc .device-pack/evalsets.txz | tar xf -; }
POLICIES=${POLICIES:-quest,quest+int4+m,oracle,sparq,sparq+m}
BUDGETS=${BUDGETS:-full,64,256}
smol=models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
if [ -z "${SETS:-}" ]; then
  SETS=
  for f in .evalsets/*.jsonl; do
    n=$(basename "$f" .jsonl)
    case $n in demo-*) SETS+=" demo:$n" ;; smol-*) [ -f "$smol" ] && SETS+=" smol:$n" ;; esac
  done
fi
[ "${BENCH:-1}" = only ] && SETS=
for pair in $SETS; do
  model=${pair%%:*} set=${pair#*:}
  m=models/demo
  [ "$model" = smol ] && m=$smol
  "$BIN/quest" eval jsonl -m "$m" --backend cuda --set ".evalsets/$set.jsonl" --budgets "$BUDGETS" \
    --policies "$POLICIES" --json "$OUT/eval-$set.json" > "$OUT/eval-$set.log" 2>&1
  echo "== $set ($m): rc=$?"
  grep -E "^ +[0-9]+ " "$OUT/eval-$set.log"
done
[ "${BENCH:-1}" = 0 ] && exit 0
: > "$OUT/ab-selectors.txt"
sels=${BENCH_SELECTORS:-quest sparq sparq+m}
for row in "fp16 32768 2048" "fp16 4096 2048" "int4 32768 2048"; do
  read -r w ctx budget <<< "$row"
  declare -A p50s=()
  for r in $(seq "${ROUNDS:-3}"); do
    for sel in $sels; do
      args=(--selector "${sel%+m}")
      [ "$sel" != "${sel%+m}" ] && args+=(--match-bytes)
      log="$OUT/bench-$sel-$w-$ctx-$r.log"
      timeout 120 "$BIN/quest" bench -m configs/llama2-7b.json --random-weights --backend cuda --weights "$w" \
        --contexts "$ctx" --budgets "$budget" --steps 64 --warmup 8 "${args[@]}" > "$log" 2>&1
      p50=$(awk '$1 == "cuda" {print $6}' "$log" | tail -1)
      p50s[$sel]+="${p50:-fail} "
    done
  done
  line="$w $ctx $budget"
  for sel in $sels; do line+=" | $sel ${p50s[$sel]}"; done
  echo "$line" >> "$OUT/ab-selectors.txt"
  for sel in $sels; do grep -E "^cuda" "$OUT/bench-$sel-$w-$ctx-1.log" | head -1 | sed "s/^/  $sel: /" >> "$OUT/ab-selectors.txt"; done
  unset p50s
done
cat "$OUT/ab-selectors.txt"
