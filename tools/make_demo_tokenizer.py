#!/usr/bin/env python3
"""Trains the tokenizer of quest's embedded demo model: tests/fixtures/tokenizer/demo-512.model.

A 512-piece SentencePiece BPE model over tools/data/demo_corpus.txt (original children's-story text written for this
project), set up like Llama-2's tokenizer: byte fallback, identity normalization, a dummy-prefix space, spaces kept
as they are, digits split, <unk>=0 <s>=1 </s>=2 and no pad. Training is single-threaded and unshuffled, and the
corpus is passed as an iterator so that no file path ends up in the model, so the same sentencepiece version gives
the same bytes on every run.

Usage: pip install sentencepiece; python3 tools/make_demo_tokenizer.py [--corpus FILE] [--output FILE]
"""

import argparse
import io
import pathlib
import sys

import sentencepiece as spm

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
from make_retrieval_data import train_llama_style_spm  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=pathlib.Path, default=ROOT / "tools" / "data" / "demo_corpus.txt")
    parser.add_argument("--output", type=pathlib.Path, default=ROOT / "tests" / "fixtures" / "tokenizer" / "demo-512.model")
    args = parser.parse_args()

    # One sentence per non-empty line; SentencePiece would skip the empty ones anyway.
    lines = [line for line in args.corpus.read_text(encoding="utf-8").splitlines() if line.strip()]
    if not lines:
        print(f"error: {args.corpus} has no text", file=sys.stderr)
        return 1

    model = io.BytesIO(train_llama_style_spm(lines, 512, 4192))

    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_bytes(model.getvalue())

    sp = spm.SentencePieceProcessor(model_proto=model.getvalue())
    sample = "Once upon a time, a little frog sat on a log."
    ids = sp.encode(sample)
    assert sp.vocab_size() == 512 and sp.bos_id() == 1 and sp.eos_id() == 2 and sp.unk_id() == 0
    assert sp.decode(ids) == sample
    print(f"wrote {args.output} ({len(model.getvalue())} bytes, sentencepiece {spm.__version__}); "
          f"{sample!r} -> {len(ids)} tokens")
    return 0


if __name__ == "__main__":
    sys.exit(main())
