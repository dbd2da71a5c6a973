#!/usr/bin/env python3
"""Every "SPEC n" / "SPEC n.m" cited in the repository resolves to a heading of docs/spec.md.

The operator contract is docs/spec.md; code, tests and docs cite its sections as "SPEC 3.4",
"SPEC 3.2 / 3.3", "SPEC 3.1 - 3.5" (a range: every section in it), "SPEC 3, 6" (a list), also
wrapped onto the next comment line. A citation resolves when docs/spec.md has a heading whose first
word is that number ("## 3. Fused MoE", "### 3.4 Router weight ..."). The check also fails on a
mention of SPEC.md, the pre-repository document (cite docs/spec.md instead), on a duplicated
section number, and when it finds no citation at all (a broken file listing).

Usage: check_spec_citations.py [REPO_ROOT]   (default: the parent of this script's folder)
Registered with ctest as `spec_citations` (tests/CMakeLists.txt), so scripts/test.sh runs it.
Exit 0 when everything resolves; 1 with one line per problem (file:line, the citation, why).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

SPEC_PATH = "docs/spec.md"
NUM = r"\d+(?:\.\d+)*"
# Between "SPEC" and its first number: blanks, or a line break plus the next line's comment leader.
LEAD = r"(?:[ \t]+|[ \t]*\n[ \t]*(?://+|#+|\*+|--)?[ \t]*)"
# Between two numbers of one citation: a list separator or a range dash (same line only).
JOIN = r"[ \t]*(?:,|/|-|\u2013|and)[ \t]*"
CITATION = re.compile(r"\bSPEC(?:\.md)?(?:'s)?" + LEAD + "(" + NUM + ")((?:" + JOIN + NUM + ")*)")
OLD_DOC = re.compile(r"\bSPEC\.md\b")
HEADING = re.compile(r"^#{2,6}[ \t]+(" + NUM + r")\.?(?=[ \t]|$)", re.M)
SKIP_DIRS = {".git", "__pycache__", "out"}
MAX_BYTES = 4 << 20


def repo_files(root: Path) -> list[Path]:
    """Tracked and not-ignored files (git), or a walk that skips build and hidden folders."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                             capture_output=True, check=True).stdout
        names = sorted({n for n in out.decode("utf-8", "replace").split("\0") if n})
        return [root / n for n in names]
    except (OSError, subprocess.CalledProcessError):
        files = []
        for d, dirs, names in os.walk(root):
            dirs[:] = sorted(x for x in dirs if x not in SKIP_DIRS and not x.startswith((".", "build")))
            files += [Path(d) / n for n in sorted(names)]
        return files


def read_text(path: Path) -> str | None:
    try:
        if not path.is_file() or path.stat().st_size > MAX_BYTES:
            return None
        data = path.read_bytes()
    except OSError:
        return None
    if b"\0" in data:
        return None  # binary
    return data.decode("utf-8", "replace")


def expand(first: str, rest: str) -> list[str]:
    """The section numbers of one citation: "3.1", ", 3.4 - 3.6" -> 3.1, 3.4, 3.5, 3.6."""
    tokens = re.findall(NUM + "|-|\u2013", rest)
    nums, i = [first], 0
    while i < len(tokens):
        if tokens[i] in ("-", "\u2013") and i + 1 < len(tokens):
            lo, hi = nums[-1].split("."), tokens[i + 1].split(".")
            if len(lo) == len(hi) and lo[:-1] == hi[:-1] and int(lo[-1]) < int(hi[-1]):
                nums += [".".join(lo[:-1] + [str(n)]) for n in range(int(lo[-1]) + 1, int(hi[-1]) + 1)]
            else:
                nums.append(tokens[i + 1])
            i += 2
        elif tokens[i] in ("-", "\u2013"):
            i += 1
        else:
            nums.append(tokens[i])
            i += 1
    return nums


def main(argv: list[str]) -> int:
    root = Path(argv[1]).resolve() if len(argv) > 1 else Path(__file__).resolve().parent.parent
    spec_text = read_text(root / SPEC_PATH)
    if spec_text is None:
        print(f"spec_citations: {SPEC_PATH} is missing under {root}")
        return 1
    problems = []
    sections: dict[str, int] = {}
    for m in HEADING.finditer(spec_text):
        line = spec_text.count("\n", 0, m.start()) + 1
        if m.group(1) in sections:
            problems.append(f"{SPEC_PATH}:{line}: section {m.group(1)} is a heading twice "
                            f"(first at line {sections[m.group(1)]})")
        sections.setdefault(m.group(1), line)

    cited: dict[str, int] = {}
    n_files = 0
    for path in repo_files(root):
        text = read_text(path)
        if text is None or "SPEC" not in text:
            continue
        rel = path.relative_to(root).as_posix()
        found = False
        for m in CITATION.finditer(text):
            found = True
            line = text.count("\n", 0, m.start()) + 1
            for num in expand(m.group(1), m.group(2)):
                cited[num] = cited.get(num, 0) + 1
                if num not in sections:
                    quote = " ".join(m.group(0).split())
                    problems.append(f"{rel}:{line}: cites SPEC {num} (\"{quote}\"), but {SPEC_PATH} has no "
                                    f"heading '## {num}' / '### {num}'")
        if rel != "tests/check_spec_citations.py":
            for m in OLD_DOC.finditer(text):
                line = text.count("\n", 0, m.start()) + 1
                problems.append(f"{rel}:{line}: refers to SPEC.md, which is not in the repository; "
                                f"cite {SPEC_PATH} (SPEC n.m) instead")
        n_files += found
    if not cited:
        problems.append(f"no SPEC citation found under {root}: is the file listing broken?")
    for p in problems:
        print(p)
    if problems:
        print(f"spec_citations: FAILED, {len(problems)} problem(s)")
        return 1
    print(f"spec_citations: {sum(cited.values())} citations of {len(cited)} sections in {n_files} files resolve "
          f"in {SPEC_PATH} ({len(sections)} numbered sections)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
