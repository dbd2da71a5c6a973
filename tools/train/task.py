"""The evaluation task of the bundled models: GSM8K-like multi-step arithmetic word problems.

Each problem is a few short sentences about one person's stock of some item, changed by 2 to 4
integer operations (add, subtract, multiply, divide; "buys 3 boxes with 4 pens in each" is two of
them), and a question about the final count. The target is a worked chain of the intermediate
results, GSM8K style, ending in "#### <answer>":

    prompt:  "Q: Ava has 12 pens. She buys 3 boxes with 4 pens in each. She gives 5 to Ben.
              How many pens does Ava have now?\\nA:"
    target:  " 3*4=12. 12+12=24. 24-5=19. #### 19"

Everything is exact integer arithmetic; every intermediate value lies in [1, MAX_VALUE]. The
generator is deterministic given its seed and uses only the standard library (random.Random, whose
randrange/choice sequences are stable across Python 3 versions). Two splits:
  - test:  the first N problems of the TEST_SEED stream (models/data/arith_test.jsonl, N = 500);
  - train: the TRAIN_SEED stream with every question that also occurs in the test split dropped,
           so the splits never overlap (check_splits() asserts it).
The exact-match metric extracts the first "####" answer of a completion (extract_answer) and
compares integers. File format and usage: docs/models.md. Tests: tools/train/test_train.py.

    python tools/train/task.py --write models/data/arith_test.jsonl   # regenerate the test file
    python tools/train/task.py --check                                 # determinism + no overlap
    python tools/train/task.py --show 5                                # print a few problems
"""

import argparse
import json
import random
import re
import sys
from typing import Dict, Iterator, List, Optional, Set

TEST_SEED = 7001
TRAIN_SEED = 7002
TEST_SIZE = 500
MAX_VALUE = 999
TASK_NAME = "arith"

# (name, subject pronoun, object pronoun, possessive)
PEOPLE = [
    ("Ava", "she", "her", "her"), ("Ben", "he", "him", "his"), ("Cara", "she", "her", "her"),
    ("Dan", "he", "him", "his"), ("Eve", "she", "her", "her"), ("Finn", "he", "him", "his"),
    ("Gia", "she", "her", "her"), ("Hugo", "he", "him", "his"), ("Ivy", "she", "her", "her"),
    ("Jack", "he", "him", "his"), ("Kim", "she", "her", "her"), ("Leo", "he", "him", "his"),
    ("Mia", "she", "her", "her"), ("Noah", "he", "him", "his"), ("Olga", "she", "her", "her"),
    ("Paul", "he", "him", "his"), ("Rosa", "she", "her", "her"), ("Sam", "he", "him", "his"),
    ("Tara", "she", "her", "her"), ("Owen", "he", "him", "his"),
]
ITEMS = ["apples", "marbles", "pencils", "stickers", "cookies", "cards", "shells", "coins", "books",
         "stamps", "beads", "eggs", "toys", "plums", "cups", "pens"]
CONTAINERS = ["boxes", "bags", "packs", "jars", "baskets", "crates"]


def prompt_of(question: str) -> str:
    """The text the model is conditioned on (after the BOS token)."""
    return "Q: " + question + "\nA:"


def extract_answer(completion: str) -> Optional[int]:
    """The integer after the first "####" of a completion (spaces allowed), else None."""
    m = re.search(r"####\s*(-?\d+)", completion)
    return int(m.group(1)) if m else None


class _Story:
    """One problem being written: the running count x and the sentences and steps so far."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.name, self.subj, self.obj, self.poss = rng.choice(PEOPLE)
        self.friend = rng.choice([p[0] for p in PEOPLE if p[0] != self.name])
        self.item = rng.choice(ITEMS)
        self.box = rng.choice(CONTAINERS)
        self.x = rng.randint(2, 60)
        self.sentences = [rng.choice(["{N} has {x} {it}.", "{N} starts with {x} {it}."])
                          .format(N=self.name, x=self.x, it=self.item)]
        self.steps: List[str] = []

    def who(self) -> str:
        """The subject of a sentence: the name or the capitalised pronoun."""
        return self.name if self.rng.random() < 0.5 else self.subj.capitalize()

    def say(self, template: str, **kw) -> None:
        self.sentences.append(template.format(S=self.who(), O=self.obj, P=self.poss, F=self.friend,
                                              it=self.item, box=self.box, **kw))

    # Each operation returns False (and changes nothing) when it does not apply to the current x.
    def add(self) -> bool:
        b = self.rng.randint(1, 30)
        if self.x + b > MAX_VALUE:
            return False
        self.say(self.rng.choice(["{S} buys {b} more.", "{S} finds {b} more.", "{F} gives {O} {b} more."]), b=b)
        self.steps.append(f"{self.x}+{b}={self.x + b}")
        self.x += b
        return True

    def sub(self) -> bool:
        if self.x < 2:
            return False
        b = self.rng.randint(1, min(30, self.x - 1))
        self.say(self.rng.choice(["{S} gives {b} to {F}.", "{S} loses {b}.", "{S} sells {b} of them."]), b=b)
        self.steps.append(f"{self.x}-{b}={self.x - b}")
        self.x -= b
        return True

    def add_groups(self) -> bool:
        c, d = self.rng.randint(2, 6), self.rng.randint(2, 12)
        if self.x + c * d > MAX_VALUE:
            return False
        self.say("{S} buys {c} {box} with {d} {it} in each.", c=c, d=d)
        self.steps += [f"{c}*{d}={c * d}", f"{self.x}+{c * d}={self.x + c * d}"]
        self.x += c * d
        return True

    def sub_groups(self) -> bool:
        c, d = self.rng.randint(2, 5), self.rng.randint(2, 10)
        if c * d >= self.x:
            return False
        self.say("{S} gives away {c} {box} with {d} {it} in each.", c=c, d=d)
        self.steps += [f"{c}*{d}={c * d}", f"{self.x}-{c * d}={self.x - c * d}"]
        self.x -= c * d
        return True

    def mul(self) -> bool:
        f = self.rng.choice([2, 3])
        if self.x > 99:
            return False
        self.say("{S} " + {2: "doubles", 3: "triples"}[f] + " {P} {it}.")
        self.steps.append(f"{self.x}*{f}={self.x * f}")
        self.x *= f
        return True

    def div(self) -> bool:
        fs = [f for f in (2, 3, 4, 5) if self.x % f == 0 and self.x >= 2 * f]
        if not fs:
            return False
        f = self.rng.choice(fs)
        self.say("{S} splits {P} {it} into {f} equal piles and keeps one pile.", f=f)
        self.steps.append(f"{self.x}/{f}={self.x // f}")
        self.x //= f
        return True


# (method, number of operations it adds, weight)
_OPS = [(_Story.add, 1, 3), (_Story.sub, 1, 3), (_Story.add_groups, 2, 2), (_Story.sub_groups, 2, 1),
        (_Story.mul, 1, 1), (_Story.div, 1, 1)]


def make_problem(rng: random.Random) -> Dict:
    """One problem with 2 to 4 operations, drawn from rng."""
    story = _Story(rng)
    want = rng.randint(2, 4)
    while len(story.steps) < want:
        left = want - len(story.steps)
        ops = [(op, w) for op, cost, w in _OPS if cost <= left]
        op = rng.choices([o for o, _ in ops], weights=[w for _, w in ops])[0]
        op(story)  # an op that does not apply is simply redrawn
    question = " ".join(story.sentences) + f" How many {story.item} does {story.name} have now?"
    target = " " + " ".join(s + "." for s in story.steps) + f" #### {story.x}"
    return {"question": question, "prompt": prompt_of(question), "target": target, "answer": story.x,
            "steps": len(story.steps)}


def _stream(seed: int) -> Iterator[Dict]:
    rng = random.Random(seed)
    while True:
        yield make_problem(rng)


def test_split(n: int = TEST_SIZE) -> List[Dict]:
    """The held-out split: the first n problems of the TEST_SEED stream, ids "test-<i>"."""
    out = []
    for i, p in zip(range(n), _stream(TEST_SEED)):
        out.append({"id": f"test-{i}", **p})
    return out


def train_split(n: int, exclude: Optional[Set[str]] = None) -> List[Dict]:
    """n training problems of the TRAIN_SEED stream, skipping any question in `exclude` (by default
    the questions of the whole test split), ids "train-<i>"."""
    if exclude is None:
        exclude = {p["question"] for p in test_split()}
    out = []
    for p in _stream(TRAIN_SEED):
        if len(out) == n:
            break
        if p["question"] not in exclude:
            out.append({"id": f"train-{len(out)}", **p})
    return out


def check_splits(n_train: int = 20000) -> None:
    """Asserts determinism, exact answers, answer extraction and no train/test overlap."""
    test = test_split()
    assert test == test_split(), "test split is not deterministic"
    train = train_split(n_train)
    assert train[:50] == train_split(50), "train split is not deterministic"
    overlap = {p["question"] for p in test} & {p["question"] for p in train}
    assert not overlap, f"{len(overlap)} questions in both splits, e.g. {sorted(overlap)[0]!r}"
    for p in test + train:
        assert extract_answer(p["target"]) == p["answer"], p
        assert 2 <= p["steps"] <= 4, p
        # Replaying the chain reproduces the answer: each step's left operand is a number of the
        # question or an earlier result, and each result is exact.
        for step in p["target"].split("####")[0].split("."):
            if step.strip():
                m = re.fullmatch(r"\s*(\d+)([-+*/])(\d+)=(\d+)", step)
                assert m, (step, p)
                a, op, b, r = int(m.group(1)), m.group(2), int(m.group(3)), int(m.group(4))
                exact = {"+": a + b, "-": a - b, "*": a * b, "/": a // b if a % b == 0 else None}[op]
                assert exact == r and 0 < r <= MAX_VALUE, (step, p)


def write_jsonl(path: str, problems: List[Dict]) -> None:
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for p in problems:
            f.write(json.dumps(p, ensure_ascii=True, sort_keys=False) + "\n")


def read_jsonl(path: str) -> List[Dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def main(argv: List[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--write", metavar="PATH", help="write the test split as JSONL")
    ap.add_argument("--check", action="store_true", help="check determinism, answers and no overlap")
    ap.add_argument("--show", type=int, default=0, metavar="N", help="print N test problems")
    args = ap.parse_args(argv)
    if args.write:
        write_jsonl(args.write, test_split())
        print(f"wrote {TEST_SIZE} problems to {args.write}")
    if args.check:
        check_splits()
        print("task: splits deterministic, answers exact, no train/test overlap")
    for p in test_split(args.show) if args.show else []:
        print(p["prompt"] + p["target"] + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
