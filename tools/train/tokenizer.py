"""The character-level tokenizer of the bundled models, saved as tokenizer.json next to each model.

One token per character, plus three special tokens. The C++ twin is include/moekit/model/tokenizer.h
(src/model/tokenizer.cpp); both read the same tokenizer.json and must give the same ids:

    {"type": "moekit-char", "version": 1,
     "vocab": ["<pad>", "<bos>", "<eos>", "\\n", " ", "!", ..., "~"],
     "special_tokens": {"pad": 0, "bos": 1, "eos": 2},
     "unknown": "error"}

- id i is vocab[i]. Every entry that is not a special token is exactly one Unicode character (the
  default vocabulary is "\\n" and printable ASCII 32..126: 99 entries), and no two are equal.
- encode(text) maps each character to its id and adds no special token; a character outside the
  vocabulary is an error naming it and its position ("unknown": "error" is the only policy).
- decode(ids) concatenates the entries; special tokens decode to nothing; an id outside
  [0, len(vocab)) is an error.
A model's config.json may have a larger vocab_size (rounded up to 128); the extra rows are never
produced by encode. Format described in docs/models.md; tests: tools/train/test_train.py and
tests/test_tokenizer.cpp (which also checks tests/data/tokenizer_golden.json, written by
`python tools/train/tokenizer.py --golden tests/data/tokenizer_golden.json`).
"""

import argparse
import json
import os
import sys
from typing import Dict, List, Sequence

TYPE = "moekit-char"
VERSION = 1
SPECIALS = ("pad", "bos", "eos")


class CharTokenizer:
    def __init__(self, vocab: Sequence[str], special_tokens: Dict[str, int]):
        self.vocab = list(vocab)
        self.special_tokens = dict(special_tokens)
        if sorted(self.special_tokens) != sorted(SPECIALS):
            raise ValueError(f"tokenizer: special_tokens must name exactly {', '.join(SPECIALS)}, got {sorted(self.special_tokens)}")
        for name in SPECIALS:
            i = self.special_tokens.get(name)
            if not isinstance(i, int) or not 0 <= i < len(self.vocab):
                raise ValueError(f"tokenizer: special token '{name}' must be an id in [0, {len(self.vocab)}), got {i!r}")
        special_ids = set(self.special_tokens.values())
        self.char_to_id: Dict[str, int] = {}
        for i, s in enumerate(self.vocab):
            if i in special_ids:
                continue
            if len(s) != 1:
                raise ValueError(f"tokenizer: vocab[{i}] must be one character, got {s!r}")
            if s in self.char_to_id:
                raise ValueError(f"tokenizer: vocab[{i}] {s!r} duplicates vocab[{self.char_to_id[s]}]")
            self.char_to_id[s] = i

    @classmethod
    def default(cls) -> "CharTokenizer":
        """<pad> <bos> <eos>, newline, then printable ASCII 32..126 (99 tokens)."""
        return cls(["<pad>", "<bos>", "<eos>", "\n"] + [chr(c) for c in range(32, 127)],
                   {"pad": 0, "bos": 1, "eos": 2})

    @property
    def pad_id(self) -> int:
        return self.special_tokens["pad"]

    @property
    def bos_id(self) -> int:
        return self.special_tokens["bos"]

    @property
    def eos_id(self) -> int:
        return self.special_tokens["eos"]

    def __len__(self) -> int:
        return len(self.vocab)

    def encode(self, text: str) -> List[int]:
        ids = []
        for pos, ch in enumerate(text):
            i = self.char_to_id.get(ch)
            if i is None:
                raise ValueError(f"tokenizer: character U+{ord(ch):04X} at position {pos} is not in the vocabulary")
            ids.append(i)
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        special_ids = set(self.special_tokens.values())
        out = []
        for i in ids:
            if not 0 <= i < len(self.vocab):
                raise ValueError(f"tokenizer: id {i} is outside [0, {len(self.vocab)})")
            if i not in special_ids:
                out.append(self.vocab[i])
        return "".join(out)

    def to_json(self) -> Dict:
        return {"type": TYPE, "version": VERSION, "vocab": self.vocab, "special_tokens": self.special_tokens,
                "unknown": "error"}

    @classmethod
    def from_json(cls, obj: Dict) -> "CharTokenizer":
        if obj.get("type") != TYPE or obj.get("version") != VERSION:
            raise ValueError(f"tokenizer: expected type '{TYPE}' version {VERSION}, got {obj.get('type')!r} "
                             f"version {obj.get('version')!r}")
        if obj.get("unknown", "error") != "error":
            raise ValueError(f"tokenizer: unknown must be 'error', got {obj.get('unknown')!r}")
        return cls(obj["vocab"], obj["special_tokens"])

    def save(self, path: str) -> None:
        with open(path, "w", encoding="utf-8", newline="\n") as f:
            json.dump(self.to_json(), f, ensure_ascii=True, indent=1)
            f.write("\n")

    @classmethod
    def load(cls, path: str) -> "CharTokenizer":
        with open(path, encoding="utf-8") as f:
            return cls.from_json(json.load(f))


def golden(path: str) -> None:
    """Writes the default tokenizer with a few (text, ids) pairs for the C++ test."""
    tok = CharTokenizer.default()
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import task  # noqa: E402 (sibling module)

    texts = ["", "Q: 2+2?\nA: 2+2=4. #### 4", " !\"#$%&'()*+,-./09:;<=>?@AZ[\\]^_`az{|}~"]
    texts += [p["prompt"] + p["target"] for p in task.test_split(3)]
    cases = [{"text": t, "ids": tok.encode(t)} for t in texts]
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        json.dump({"tokenizer": tok.to_json(), "cases": cases}, f, ensure_ascii=True)
        f.write("\n")


def main(argv: List[str]) -> int:
    ap = argparse.ArgumentParser(description="the moekit character tokenizer")
    ap.add_argument("--write", metavar="PATH", help="write the default tokenizer.json")
    ap.add_argument("--golden", metavar="PATH", help="write the C++ test's golden file")
    args = ap.parse_args(argv)
    if args.write:
        CharTokenizer.default().save(args.write)
    if args.golden:
        golden(args.golden)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
