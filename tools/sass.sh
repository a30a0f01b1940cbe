#!/bin/bash
# SASS of a CUDA kernel built here (no GPU needed): fetches cuobjdump and nvdisasm from PyPI once (the CUDA Toolkit
# on the development machine has nvcc and ptxas only), then prints the kernel's instructions and an opcode histogram.
#
#   tools/sass.sh OBJECT REGEX [--full | --loops]
#     OBJECT  a CUDA object file, e.g. build-gpu/CMakeFiles/quest_cuda.dir/kernels/gemv_int4.cu.o
#     REGEX   matched against the mangled kernel names (the first match is shown), e.g. 'gemv_int4_stream_kernel'
#     --full  print the whole listing (default: the histogram and the list of branches / loads / MMAs)
#     --loops for each loop (a backward branch), its length in instructions, its registers and stack, and where in it
#             the global / shared loads, barriers, shuffles and MMAs sit (position: opcode): e.g. whether a GEMV's
#             refills follow each chunk or were moved to the end of the item
#
# Registers and spills: ptxas -v (e.g. `eval "${cmd/ -c / -Xptxas -v -c }"` on the object's ninja command).
set -eu
[ $# -ge 2 ] || { sed -n 2,10p "$0"; exit 2; }
obj=$1 regex=$2 full=${3:-}
tools=${QUEST_SASS_TOOLS:-$HOME/.cache/quest-sass-tools}
if [ ! -x "$tools/nvidia/cu13/bin/nvdisasm" ]; then
  mkdir -p "$tools/whl"
  pip download --quiet --no-deps -d "$tools/whl" nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm
  for w in "$tools"/whl/*.whl; do python3 -m zipfile -e "$w" "$tools"; done
  chmod +x "$tools"/nvidia/cu13/bin/*
fi
export PATH="$tools/nvidia/cu13/bin:$PATH"
name=$(cuobjdump -sass "$obj" | grep -o "Function : [^ ]*" | sed 's/Function : //' | grep -E -m1 "$regex") || {
  echo "no kernel matching '$regex' in $obj" >&2
  exit 1
}
listing=$(cuobjdump -sass -fun "$name" "$obj")
echo "$name"
if [ "$full" = "--full" ]; then
  echo "$listing"
  exit 0
fi
if [ "$full" = "--loops" ]; then
  cuobjdump -res-usage -fun "$name" "$obj" | grep -oE 'REG:[0-9]+|STACK:[0-9]+' | tr '\n' ' '
  echo
  # Instructions as "address opcode-and-operands"; a branch to a lower address closes a loop.
  echo "$listing" | grep -oE '^\s+/\*[0-9a-f]+\*/\s+[^;]+' | sed -E 's/^\s+\/\*([0-9a-f]+)\*\/\s+/\1 /' | awk '
    function hex(h,   v, k) { v = 0; for (k = 1; k <= length(h); ++k) v = v * 16 + index("0123456789abcdef", substr(h, k, 1)) - 1; return v }
    { addr[NR] = hex($1); line[NR] = $0; n = NR }
    END {
      for (i = 1; i <= n; ++i) {
        if (line[i] !~ /BRA 0x/) continue
        t = line[i]; sub(/.*BRA 0x/, "", t); sub(/[^0-9a-f].*/, "", t); target = hex(t)
        if (target >= addr[i]) continue
        for (s = 1; s <= i && addr[s] < target; ++s) {}
        printf "loop %04x..%04x: %d instructions\n ", target, addr[i], i - s + 1
        for (j = s; j <= i; ++j) {
          if (line[j] !~ /(LDG|LDS|LDSM|LDGSTS|BAR|SHFL|HMMA|ATOMS|STS|STG)/) continue
          op = line[j]; sub(/^[0-9a-f]+ +/, "", op); if (op ~ /^@/) sub(/^@[!A-Z0-9]+ +/, "", op); sub(/ .*/, "", op)
          printf " %d:%s", j - s + 1, op
        }
        printf "\n"
      }
    }'
  exit 0
fi
echo "$listing" | grep -oE '^\s+/\*[0-9a-f]+\*/\s+[^;]+' | awk '{op = $2; if (op ~ /^@/) op = $3; sub(/\..*/, "", op); print op}' |
  sort | uniq -c | sort -rn | head -30
echo "-- branches, barriers, global loads / stores, MMAs (address: instruction)"
echo "$listing" | grep -E 'BRA|BAR|EXIT|LDG|STG|HMMA' | sed 's/\/\* 0x[0-9a-f]* \*\///; s/^ *//' | cut -c1-100
