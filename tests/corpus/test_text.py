"""Raw text as paragraphs: WikiText headings and blank lines are dropped, and a file read in batches
gives the paragraphs the whole text gives."""

from __future__ import annotations

from pathlib import Path

from gradscope.corpus import is_heading, paragraphs
from gradscope.corpus.text import iter_paragraphs


def test_headings_and_blank_lines_are_dropped() -> None:
    text = " = Title = \n\n Para one . \n = = Sub = = \n   \n a = b is not a heading \n = = = Deep = = = \n"
    assert paragraphs(text) == ["Para one .", "a = b is not a heading"]
    assert is_heading(" = = Sub = = ") and not is_heading("x = y =") and not is_heading("= =")


def test_paragraphs_are_read_as_corpus_prepare_splits_them(tmp_path: Path) -> None:
    text = "a b\r\nc d\r = H = \n\x0be f\u2028g h\n\n = = Sub = = \n  i  \x85j\n" * 3 + "tail without newline"
    path = tmp_path / "t.txt"
    path.write_bytes(text.encode())
    assert [p for batch in iter_paragraphs(path, batch=2) for p in batch] == paragraphs(text)
