# Sourced by the GPU-machine scripts (gpu_check.sh, soak.sh, ncu.sh), from the repository root: unpacks what
# tools/device/stage.sh packed (.device-pack/db.txz -> .device-bin; .device-pack/old.txz -> .device-old, the "old"
# side of an A/B when stage.sh --old made one), unpacks the Debian runtime libraries of .device-deps into /tmp/deps
# (never into /), sets OUT (results, default /tmp/quest-out) and BIN (the binaries, default .device-bin), and exports
# LD_LIBRARY_PATH, PATH (compute-sanitizer) and the test suite's QUEST_* folders.
# Carry [".device-pack", ".device-deps"] with the device tool (at most 64 MiB together with the tracked tree).
if [ ! -d .device-bin ]; then
  if [ -f .device-pack/db.txz ]; then xz -dc .device-pack/db.txz | tar xf -
  elif [ -f .device-pack/db.tgz ]; then tar xzf .device-pack/db.tgz  # packs made before xz
  fi
fi
[ ! -d .device-old ] && [ -f .device-pack/old.txz ] && xz -dc .device-pack/old.txz | tar xf -
mkdir -p /tmp/deps
for f in .device-deps/*.deb; do [ -f "$f" ] && dpkg -x "$f" /tmp/deps; done
export LD_LIBRARY_PATH=/tmp/deps/usr/lib/x86_64-linux-gnu:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export PATH=$PATH:/usr/local/cuda/bin
# NCCL (the tensor-parallel backend links libnccl.so.2): the toolkit's, else the PyPI wheel's (nvidia-nccl-cu13).
if [ ! -e /usr/local/cuda/lib64/libnccl.so.2 ]; then
  nccl_lib=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
  [ -n "$nccl_lib" ] && export LD_LIBRARY_PATH=$nccl_lib:$LD_LIBRARY_PATH
fi
# NVLink multicast stays off on these shared hosts (KINDS.md).
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/quest-out}
mkdir -p "$OUT"
BIN=${BIN:-$PWD/.device-bin}
export QUEST_SOURCE_DIR=$PWD QUEST_DEMO_MODEL=$PWD/.device-bin/demo-random QUEST_SHARED_DIR=$PWD/.device-bin/shared
