#!/usr/bin/env python3
"""transformers' GGUF-to-tokenizers conversion of a SentencePiece ("llama") GGUF vocabulary against sentencepiece.

A second oracle for tokenizer/spm_gguf.cpp (the first, in tests/test_spm_gguf.cpp, is libsentencepiece): for each
(GGUF, tokenizer.model) pair, every line of tests/fixtures/tokenizer/bpe/corpus.jsonl is encoded (with BOS) and
decoded (skipping control tokens) by AutoTokenizer.from_pretrained(dir, gguf_file=...) and by sentencepiece; the
lines that differ are counted and the first few printed. It checks the conversion, not quest; nothing is written.

Usage (needs transformers, torch, gguf, sentencepiece):
  python3 tools/check_spm_gguf_hf.py [GGUF TOKENIZER_MODEL]...
Without arguments: tests/fixtures/gguf/spm_demo.gguf against demo-512.model, and, when
`tools/make_gguf_fixtures.py --shared build/gguf-shared` has run, stories260K and Llama-2 against ../shared.
"""
import json
import pathlib
import sys

import sentencepiece as spm
from transformers import AutoTokenizer

ROOT = pathlib.Path(__file__).resolve().parent.parent


def pairs() -> list[tuple[pathlib.Path, pathlib.Path]]:
    if len(sys.argv) > 1:
        a = [pathlib.Path(x) for x in sys.argv[1:]]
        return list(zip(a[0::2], a[1::2]))
    out = [(ROOT / "tests/fixtures/gguf/spm_demo.gguf", ROOT / "tests/fixtures/tokenizer/demo-512.model")]
    shared, built = ROOT.parent / "shared/models", ROOT / "build/gguf-shared"
    for g, m in (("stories260K.gguf", "stories260K/tokenizer.model"),
                 ("llama2-vocab.gguf", "llama2-tokenizer/tokenizer.model")):
        if (built / g).exists() and (shared / m).exists():
            out.append((built / g, shared / m))
    return out


def main() -> None:
    lines = [json.loads(x) for x in (ROOT / "tests/fixtures/tokenizer/bpe/corpus.jsonl").read_text(encoding="utf-8").split("\n") if x]
    for gguf, model in pairs():
        sp = spm.SentencePieceProcessor(model_file=str(model))
        hf = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        ids_diff, dec_diff, shown = 0, 0, 0
        for i, text in enumerate(lines):
            want = [sp.bos_id()] + sp.encode(text)
            got = hf(text)["input_ids"]
            if got != want:
                ids_diff += 1
                if shown < 4:
                    shown += 1
                    print(f"  {gguf.name} line {i} {text[:60]!r}:\n    hf {got[:16]}\n    sp {want[:16]}")
            if hf.decode(want, skip_special_tokens=True) != sp.decode(want):
                dec_diff += 1
                if shown < 8:
                    shown += 1
                    print(f"  {gguf.name} decode line {i}: hf {hf.decode(want, skip_special_tokens=True)[:60]!r} "
                          f"sp {sp.decode(want)[:60]!r}")
        print(f"{gguf.name}: {len(lines)} lines, ids differ on {ids_diff}, decode differs on {dec_diff}")


if __name__ == "__main__":
    main()
