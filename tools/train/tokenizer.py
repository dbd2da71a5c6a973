"""The character-level tokenizer of the bundled models, saved as a Hugging Face `tokenizers` JSON.

One token per character, plus three special tokens. The file is a plain `tokenizers` WordLevel model
behind a per-character Split pre-tokenizer, so `transformers.AutoTokenizer.from_pretrained(model_dir)`
loads it (with tokenizer_config.json naming the special tokens); the C++ twin is
include/moekit/model/tokenizer.h (src/model/tokenizer.cpp). All three give the same ids:

    {"version": "1.0", "added_tokens": [<pad> 0, <bos> 1, <eos> 2, all "special": true],
     "normalizer": null,
     "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "[\\s\\S]"}, "behavior": "Isolated", ...},
     "post_processor": {"type": "TemplateProcessing", "single": "<bos> $A", ...},
     "decoder": {"type": "Fuse"},
     "model": {"type": "WordLevel", "vocab": {"<pad>": 0, "<bos>": 1, "<eos>": 2, "\\n": 3, " ": 4, ...,
               "~": 98}, "unk_token": "<unk>"}}

- Every vocab entry that is not a special token is exactly one Unicode character (the default
  vocabulary is "\\n" and printable ASCII 32..126: 99 entries), and no two are equal.
- encode(text) maps each character to its id and adds no special token (HF: add_special_tokens=False;
  with True the post-processor prepends <bos>). The text of a special token ("<eos>") in the input is
  that token, as in HF. A character outside the vocabulary is an error: "<unk>" is deliberately not
  in the vocabulary, so HF raises too ("Missing [UNK] token") instead of dropping the character.
- decode(ids) concatenates the entries; special tokens decode to nothing (HF skip_special_tokens);
  an id outside [0, len(vocab)) is an error.
Format described in docs/models.md; tests: tools/train/test_train.py (including AutoTokenizer parity
when transformers is installed) and tests/test_tokenizer.cpp (which also checks
tests/data/tokenizer_golden.json, written by
`python tools/train/tokenizer.py --golden tests/data/tokenizer_golden.json`).
"""

import argparse
import json
import os
import sys
from typing import Dict, List, Sequence

SPECIALS = ("pad", "bos", "eos")
SPECIAL_TEXT = {"pad": "<pad>", "bos": "<bos>", "eos": "<eos>"}
SPLIT_CHARS = {"type": "Split", "pattern": {"Regex": "[\\s\\S]"}, "behavior": "Isolated", "invert": False}
UNK = "<unk>"  # named by the model but absent from the vocabulary: unknown characters are errors


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
            if self.vocab[i] != SPECIAL_TEXT[name]:
                raise ValueError(f"tokenizer: special token '{name}' (id {i}) must be {SPECIAL_TEXT[name]!r}, got {self.vocab[i]!r}")
        special_ids = set(self.special_tokens.values())
        if len(special_ids) != len(SPECIALS):
            raise ValueError(f"tokenizer: special tokens must have distinct ids, got {self.special_tokens}")
        self.char_to_id: Dict[str, int] = {}
        for i, s in enumerate(self.vocab):
            if i in special_ids:
                continue
            if len(s) != 1:
                raise ValueError(f"tokenizer: vocab[{i}] must be one character, got {s!r}")
            if s in self.char_to_id:
                raise ValueError(f"tokenizer: vocab[{i}] {s!r} duplicates vocab[{self.char_to_id[s]}]")
            self.char_to_id[s] = i
        # (text, id) of the special tokens, longest first: matched in encode's input as HF does.
        self.special_texts = sorted(((self.vocab[i], i) for i in special_ids), key=lambda t: -len(t[0]))

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
        ids, pos = [], 0
        while pos < len(text):
            hit = next(((s, i) for s, i in self.special_texts if text.startswith(s, pos)), None)
            if hit is not None:  # an added token's text is that token (HF matches added tokens first)
                ids.append(hit[1])
                pos += len(hit[0])
                continue
            i = self.char_to_id.get(text[pos])
            if i is None:
                raise ValueError(f"tokenizer: character U+{ord(text[pos]):04X} at position {pos} is not in the vocabulary")
            ids.append(i)
            pos += 1
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
        """The tokenizers JSON (tokenizer.json)."""
        bos = self.vocab[self.bos_id]
        seq = lambda s, t: {"Sequence": {"id": s, "type_id": t}}  # noqa: E731
        bos_tok = {"SpecialToken": {"id": bos, "type_id": 0}}
        added = [{"id": i, "content": self.vocab[i], "single_word": False, "lstrip": False, "rstrip": False,
                  "normalized": False, "special": True} for i in sorted(self.special_tokens.values())]
        return {
            "version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
            "pre_tokenizer": dict(SPLIT_CHARS),
            "post_processor": {"type": "TemplateProcessing", "single": [bos_tok, seq("A", 0)],
                               "pair": [bos_tok, seq("A", 0), seq("B", 1)],
                               "special_tokens": {bos: {"id": bos, "ids": [self.bos_id], "tokens": [bos]}}},
            "decoder": {"type": "Fuse"},
            "model": {"type": "WordLevel", "vocab": {s: i for i, s in enumerate(self.vocab)}, "unk_token": UNK},
        }

    def tokenizer_config(self, model_max_length: int) -> Dict:
        """tokenizer_config.json: what AutoTokenizer needs besides tokenizer.json."""
        return {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": self.vocab[self.bos_id],
                "eos_token": self.vocab[self.eos_id], "pad_token": self.vocab[self.pad_id],
                "model_max_length": model_max_length, "clean_up_tokenization_spaces": False,
                "padding_side": "left"}

    @classmethod
    def from_json(cls, obj: Dict) -> "CharTokenizer":
        model = obj.get("model") or {}
        if model.get("type") != "WordLevel" or obj.get("pre_tokenizer") != SPLIT_CHARS or obj.get("normalizer"):
            raise ValueError("tokenizer: expected a WordLevel model behind the per-character Split pre-tokenizer "
                             f"and no normalizer, got model {model.get('type')!r}, pre_tokenizer "
                             f"{obj.get('pre_tokenizer')!r}, normalizer {obj.get('normalizer')!r}")
        vocab_map = model.get("vocab") or {}
        if sorted(vocab_map.values()) != list(range(len(vocab_map))):
            raise ValueError("tokenizer: model.vocab ids must be 0..n-1, each once")
        vocab = [""] * len(vocab_map)
        for s, i in vocab_map.items():
            vocab[i] = s
        by_text = {t["content"]: t["id"] for t in obj.get("added_tokens", []) if t.get("special")}
        missing = [SPECIAL_TEXT[n] for n in SPECIALS if SPECIAL_TEXT[n] not in by_text]
        if missing:
            raise ValueError(f"tokenizer: added_tokens lacks the special tokens {missing}")
        return cls(vocab, {n: by_text[SPECIAL_TEXT[n]] for n in SPECIALS})

    def save(self, path: str) -> None:
        with open(path, "w", encoding="utf-8", newline="\n") as f:
            json.dump(self.to_json(), f, ensure_ascii=True, indent=1)
            f.write("\n")

    def save_pretrained(self, model_dir: str, model_max_length: int) -> None:
        """tokenizer.json and tokenizer_config.json into a model folder."""
        self.save(os.path.join(model_dir, "tokenizer.json"))
        with open(os.path.join(model_dir, "tokenizer_config.json"), "w", encoding="utf-8", newline="\n") as f:
            json.dump(self.tokenizer_config(model_max_length), f, indent=1)
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

    texts = ["", "Q: 2+2?\nA: 2+2=4. #### 4", " !\"#$%&'()*+,-./09:;<=>?@AZ[\\]^_`az{|}~", "a<eos>b<bos<pad>>"]
    texts += [p["prompt"] + p["target"] for p in task.test_split(3)]
    cases = [{"text": t, "ids": tok.encode(t)} for t in texts]
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        json.dump({"tokenizer": tok.to_json(), "cases": cases}, f, ensure_ascii=True)
        f.write("\n")


def main(argv: List[str]) -> int:
    ap = argparse.ArgumentParser(description="the moekit character tokenizer")
    ap.add_argument("--write", metavar="DIR", help="write tokenizer.json and tokenizer_config.json into DIR")
    ap.add_argument("--golden", metavar="PATH", help="write the C++ test's golden file")
    args = ap.parse_args(argv)
    if args.write:
        CharTokenizer.default().save_pretrained(args.write, 512)
    if args.golden:
        golden(args.golden)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
