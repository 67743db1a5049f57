"""`gradscope corpus prepare`: raw text → SentencePiece tokenizer → tokenised, memory-mapped corpus.

Tokenizer (the study used SentencePiece through torchtext's ``generate_sp_model``, whose defaults
are SentencePiece's own): a ``unigram`` model of ``vocab_size`` pieces, ``character_coverage``
0.9995, trained on the train split's paragraphs only (one paragraph per training sentence), with
no BOS/EOS/PAD pieces (``<unk>`` is id 0), ``num_threads`` 1 (so that the same text gives the same
model) and ``max_sentence_length`` large enough that no paragraph is skipped. The whole corpus is
written to a temporary directory beside ``out`` and renamed into place when complete.
"""

from __future__ import annotations

import warnings

import io
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any, Callable

import numpy as np

from gradscope.corpus.store import (COUNTS, FORMAT, FORMAT_VERSION, MANIFEST, SPLITS, TOKENIZER,
                                    offsets_file, open_corpus, sha256_bytes, sha256_path, tokens_file, Corpus)
from gradscope.corpus.text import paragraphs, read_text, split_paragraphs
from gradscope.errors import GradscopeError, check
from gradscope.guard import memory_budget
from gradscope.files.publish import WRITE_ERRORS, disk_error, publish, remove_stale_temporaries, temp_path
from gradscope.version import __version__
from gradscope.fields import with_overrides
from gradscope.workflows.study.options import CorpusOptions  # declared torch-free


MAX_SENTENCE_BYTES = 1 << 16  # the longest paragraph the tokenizer learns from
ENCODE_BATCH = 4096  # paragraphs per SentencePiece encode call
# Peak memory of prepare per byte of source text (docs/lm.md): mostly SentencePiece's own while it learns
# the pieces (its copy of the text and the suffix array over it), then the text, its paragraphs and the ids
MEMORY_PER_TEXT_BYTE = 24  # measured 21.0–23.2 (4 and 12 MB of text, K = 2,000; unigram, bpe, char; word 12)


def _size(nbytes: int) -> str:
    return f"{nbytes / 1e9:,.1f} GB" if nbytes >= 1e9 else f"{nbytes / 1e6:.1f} MB"


def _train_tokenizer(texts: list[str], s: CorpusOptions) -> bytes:
    import sentencepiece as spm  # only corpus preparation needs it (start-up stays cheap)

    # SentencePiece skips longer paragraphs when it learns the pieces (they are still encoded): without a
    # cap, one multi-megabyte line makes training run for hours
    longest = min(max((len(t.encode("utf-8")) for t in texts), default=1), MAX_SENTENCE_BYTES)
    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(texts), model_writer=model, vocab_size=s.vocab_size, model_type=s.model_type,
            character_coverage=s.character_coverage, bos_id=-1, eos_id=-1, pad_id=-1, unk_id=0, num_threads=1,
            max_sentence_length=max(4192, longest + 1), input_sentence_size=0, shuffle_input_sentence=False,
            minloglevel=2)
    except RuntimeError as exc:
        msg = " ".join(str(exc).split())
        m = re.search(r"value <= (\d+)", msg)
        if m:
            raise GradscopeError(f"vocab: got {s.vocab_size}; this corpus's train split supports at most "
                                 f"{m.group(1)} pieces ({s.model_type} model)") from None
        m = re.search(r"smaller than required_chars\. (\d+) vs (\d+)", msg)
        if m:
            raise GradscopeError(f"vocab: got {s.vocab_size}; the train split has {m.group(2)} distinct characters, "
                                 f"so the vocabulary needs at least that many pieces") from None
        raise GradscopeError(f"vocab: SentencePiece could not train a {s.vocab_size}-piece {s.model_type} model on "
                             f"this text ({msg[:160]})") from None
    proto = model.getvalue()
    pieces = spm.SentencePieceProcessor(model_proto=proto).get_piece_size()
    # a char model takes every character of the text, whatever vocab_size says: a corpus claiming more types than
    # its tokenizer has would count types that never occur in its frequency bins
    check(pieces == s.vocab_size, f"vocab: got {s.vocab_size}; the {s.model_type} tokenizer of this text has {pieces} "
                                  f"pieces, so pass vocab {pieces}")
    return proto


def _encode(proto: bytes, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Token ids (int32, concatenated) and paragraph offsets (int64, n + 1); paragraphs that
    encode to nothing are dropped. Encoded ENCODE_BATCH paragraphs at a time, so SentencePiece's
    Python lists of ids (~36 bytes per token) never hold a whole split."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_proto=proto)
    ids = []
    for start in range(0, len(texts), ENCODE_BATCH):
        ids += [a for a in (np.asarray(p, dtype=np.int32) for p in sp.encode(texts[start:start + ENCODE_BATCH])) if a.size]
    lengths = np.array([p.size for p in ids], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    tokens = np.concatenate(ids).astype(np.int32) if ids else np.zeros(0, dtype=np.int32)
    return tokens, offsets


def _path_exists(path: Path, what: str) -> bool:
    """Whether anything (a broken link too) is at ``path``; a path the system cannot look up (a name
    too long, a loop of links) is a one-line error naming ``what``."""
    try:
        os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError as exc:
        raise GradscopeError(f"{what}: {str(path)[:80]}{'…' if len(str(path)) > 80 else ''} is not a usable path "
                             f"({exc.strerror})") from None
    except ValueError as exc:  # an embedded NUL byte
        raise GradscopeError(f"{what}: {str(path)[:80]!r} is not a usable path ({exc})") from None
    return True


def _check_names(path: Path, what: str) -> None:
    """Every component of ``path`` within the system's name limit (NAME_MAX bytes, PATH_MAX in all)."""
    full = os.fsencode(path.absolute())
    longest = max((len(part) for part in full.split(b"/")), default=0)
    check(longest <= 255 and len(full) < 4096,
          f"{what}: {str(path)[:80]}{'…' if len(str(path)) > 80 else ''} is not a usable path (a name longer than "
          f"255 bytes, or a path longer than 4,095)")


def _remove_made(made: list[Path]) -> None:
    """Remove the directories this run made (deepest first), so a refused run leaves nothing behind."""
    for p in reversed(made):
        try:
            p.rmdir()
        except OSError:
            pass


def _save(path: Path, arr: np.ndarray) -> None:
    with open(path, "wb") as fh:
        np.save(fh, arr, allow_pickle=False)


LEAK_REFUSED = 0.5  # a held-out split with this share of its paragraphs in an earlier split is that split again


class SplitLeakWarning(UserWarning):
    """Some paragraphs of a held-out split also occur in the training (or valid) split."""


def _normalised(paragraph: str) -> str:
    """A paragraph compared across splits: whitespace runs (spaces, tabs, CR of CRLF line ends) as one space."""
    return " ".join(paragraph.split())


def check_leakage(paras: dict[str, list[str]], named: dict[str, str]) -> None:
    """Paragraphs of the valid and test splits that also occur in an earlier split (train; for test, valid
    too), compared after normalising whitespace and line ends, in any order: a split holding
    :data:`LEAK_REFUSED` or more of them is refused in one line (it is the other split again, reordered or
    re-spaced); a smaller share is a :class:`SplitLeakWarning` naming it (real corpora repeat some lines)."""
    seen: set[str] = set()
    order = [k for k in ("train", "valid", "test") if k in paras]
    for i, k in enumerate(order):
        mine = [_normalised(x) for x in paras[k]]
        if i:
            shared = sum(x in seen for x in mine)
            share = shared / len(mine) if mine else 0.0
            earlier = " and ".join(order[:i])
            check(share < LEAK_REFUSED,
                  f"{named[k]}: {share:.0%} of its paragraphs ({shared:,} of {len(mine):,}) also occur in the {earlier} "
                  f"split (compared after normalising whitespace and line ends); each split needs its own text")
            if shared:
                warnings.warn(f"{named[k]}: {shared:,} of its {len(mine):,} paragraphs ({share:.1%}) also occur in the "
                              f"{earlier} split (compared after normalising whitespace and line ends); they are "
                              f"scored on text the model trained on", SplitLeakWarning, stacklevel=3)
        seen.update(mine)


def prepare_corpus(raw: Path | str, out: Path | str, *, opts: CorpusOptions | None = None,
                   on_stage: Callable[[str], None] | None = None, **overrides: Any) -> Corpus:
    """Make a corpus directory ``out`` from the UTF-8 text ``raw`` (one paragraph per line;
    WikiText headings and blank lines dropped). ``opts``: :class:`CorpusOptions` (None: its defaults),
    ``overrides`` its fields, named as the flags. With ``valid_file`` and ``test_file`` (e.g.
    WikiText's own ``wiki.valid.raw``/``wiki.test.raw``) those are the held-out splits; otherwise
    ``raw``'s paragraphs are split by ``valid``/``test``. Returns the opened corpus.
    ``out`` must not exist yet (it is never overwritten). ``on_stage(text)`` is called as each stage
    starts (reading, training the tokenizer, encoding, writing): on WikiText-103 they take minutes."""
    stage = on_stage if on_stage is not None else (lambda _text: None)
    settings = with_overrides(CorpusOptions, opts, overrides, "prepare_corpus")
    out = Path(out)
    valid_file, test_file = settings.valid_file, settings.test_file  # both or neither (CorpusOptions)
    check(not _path_exists(out, "out"), f"out: {out} already exists; choose a new directory")
    _check_names(out, "out")  # a name the system refuses is found now, not after minutes of work and a made parent
    above = next((p for p in out.absolute().parents if _path_exists(p, "out")), None)  # checked before minutes of work
    check(above is None or above.is_dir(), f"out: {above} is not a directory")
    sources = {"train": Path(raw)} if valid_file is None else \
        {"train": Path(raw), "valid": Path(valid_file), "test": Path(test_file)}  # type: ignore[arg-type]
    names = {k: "raw" if k == "train" else f"{k}_file" for k in sources}
    for k, p in sources.items():  # sizes before anything is read: a huge (or sparse) file is refused at once
        check(_path_exists(p, names[k]) and p.is_file(), f"{names[k]}: {p} is not a file")
    total = sum(p.stat().st_size for p in sources.values())
    need, budget = total * MEMORY_PER_TEXT_BYTE, memory_budget()
    check(need <= budget, f"raw: {total:,} bytes of text; preparing a corpus from it needs about {_size(need)} of memory "
                          f"({MEMORY_PER_TEXT_BYTE}× the text), and the memory budget is {_size(budget)} (half the "
                          f"memory available now; GRADSCOPE_MEMORY_BUDGET in bytes sets it)")
    stage("reading the text")
    paras, source_info = {}, {}
    for k, p in sources.items():
        text = read_text(p, names[k])
        data = text.encode("utf-8")
        source_info[k] = {"path": str(p.resolve()), "sha256": sha256_bytes(data), "bytes": len(data)}
        del data
        paras[k] = paragraphs(text)
        del text
        same = next((j for j in source_info if j != k and source_info[j]["sha256"] == source_info[k]["sha256"]), None)
        if same is not None:
            raise GradscopeError(f"{names[k]}: {p} holds the same text as the {same} split ({sources[same]}); each split "
                                 f"needs its own (a split scored on what another holds gives a meaningless number)")
    if valid_file is not None:
        check_leakage(paras, {k: f"{names[k]}: {sources[k]}" for k in sources})
    if valid_file is None:
        all_paras = paras["train"]
        check(len(all_paras) >= 3, f"raw: {sources['train']} has {len(all_paras)} paragraph(s) after removing "
                                   f"headings and blank lines; need at least 3 (one per split)")
        parts = split_paragraphs(len(all_paras), settings.valid, settings.test, settings.split_seed)
        paras = {k: [all_paras[i] for i in parts[k]] for k in SPLITS}
    for k in SPLITS:
        check(len(paras[k]) >= 1, f"raw: the {k} split has no paragraph; give more text or larger fractions")
    stage(f"training the {settings.model_type} tokenizer on {len(paras['train']):,} paragraphs")
    proto = _train_tokenizer(paras["train"], settings)
    stage("encoding the splits")
    encoded = {k: _encode(proto, paras[k]) for k in SPLITS}
    for k in SPLITS:
        check(encoded[k][1].shape[0] >= 2,
              f"{names.get(k, 'raw')}: the {k} split's {len(paras[k]):,} paragraph(s) encode to no token "
              f"(control characters or other text the tokenizer drops); every split needs at least one paragraph")
    vocab = settings.vocab_size
    counts = np.bincount(encoded["train"][0], minlength=vocab).astype(np.int64)
    check(counts.shape[0] == vocab, f"vocab: the tokenizer produced ids beyond {vocab - 1}")
    made = [p for p in reversed(out.absolute().parents) if not _path_exists(p, "out")]
    try:
        for p in made:
            p.mkdir()
    except (FileExistsError, NotADirectoryError):
        _remove_made(made)
        raise GradscopeError(f"out: {out.parent} is not a directory") from None
    except OSError as exc:
        _remove_made(made)
        raise disk_error(exc, out, "out") from None
    remove_stale_temporaries(out.parent, out.name)
    tmp = temp_path(out)
    stage("writing the corpus")
    try:
        tmp.mkdir()
        (tmp / TOKENIZER).write_bytes(proto)
        _save(tmp / COUNTS, counts)
        for k in SPLITS:
            _save(tmp / tokens_file(k), encoded[k][0])
            _save(tmp / offsets_file(k), encoded[k][1])
        files = {p.name: sha256_path(p) for p in sorted(tmp.iterdir())}
        manifest: dict[str, Any] = {
            "format": FORMAT, "format_version": FORMAT_VERSION, "gradscope_version": __version__,
            "vocab_size": vocab,
            "tokenizer": {"library": "sentencepiece", "file": TOKENIZER, "sha256": sha256_bytes(proto),
                          "bos_id": -1, "eos_id": -1, "pad_id": -1, "unk_id": 0, "num_threads": 1},
            "settings": settings.recorded(),
            "split": "files" if valid_file is not None else "seeded paragraph permutation",
            "sources": source_info,
            "preprocessing": "WikiText headings (' = … = ' lines) and blank lines removed; one paragraph per line",
            "splits": {k: {"paragraphs": int(encoded[k][1].shape[0] - 1), "tokens": int(encoded[k][0].shape[0])}
                       for k in SPLITS},
            "files": files,
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
        publish(tmp, out, overwrite=False, what="out")
    except OSError as exc:
        if exc.errno in WRITE_ERRORS:
            raise disk_error(exc, out, "out") from None
        raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return open_corpus(out)


def encode_text(corpus: Corpus, text: str) -> list[int]:
    """``text`` as token ids under the corpus's tokenizer."""
    import sentencepiece as spm

    return list(spm.SentencePieceProcessor(model_proto=corpus.tokenizer_proto()).encode(text))


def decode_ids(corpus: Corpus, ids: list[int]) -> str:
    """Token ids back to text under the corpus's tokenizer."""
    import sentencepiece as spm

    return str(spm.SentencePieceProcessor(model_proto=corpus.tokenizer_proto()).decode([int(i) for i in ids]))
