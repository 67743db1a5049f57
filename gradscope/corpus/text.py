"""Raw text → paragraphs, the way the study's WikiText-103 preprocessing did it (paper, appendix E).

WikiText's raw files hold one paragraph per line; section headings are lines of the form
`` = Title = `` or `` = = Subsection = = `` (the same number of ``=`` on both sides); blank lines
separate them. Headings and blank lines are dropped; every other line, stripped of surrounding
whitespace, is one paragraph. Nothing else is changed (no lower-casing, no ``@-@`` undoing), so a
corpus keeps the text the tokenizer is trained on.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from gradscope.errors import GradscopeError, check

TEXT_LABEL = "text"  # what errors call a text file unless told: the commands' --text
HEADING = re.compile(r"^(=\s)+.*?(\s=)+$")  # after strip(): "= Title =", "= = Sub = =" (WikiText)


def is_heading(line: str) -> bool:
    """True for a WikiText heading line (`` = … = ``, any depth)."""
    s = line.strip()
    return s.startswith("= ") and s.endswith(" =") and HEADING.match(s) is not None


def paragraphs(text: str) -> list[str]:
    """The paragraphs of a raw text: every non-empty line that is not a heading, stripped."""
    out = []
    for line in text.splitlines():
        s = line.strip()
        if s and not is_heading(s):
            out.append(s)
    return out


def read_text(path: Path, what: str = TEXT_LABEL) -> str:
    """A UTF-8 text file as a string; a missing, unreadable or non-UTF-8 file is a one-line error."""
    path = Path(path)
    check(path.is_file(), f"{what}: {path} is not a file")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise GradscopeError(f"{what}: cannot read {path} ({exc.strerror})") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise GradscopeError(f"{what}: {path} is not UTF-8 text (byte {exc.start}: {exc.reason})") from None


def split_paragraphs(n: int, valid: float, test: float, seed: int) -> dict[str, np.ndarray]:
    """A deterministic paragraph split of ``n`` paragraphs: a permutation drawn from ``seed``
    (``numpy.random.default_rng``); its first round(valid·n) paragraphs form valid, the next
    round(test·n) test, the rest train. Each split keeps the paragraphs in their original order."""
    check(0 <= valid < 1 and 0 <= test < 1 and valid + test < 1,
          f"valid/test fractions: got {valid}/{test}; each in [0, 1) and their sum below 1")
    order = np.random.default_rng(seed).permutation(n)
    n_valid, n_test = int(round(valid * n)), int(round(test * n))
    parts = {"valid": order[:n_valid], "test": order[n_valid:n_valid + n_test], "train": order[n_valid + n_test:]}
    return {k: np.sort(v) for k, v in parts.items()}


def iter_paragraphs(path: Path, what: str = TEXT_LABEL, batch: int = 4096):  # noqa: ANN201 - a generator of lists
    """The paragraphs of a UTF-8 text file, exactly as :func:`paragraphs` of the whole text gives
    them, read line by line (memory bounded by one line and one batch): lists of up to ``batch``
    paragraphs. A non-UTF-8 byte is a one-line error naming its offset in the file.

    Reading splits at ``\\n`` first, then :meth:`str.splitlines` splits each piece: the boundaries
    splitlines knows include ``\\n``, and ``\\r\\n`` never straddles a piece, so the result is the same."""
    path = Path(path)
    check(path.is_file(), f"{what}: {path} is not a file")
    out: list[str] = []
    offset = 0
    try:
        with open(path, "rb") as fh:
            for raw in fh:
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise GradscopeError(f"{what}: {path} is not UTF-8 text (byte {offset + exc.start}: "
                                         f"{exc.reason})") from None
                offset += len(raw)
                for piece in line.splitlines():
                    s = piece.strip()
                    if s and not is_heading(s):
                        out.append(s)
                if len(out) >= batch:
                    yield out
                    out = []
    except OSError as exc:
        raise GradscopeError(f"{what}: cannot read {path} ({exc.strerror})") from None
    if out:
        yield out
