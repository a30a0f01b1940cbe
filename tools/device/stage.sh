#!/bin/bash
# Here (the development machine): build the CUDA binaries for sm_90 and stage what the GPU machine needs in
# .device-bin (binaries, the demo model, stories260K from ../shared) and .device-deps (Debian runtime libraries).
# The device tool carries at most 64 MiB: .device-pack/db.tgz holds .device-bin compressed (~29 MB); carry
# [".device-pack", ".device-deps"] and the scripts unpack it when .device-bin is absent.
set -eu
cd "$(dirname "$0")/../.."
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DQUEST_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 > /dev/null
cmake --build build-gpu -j2 --target quest quest_cuda_tests quest_kernel_bench demo_model
rm -rf .device-bin && mkdir -p .device-bin/shared/models
cp build-gpu/quest build-gpu/tests/quest_cuda_tests build-gpu/tests/quest_kernel_bench .device-bin/
cp -r build-gpu/models/demo-random .device-bin/demo-random
[ -d ../shared/models/stories260K ] && cp -r ../shared/models/stories260K .device-bin/shared/models/
[ -d .device-deps ] || ../shared/device/fetch-debs.sh .device-deps
mkdir -p .device-pack && tar czf .device-pack/db.tgz .device-bin
du -sh .device-bin .device-pack .device-deps
