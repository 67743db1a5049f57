"""Probe triplets for gradient stability (docs/definitions.md §4).

Around a target position p (1-based) in sequences of length L:
    base        = (P,  x,  S)
    same-target = (P,  x,  S′)   shares everything up to and including the target
    same-suffix = (P′, x′, S)    shares the suffix; target (x′ ≠ x where the group allows) and prefix differ
Disturbants (prefix and suffix) come from one frequency group, the target from one group. The
model reads the L tokens, then L query tokens (the output phase; PE continues through it).
"""

from __future__ import annotations

import ast
import math
import struct
import warnings
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np
import torch

from gradscope.fields import GROUPS  # noqa: F401 - the probe groups, declared with the options
from gradscope.errors import GradscopeError, check
from gradscope.guard import check_bytes, check_tensor
from gradscope.tasks.vocab import group_bounds

MEMBERS = ("base", "same-target", "same-suffix")
MAX_LABEL = 100  # characters of a condition label
MAX_HEADER = 10_000  # bytes of a .npy header (numpy's own limit)
# The most triplets a probes file may hold: 256 × the default 4 conditions × 64, more than any analysis
# runs. A file's sizes are checked against what this implies before anything is decompressed (a 42 MB
# deflate bomb would otherwise grow past 8 GB before the machine's memory refused it).
MAX_PROBE_TRIPLETS = 1 << 16


@dataclass(frozen=True)
class Probes:
    """tokens (n, 3 member, L); target_group / disturbant_group: one label per triplet."""

    tokens: torch.Tensor
    target_group: tuple[str, ...]
    disturbant_group: tuple[str, ...]

    def __post_init__(self) -> None:
        check_tensor(self.tokens, "probes", kind="int", ndim=3)
        check(self.tokens.shape[0] >= 1 and self.tokens.shape[1] == 3 and self.tokens.shape[2] >= 1,
              f"probes: shape {tuple(self.tokens.shape)}; expected (n, 3 [base, same-target, same-suffix], L) with "
              f"n, L >= 1")
        n = self.tokens.shape[0]
        check(len(self.target_group) == n and len(self.disturbant_group) == n,
              f"probes: {len(self.target_group)} target and {len(self.disturbant_group)} disturbant labels for {n} "
              f"triplets; give one of each per triplet")

    def __len__(self) -> int:
        return self.tokens.shape[0]

    @property
    def length(self) -> int:
        return self.tokens.shape[-1]

    @property
    def conditions(self) -> tuple[str, ...]:
        """'target/disturbant' label per triplet."""
        return tuple(f"{t}/{d}" for t, d in zip(self.target_group, self.disturbant_group))

    def model_inputs(self, query: int) -> torch.Tensor:
        """(n·3, 2L) rows: the probe tokens, then L query tokens; order (triplet, member)."""
        x = self.tokens.reshape(-1, self.length)
        return torch.cat([x, torch.full_like(x, query)], dim=1)


def vocabulary_groups(vocab_size: int) -> dict[str, torch.Tensor]:
    """Token ids of each group of a dual-frequency vocabulary (docs/definitions.md §3): frequent = [0, K/2),
    rare = [K/2, K), all = [0, K)."""
    pools = {"all": torch.arange(vocab_size)}
    for i, name in enumerate(GROUPS[:2]):
        low, high = group_bounds(vocab_size, i)
        pools[name] = torch.arange(low, high)
    return pools


def frequency_groups(counts: torch.Tensor, split: float = 0.5) -> dict[str, torch.Tensor]:
    """Frequent and rare token ids from counts per token id (a user's corpus statistics).

    Tokens with a nonzero count are ranked by count (descending; ties by id); the top ``split``
    fraction of them (rounded up, at least one) is frequent, the rest rare. With the paper's dual
    vocabulary (every frequent token 7× as likely as every rare one) and split 0.5 this gives back
    its halves. Tokens never seen belong to no group; ``all`` holds every seen token.
    """
    counts = torch.as_tensor(counts)
    check(counts.dim() == 1 and counts.numel() >= 2 and not counts.is_complex() and bool((counts >= 0).all()),
          f"counts: expected non-negative counts per token id, shape (K,) with K >= 2; got shape {tuple(counts.shape)}")
    check(0 < split < 1, f"split: got {split}; it must lie strictly between 0 and 1")
    seen = torch.nonzero(counts > 0).flatten()
    check(seen.numel() >= 2, f"counts: only {seen.numel()} token(s) have a nonzero count; need at least 2")
    order = seen[torch.argsort(-counts[seen].double(), stable=True)]
    n_freq = min(seen.numel() - 1, max(1, math.ceil(split * seen.numel())))
    return {"frequent": order[:n_freq].sort().values, "rare": order[n_freq:].sort().values, "all": seen}


def make_triplets(n: int, length: int, position: int, pools: dict[str, torch.Tensor], target_group: str,
                  disturbant_group: str, gen: torch.Generator) -> torch.Tensor:
    """n triplets (n, 3, L) for one condition, tokens drawn uniformly from the groups' id pools
    (``pools``: group name → token ids), with ``gen`` (CPU)."""
    check(1 <= position <= length, f"position: got {position}; valid positions are 1…{length}")
    for name, g in (("target_groups", target_group), ("disturbant_groups", disturbant_group)):
        check(g in pools, f"{name}: got {g!r}; valid values are {', '.join(pools)}")

    def draw(shape: tuple[int, ...], group: str) -> torch.Tensor:
        return pools[group][torch.randint(0, pools[group].numel(), shape, generator=gen)]

    p = position - 1
    base = draw((n, length), disturbant_group)
    target_idx = torch.randint(0, pools[target_group].numel(), (n,), generator=gen)
    base[:, p] = pools[target_group][target_idx]
    same_target = base.clone()
    same_target[:, p + 1:] = draw((n, length - p - 1), disturbant_group)
    same_suffix = base.clone()
    same_suffix[:, :p] = draw((n, p), disturbant_group)
    size = pools[target_group].numel()
    if size > 1:  # a different target from the same group
        shift = torch.randint(1, size, (n,), generator=gen)
        same_suffix[:, p] = pools[target_group][(target_idx + shift) % size]
    return torch.stack([base, same_target, same_suffix], dim=1)


def make_probes(n: int, length: int, position: int, vocab_size: int, conditions: list[tuple[str, str]],
                seed: int, pools: dict[str, torch.Tensor] | None = None) -> Probes:
    """``n`` triplets for each (target group, disturbant group) condition (balanced), seeded. Groups
    are the dual vocabulary's halves (:func:`vocabulary_groups`) unless ``pools`` gives others
    (e.g. :func:`frequency_groups` of a corpus)."""
    check(n >= 1, f"triplets: got {n}; need at least 1 per condition")
    pools = vocabulary_groups(vocab_size) if pools is None else pools
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.cat([make_triplets(n, length, position, pools, t, d, gen) for t, d in conditions])
    return Probes(tokens, tuple(t for t, _ in conditions for _ in range(n)),
                  tuple(d for _, d in conditions for _ in range(n)))


def check_probes_fit(probes: Probes, vocab_size: int, length: int) -> None:
    """Probe tokens must be vocabulary tokens (not the query) and have the model's input length."""
    check(probes.tokens.dim() == 3 and probes.tokens.shape[1] == 3,
          f"probes: got shape {tuple(probes.tokens.shape)}; expected (n, 3, L)")
    check(probes.length == length,
          f"probes: sequences have length {probes.length}; this checkpoint's task has L = {length}")
    low, high = int(probes.tokens.min()), int(probes.tokens.max())
    check(low >= 0 and high < vocab_size,
          f"probes: token ids span {low}…{high}; this model's vocabulary is 0…{vocab_size - 1}")


# ---- probes and token counts from files: the validation layer of docs/definitions.md §4's inputs ---------------

NPY_MAGIC = b"\x93NUMPY"
ZIP_MAGICS = (b"PK\x03\x04", b"PK\x05\x06")
PROBE_ARRAYS = (("tokens", "iu", 3), ("target_group", "US", 1), ("disturbant_group", "US", 1))


def _npy_header(fh: IO[bytes], what: str) -> tuple[tuple[int, ...], bool, np.dtype]:
    """(shape, fortran order, dtype) from a .npy header, parsed strictly: a literal dict of exactly
    descr (a dtype string), fortran_order (a bool) and shape (a tuple of ints), at most
    MAX_HEADER characters (numpy's own reader also runs a Python-2 tokenizer over bad headers,
    which raises tokenize errors and prints warnings)."""
    magic = fh.read(8)
    check(len(magic) == 8 and magic[:6] == NPY_MAGIC and magic[6] in (1, 2, 3) and magic[7] == 0,
          f"{what}: not a .npy array of format version 1, 2 or 3")
    size_format = "<H" if magic[6] == 1 else "<I"
    raw = fh.read(struct.calcsize(size_format))
    length = struct.unpack(size_format, raw)[0] if len(raw) == struct.calcsize(size_format) else -1
    check(0 <= length <= MAX_HEADER, f"{what}: its .npy header is truncated or longer than {MAX_HEADER} bytes")
    header = fh.read(length)
    check(len(header) == length, f"{what}: truncated inside its .npy header")
    try:
        d = ast.literal_eval(header.decode("latin1" if magic[6] < 3 else "utf-8"))
    except (UnicodeDecodeError, ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        raise GradscopeError(f"{what}: its .npy header is not a literal dictionary") from None
    ok = isinstance(d, dict) and set(d) == {"descr", "fortran_order", "shape"} and isinstance(d["descr"], str) \
        and isinstance(d["fortran_order"], bool) and isinstance(d["shape"], tuple) \
        and all(type(x) is int and x >= 0 for x in d["shape"])
    check(ok, f"{what}: its .npy header is malformed (expected descr, fortran_order and a shape of sizes >= 0)")
    try:
        dtype = np.dtype(d["descr"])
    except (TypeError, ValueError):
        raise GradscopeError(f"{what}: its .npy header names an unknown dtype {d['descr'][:20]!r}") from None
    return d["shape"], d["fortran_order"], dtype


def read_npy(fh: IO[bytes], present: float, what: str, kinds: str, ndim: int,
             limit: tuple[tuple[int | None, ...], int | None] = ((), None)) -> np.ndarray:
    """One array from the .npy stream ``fh``, its header checked before any data is read: a plain
    dtype of the numpy ``kinds`` (never objects, so never a pickle), ``ndim`` dimensions, each at
    most its entry of ``limit[0]`` and at most ``limit[1]`` bytes in all (what the command reads;
    None: any), and a size that fits in memory and that the ``present`` bytes on disk can plausibly
    hold (a deflate bomb declares gigabytes in a few kilobytes). Then exactly that many bytes are read."""
    shape, fortran, dtype = _npy_header(fh, what)
    wanted = "integers" if kinds == "iu" else "numbers" if "f" in kinds else "strings"
    check(not dtype.hasobject and dtype.fields is None and dtype.shape == () and dtype.kind in kinds,
          f"{what}: holds dtype {dtype.str!r}; expected {wanted}")
    check(len(shape) == ndim, f"{what}: has shape {shape}; expected {ndim} dimension(s)")
    nbytes = math.prod(shape) * dtype.itemsize
    for axis, (size, most) in enumerate(zip(shape, limit[0])):
        if most is not None and size > most:
            raise GradscopeError(f"{what}: declares shape {shape}; this command reads at most {most:,} along axis "
                                 f"{axis} (refused before decompressing)")
    if limit[1] is not None and nbytes > limit[1]:
        raise GradscopeError(f"{what}: declares shape {shape}, {nbytes:,} bytes; this command reads at most "
                             f"{limit[1]:,} (refused before decompressing)")
    check_bytes(min(nbytes, 1 << 100), what, present=present)
    try:
        data = fh.read(nbytes)
    except (EOFError, OSError, zlib.error, zipfile.BadZipFile) as exc:
        raise GradscopeError(f"{what}: its data cannot be read ({' '.join(str(exc).split())[:120]})") from None
    check(len(data) == nbytes, f"{what}: truncated: its header declares {nbytes} bytes of data, the file holds {len(data)}")
    return np.frombuffer(data, dtype=dtype).reshape(shape, order="F" if fortran else "C")


def _labels(values: np.ndarray | None, n: int, what: str) -> tuple[str, ...]:
    """One printable label of at most MAX_LABEL characters per triplet ("file" when none are given)."""
    if values is None:
        return ("file",) * n
    check(values.shape == (n,), f"{what}: {values.shape[0]} labels for {n} triplets; give one per triplet")
    out = []
    for v in values.tolist():
        try:
            text = v.decode("utf-8") if isinstance(v, bytes) else v
            text.encode("utf-8")
        except UnicodeError:
            raise GradscopeError(f"{what}: a label is not valid UTF-8 text") from None
        check(0 < len(text) <= MAX_LABEL and text.isprintable(),
              f"{what}: got the label {text[:40]!r}; labels are 1 to {MAX_LABEL} printable characters")
        out.append(text)
    return tuple(out)


def _member_limits(length: int | None) -> dict[str, tuple[tuple[int | None, ...], int | None]]:
    """Per probe array: the largest shape the command reads, and the most bytes it can take
    uncompressed (None: unknown; the .npy header and the memory check then bound it)."""
    n = MAX_PROBE_TRIPLETS
    labels = n * MAX_LABEL * 4  # unicode labels: 4 bytes a character
    tokens = None if length is None else n * 3 * length * 8  # int64 ids (a wrong L is refused later, by name)
    return {"tokens": ((n,), tokens), "target_group": ((n,), labels), "disturbant_group": ((n,), labels)}


def _read_npz(path: Path, length: int | None = None) -> dict[str, np.ndarray]:
    what = f"probes: {path}"
    limits = _member_limits(length)
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as exc:
        raise GradscopeError(f"{what} is not a readable .npz archive ({' '.join(str(exc).split())[:120]})") from None
    with archive:
        infos = archive.infolist()
        names = [i.filename for i in infos]
        check(len(set(names)) == len(names), f"{what}: the archive names a member twice")
        by_name = {i.filename: i for i in infos}
        check("tokens.npy" in by_name or "tokens" in by_name, f"{what}: has no 'tokens' array (members: {', '.join(names[:5])[:120]}); "
                                       f"expected .npz with 'tokens' (+ 'target_group', 'disturbant_group')")
        arrays = {}
        for key, kinds, ndim in PROBE_ARRAYS:
            info = by_name.get(f"{key}.npy") or by_name.get(key)  # numpy reads either name
            if info is None:
                continue
            check(not info.flag_bits & 0x1, f"{what}: its {key} array is encrypted")
            check(info.compress_type in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED),
                  f"{what}: its {key} array uses compression method {info.compress_type}; expected stored or deflated")
            most = None if limits[key][1] is None else limits[key][1] + MAX_HEADER + 128  # data and its .npy header
            check(most is None or info.file_size <= most,
                  f"{what}: its {key} array declares {info.file_size:,} bytes uncompressed; this command reads at "
                  f"most {MAX_PROBE_TRIPLETS:,} triplets ({most:,} bytes; refused before decompressing)")
            try:
                with archive.open(info) as fh:
                    arrays[key] = read_npy(fh, info.compress_size, f"{what}: {key}", kinds, ndim, limits[key])
            except (zipfile.BadZipFile, zlib.error, EOFError, OSError, ValueError) as exc:
                if isinstance(exc, GradscopeError):
                    raise
                raise GradscopeError(f"{what}: its {key} array cannot be read ({' '.join(str(exc).split())[:120]})") from None
    return arrays


def read_probe_arrays(path: Path, length: int | None = None) -> Probes:
    """Probe triplets from a .npy file (int (n, 3, L)) or a .npz archive (``tokens`` plus optional
    ``target_group`` and ``disturbant_group`` string arrays). Everything is checked before it is
    used: sizes against what the command reads (at most :data:`MAX_PROBE_TRIPLETS` triplets of
    ``length`` L, when the model's L is known: the zip headers' and the .npy headers' declared sizes,
    before anything is decompressed), against memory and against the bytes on disk, dtypes (never
    objects, so never a pickle), shapes, and ids (non-negative; against a vocabulary with
    :func:`check_probes_fit`)."""
    path = Path(path)
    what = f"probes: {path}"
    check(path.is_file(), f"probes: {path} does not exist")
    try:
        with open(path, "rb") as fh:
            magic = fh.read(6)
            fh.seek(0)
            npy = read_npy(fh, path.stat().st_size, what, "iu", 3, _member_limits(length)["tokens"]) \
                if magic == NPY_MAGIC else None
    except OSError as exc:
        raise GradscopeError(f"{what}: cannot be read ({exc.strerror or type(exc).__name__})") from None
    if npy is not None:
        arrays = {"tokens": npy}
    elif magic[:4] in ZIP_MAGICS:
        arrays = _read_npz(path, length)
    else:
        raise GradscopeError(f"probes: cannot read {path}: neither .npy nor .npz; expected .npy int64 (n, 3, L), "
                             f".npz with 'tokens', or a stability store")
    tokens = arrays["tokens"]
    check(tokens.shape[0] >= 1 and tokens.shape[1] == 3 and tokens.shape[2] >= 1,
          f"{what} has shape {tokens.shape}; expected (n, 3 [base, same-target, same-suffix], L) with n, L >= 1")
    low, high = int(tokens.min()), int(tokens.max())
    check(low >= 0 and high < 2**62, f"{what}: token ids span {low}…{high}; ids are non-negative vocabulary indices")
    n = tokens.shape[0]
    return Probes(torch.from_numpy(tokens.astype(np.int64)), _labels(arrays.get("target_group"), n, f"{what}: target_group"),
                  _labels(arrays.get("disturbant_group"), n, f"{what}: disturbant_group"))


def validate_probes(probes: Any, what: str = "probes") -> Probes:
    """Probes given from outside (a tensor, a store, a Probes), checked: (n >= 1, 3, L >= 1) integer
    ids >= 0, one label of at most MAX_LABEL printable characters per triplet."""
    if isinstance(probes, torch.Tensor):
        check_tensor(probes, what, kind="int", ndim=3)
        probes = Probes(probes.long(), ("file",) * probes.shape[0], ("file",) * probes.shape[0])
    check(isinstance(probes, Probes), f"{what}: got {type(probes).__name__}; expected a path, a Probes or a tensor (n, 3, L)")
    low = int(probes.tokens.min())  # Probes checked the shape (n >= 1, 3, L >= 1) and the dtype
    check(low >= 0, f"{what}: token ids below 0 ({low}); ids are vocabulary indices")
    labels = probes.target_group + probes.disturbant_group
    check(all(isinstance(v, str) and 0 < len(v) <= MAX_LABEL and v.isprintable() for v in labels),
          f"{what}: condition labels must be 1 to {MAX_LABEL} printable characters")
    return probes


def read_counts_file(path: Path) -> torch.Tensor:
    """Token counts (K,) from a .npy file, or a text file with one count per line (line i = token id
    i): K >= 2 finite, non-negative numbers, the size checked against memory before reading."""
    path = Path(path)
    what = f"token_counts: {path}"
    check(path.is_file(), f"{what} does not exist")
    try:
        size = path.stat().st_size
        with open(path, "rb") as fh:
            magic = fh.read(6)
            fh.seek(0)
            npy = read_npy(fh, size, what, "iuf", 1) if magic == NPY_MAGIC else None
    except OSError as exc:
        raise GradscopeError(f"{what}: cannot be read ({exc.strerror or type(exc).__name__})") from None
    if npy is not None:
        values = npy
    else:
        check_bytes(4 * size, what)  # at most size/2 lines of one count, 8 bytes each
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # numpy warns about an empty file; it is refused below
                values = np.loadtxt(path, ndmin=1, dtype=np.float64)
        except (ValueError, OSError) as exc:
            raise GradscopeError(f"{what}: cannot be read as one count per line ({type(exc).__name__}); expected "
                                 f".npy or one count per line") from None
    check(values.ndim == 1 and values.size >= 2,
          f"{what} must hold one count per token id, shape (K,) with K >= 2; got shape {values.shape}")
    values = values.astype(np.float64)
    check(bool(np.isfinite(values).all()) and bool((values >= 0).all()),
          f"{what} must hold finite, non-negative counts")
    return torch.from_numpy(values)


