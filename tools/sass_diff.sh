#!/bin/bash
# Per-kernel SASS comparison of two CUDA object files (no GPU needed): for every kernel function of NEW, whether its
# instruction listing equals the one of the same kernel in OLD (addresses, encodings and the per-file hash of
# anonymous namespaces stripped), then the kernels only in OLD. Exit status 1 when a kernel of NEW differs or is
# missing from OLD.
#
#   tools/sass_diff.sh OLD.o NEW.o
#     e.g. tools/sass_diff.sh /work/base/build-gpu/CMakeFiles/quest_cuda.dir/kernels/gemv_int4.cu.o \
#          build-gpu/CMakeFiles/quest_cuda.dir/kernels/linear/gemv_int4.cu.o
#
# cuobjdump comes from PATH, or from PyPI once as in tools/sass.sh.
set -eu
[ $# -eq 2 ] || { sed -n 2,10p "$0"; exit 2; }
old=$1 new=$2
if ! command -v cuobjdump > /dev/null; then
  tools=${QUEST_SASS_TOOLS:-$HOME/.cache/quest-sass-tools}
  if [ ! -x "$tools/nvidia/cu13/bin/cuobjdump" ]; then
    mkdir -p "$tools/whl"
    pip download --quiet --no-deps -d "$tools/whl" nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm
    for w in "$tools"/whl/*.whl; do python3 -m zipfile -e "$w" "$tools"; done
    chmod +x "$tools"/nvidia/cu13/bin/*
  fi
  export PATH="$tools/nvidia/cu13/bin:$PATH"
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# One file per kernel: its instructions without the /*addr*/ prefix and the /* 0x... */ encoding lines. Names (and
# symbol references inside the listing) with the anonymous namespace's per-file token replaced, e.g.
# 45_GLOBAL__N__1a47099e_12_gemv_int4_cu_38011558 -> _GLOBAL__N_.
split_sass() {  # object, output folder
  mkdir -p "$2"
  cuobjdump -sass "$1" | sed -E 's/[0-9]+_GLOBAL__N__[0-9a-f]+_[0-9]+_[A-Za-z0-9_]+_cu_[0-9a-f]{8}/_GLOBAL__N_/g' |
    awk -v dir="$2" '
      /Function : / { name = $0; sub(/.*Function : /, "", name); sub(/[ \t].*/, "", name); f = dir "/" (++n);
                      print name > (dir "/names." n); close(dir "/names." n); next }
      f != "" && /^[ \t]+\/\*[0-9a-f]+\*\// {
        line = $0; sub(/^[ \t]+\/\*[0-9a-f]+\*\/[ \t]+/, "", line); sub(/[ \t]*\/\* 0x[0-9a-f]+ \*\/[ \t]*$/, "", line)
        print line > f
      }'
  for nf in "$2"/names.*; do
    [ -e "$nf" ] || continue
    i=${nf##*.}
    mv "$2/$i" "$2/k.$(md5sum < "$nf" | cut -c1-16)" 2> /dev/null || : > "$2/k.$(md5sum < "$nf" | cut -c1-16)"
    cat "$nf" >> "$2/index"
    echo "$(md5sum < "$nf" | cut -c1-16) $(cat "$nf")" >> "$2/map"
  done
}
split_sass "$old" "$tmp/old"
split_sass "$new" "$tmp/new"
status=0 same=0 diff=0
while read -r key name; do
  if [ ! -e "$tmp/old/k.$key" ]; then
    echo "only in new: $name"
    status=1
  elif cmp -s "$tmp/old/k.$key" "$tmp/new/k.$key"; then
    echo "identical ($(wc -l < "$tmp/new/k.$key") instructions): $name"
    same=$((same + 1))
  else
    echo "DIFFERENT: $name"
    diff=$((diff + 1))
    status=1
  fi
done < "$tmp/new/map"
only_old=0
while read -r key name; do
  [ -e "$tmp/new/k.$key" ] || { echo "only in old: $name"; only_old=$((only_old + 1)); }
done < "$tmp/old/map"
echo "summary: $same identical, $diff different, $(grep -c . "$tmp/new/map") in new, $only_old only in old"
exit $status
