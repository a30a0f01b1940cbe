#!/bin/bash
# Long-decode soak on the GPU machine (the device tool), from the repository root, with .device-bin and .device-deps
# carried (run tools/device/stage.sh here first: the binary must have `quest soak`). Phases (default: fill limit reset
# quest); each writes its log and CSV to $OUT and the summary is printed last.
#
#   quest  Llama-2-7B shape (configs/llama2-7b.json, random FP16 weights), context 128K, Quest B=2048 S=16, greedy:
#          QUEST_TOKENS (100000) decode steps after a 16-token prompt; every step's logits checked finite; latency
#          per 4096-position bucket against the bytes model.                                  ~9 min on an H200
#   full   the same with full attention, FULL_TOKENS (24000) steps after a FULL_START-token (100000) random prompt:
#          the far end of the 128K context, where the KV read dominates. ~8 min. A full-attention decode of all of
#          0..100K takes ~18 min: three calls, FULL_START=16 FULL_TOKENS=45000, then 45000/35000, then 80000/25000.
#   fill   the demo model on a 512-token context, asked for 100000 tokens: must stop with "the context is full"
#          (soak and generate).                                                                 seconds
#   limit  the 7B shape at 128K with --memory-limit 20GiB: must be refused (exit 2) by the memory plan with its
#          numbers, before anything is allocated.                                               seconds
#   reset  chat on the demo model, 100 answers each followed by /reset, device memory sampled with nvidia-smi:
#          must stay flat (no leak across generate calls).                                      ~1 min
#
# Each phase stops cleanly before DEADLINE seconds (default 585) from the script's start (quest soak --time-limit),
# so a 600 s call always returns its logs; a phase that ran short says how far it got.
#   e.g. the device tool: command "bash tools/device/soak.sh quest", carry [".device-pack", ".device-deps"]
#        then                "bash tools/device/soak.sh fill limit reset full"
# A dry run of the script on the CPU: BIN=build BACKEND=cpu SOAK_CONFIG=configs/demo-random-model.json CONTEXT=2048
#   QUEST_TOKENS=300 FULL_START=1500 FULL_TOKENS=200 tools/device/soak.sh fill quest full   (limit/reset need a GPU)
set -u
. "$(dirname "$0")/env.sh"
BIN=$(cd "$BIN" && pwd)
BACKEND=${BACKEND:-cuda}
SOAK_CONFIG=${SOAK_CONFIG:-configs/llama2-7b.json}
CONTEXT=${CONTEXT:-131072}
DEMO=${DEMO:-$BIN/demo-random}
[ -d "$DEMO" ] || DEMO=$BIN/models/demo-random
DEADLINE=${DEADLINE:-585}
QUEST_TOKENS=${QUEST_TOKENS:-100000}
FULL_START=${FULL_START:-100000}
FULL_TOKENS=${FULL_TOKENS:-24000}
phases=${*:-fill limit reset quest}
start=$(date +%s)
left() { echo $(( DEADLINE - ($(date +%s) - start) - 5 )); }
summary=()
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem,driver_version --format=csv,noheader 2>/dev/null
git log -1 --format='commit %h %s' 2>/dev/null
"$BIN/quest" soak --help > /dev/null 2>&1 || { echo "error: $BIN/quest has no soak subcommand: run tools/device/stage.sh"; exit 2; }

soak_7b() {  # name, extra flags...
  local name=$1
  shift
  local t
  t=$(left)
  if [ "$t" -lt 60 ]; then summary+=("$name: skipped, ${t} s left before DEADLINE"); return; fi
  "$BIN/quest" soak -m "$SOAK_CONFIG" --random-weights --backend "$BACKEND" -c "$CONTEXT" --bucket 4096 \
    --page-size 16 --time-limit "$t" --csv "$OUT/soak-$name.csv" "$@" > "$OUT/soak-$name.log" 2>&1
  local rc=$?
  summary+=("$name: rc=$rc; $(grep -E '^soak: [0-9]+ decode steps|^latency:|^every logit|^FAILED|^stopped' \
    "$OUT/soak-$name.log" | tr '\n' ' ')")
}

for p in $phases; do
  case $p in
    quest)
      soak_7b quest --budget 2048 --prompt-tokens 16 --tokens "$QUEST_TOKENS"
      ;;
    full)
      soak_7b full --full-attention --prompt-tokens "$FULL_START" --tokens "$FULL_TOKENS"
      ;;
    fill)
      {
        "$BIN/quest" soak -m "$DEMO" --backend "$BACKEND" -c 512 --tokens 100000 --prompt-tokens 8 --bucket 128
        echo "soak rc=$?"
        "$BIN/quest" generate -m "$DEMO" --backend "$BACKEND" -c 64 -n 500 --temp 0 -p "Once upon a time"
        echo "generate rc=$?"
      } > "$OUT/fill.log" 2>&1
      summary+=("fill: $(grep -cE 'the context is full' "$OUT/fill.log") of 2 runs stopped at a full context; \
$(grep -E 'rc=|^stopped|context is full' "$OUT/fill.log" | tr '\n' ' ')")
      ;;
    limit)
      "$BIN/quest" soak -m configs/llama2-7b.json --random-weights --backend cuda -c 131072 --tokens 10 \
        --memory-limit 20GiB > "$OUT/limit.log" 2>&1
      summary+=("limit: rc=$? (want 2) $(grep -E '^error' "$OUT/limit.log" | head -1)")
      ;;
    reset)
      for i in $(seq 100); do printf 'Once upon a time there was a %d\n/reset\n' "$i"; done > /tmp/reset-in.txt
      "$BIN/quest" chat -m "$DEMO" --backend "$BACKEND" -n 32 --temp 0 < /tmp/reset-in.txt \
        > /tmp/reset-out.txt 2> "$OUT/reset.log" &
      pid=$!
      : > /tmp/reset-mem.txt
      while kill -0 $pid 2>/dev/null; do
        nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits 2>/dev/null |
          awk -F', *' -v p=$pid '$1 == p {print $2}' >> /tmp/reset-mem.txt
        sleep 0.2
      done
      wait $pid
      rc=$?
      resets=$(grep -c 'conversation reset' "$OUT/reset.log")
      mem=$(sort -n /tmp/reset-mem.txt | awk 'NR == 1 {lo = $1} {hi = $1; n++} END {printf "%d samples, %s..%s MiB", n, lo, hi}')
      echo "device memory (MiB, nvidia-smi per process): $mem" >> "$OUT/reset.log"
      summary+=("reset: rc=$rc, $resets resets, device memory $mem (flat: equal ends)")
      ;;
    *)
      echo "unknown phase '$p' (phases: quest full fill limit reset)"
      ;;
  esac
done
echo
echo "==== soak summary ($(( $(date +%s) - start )) s) ===="
for l in "${summary[@]}"; do echo "$l"; done
for n in quest full; do
  [ -f "$OUT/soak-$n.log" ] && { echo "--- $n"; grep -E '^positions' "$OUT/soak-$n.log" | awk 'NR % 4 == 1'; }
done
true
