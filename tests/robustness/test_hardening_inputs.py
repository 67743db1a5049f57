"""Hardening fuzz suite (issue #15): probes files, token-counts files, sweep specs and option values,
mutated by hypothesis and fed through `gradscope stability`, `dynamics`, `sweep --dry-run` and
`reproduce --dry-run`. Every mutation must end in exit 0 with the right output, or exit 2 with one
`error:` line; never a traceback, never a file outside the working directory, never a partial or
replaced output. Plus the stability workflow's UX: each checkpoint labelled by its own model, one
checkpoint in memory at a time, an existing store refused before any work, no temporaries left.
"""

from __future__ import annotations

import gc
import io
import json
import math
import os
import struct
import subprocess
import sys
import warnings
import weakref
import zipfile
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers.runs import COMPLEX_CORE, DEFAULT_CORE, OTHER_CORE
from tests.helpers.fuzzkit import assert_clean, assert_untouched, count, invoke, leftovers, snapshot
from gradscope.store import read_store

ROOT = Path(__file__).resolve().parents[2]
FUZZ = dict(derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
K, L = 8, 4  # the test checkpoints' vocabulary and probe length
FAST = ("-q", "--resamples", "2")
BUDGET = str(256 << 20)  # a small memory budget: large option values are refused, never run



@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Small trained checkpoints of two registered cores, "first" (the default) and "other" (a second
    gated core), vocabulary 8, L = 4, and a factory's LM checkpoint."""
    from tests.robustness.test_hardening_diverged import small_checkpoint
    base = tmp_path_factory.mktemp("inputs")
    out = {"first": small_checkpoint(tmp_path_factory, DEFAULT_CORE), "other": small_checkpoint(tmp_path_factory, OTHER_CORE)}
    sys.path.insert(0, str(ROOT / "docs" / "examples"))
    try:
        from lstm_lm_factory import LanguageModel
    finally:
        sys.path.pop(0)
    torch.manual_seed(0)
    torch.save(LanguageModel().state_dict(), base / "lm.pt")  # vocabulary 12
    out["lm"] = base / "lm.pt"
    return out


class Work:
    """A fresh working directory per example, inside a parent whose contents are watched."""

    def __init__(self, root: Path) -> None:
        self.root, self.n = root, 0

    def new(self) -> Path:
        self.n += 1
        d = self.root / f"w{self.n}"
        d.mkdir()
        return d


# ---- probes files: .npy ------------------------------------------------------------------------

TOKENS = (np.arange(2 * 3 * L).reshape(2, 3, L) * 5) % K  # two valid triplets


def npy(header: str, data: bytes, version: int = 1) -> bytes:
    """A .npy file with a hand-written header (any text) and data."""
    h = header.encode("latin1")
    size = 10 if version == 1 else 12
    h += b" " * ((-(size + len(h) + 1)) % 64) + b"\n"
    length = struct.pack("<H", len(h)) if version == 1 else struct.pack("<I", len(h))
    return b"\x93NUMPY" + bytes([version, 0]) + length + h + data


def array_bytes(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array(buf, arr, allow_pickle=True)
    return buf.getvalue()


HEADERS = [
    "{'descr': '<i8', 'fortran_order': False, 'shape': (1000000000000, 3, 4), }",  # claims 10^12 triplets
    "{'descr': '<i8', 'fortran_order': False, 'shape': (0, 3, 4), }",
    "{'descr': '<i8', 'fortran_order': False, 'shape': (-1, 3, 4), }",
    "{'descr': '<i8', 'fortran_order': False, 'shape': (4611686018427387904, 4611686018427387904, 4), }",
    "{'descr': '|O', 'fortran_order': False, 'shape': (2, 3, 4), }",
    "{'descr': '<f8', 'fortran_order': False, 'shape': (2, 3, 4), }",
    "{'descr': '>i8', 'fortran_order': False, 'shape': (2, 3, 4), }",
    "{'descr': '<i8', 'fortran_order': True, 'shape': (2, 3, 4), }",
    "{'descr': '<i8', 'fortran_order': 'x', 'shape': (2, 3, 4), }",
    "{'descr': '<i8', 'shape': (2, 3, 4), }",
    "{'descr': [('a', '<i8')], 'fortran_order': False, 'shape': (2, 3, 4), }",
    "{'descr': ('<i8', (1000000000,)), 'fortran_order': False, 'shape': (2, 3, 4), }",
    "{'descr': '<U4', 'fortran_order': False, 'shape': (2, 3, 4), }",
    "{'descr': '<i8', 'fortran_order': False, 'shape': ('a', 3, 4), }",
    "[1, 2, 3]",
    "{{{{",
    "{'descr': '<i8', 'fortran_order': False, 'shape': " + "(" * 300 + ")" * 300 + "}",
    "{'descr': '<i8', 'fortran_order': False, 'shape': (2, 3, 4), 'extra': 1}",
]


@st.composite
def npy_files(draw: st.DrawFn) -> tuple[str, bytes]:
    kind = draw(st.sampled_from(["valid", "shape", "dtype", "value", "header", "cut", "flip"]))
    arr = TOKENS.copy()
    if kind == "shape":
        shape = draw(st.tuples(st.sampled_from([0, 1, 2]), st.sampled_from([0, 2, 3, 4]), st.sampled_from([0, 3, 4, 5])))
        arr = (np.arange(math.prod(shape)).reshape(shape) % K) if draw(st.booleans()) else np.zeros(shape[:2], int)
    elif kind == "dtype":
        dtype = draw(st.sampled_from(["i1", "i2", "<i4", ">i8", "u1", "u8", "f4", "f8", "?", "c8", "U3", "O", "S2"]))
        arr = arr.astype(dtype)
    elif kind == "value":
        arr.flat[draw(st.integers(0, arr.size - 1))] = draw(st.sampled_from([-1, K - 1, K, 2**31, 2**62, 2**63 - 1,
                                                                              -2**63]))
    data = npy(draw(st.sampled_from(HEADERS)), TOKENS.astype("<i8").tobytes()) if kind == "header" \
        else array_bytes(arr)
    if kind == "cut":
        data = data[:draw(st.integers(0, len(data) - 1))]
    elif kind == "flip":
        i = draw(st.integers(0, len(data) - 1))
        data = data[:i] + bytes([data[i] ^ draw(st.integers(1, 255))]) + data[i + 1:]
    return kind, data


def numpy_reads(data: bytes, npz: bool = False) -> dict[str, np.ndarray] | None:
    """What numpy itself reads from the file (no pickles), or None: the oracle."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            loaded = np.load(io.BytesIO(data), allow_pickle=False)
            return {k: loaded[k] for k in loaded.files} if npz else {"tokens": loaded}
    except Exception:  # noqa: BLE001 - any failure means numpy cannot read it either
        return None


def valid_tokens(t: np.ndarray) -> bool:
    return t.dtype.kind in "iu" and t.ndim == 3 and t.shape[0] >= 1 and t.shape[1:] == (3, L) \
        and int(t.min()) >= 0 and int(t.max()) < K


def run_probes(ckpt: Path, work: Path, name: str, data: bytes) -> tuple[object, Path]:
    path = work / name
    path.write_bytes(data)
    out = work / "s.zarr"
    before = snapshot(work)
    outcome = invoke(["stability", ckpt, "--probes", path, "-o", out, *FAST])
    assert_clean(outcome, name)
    assert_untouched(before, snapshot(work), new_ok=("s.zarr",) if outcome.rc == 0 else ())
    return outcome, out


def test_probes_npy_mutations(runs: dict[str, Path], tmp_path: Path) -> None:
    work = Work(tmp_path)

    @settings(max_examples=26, **FUZZ)
    @given(npy_files())
    def check(case: tuple[str, bytes]) -> None:
        kind, data = case
        count("probes-npy")
        outcome, out = run_probes(runs["first"], work.new(), "p.npy", data)
        ref = numpy_reads(data)
        valid = ref is not None and valid_tokens(ref["tokens"])
        if kind != "flip" and kind != "cut":
            assert (outcome.rc == 0) == valid, (kind, outcome.err)
        if outcome.rc == 0:
            assert ref is not None, "accepted a file numpy cannot read"
            assert np.array_equal(read_store(out)["probe_tokens"].values, ref["tokens"].astype(np.int64))

    check()


# ---- probes files: .npz ------------------------------------------------------------------------

def zip_of(members: list[tuple[str, bytes]], compression: int) -> bytes:
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # duplicate names
        with zipfile.ZipFile(buf, "w", compression) as zf:
            for name, data in members:
                zf.writestr(name, data)
    return buf.getvalue()


def patch_headers(data: bytes, offset_local: int, offset_central: int, value: int) -> bytes:
    """Set a 2-byte field in every local and central zip header (flags: 6/8, method: 8/10)."""
    out = bytearray(data)
    for sig, off in ((b"PK\x03\x04", offset_local), (b"PK\x01\x02", offset_central)):
        i = out.find(sig)
        while i >= 0:
            out[i + off:i + off + 2] = struct.pack("<H", value)
            i = out.find(sig, i + 4)
    return bytes(out)


LABELS = [np.array(["rare", "frequent"]), np.array([b"rare", b"freq"]), np.array(["a"]), np.array(["", "x"]),
          np.array(["x\x00", "y"]), np.array(["r" * 200, "f"]), np.array([1, 2]), np.array([["a", "b"]]),
          np.array(["rare", "frequent"], dtype=object), np.array([b"\xff\xfe", b"ok"])]


@st.composite
def npz_files(draw: st.DrawFn) -> tuple[str, bytes]:
    kind = draw(st.sampled_from(["valid", "labels", "members", "tokens", "flags", "method", "cut", "flip"]))
    members = [("tokens.npy", array_bytes(TOKENS)),
               ("target_group.npy", array_bytes(np.array(["rare", "frequent"]))),
               ("disturbant_group.npy", array_bytes(np.array(["frequent", "frequent"])))]
    if kind == "labels":
        which = draw(st.sampled_from([1, 2]))
        members[which] = (members[which][0], array_bytes(draw(st.sampled_from(LABELS))))
    elif kind == "members":
        change = draw(st.sampled_from(["drop-tokens", "drop-labels", "rename", "duplicate", "extra", "no-ext"]))
        if change == "drop-tokens":
            members = members[1:]
        elif change == "drop-labels":
            members = members[:1]
        elif change == "rename":
            members[0] = ("Tokens.npy", members[0][1])
        elif change == "duplicate":
            members.append(("tokens.npy", array_bytes(TOKENS + 1)))
        elif change == "extra":
            members.append(("junk.bin", os.urandom(64)))
        else:
            members[0] = ("tokens", members[0][1])
    elif kind == "tokens":
        _, data = draw(npy_files())
        members[0] = ("tokens.npy", data)
    compression = draw(st.sampled_from([zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED]))
    data = zip_of(members, compression)
    if kind == "flags":
        data = patch_headers(data, 6, 8, 0x1)  # "encrypted"
    elif kind == "method":
        data = patch_headers(data, 8, 10, draw(st.sampled_from([1, 12, 14, 99])))
    elif kind == "cut":
        data = data[:draw(st.integers(0, len(data) - 1))]
    elif kind == "flip":
        i = draw(st.integers(0, len(data) - 1))
        data = data[:i] + bytes([data[i] ^ draw(st.integers(1, 255))]) + data[i + 1:]
    return kind, data


def labels_ok(values: np.ndarray | None, n: int) -> bool:
    if values is None:
        return True
    if values.dtype.kind not in "US" or values.shape != (n,):
        return False
    try:
        texts = [v.decode("utf-8") if isinstance(v, bytes) else v for v in values.tolist()]
    except UnicodeError:
        return False
    return all(0 < len(t) <= 100 and t.isprintable() for t in texts)


def test_probes_npz_mutations(runs: dict[str, Path], tmp_path: Path) -> None:
    work = Work(tmp_path)

    @settings(max_examples=26, **FUZZ)
    @given(npz_files())
    def check(case: tuple[str, bytes]) -> None:
        kind, data = case
        count("probes-npz")
        outcome, out = run_probes(runs["first"], work.new(), "p.npz", data)
        ref = numpy_reads(data, npz=True)
        tokens = None if ref is None else ref.get("tokens")
        valid = tokens is not None and valid_tokens(tokens) and all(
            labels_ok(ref.get(k), tokens.shape[0]) for k in ("target_group", "disturbant_group"))
        if kind in ("valid", "labels", "tokens"):
            assert (outcome.rc == 0) == valid, (kind, outcome.err)
        if outcome.rc == 0:
            assert tokens is not None, "accepted an archive numpy cannot read"
            ds = read_store(out)
            assert np.array_equal(ds["probe_tokens"].values, tokens.astype(np.int64))
            if "target_group" in ref:
                assert ds["target_group"].values.tolist() == [
                    v.decode() if isinstance(v, bytes) else v for v in ref["target_group"].tolist()]

    check()


def test_a_deflate_bomb_is_refused_before_it_is_decompressed(runs: dict[str, Path], tmp_path: Path) -> None:
    """A 480 MB zero array in 470 kB (ratio ~1000) is refused from its header, fast, and so is one
    whose header claims 10^12 triplets."""
    n = 5_000_000
    header = npy("{'descr': '<i8', 'fortran_order': False, 'shape': (%d, 3, 4), }" % n, b"")
    packer = zlib.compressobj(9, zlib.DEFLATED, -15)  # raw deflate, as in a zip member
    head = packer.compress(header) + packer.flush(zlib.Z_FULL_FLUSH)
    block = packer.compress(bytes(1 << 24)) + packer.flush(zlib.Z_FULL_FLUSH)  # after a full flush: the same bytes
    blocks = n * 96 >> 24  # 16 MiB of zeros each
    body = head + block * blocks + packer.flush()
    size, name = len(header) + (blocks << 24), b"tokens.npy"
    local = struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, 0, 8, 0, 0, 0, len(body), size, len(name), 0) + name
    central = struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 20, 20, 0, 8, 0, 0, 0, len(body), size, len(name), 0, 0,
                          0, 0, 0, 0) + name
    end = struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, 1, 1, len(central), len(local) + len(body), 0)
    buf = io.BytesIO(local + body + central + end)
    assert len(buf.getvalue()) < size / 1000  # a real deflate bomb
    (tmp_path / "bomb.npz").write_bytes(buf.getvalue())
    outcome = invoke(["stability", runs["first"], "--probes", tmp_path / "bomb.npz", "-o", tmp_path / "s.zarr", *FAST])
    count("probes-npz")
    # refused from the zip header's declared size against the triplets the command reads (issue #24)
    assert outcome.rc == 2 and "before decompressing" in outcome.err and outcome.err.count("\n") == 1, outcome.err
    (tmp_path / "claims.npy").write_bytes(npy(HEADERS[0], TOKENS.tobytes()))
    outcome = invoke(["stability", runs["first"], "--probes", tmp_path / "claims.npy", "-o", tmp_path / "s.zarr", *FAST])
    count("probes-npy")
    assert outcome.rc == 2 and "at most" in outcome.err, outcome.err
    assert not (tmp_path / "s.zarr").exists() and not leftovers(tmp_path)


def _bomb(path: Path, triplets: int, length: int, honest_header: bool) -> None:
    """A .npz whose tokens.npy declares (triplets, 3, length) int64 zeros, deflated (~1000:1). With
    ``honest_header`` the zip header states the true uncompressed size; without, it understates it
    (as a forged archive would), and only the .npy header inside tells the truth. (The honest one's
    CRC is wrong: it is never read to its end.)"""
    header = npy("{'descr': '<i8', 'fortran_order': False, 'shape': (%d, 3, %d), }" % (triplets, length), b"")
    packer = zlib.compressobj(9, zlib.DEFLATED, -15)
    nbytes = triplets * 3 * length * 8
    body = packer.compress(header) + packer.compress(bytes(1 << 20)) * (nbytes >> 20) + packer.flush()
    size, name = len(header) + (nbytes >> 20 << 20), b"tokens.npy"
    stated = size if honest_header else 1 << 20  # a forged header: 1 MiB, with the CRC of that first MiB
    crc = 0 if honest_header else zlib.crc32((header + bytes(stated))[:stated])
    local = struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, 0, 8, 0, 0, crc, len(body), stated, len(name), 0) + name
    central = struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 20, 20, 0, 8, 0, 0, crc, len(body), stated, len(name), 0,
                          0, 0, 0, 0, 0) + name
    end = struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, 1, 1, len(central), len(local) + len(body), 0)
    path.write_bytes(local + body + central + end)


@pytest.mark.parametrize("honest_header", [True, False])
def test_a_bomb_is_judged_by_what_the_command_reads_not_by_memory(tmp_path: Path, honest_header: bool) -> None:
    """Issue #24: a 42 MB deflate bomb grew past 8 GB before the machine's memory refused it. Here a
    bomb of 2 × MAX_PROBE_TRIPLETS triplets (100 MB of zeros, ~100 kB on disk, a ratio below the
    generic bomb check's) with a memory budget of 1 TB: refused from the declared sizes alone, in
    well under a second, allocating almost nothing."""
    import time
    import tracemalloc

    from gradscope.errors import GradscopeError
    from gradscope.tasks.probes import MAX_PROBE_TRIPLETS, read_probe_arrays

    L = 16
    _bomb(tmp_path / "bomb.npz", 2 * MAX_PROBE_TRIPLETS, L, honest_header)
    assert (tmp_path / "bomb.npz").stat().st_size < 2 * MAX_PROBE_TRIPLETS * 3 * L * 8 / 500
    os.environ["GRADSCOPE_MEMORY_BUDGET"] = str(1 << 40)  # memory would let it through
    try:
        tracemalloc.start()
        tic = time.perf_counter()
        with pytest.raises(GradscopeError, match="at most 65,?536") as err:
            read_probe_arrays(tmp_path / "bomb.npz", L)
        seconds, (_, peak) = time.perf_counter() - tic, tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        del os.environ["GRADSCOPE_MEMORY_BUDGET"]
    assert "before decompressing" in str(err.value)
    assert seconds < 1.0 and peak < 4 << 20, (seconds, peak)
    count("probes-npz")


# ---- token-counts files (a model of your own) ---------------------------------------------------

COUNT_VALUES = st.one_of(st.integers(-3, 10**6), st.sampled_from([0, 1e400, -1e400, float("nan"), 1e308, 2**70]),
                         st.floats(allow_nan=True, allow_infinity=True))


@st.composite
def counts_files(draw: st.DrawFn) -> tuple[str, bytes]:
    kind = draw(st.sampled_from(["valid", "text", "junk", "npy", "npy-shape"]))
    if kind == "valid":  # 2 to 12 counts (the model's vocabulary is 12), two or more of them seen
        values = draw(st.lists(st.integers(0, 10**6), min_size=2, max_size=12).filter(lambda v: sum(x > 0 for x in v) >= 2))
        return kind, "\n".join(map(str, values)).encode()
    if kind == "text":
        values = draw(st.lists(COUNT_VALUES, min_size=0, max_size=14))
        sep = draw(st.sampled_from(["\n", "\r\n", " ", ","]))
        return kind, sep.join(repr(v) if isinstance(v, float) else str(v) for v in values).encode()
    if kind == "junk":
        return kind, draw(st.binary(max_size=40))
    if kind == "npy":
        dtype = draw(st.sampled_from(["<i8", "<f8", "<f4", "u1", "?", "c8", "U3", "O"]))
        values = np.array(draw(st.lists(st.integers(0, 100), min_size=0, max_size=14))).astype(dtype)
        return kind, array_bytes(values)
    return kind, array_bytes(np.ones(draw(st.sampled_from([(3, 4), (), (0,), (1,), (13,)]))))


def test_token_counts_mutations(runs: dict[str, Path], tmp_path: Path) -> None:
    work = Work(tmp_path)
    factory = f"{ROOT / 'docs' / 'examples' / 'lstm_lm_factory.py'}:build"

    @settings(max_examples=16, **FUZZ)
    @given(counts_files())
    def check(case: tuple[str, bytes]) -> None:
        kind, data = case
        count("token-counts")
        w = work.new()
        path = w / ("c.npy" if kind.startswith("npy") else "c.txt")
        path.write_bytes(data)
        before = snapshot(w)
        outcome = invoke(["stability", runs["lm"], "--model-factory", factory, "--token-counts", path, "--length", "4",
                          "--triplets", "1", "--target-pos", "2", "-o", w / "s.zarr", *FAST])
        assert_clean(outcome, kind)
        assert_untouched(before, snapshot(w), new_ok=("s.zarr",) if outcome.rc == 0 else ())
        if kind == "valid":
            assert outcome.rc == 0, outcome.err
        if outcome.rc == 0:  # then the counts were K <= 12 finite non-negative numbers, two or more seen
            tokens = read_store(w / "s.zarr")["probe_tokens"].values
            assert tokens.shape[1:] == (3, 4) and tokens.min() >= 0 and tokens.max() < 12

    check()


# ---- sweep specs ---------------------------------------------------------------------------------

def toml_value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return "nan" if v != v else ("inf" if v > 0 else "-inf") if math.isinf(v) else repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    assert isinstance(v, dict)
    return "{" + ", ".join(f"{json.dumps(k)} = {toml_value(x)}" for k, x in v.items()) + "}"


def toml(doc: dict) -> str:
    lines = [f"{json.dumps(k)} = {toml_value(v)}" for k, v in doc.items() if not isinstance(v, dict)]
    for k, v in doc.items():
        if isinstance(v, dict):
            lines.append(f"[{json.dumps(k)}]")
            lines += [f"{json.dumps(kk)} = {toml_value(vv)}" for kk, vv in v.items()]
    return "\n".join(lines) + "\n"


BAD_NAMES = st.sampled_from(["/../../x", "../up", "a/b", ".hidden", "", "x" * 300, "ok name", "tab\tname", "..",
                             "C:\\x", "ünï", 3, 1.5, True, [1], {"a": 1}])
SCALARS = st.one_of(st.integers(-2, 40), st.sampled_from([10**6, 10**9, 10**12, 2**63, 10**30, 0.5, float("nan"),
                                                          float("inf"), DEFAULT_CORE, OTHER_CORE, COMPLEX_CORE, "none", "sinusoidal",
                                                          "../x", "", True]))
VALUES = st.one_of(SCALARS, st.lists(SCALARS, max_size=3), st.dictionaries(st.sampled_from(["a", "b"]), SCALARS,
                                                                           max_size=2))
SETTING_KEYS = st.sampled_from(["hidden_size", "vocab_size", "iterations", "batch_size", "lr", "embed_size", "num_layers",
                                "length", "heldout_size", "checkpoint_every", "max_len", "seed", "bogus", "device", "pe",
                                "core"])
AXIS_KEYS = st.sampled_from(["seed", "pe", "core", "vocab_size", "hidden_size", "task", "bogus"])
TABLE_KEYS = {"accuracy": ["checkpoints", "bins", "device", "bogus"],
              "stability": ["checkpoints", "target_freq", "disturbant", "triplets", "target_pos", "position", "seed", "device"]}


@st.composite
def specs(draw: st.DrawFn) -> tuple[str, str]:
    """(mutation, TOML text): a valid spec, then at most one mutation."""
    doc: dict = {"name": draw(st.sampled_from(["grid", "g-1", "sweep_2", "a.b"])), "settings": {"iterations": 10},
                 "axes": {"seed": draw(st.sampled_from([[1], [1, 2]]))}}
    if draw(st.booleans()):
        doc["axes"]["pe"] = ["none", "sinusoidal"]
    if draw(st.booleans()):
        doc["stability"] = {"triplets": 2, "checkpoints": "last"}
    mutation = draw(st.sampled_from(["none", "none", "name", "preset", "settings", "axes", "table", "deep", "insert",
                                     "cut", "table-as-value", "grid"]))
    if mutation == "name":
        doc["name"] = draw(BAD_NAMES)
    elif mutation == "preset":
        doc["preset"] = draw(st.sampled_from(["paper", "bogus", 3, ""]))
    elif mutation == "settings":
        doc["settings"][draw(SETTING_KEYS)] = draw(VALUES)
    elif mutation == "axes":
        doc["axes"][draw(AXIS_KEYS)] = draw(st.one_of(st.lists(SCALARS, min_size=0, max_size=3), SCALARS))
    elif mutation == "table":
        table = draw(st.sampled_from(list(TABLE_KEYS)))
        doc[table] = {**doc.get(table, {}), draw(st.sampled_from(TABLE_KEYS[table])): draw(st.one_of(
            SCALARS, st.sampled_from(["all", "last", [5], [1, 2], ["rare"], "frequent", 10**8, -1, 2**63])))}
    elif mutation == "grid":
        doc["axes"] = {"seed": list(range(1, 120)), "hidden_size": list(range(1, 120))}
    text = toml(doc)
    if mutation == "deep":
        depth = draw(st.sampled_from([50, 3000]))
        text += "deep = " + "[" * depth + "]" * depth + "\n"
    elif mutation == "insert":
        i = draw(st.integers(0, len(text)))
        text = text[:i] + draw(st.sampled_from(["[", "]", "=", "\"", "\n[axes]\n", "\x00", "é", "{"])) + text[i:]
    elif mutation == "cut":
        text = text[:draw(st.integers(0, len(text)))]
    elif mutation == "table-as-value":
        text = text.replace("[\"axes\"]", "\"axes\" = 1\n[\"x\"]")
    return mutation, text


def test_sweep_spec_mutations(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gradscope.guard import inside
    from gradscope.workflows.sweep import plan_points, read_spec
    monkeypatch.setenv("GRADSCOPE_MEMORY_BUDGET", BUDGET)
    watched = tmp_path / "watched"
    (watched / "cwd").mkdir(parents=True)
    monkeypatch.chdir(watched / "cwd")
    before = snapshot(tmp_path)
    specs_dir = tmp_path / "specs"
    specs_dir.mkdir()
    n = 0

    @settings(max_examples=50, **FUZZ)
    @given(specs())
    def check(case: tuple[str, str]) -> None:
        nonlocal n
        mutation, text = case
        n += 1
        count("sweep-spec")
        spec = specs_dir / f"s{n}.toml"
        spec.write_text(text, encoding="utf-8")
        outcome = invoke(["sweep", spec, "--dry-run"])
        assert_clean(outcome, text[:200])
        if mutation in ("none", "name", "grid", "table-as-value") or mutation == "deep" and len(text) > 5000:
            assert outcome.rc == (0 if mutation == "none" else 2), (mutation, text[:200], outcome.err)
        if outcome.rc == 0:  # the plan shown is the spec's grid, and its directory stays in the working directory
            parsed = read_spec(spec)
            points = plan_points(parsed)
            assert f"{len(points)} grid points" in " ".join(outcome.out.split())
            inside(Path.cwd(), f"sweep-{parsed.name}", "out")
            for p in points:
                inside(Path.cwd() / "runs", p.name, "run")

    check()
    after = snapshot(tmp_path)
    assert_untouched(before, after, new_ok=("specs",))


def test_escaping_names_and_bombs_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before the fix: name = "/../../x" planned sweep-/../../x, outside the working directory; a
    deeply nested spec raised RecursionError; --scheduler bogus:// raised ValueError."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GRADSCOPE_MEMORY_BUDGET", BUDGET)
    cases = {"name = \"/../../x\"\n[axes]\nseed = [1]\n": "name",
             "a = " + "[" * 5000 + "]" * 5000 + "\n": "too deeply",
             "[settings]\nhidden_size = 100000\n[axes]\nseed = [1]\n": "memory",
             "[axes]\nseed = " + str(list(range(1, 300))) + "\nhidden_size = " + str(list(range(1, 300))) + "\n": "grid points"}
    for i, (text, message) in enumerate(cases.items()):
        (tmp_path / f"{i}.toml").write_text(text)
        outcome = invoke(["sweep", tmp_path / f"{i}.toml", "--dry-run"])
        count("sweep-spec")
        assert outcome.rc == 2 and message in outcome.err, outcome.err
    (tmp_path / "ok.toml").write_text("[axes]\nseed = [1]\n")
    outcome = invoke(["sweep", tmp_path / "ok.toml", "--scheduler", "bogus://", "--dry-run"])
    assert outcome.rc == 2 and "--scheduler" in outcome.err, outcome.err
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([f"{i}.toml" for i in range(4)] + ["ok.toml"])


# ---- option values -------------------------------------------------------------------------------

def one_bad(good: dict[str, list], bad: dict[str, list]) -> st.SearchStrategy:
    """(None, all-valid values) or (name, values with exactly that option bad): the oracle is then
    exact both ways (valid: exit 0 and the right output; one bad value: exit 2)."""

    @st.composite
    def draw_values(draw: st.DrawFn) -> tuple[str | None, dict]:
        which = draw(st.sampled_from([None, None, *bad]))
        values = {k: draw(st.sampled_from(v)) for k, v in good.items()}
        if which is not None:
            values[which] = draw(st.sampled_from(bad[which]))
        return which, values

    return draw_values()


STABILITY_GOOD = {"seed": [0, 7, 2**63 - 1], "triplets": [1, 2], "batch": [1, 3, 2**31 - 1], "pos": [1, L],
                  "sv": [1, 3, 2**31 - 1], "resamples": [1, 2], "target": [[], ["rare"], ["all", "rare"], ["rare", "rare"]],
                  "method": ["auto", "vjp", "analytic", "func"]}
STABILITY_BAD = {"seed": [-1, 2**63, 2**64, -(2**64)], "triplets": [0, -1, 10**8, 2**63], "batch": [0, -1, 2**64],
                 "pos": [0, -1, L + 1, 2**63], "sv": [0, -1, 2**64], "resamples": [0, -1, 10**7 + 1],
                 "target": [["bogus"], [""], ["rare", "x"]], "method": ["bogus", ""]}


def test_stability_option_values(runs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRADSCOPE_MEMORY_BUDGET", BUDGET)
    work = Work(tmp_path)

    @settings(max_examples=24, **FUZZ)
    @given(one_bad(STABILITY_GOOD, STABILITY_BAD))
    def check(case: tuple[str | None, dict]) -> None:
        which, v = case
        count("options-stability")
        w = work.new()
        args = ["stability", runs["first"], "-o", w / "s.zarr", "-q", "--seed", v["seed"], "--triplets", v["triplets"],
                "--batch-size", v["batch"], "--target-pos", v["pos"], "--sv", v["sv"], "--resamples", v["resamples"],
                "--method", v["method"], "--disturbant", "rare", *(a for g in v["target"] for a in ("--target-freq", g))]
        outcome = invoke(args)
        assert_clean(outcome, str(args))
        assert outcome.rc == (0 if which is None else 2), (which, outcome.err)
        if outcome.rc == 0:  # the store holds what was asked
            ds = read_store(w / "s.zarr")
            opts = json.loads(ds.attrs["options"])
            assert (opts["seed"], opts["target_pos"], opts["batch_size"], opts["method"]) == (v["seed"], v["pos"], v["batch"],
                                                                                       v["method"])
            assert ds.sizes["triplet"] == v["triplets"] * (len(set(v["target"])) or 2)
            assert ds.sizes["sv"] == min(v["sv"], 16)  # H = 16
        else:
            assert not (w / "s.zarr").exists() and not leftovers(w)

    check()


DYNAMICS_GOOD = {"seed": [0, 5], "sequences": [1], "steps": [8, 12], "lyap_warmup": [0, 2], "trajectories": [1],
                 "reorth": [1, 3], "grid": [1, 10**9], "parts": ["flow", "grid,lyapunov", "spectra,gates", "flow,flow"]}
DYNAMICS_BAD = {"seed": [-1, 2**63 - 1, 2**64], "sequences": [0, -1, 10**9], "steps": [0, 2**63, 10**9],
                "lyap_warmup": [-1, 12, 10**9], "trajectories": [0, 10**9], "reorth": [0, 2**63], "grid": [0, -1],
                "parts": ["bogus", "", "flow,bogus"]}


def test_dynamics_option_values(runs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRADSCOPE_MEMORY_BUDGET", BUDGET)
    work = Work(tmp_path)

    @settings(max_examples=12, **FUZZ)
    @given(one_bad(DYNAMICS_GOOD, DYNAMICS_BAD))
    def check(case: tuple[str | None, dict]) -> None:
        which, v = case
        count("options-dynamics")
        w = work.new()
        parts = v["parts"].split(",")
        lyapunov = ["--steps", v["steps"], "--lyap-warmup", v["lyap_warmup"], "--trajectories", v["trajectories"],
                    "--reorth", v["reorth"]] if "lyapunov" in parts else []  # a part's options only with it
        grid = ["--grid-sequences", v["grid"]] if "grid" in parts else []
        args = ["dynamics", runs["first"], "-o", w / "d.zarr", "-q", "--seed", v["seed"], "--sequences", v["sequences"],
                *lyapunov, *grid, "--parts", v["parts"], "--target-freq", "rare", "--disturbant", "rare"]
        outcome = invoke(args)
        assert_clean(outcome, str(args))
        passed = which in ("seed", "sequences", "parts") or (which == "grid" and bool(grid)) or \
            (which in ("steps", "lyap_warmup", "trajectories", "reorth") and bool(lyapunov))
        assert outcome.rc == (2 if passed else 0), (which, outcome.err)
        if outcome.rc == 0:
            opts = json.loads(read_store(w / "d.zarr").attrs["options"])
            assert (opts["seed"], opts["parts"]) == (v["seed"], list(dict.fromkeys(parts)))
            assert not lyapunov or (opts["steps"], opts["lyap_warmup"]) == (v["steps"], v["lyap_warmup"])
        else:
            assert not (w / "d.zarr").exists() and not leftovers(w)

    check()


SWEEP_GOOD = {"workers": [None, 1, 2], "threads": [None, 1, 8], "retries": [0, 3], "resources": [None, "GPU=1", "A=1,B=2"],
              "scheduler": [None, None, "tcp://127.0.0.1:8786", "localhost:8786", "tcp://[::1]:8786"]}
SWEEP_BAD = {"workers": [0, -1, 10**8], "threads": [0, 10**9], "retries": [-1, 10**9],
             "resources": ["GPU", "GPU=0", "GPU=nan", "GPU=inf", "=1"],
             "scheduler": ["bogus://", "tcp://", "host:0", "host:99999", "../x", "tcp://h:1/x"]}
REPRODUCE_GOOD = {"seeds": ["1", "1,2", "0", str(2**63 - 1)], "triplets": [1, 64], "iterations": [None, 1, 10**12],
                  "models": [DEFAULT_CORE, f"{OTHER_CORE},{COMPLEX_CORE}"]}
REPRODUCE_BAD = {"seeds": ["-1", "1,1", str(2**63), "a", "", "9" * 5000], "triplets": [0, -1, 10**9],
                 "iterations": [0, -1], "models": [f"{DEFAULT_CORE},{DEFAULT_CORE}", "bogus", ""]}


def test_sweep_and_reproduce_option_values(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRADSCOPE_MEMORY_BUDGET", str(1 << 30))  # two local workers (256 MB each) fit
    monkeypatch.chdir(tmp_path)
    (tmp_path / "grid.toml").write_text("name = \"g\"\n[settings]\niterations = 10\n[axes]\nseed = [1, 2]\n")
    before = snapshot(tmp_path)

    @settings(max_examples=20, **FUZZ)
    @given(one_bad(SWEEP_GOOD, SWEEP_BAD))
    def sweep(case: tuple[str | None, dict]) -> None:
        which, v = case
        count("options-sweep")
        if v["scheduler"] is not None and which != "workers":
            v["workers"] = None  # workers size a local cluster only
        args = ["sweep", "grid.toml", "--dry-run", "--retries", v["retries"]]
        for flag in ("workers", "threads", "resources", "scheduler"):
            if v[flag] is not None:
                args += [f"--{flag}", v[flag]]
        outcome = invoke(args)
        assert_clean(outcome, str(args))
        assert outcome.rc == (0 if which is None else 2), (which, outcome.err)
        if outcome.rc == 0:
            assert "2 grid points" in " ".join(outcome.out.split())

    @settings(max_examples=15, **FUZZ)
    @given(one_bad(REPRODUCE_GOOD, REPRODUCE_BAD))
    def reproduce(case: tuple[str | None, dict]) -> None:
        which, v = case
        count("options-reproduce")
        args = ["reproduce", "--dry-run", "--no-measure", "--seeds", v["seeds"], "--triplets", v["triplets"],
                "--models", v["models"], "-o", "study", *(("--iterations", v["iterations"]) if v["iterations"] else ())]
        outcome = invoke(args)
        assert_clean(outcome, str(args))
        assert outcome.rc == (0 if which is None else 2), (which, outcome.err)
        if outcome.rc == 0:  # one row per model × PE × seed
            runs = len(v["models"].split(",")) * 2 * len(v["seeds"].split(","))
            assert sum(" ".join(ln.split()).startswith("│ ") and "-s" in ln for ln in outcome.out.splitlines()) == runs

    sweep()
    reproduce()
    assert_untouched(before, snapshot(tmp_path))  # dry runs write nothing


def test_device_option_values(runs: dict[str, Path], tmp_path: Path) -> None:
    """Device names reach the device parser (gradscope.train.device) through every option class."""
    for i, device in enumerate(["cpu", "meta", "xpu", "cuda:7", "", "cpu:-1"]):
        for command, extra in (("stability", ("--triplets", "1", *FAST)),
                               ("dynamics", ("--sequences", "1", "--steps", "8", "--lyap-warmup", "1", "-q"))):
            count("options-device")
            out = tmp_path / f"{command}{i}.zarr"
            outcome = invoke([command, runs["first"], "-o", out, "--device", device, "--target-freq", "rare",
                              "--disturbant", "rare", *extra])
            assert_clean(outcome, f"{command} --device {device!r}")
            assert outcome.rc == 2 or device in ("cpu", "auto", "cpu:0"), device
            assert out.exists() == (outcome.rc == 0)


# ---- the stability workflow's UX -------------------------------------------------------------------

def test_checkpoints_of_different_models_are_labelled_by_their_own_config(runs: dict[str, Path],
                                                                          tmp_path: Path) -> None:
    """Before the fix: a GRU and an LSTM given together were both recorded as "gru" (here: any two
    registered cores), and two
    checkpoints of one iteration in one folder shared (and overwrote) their rows of the table."""
    import shutil
    same = tmp_path / "same"
    same.mkdir()
    for core, role in ((DEFAULT_CORE, "first"), (OTHER_CORE, "other")):
        shutil.copy(runs[role], same / f"{core}.pt")
    out = tmp_path / "s.zarr"
    outcome = invoke(["stability", same / f"{DEFAULT_CORE}.pt", same / f"{OTHER_CORE}.pt", "-o", out, "--triplets", "1",
                      "--target-freq", "rare", "--disturbant", "rare", *FAST])
    assert outcome.rc == 0, outcome.err
    ds = read_store(out)
    assert ds["model"].values.tolist() == [f"{DEFAULT_CORE}-none", f"{OTHER_CORE}-none"]
    assert [c["model_config"]["core"] for c in json.loads(ds.attrs["checkpoints"])] == [DEFAULT_CORE, OTHER_CORE]
    rows = [ln for ln in outcome.out.splitlines() if "rare/rare" in ln]
    assert len(rows) == 2 and f"{DEFAULT_CORE}-none" in rows[0] and f"{OTHER_CORE}-none" in rows[1], outcome.out


def test_checkpoints_are_loaded_one_at_a_time(runs: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    from gradscope.workflows import common
    from gradscope.workflows import stability as workflow
    alive: list[weakref.ref] = []
    held = []
    real = common.load_checkpoint  # what every workflow loads through (common.load_source)

    def load(path: Path):  # noqa: ANN202
        gc.collect()
        held.append(sum(r() is not None for r in alive))
        loaded = real(path)
        alive.append(weakref.ref(loaded))
        return loaded

    monkeypatch.setattr(common, "load_checkpoint", load)
    run = workflow.run_checkpoint_stability([runs["first"], runs["other"], runs["first"]],
                                 workflow.StabilityOptions(triplets=1, target_freq=("rare",)))
    assert held == [0, 0, 0]  # nothing of the previous checkpoint (optimizer state included) is held
    assert len(run.results) == 3


def test_an_existing_store_is_refused_before_any_work(runs: dict[str, Path], tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from gradscope.workflows import stability as workflow
    calls = []
    real = workflow.probe_stability
    monkeypatch.setattr(workflow, "probe_stability", lambda *a, **k: calls.append(1) or real(*a, **k))
    (tmp_path / "s.zarr").mkdir()
    (tmp_path / "s.zarr" / "mine").write_text("keep")
    (tmp_path / "file.zarr").write_text("a file")
    before = snapshot(tmp_path)
    for out, extra, message in (("s.zarr", (), "already exists"), ("file.zarr", ("--overwrite",), "is a file"),
                                ("missing/s.zarr", (), "does not exist")):
        for command in ("stability", "dynamics"):
            outcome = invoke([command, runs["first"], "-o", tmp_path / out, *extra, "-q"])
            assert outcome.rc == 2 and message in outcome.err, outcome.err
    assert calls == [] and snapshot(tmp_path) == before

    def appear(*a, **k):  # noqa: ANN002, ANN003, ANN202 - another run writes the store meanwhile
        (tmp_path / "late.zarr").mkdir(exist_ok=True)
        (tmp_path / "late.zarr" / "theirs").write_text("theirs")
        return real(*a, **k)

    monkeypatch.setattr(workflow, "probe_stability", appear)
    outcome = invoke(["stability", runs["first"], "-o", tmp_path / "late.zarr", "--triplets", "1", *FAST])
    assert outcome.rc == 2 and "already exists" in outcome.err, outcome.err
    assert (tmp_path / "late.zarr" / "theirs").read_text() == "theirs" and not leftovers(tmp_path)


def test_a_killed_runs_temporaries_are_removed_by_the_rerun(runs: dict[str, Path], tmp_path: Path) -> None:
    from gradscope.files.publish import temp_path
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = temp_path(tmp_path / "k.zarr")
    stale = stale.with_name(stale.name.replace(f"-{os.getpid()}-", f"-{dead.pid}-"))
    (stale / "c").mkdir(parents=True)  # what a `stability -o k.zarr` killed while writing leaves
    ours = temp_path(tmp_path / "k.zarr")  # a live writer's (this process) must be kept
    ours.mkdir()
    outcome = invoke(["stability", runs["first"], "-o", tmp_path / "k.zarr", "--triplets", "1", *FAST])
    assert outcome.rc == 0, outcome.err
    assert not stale.exists() and ours.exists()
    ours.rmdir()
    assert not leftovers(tmp_path)
