#!/bin/bash
# SASS of a CUDA kernel built here (no GPU needed): fetches cuobjdump and nvdisasm from PyPI once (the CUDA Toolkit
# on the development machine has nvcc and ptxas only), then prints the kernel's instructions and an opcode histogram.
#
#   tools/sass.sh OBJECT REGEX [--full]
#     OBJECT  a CUDA object file, e.g. build-gpu/CMakeFiles/quest_cuda.dir/kernels/gemv_int4.cu.o
#     REGEX   matched against the mangled kernel names (the first match is shown), e.g. 'gemv_int4_stream_kernel'
#     --full  print the whole listing (default: the histogram and the list of branches / loads / MMAs)
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
echo "$listing" | grep -oE '^\s+/\*[0-9a-f]+\*/\s+[^;]+' | awk '{op = $2; if (op ~ /^@/) op = $3; sub(/\..*/, "", op); print op}' |
  sort | uniq -c | sort -rn | head -30
echo "-- branches, barriers, global loads / stores, MMAs (address: instruction)"
echo "$listing" | grep -E 'BRA|BAR|EXIT|LDG|STG|HMMA' | sed 's/\/\* 0x[0-9a-f]* \*\///; s/^ *//' | cut -c1-100
