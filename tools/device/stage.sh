#!/bin/bash
# Here (the development machine): build the CUDA binaries for sm_90 and stage what the GPU machine needs in
# .device-bin (binaries, the demo model, stories260K from ../shared) and .device-deps (Debian runtime libraries).
# The device tool carries at most 64 MiB with the tracked tree: .device-pack/db.txz holds .device-bin (xz, ~29 MB);
# carry [".device-pack", ".device-deps"] and the scripts (tools/device/env.sh) unpack it on the GPU machine.
#
#   tools/device/stage.sh --old         before a change: pack `quest` of the tree as it is now (~9 MB) as
#                                       .device-pack/old.txz, the "old" side of gpu_check.sh's ab stage
#   tools/device/stage.sh --old-bench   the same with quest_kernel_bench (~18 MB; .device-old/ on the GPU machine)
#   tools/device/stage.sh               after it: the new binaries, the models, the runtime libraries
set -eu
cd "$(dirname "$0")/../.."
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DQUEST_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 > /dev/null
mkdir -p .device-pack
if [ "${1:-}" = --old ] || [ "${1:-}" = --old-bench ]; then
  cmake --build build-gpu -j2 --target quest quest_kernel_bench
  rm -rf .device-old && mkdir .device-old
  cp build-gpu/quest .device-old/
  [ "$1" = --old ] || cp build-gpu/tests/quest_kernel_bench .device-old/
  git log -1 --format='%h %s' > .device-old/COMMIT 2>/dev/null || true
  [ -z "$(git status --porcelain --untracked-files=no 2>/dev/null)" ] ||
    echo "(with uncommitted changes)" >> .device-old/COMMIT
  tar cf - .device-old | xz -T2 -6 > .device-pack/old.txz
  rm -rf .device-old
  du -sh .device-pack/old.txz
  exit 0
fi
cmake --build build-gpu -j2 --target quest quest_cuda_tests quest_kernel_bench demo_model
rm -rf .device-bin && mkdir -p .device-bin/shared/models
cp build-gpu/quest build-gpu/tests/quest_cuda_tests build-gpu/tests/quest_kernel_bench .device-bin/
cp -r build-gpu/models/demo-random .device-bin/demo-random
[ -d ../shared/models/stories260K ] && cp -r ../shared/models/stories260K .device-bin/shared/models/
[ -d .device-deps ] || ../shared/device/fetch-debs.sh .device-deps
rm -f .device-pack/db.tgz
tar cf - .device-bin | xz -T2 -6 > .device-pack/db.txz
du -sh .device-bin .device-pack/* .device-deps
# What the device tool will carry: the tracked tree (its untracked, unignored files too) plus the two folders.
tree=$(git ls-files -z --cached --others --exclude-standard | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
total=$((tree + $(du -sb .device-pack | cut -f1) + $(du -sb .device-deps | cut -f1)))
echo "carry: $((total / 1048576)) MiB of 64 (tree $((tree / 1048576)) MiB)"
[ "$total" -le $((64 * 1048576)) ] ||
  echo "warning: over the device tool's 64 MiB: drop .device-pack/old.txz or shrink the pack"
