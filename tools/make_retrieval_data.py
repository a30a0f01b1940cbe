#!/usr/bin/env python3
"""Synthetic long-context retrieval text for quest's trained demo model (docs/training.md).

Documents are children's-story filler (sentences generated from templates and the word lists below, plus the
project's own stories in tools/data/demo_corpus.txt) with facts hidden in it and questions at the end:

  passkey   one 5-digit pass key at a random depth, asked for at the end. A share of the documents is built
            token for token like `quest eval passkey` builds its prompts (engine/eval.cpp: the task line, the
            repeated " The grass is green. ..." filler, the needle " The pass key is K. Remember it. K is the pass
            key." and the question " What is the pass key? The pass key is", each encoded on its own); the rest
            vary the filler, the needle and the question so that the model does not learn one template.
  multikey  4-16 key-value facts ("The code for the red door is 4821.") among distractors that share a colour or
            an object with each other, then one to three questions ("What is the code for the blue door? The code
            for the blue door is 7310."). Issue 8 measures page selection on this task.

A document is a list of segments; each segment is encoded with the tokenizer (SentencePiece, or a Hugging Face
tokenizer.json with --tokenizer path/tokenizer.json, e.g. SmolLM2's) on its own and the ids are
concatenated (what the engine's prompt builder does), so a sample's ids are exact and cheap to build: the filler
sentences are encoded once and drawn from a pool.

Subcommands (every one deterministic for a given --seed):
  corpus     write the tokenizer's training text
  tokenizer  train the project's SentencePiece tokenizer on that text (BPE, byte fallback, split digits)
  samples    print a few documents (text and token counts) to look at
  eval-set   write an evaluation set as JSONL: text and token ids of the prefill, the question and the answer
  ppl-text   write the held-out stories (not used for training) for `quest eval ppl --text`

Usage: python3 tools/make_retrieval_data.py tokenizer [--vocab 2048] [--out tools/data/retrieval-tokenizer.model]
       python3 tools/make_retrieval_data.py eval-set --task multikey --contexts 1024,4096 --keys 4,8,16 \\
           --samples 50 --tokenizer models/demo/tokenizer.model --out multikey.jsonl
"""

import argparse
import io
import json
import pathlib
import random
import re
import sys

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
CORPUS = ROOT / "tools" / "data" / "demo_corpus.txt"
DEFAULT_TOKENIZER = ROOT / "tools" / "data" / "retrieval-tokenizer.model"

# ---------------------------------------------------------------------------------------------------------------------
# The engine's passkey prompt (engine/eval.cpp), verbatim
# ---------------------------------------------------------------------------------------------------------------------

ENGINE_TASK = ("There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. I will "
               "quiz you about the important information there.")
ENGINE_FILLER = " The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
ENGINE_QUESTION = " What is the pass key? The pass key is"


def engine_needle(key):
    return f" The pass key is {key}. Remember it. {key} is the pass key."


# ---------------------------------------------------------------------------------------------------------------------
# Words and templates (written for this project)
# ---------------------------------------------------------------------------------------------------------------------

NAMES = ("Mia Sam Toby Lily Ben Zoe Max Ruby Leo Ella Finn Nora Jack Ivy Omar Luna Theo Rosa Hugo Anna Kit Bea Otto "
         "Lena Milo Ada Noah Iris Eli Maya Tom Nina Ravi Sara Jude Cleo Ezra Wren Abel Dora").split()
ANIMALS = ("cat dog frog bear fox owl duck rabbit mouse bird turtle goat pig horse cow hen lamb deer squirrel bee "
           "snail crab fish whale seal otter badger hedgehog puppy kitten pony tiger lion zebra monkey panda").split()
COLORS = ("red blue green yellow orange purple pink brown black white gray silver golden").split()
OBJECTS = ("door box car kite boat ball cup hat bag book chair lamp bike drum bell key shoe coat tent cart basket "
           "bottle clock gate window jar sock rope flag kettle ladder").split()
PLACES = ("the park|the forest|the river|the garden|the beach|the farm|the hill|the pond|the village|the kitchen|"
          "the barn|the school|the market|the library|the meadow|the lake|the orchard|the bakery|the harbor|"
          "the attic|the cave|the field|the island|the valley|the bridge").split("|")
ADJS = ("little big happy sleepy brave tiny shiny quiet kind funny fluffy soft old young clever busy gentle "
        "curious tired hungry warm cold bright round tall").split()
FOODS = ("apples bread honey soup carrots cookies berries cheese pears cake rice beans plums nuts pie milk").split()
THINGS = ("a stone|a feather|a shell|a leaf|a flower|a stick|a ribbon|a coin|a map|a bucket|a blanket|a pebble|"
          "a song|a letter|a puzzle|a lantern|a seed|a nest|a button|a crayon").split("|")
TIMES = ("In the morning|At noon|In the evening|At night|On Monday|On Tuesday|On a rainy day|After lunch|"
         "Before dinner|One sunny day|Later that day|The next day|Every spring|In the winter|At dawn").split("|")
WEATHER = ("the sun was warm|the wind was soft|the rain fell slowly|the snow was deep|the clouds were gray|"
           "the air smelled sweet|the sky was clear|the stars were bright|the fog was thick").split("|")
VERBS_PAST = ("walked to|ran to|hopped to|looked at|sang near|played in|rested near|danced in|waited by|"
              "climbed up|swam across|drew a picture of|read a book in|ate lunch in").split("|")
FEELINGS = "happy sad proud scared calm excited surprised sleepy glad brave".split()

TEMPLATES = (
    "{Name} had a {adj} {animal} named {Name2}.",
    "The {adj} {animal} {verb} {place}.",
    "{Time}, {Name} {verb} {place}.",
    "{Time}, {weather}.",
    "{Name} found {thing} near {place}.",
    "The {color} {object} was next to the {color2} {object2}.",
    "{Name} and {Name2} shared some {food} with a {adj} {animal}.",
    "{Name} felt {feeling} because {weather}.",
    "\"Look at the {adj} {animal}!\" said {Name}.",
    "\"Can we go to {place}?\" asked {Name}.",
    "The {animal} liked {food} more than anything.",
    "{Name} put {thing} in the {color} {object}.",
    "There was a {adj} {animal} who lived in {place}.",
    "{Name} counted {n} {animal}s by {place}.",
    "The {animal} and the {animal2} were good friends.",
    "{Name}'s {object} was {color} and {adj}.",
    "{Time}, the {animal} found {thing}.",
    "{Name} smiled and gave {thing} to {Name2}.",
    "Everyone in {place} was {feeling}.",
    "The {adj} {object} made a funny sound.",
    "{Name} wanted to paint the {object} {color}.",
    "A {color} bird sat on the {object}.",
    "{Name2} told a story about a {adj} {animal}.",
    "They walked home together, and {weather}.",
    "{Name} baked {food} for the whole family.",
    "The {animal} was too {adj} to climb the {object}.",
    "{Time}, {Name} and the {animal} {verb} {place}.",
    "{Name} said, \"I like the {color} {object} best.\"",
    "It took {n} days to walk to {place}.",
    "The {animal} hid behind the {color} {object}.",
)

# Pass-key needles and questions (besides the engine's); the question always ends just before the key.
NEEDLES = (
    " The pass key is {key}. Remember it. {key} is the pass key.",
    "The pass key is {key}. Remember it. {key} is the pass key.",
    "The pass key is {key}. Remember it.",
    "Remember this: the pass key is {key}.",
    "The secret pass key is {key}. Keep it safe.",
    "Here is the pass key: {key}. The pass key is {key}.",
    "{Name} whispered, \"The pass key is {key}.\"",
    "Note that the pass key is {key}.",
)
QUESTIONS = (
    " What is the pass key? The pass key is",
    "What is the pass key? The pass key is",
    "What was the pass key? The pass key is",
    "Do you remember the pass key? The pass key is",
    "Tell me the pass key. The pass key is",
)
TASKS = (
    ENGINE_TASK,
    "There is a pass key hidden in the story below. Find it and remember it.",
    "Read the story and remember the numbers in it. I will ask about them.",
    "Some facts are hidden in this text. Remember them.",
)

# Key-value facts. Each family: (fact, question that ends right before the value).
FACT_FAMILIES = (
    ("The code for the {color} {object} is {value}.",
     "What is the code for the {color} {object}? The code for the {color} {object} is"),
    ("The number on the {color} {object} is {value}.",
     "What is the number on the {color} {object}? The number on the {color} {object} is"),
    ("{Name}'s lucky number is {value}.",
     "What is {Name}'s lucky number? {Name}'s lucky number is"),
)


def fill_template(rng, template):
    n1, n2 = rng.sample(NAMES, 2)
    a1, a2 = rng.sample(ANIMALS, 2)
    c1, c2 = rng.sample(COLORS, 2)
    o1, o2 = rng.sample(OBJECTS, 2)
    return template.format(
        Name=n1, Name2=n2, animal=a1, animal2=a2, color=c1, color2=c2, object=o1, object2=o2,
        adj=rng.choice(ADJS), place=rng.choice(PLACES), verb=rng.choice(VERBS_PAST), food=rng.choice(FOODS),
        thing=rng.choice(THINGS), Time=rng.choice(TIMES), weather=rng.choice(WEATHER),
        feeling=rng.choice(FEELINGS), n=rng.randint(2, 12))


def read_stories(path=CORPUS):
    """The corpus as stories (title, then paragraphs; blank lines between), each a list of sentences."""
    text = pathlib.Path(path).read_text(encoding="utf-8")
    stories, cur = [], []
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        # A title: a short line without final punctuation.
        if not re.search(r"[.!?\"]$", line) and len(line.split()) <= 8:
            if cur:
                stories.append(cur)
            cur = []
            continue
        cur.extend(s for s in re.split(r"(?<=[.!?])\s+(?=[A-Z\"])|(?<=[.!?]\")\s+", line) if s)
    if cur:
        stories.append(cur)
    return stories


def split_stories(stories):
    """Training stories and held-out ones (every sixth story, for perplexity)."""
    train = [s for i, s in enumerate(stories) if i % 6 != 5]
    held = [s for i, s in enumerate(stories) if i % 6 == 5]
    return train, held


# ---------------------------------------------------------------------------------------------------------------------
# Documents as segments
# ---------------------------------------------------------------------------------------------------------------------

class Doc:
    """Segments of text; `answer[i]` marks the segments that are answers (trained harder, scored in evaluation)."""

    def __init__(self):
        self.segs, self.answer, self.filler, self.ids = [], [], [], []

    def add(self, text, answer=False, filler=False, ids=None):
        self.segs.append(text)
        self.answer.append(answer)
        self.filler.append(filler)
        self.ids.append(ids)


class Composer:
    """Builds token-exact documents of a target length. `sp` is a SentencePieceProcessor; everything random comes
    from the `random.Random` passed to each call."""

    def __init__(self, sp, seed=0, pool_size=20000, stories=None):
        self.sp = sp
        self.bos = sp.bos_id()
        self.bos_ids = [self.bos] if self.bos is not None and self.bos >= 0 else []
        rng = random.Random(seed)
        if stories is None:
            stories, _ = split_stories(read_stories())
        self.stories = stories
        pool = sorted({fill_template(rng, rng.choice(TEMPLATES)) for _ in range(pool_size)})
        pool += sorted({s for st in stories for s in st})
        self.pool_text = pool
        self.pool_ids = [np.asarray(sp.encode(s), dtype=np.int32) for s in pool]
        self.pool_len = np.asarray([len(a) for a in self.pool_ids])
        self.story_ids = [[np.asarray(sp.encode(s), dtype=np.int32) for s in st] for st in stories]
        self._cache = {}

    # -- encoding -------------------------------------------------------------------------------------------------

    def enc(self, text, cache=False):
        if cache:
            a = self._cache.get(text)
            if a is None:
                a = self._cache[text] = np.asarray(self.sp.encode(text), dtype=np.int32)
            return a
        return np.asarray(self.sp.encode(text), dtype=np.int32)

    # -- filler -----------------------------------------------------------------------------------------------------

    def filler_stream(self, rng, style):
        """An endless iterator of (text, ids) filler sentences in one of the styles."""
        if style == "engine":
            ids = self.enc(ENGINE_FILLER, cache=True)
            while True:
                yield ENGINE_FILLER, ids
        elif style == "repeat":  # a short block of sentences repeated, like the engine's filler
            block = rng.sample(range(len(self.pool_ids)), rng.randint(1, 6))
            while True:
                for i in block:
                    yield self.pool_text[i], self.pool_ids[i]
        elif style == "story":  # consecutive sentences of the project's stories, story after story
            while True:
                s = rng.randrange(len(self.stories))
                for text, ids in zip(self.stories[s], self.story_ids[s]):
                    yield text, ids
        else:  # "mixed": independent sentences from the pool
            n = len(self.pool_ids)
            while True:
                i = rng.randrange(n)
                yield self.pool_text[i], self.pool_ids[i]

    # -- documents --------------------------------------------------------------------------------------------------

    def _assemble(self, rng, head, inserts, tail, budget, style, forced=None):
        """head + filler with the `inserts` (lists of (text, is_answer)) spread at random depths (`forced`: {insert
        index: depth}) + tail, where the filler takes `budget` tokens minus everything else. Returns (Doc, depths of
        the inserts in [0, 1])."""
        doc = Doc()
        head = [(t, a, self.enc(t)) for t, a in head]
        tail = [(t, a, self.enc(t)) for t, a in tail]
        inserts = [[(t, a, self.enc(t)) for t, a in ins] for ins in inserts]
        fixed = sum(len(x) for _, _, x in head + tail) + sum(len(x) for ins in inserts for _, _, x in ins)
        room = max(0, budget - fixed)
        filler = []
        used = 0
        for text, ids in self.filler_stream(rng, style):
            if used + len(ids) > room:
                break
            filler.append((text, ids))
            used += len(ids)
        depths = [rng.random() for _ in inserts]
        for k, d in (forced or {}).items():
            depths[k] = d
        slots = sorted(((round(d * len(filler)), k) for k, d in enumerate(depths)), reverse=True)
        items = [[(t, False, True, x)] for t, x in filler]
        for pos, k in slots:
            items.insert(pos, [(t, a, False, x) for t, a, x in inserts[k]])
        for t, a, x in head:
            doc.add(t, a, False, x)
        for it in items:
            for t, a, f, x in it:
                doc.add(t, a, f, x)
        for t, a, x in tail:
            doc.add(t, a, False, x)
        real = [round(d * len(filler)) / max(1, len(filler)) for d in depths]
        return doc, real

    def passkey_engine(self, rng, context, depth=None, key=None):
        """Exactly `make_passkey_prompt` of engine/eval.cpp at `context` tokens, then the answer."""
        key = key if key is not None else rng.randint(10000, 99999)
        depth = rng.random() if depth is None else depth
        task = self.bos_ids + list(self.enc(ENGINE_TASK, cache=True))
        filler = self.enc(ENGINE_FILLER, cache=True)
        needle = self.enc(engine_needle(key))
        question = self.enc(ENGINE_QUESTION, cache=True)
        fixed = len(task) + len(needle) + len(question)
        n_fill = max(0, (context - fixed) // len(filler))
        before = int(np.floor(depth * n_fill + 0.5))  # std::lround for depth >= 0
        doc = Doc()
        doc.add(ENGINE_TASK)
        for _ in range(before):
            doc.add(ENGINE_FILLER, filler=True)
        doc.add(engine_needle(key))
        for _ in range(before, n_fill):
            doc.add(ENGINE_FILLER, filler=True)
        doc.add(ENGINE_QUESTION)
        doc.add(f"{key}.", answer=True)
        doc.meta = {"task": "passkey", "format": "engine", "key": key, "depth": depth, "answer": str(key)}
        return doc

    def passkey_varied(self, rng, length):
        key = rng.randint(10000, 99999)
        name = rng.choice(NAMES)
        needle = rng.choice(NEEDLES).format(key=key, Name=name)
        question = rng.choice(QUESTIONS)
        head = [(rng.choice(TASKS), False)] if rng.random() < 0.7 else []
        style = rng.choice(("engine", "repeat", "mixed", "mixed", "story", "story"))
        answer = f"{key}."
        tail = [(question, False), (answer, True)]
        doc, depths = self._assemble(rng, head, [[(needle, False)]], tail, length - 1, style)
        doc.meta = {"task": "passkey", "format": style, "key": key, "depth": depths[0], "answer": str(key)}
        return doc

    def multikey(self, rng, length, n_keys=None, n_questions=None, family=None, style=None, depth=None):
        # At short lengths at most about half of the document is facts (a fact is about 13 tokens).
        n_keys = n_keys or rng.randint(4, max(4, min(16, length // 26)))
        fam = FACT_FAMILIES[family if family is not None else rng.choice((0, 0, 1, 2))]
        values = rng.sample(range(1000, 10000), n_keys)
        # Keys that share colours and objects with each other (the distractors), all distinct.
        if "{Name}" in fam[0]:
            keys = [dict(Name=n) for n in rng.sample(NAMES, n_keys)]
        else:
            cs = rng.sample(COLORS, min(len(COLORS), max(2, (n_keys + 2) // 3)))
            os_ = rng.sample(OBJECTS, min(len(OBJECTS), max(2, (n_keys + 2) // 3)))
            pairs = [(c, o) for c in cs for o in os_]
            rng.shuffle(pairs)
            while len(pairs) < n_keys:  # not reached with 13 colours x 30 objects, kept for safety
                pairs.append((rng.choice(COLORS), rng.choice(OBJECTS)))
            keys = [dict(color=c, object=o) for c, o in pairs[:n_keys]]
        facts = [fam[0].format(value=v, **k) for k, v in zip(keys, values)]
        n_questions = n_questions or rng.choice((1, 1, 2, 3))
        asked = rng.sample(range(n_keys), min(n_questions, n_keys))
        head = [(rng.choice(TASKS[2:]), False)] if rng.random() < 0.5 else []
        tail = []
        for q in asked:
            tail += [(fam[1].format(**keys[q]), False), (f"{values[q]}.", True)]
        style = style or rng.choice(("mixed", "mixed", "story", "repeat", "engine"))
        doc, depths = self._assemble(rng, head, [[(f, False)] for f in facts], tail, length - 1, style,
                                     forced=None if depth is None else {asked[0]: depth})
        doc.meta = {"task": "multikey", "format": style, "n_keys": n_keys, "answer": str(values[asked[0]]),
                    "depth": depths[asked[0]], "asked": [fam[1].format(**keys[q]) for q in asked],
                    "answers": [str(values[q]) for q in asked]}
        return doc

    # -- ids ------------------------------------------------------------------------------------------------------

    def encode_doc(self, doc):
        """(ids int32, answer mask bool): every segment encoded on its own, BOS first (when the tokenizer adds one)."""
        parts = [np.asarray(self.bos_ids, dtype=np.int32)]
        mask = [np.zeros(len(self.bos_ids), dtype=bool)]
        for t, a, f, x in zip(doc.segs, doc.answer, doc.filler, doc.ids):
            ids = x if x is not None else self.enc(t, cache=f)
            parts.append(ids)
            mask.append(np.full(len(ids), a, dtype=bool))
        return np.concatenate(parts), np.concatenate(mask)

    def sample(self, rng, length, mix=(0.25, 0.30, 0.45)):
        """One training document of at most `length` tokens: engine passkey / varied passkey / multikey."""
        r = rng.random()
        if r < mix[0]:
            return self.passkey_engine(rng, length - 8)
        if r < mix[0] + mix[1]:
            return self.passkey_varied(rng, length)
        return self.multikey(rng, length)

    def batch(self, seed, batch_size, length, pad_id, mix=(0.25, 0.30, 0.45)):
        """A training batch: input ids [B, L] int32 (padded with pad_id) and per-token weights [B, L] int8:
        0 padding, 1 text, 2 answer."""
        rng = random.Random(seed)
        ids = np.full((batch_size, length), pad_id, dtype=np.int32)
        kind = np.zeros((batch_size, length), dtype=np.int8)
        for b in range(batch_size):
            x, m = self.encode_doc(self.sample(rng, length, mix))
            x, m = x[:length], m[:length]
            ids[b, :len(x)] = x
            kind[b, :len(x)] = np.where(m, 2, 1)
        return ids, kind


# ---------------------------------------------------------------------------------------------------------------------
# Evaluation sets
# ---------------------------------------------------------------------------------------------------------------------

def split_for_eval(comp, doc):
    """(prefill ids with BOS, question ids, answer ids) of a document whose last segments are question, answer[,
    question, answer...]: the prefill ends before the FIRST question, which is all that evaluation asks."""
    qi = next(i for i in range(len(doc.segs)) if doc.answer[i]) - 1
    pre = Doc()
    for t, a, f, x in zip(doc.segs[:qi], doc.answer[:qi], doc.filler[:qi], doc.ids[:qi]):
        pre.add(t, a, f, x)
    prefill, _ = comp.encode_doc(pre)
    question = comp.enc(doc.segs[qi])
    answer = comp.enc(doc.segs[qi + 1])
    return prefill, question, answer


FAMILY_NAMES = ("code", "number", "name")  # FACT_FAMILIES in order, for eval-set --family


def eval_docs(comp, task, context, n, seed, n_keys=8, style=None, family=0):
    """`n` evaluation documents, depths spread evenly from 0 to 1 (passkey: the engine's format). family: the fact
    template of multikey (an index of FACT_FAMILIES)."""
    rng = random.Random(seed * 1000003 + context * 17 + n_keys)
    docs = []
    for i in range(n):
        depth = i / (n - 1) if n > 1 else 0.5
        if task == "passkey":
            docs.append(comp.passkey_engine(rng, context, depth=depth))  # as `quest eval passkey --contexts`
        else:
            d = comp.multikey(rng, context, n_keys=n_keys, n_questions=1, family=family, style=style or "mixed",
                              depth=depth)
            docs.append(d)
    return docs


def doc_text(doc):
    """Readable text of a document's segments (engine segments carry their own leading spaces)."""
    out = ""
    for t in doc.segs:
        out += t if (t.startswith(" ") or not out) else " " + t
    return out


# --chat chatml: the prompt as one user turn of ChatML after the default system turn (SmolLM2's chat template with
# its default system message), the question's sentence ending the turn and the answer's lead-in starting the
# assistant's: "<|im_start|>system\n...<|im_end|>\n<|im_start|>user\n" + document + " " + "What is ...?" +
# "<|im_end|>\n<|im_start|>assistant\n" + "The ... is" (then the answer's ids, as without it).
CHATML_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def chat_wrap(comp, chat, prefill, question_text):
    if chat is None:
        return prefill, comp.enc(question_text)
    head = comp.enc(f"<|im_start|>system\n{CHATML_SYSTEM}<|im_end|>\n<|im_start|>user\n")
    body = prefill[1:] if comp.sp.bos_id() >= 0 and len(prefill) and prefill[0] == comp.sp.bos_id() else prefill
    ask, sep, lead = question_text.strip().partition("? ")
    if not sep:
        raise SystemExit(f"--chat: the question {question_text!r} has no '? ' between its question and lead-in")
    q = comp.enc(" " + ask + "?<|im_end|>\n<|im_start|>assistant\n" + lead)
    return np.concatenate([np.asarray(head, dtype=np.int32), np.asarray(body, dtype=np.int32)]), np.asarray(q, dtype=np.int32)


def write_eval_set(comp, task, contexts, keys, n, seed, out, style=None, chat=None, family=0):
    rows = 0
    with open(out, "w", encoding="utf-8") as f:
        for ctx in contexts:
            for k in (keys if task == "multikey" else [0]):
                for i, doc in enumerate(eval_docs(comp, task, ctx, n, seed, n_keys=k, style=style, family=family)):
                    prefill, question, answer = split_for_eval(comp, doc)
                    qi = next(j for j in range(len(doc.segs)) if doc.answer[j]) - 1
                    prefill, question = chat_wrap(comp, chat, prefill, doc.segs[qi])
                    pre_doc = Doc()
                    pre_doc.segs = doc.segs[:qi]
                    row = {
                        "id": f"{task}-{ctx}-{k}-{i}" + (f"-{FAMILY_NAMES[family]}" if family else "") +
                              (f"-{chat}" if chat else ""), "task": task, "context": ctx,
                        "n_keys": k or 1,
                        "depth": round(doc.meta["depth"], 4), "answer": doc.meta["answer"],
                        "prompt": doc_text(pre_doc), "question": doc.segs[qi],
                        "prefill_ids": prefill.tolist(), "question_ids": question.tolist(),
                        "answer_ids": answer.tolist(),
                    }
                    f.write(json.dumps(row) + "\n")
                    rows += 1
    return rows


# ---------------------------------------------------------------------------------------------------------------------
# Tokenizer
# ---------------------------------------------------------------------------------------------------------------------

def corpus_lines(seed=0, n_docs=3000):
    """The tokenizer's training text: documents of every kind (as text), the template sentences, the stories."""
    rng = random.Random(seed)
    lines = [ENGINE_TASK, ENGINE_FILLER.strip(), ENGINE_QUESTION.strip()]
    lines += [t for t in TASKS] + [q.strip() for q in QUESTIONS]
    stories, _ = split_stories(read_stories())
    lines += [" ".join(st) for st in stories]
    for _ in range(n_docs):
        parts = []
        for _ in range(rng.randint(3, 12)):
            parts.append(fill_template(rng, rng.choice(TEMPLATES)))
        key = rng.randint(10000, 99999)
        parts.insert(rng.randrange(len(parts) + 1), rng.choice(NEEDLES).format(key=key, Name=rng.choice(NAMES)).strip())
        fam = rng.choice(FACT_FAMILIES)
        k = dict(color=rng.choice(COLORS), object=rng.choice(OBJECTS), Name=rng.choice(NAMES))
        v = rng.randint(1000, 9999)
        parts.insert(rng.randrange(len(parts) + 1), fam[0].format(value=v, **k))
        parts.append(fam[1].format(**k) + f" {v}.")
        parts.append(rng.choice(QUESTIONS).strip() + f" {key}.")
        lines.append(" ".join(parts))
    return lines


def train_llama_style_spm(lines, vocab, max_sentence_length):
    """A SentencePiece BPE model (serialized) trained on `lines` as Llama-2's tokenizer.model is set up: byte fallback,
    <unk>=0 <s>=1 </s>=2 and no pad, nothing rewritten, a dummy-prefix space, spaces kept; digits one token each so
    that numbers are copied digit by digit. Single-threaded and unshuffled, the lines passed as an iterator (no file
    path in the model): the same sentencepiece version gives the same bytes on every run. tools/make_demo_tokenizer.py
    uses it too."""
    import sentencepiece as spm
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_writer=model,
        model_type="bpe",
        vocab_size=vocab,
        character_coverage=1.0,
        byte_fallback=True,
        unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
        normalization_rule_name="identity",
        add_dummy_prefix=True,
        remove_extra_whitespaces=False,
        split_digits=True,
        allow_whitespace_only_pieces=True,
        max_sentencepiece_length=16,
        max_sentence_length=max_sentence_length,
        num_threads=1,
        shuffle_input_sentence=False,
        input_sentence_size=0,
        self_test_sample_size=0,
        minloglevel=2,
    )
    return model.getvalue()


def train_tokenizer(vocab=2048, seed=0):
    return train_llama_style_spm(corpus_lines(seed), vocab, 1 << 16)


class HfTokenizer:
    """A Hugging Face tokenizer.json behind the two SentencePieceProcessor calls the Composer makes. bos_id() is the
    id the tokenizer's post-processor puts before a text (-1 when it adds none, as SmolLM2's and Qwen2's do), so
    that the prompts start as `quest eval passkey` starts them (Tokenizer::encode with add_bos)."""

    def __init__(self, path):
        from tokenizers import Tokenizer
        self.tok = Tokenizer.from_file(str(path))
        plain, added = self.tok.encode("a", add_special_tokens=False).ids, self.tok.encode("a").ids
        self.bos = added[0] if len(added) > len(plain) and added[1:] == plain else -1

    def bos_id(self):
        return self.bos

    def encode(self, text):
        return self.tok.encode(text, add_special_tokens=False).ids


def load_sp(path):
    """--tokenizer: a SentencePiece tokenizer.model, or a tokenizer.json (or a folder holding one, e.g. the folder
    `quest quantize` writes from a GGUF file)."""
    path = pathlib.Path(path)
    if path.is_dir():
        path = path / "tokenizer.json"
    if path.suffix == ".json":
        return HfTokenizer(path)
    import sentencepiece as spm
    return spm.SentencePieceProcessor(model_file=str(path))


# ---------------------------------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------------------------------

def int_list(s):
    return [int(x) for x in s.split(",") if x]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("corpus", help="write the tokenizer's training text")
    c.add_argument("--out", type=pathlib.Path, required=True)
    c.add_argument("--seed", type=int, default=0)
    t = sub.add_parser("tokenizer", help="train the SentencePiece tokenizer")
    t.add_argument("--out", type=pathlib.Path, default=DEFAULT_TOKENIZER)
    t.add_argument("--vocab", type=int, default=2048)
    t.add_argument("--seed", type=int, default=0)
    s = sub.add_parser("samples", help="print documents")
    s.add_argument("--tokenizer", type=pathlib.Path, default=DEFAULT_TOKENIZER)
    s.add_argument("--length", type=int, default=512)
    s.add_argument("-n", type=int, default=4)
    s.add_argument("--seed", type=int, default=0)
    e = sub.add_parser("eval-set", help="write a JSONL evaluation set")
    e.add_argument("--tokenizer", type=pathlib.Path, default=DEFAULT_TOKENIZER)
    e.add_argument("--task", choices=("multikey", "passkey"), default="multikey")
    e.add_argument("--contexts", type=int_list, default=[1024, 4096])
    e.add_argument("--keys", type=int_list, default=[4, 8, 16], help="multikey: facts per document")
    e.add_argument("--samples", type=int, default=50, help="documents per context (and key count)")
    e.add_argument("--filler", choices=("mixed", "story", "repeat", "engine"), default="mixed")
    e.add_argument("--seed", type=int, default=1)
    e.add_argument("--chat", choices=("chatml",), default=None,
                   help="the prompt as a ChatML user turn, the answer's lead-in as the assistant's (SmolLM2, Qwen2)")
    e.add_argument("--family", choices=FAMILY_NAMES, default="code",
                   help="multikey: the facts' template: code (\"The code for the red door is 4821.\": keys that "
                        "share colours and objects), number (\"The number on the red door is ...\"), name "
                        "(\"Mia's lucky number is ...\": distinct names)")
    e.add_argument("--out", type=pathlib.Path, required=True)
    h = sub.add_parser("ppl-text", help="write the held-out stories")
    h.add_argument("--out", type=pathlib.Path, required=True)
    a = p.parse_args(argv)

    if a.cmd == "corpus":
        a.out.write_text("\n".join(corpus_lines(a.seed)) + "\n", encoding="utf-8")
        print(f"wrote {a.out}")
    elif a.cmd == "tokenizer":
        import sentencepiece as spm
        blob = train_tokenizer(a.vocab, a.seed)
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_bytes(blob)
        sp = spm.SentencePieceProcessor(model_proto=blob)
        sample = "The code for the red door is 4821. What is the pass key? The pass key is 12345."
        ids = sp.encode(sample)
        assert sp.vocab_size() == a.vocab and sp.bos_id() == 1 and sp.eos_id() == 2 and sp.unk_id() == 0
        assert sp.decode(ids) == sample
        print(f"wrote {a.out} ({len(blob)} bytes, {a.vocab} pieces, sentencepiece {spm.__version__}); "
              f"{sample!r} -> {len(ids)} tokens: {sp.encode(sample, out_type=str)}")
    elif a.cmd == "samples":
        comp = Composer(load_sp(a.tokenizer))
        rng = random.Random(a.seed)
        for _ in range(a.n):
            doc = comp.sample(rng, a.length)
            ids, mask = comp.encode_doc(doc)
            print(f"--- {doc.meta} {len(ids)} tokens, answer tokens {int(mask.sum())}")
            print(doc_text(doc))
    elif a.cmd == "eval-set":
        comp = Composer(load_sp(a.tokenizer))
        n = write_eval_set(comp, a.task, a.contexts, a.keys, a.samples, a.seed, a.out, style=a.filler, chat=a.chat,
                           family=FAMILY_NAMES.index(a.family))
        print(f"wrote {a.out}: {n} prompts")
    elif a.cmd == "ppl-text":
        _, held = split_stories(read_stories())
        a.out.write_text("\n\n".join(" ".join(st) for st in held) + "\n", encoding="utf-8")
        print(f"wrote {a.out}: {len(held)} held-out stories")
    return 0


if __name__ == "__main__":
    sys.exit(main())
