"""A library model's own tokenizer, from the files ``tokenizer.save_pretrained(dir)`` wrote:
transformers' ``AutoTokenizer`` from local files only (nothing is downloaded) and never with remote
code. Every failure is a one-line :class:`GradscopeError`."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from gradscope.errors import GradscopeError, check
from gradscope.guard import check_bytes

TOKENIZER_LABEL = "tokenizer"  # what errors call the tokenizer folder unless told: the commands' --tokenizer
# what save_pretrained writes for the tokenizers transformers knows; hashed together as the tokenizer's identity
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "vocab.json", "merges.txt", "vocab.txt", "tokenizer.model", "spiece.model",
                   "sentencepiece.bpe.model")
VOCABULARY_FILES = ("tokenizer.json", "vocab.json", "vocab.txt", "tokenizer.model", "spiece.model",
                    "sentencepiece.bpe.model")  # at least one: the others only configure a vocabulary


def tokenizer_files(folder: Path, what: str = TOKENIZER_LABEL) -> list[Path]:
    """The tokenizer files of ``folder`` (sorted by name); a folder without a vocabulary file is refused."""
    folder = Path(folder)
    check(folder.is_dir(), f"{what}: {folder} is not a directory (give the folder tokenizer.save_pretrained wrote)")
    found = [folder / n for n in sorted(TOKENIZER_FILES) if (folder / n).is_file()]
    check(any(p.name in VOCABULARY_FILES for p in found),
          f"{what}: {folder} holds no tokenizer (none of {', '.join(VOCABULARY_FILES)}); save the model's tokenizer "
          f"there with tokenizer.save_pretrained(DIR), or name its folder with --tokenizer")
    for p in found:
        check_bytes(p.stat().st_size, f"{what}: {p}")
    return found


def tokenizer_sha256(files: list[Path]) -> str:
    """One sha256 over the tokenizer's files: each file's name and its bytes' sha256, in name order."""
    h = hashlib.sha256()
    for p in files:
        h.update(p.name.encode() + b"\0" + hashlib.sha256(p.read_bytes()).hexdigest().encode() + b"\n")
    return h.hexdigest()


def _refuse_remote_code(folder: Path, what: str) -> None:
    cfg = folder / "tokenizer_config.json"
    if not cfg.is_file():
        return
    try:
        data = json.loads(cfg.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise GradscopeError(f"{what}: {cfg} is not valid JSON ({type(exc).__name__})") from None
    check(isinstance(data, dict), f"{what}: {cfg} is not a JSON object")
    check("auto_map" not in data, f"{what}: {cfg} asks for the tokenizer's own code (auto_map); gradscope runs no "
                                  f"code from a model directory")


def load_tokenizer(folder: Path, what: str = TOKENIZER_LABEL) -> Any:
    """``AutoTokenizer.from_pretrained(folder, local_files_only=True, trust_remote_code=False)``, one
    line on any failure. Only a fast (Rust ``tokenizers``) or SentencePiece tokenizer transformers
    ships is accepted; the tokenizer must map text to ids (``__call__``)."""
    folder = Path(folder)
    tokenizer_files(folder, what)
    _refuse_remote_code(folder, what)
    try:
        import transformers
    except ImportError:
        raise GradscopeError(f"{what}: reading a tokenizer needs transformers: pip install 'gradscope[hf]'") from None
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    try:
        tok = transformers.AutoTokenizer.from_pretrained(str(folder), local_files_only=True, trust_remote_code=False)
    except Exception as exc:  # noqa: BLE001 - transformers and tokenizers raise many types: one line
        raise GradscopeError(f"{what}: {folder} does not load as a tokenizer ({type(exc).__name__}: "
                             f"{' '.join(str(exc).split())[:200]})") from None
    finally:
        transformers.logging.set_verbosity(verbosity)
    check(callable(tok) and hasattr(tok, "convert_ids_to_tokens"),
          f"{what}: {folder} loads as {type(tok).__name__}, not a tokenizer")
    return tok


def start_token(tok: Any) -> int | None:
    """The token a paragraph starts from: the tokenizer's BOS token, else its EOS token (the
    document separator of GPT-style tokenizers), else None (the first token is then context only)."""
    for name in ("bos_token_id", "eos_token_id"):
        value = getattr(tok, name, None)
        if isinstance(value, int) and value >= 0:
            return value
    return None


def encode(tok: Any, paragraphs: list[str], what: str = TOKENIZER_LABEL) -> list[list[int]]:
    """Token ids of each paragraph, no special tokens added; a failure of the tokenizer is one line."""
    try:
        ids = tok(paragraphs, add_special_tokens=False)["input_ids"]
    except Exception as exc:  # noqa: BLE001 - a broken tokenizer fails in its own way
        raise GradscopeError(f"{what}: encoding failed ({type(exc).__name__}: {' '.join(str(exc).split())[:200]})") from None
    check(isinstance(ids, list) and len(ids) == len(paragraphs), f"{what}: encoding gave no list of ids per paragraph")
    return ids
