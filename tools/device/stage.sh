#!/bin/bash
# Here (the development machine): build the CUDA binaries for sm_90 and stage what the GPU machine needs in
# .device-bin (binaries, the demo model, stories260K from ../shared) and .device-deps (Debian runtime libraries).
set -eu
cd "$(dirname "$0")/../.."
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DQUEST_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 > /dev/null
cmake --build build-gpu -j2 --target quest quest_cuda_tests quest_kernel_bench demo_model
rm -rf .device-bin && mkdir -p .device-bin/shared/models
cp build-gpu/quest build-gpu/tests/quest_cuda_tests build-gpu/tests/quest_kernel_bench .device-bin/
cp -r build-gpu/models/demo-random .device-bin/demo-random
[ -d ../shared/models/stories260K ] && cp -r ../shared/models/stories260K .device-bin/shared/models/
[ -d .device-deps ] || ../shared/device/fetch-debs.sh .device-deps
du -sh .device-bin .device-deps
