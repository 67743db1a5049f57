"""Probe and token-counts files (``tasks.probes``: ``read_probe_arrays``, ``read_counts_file``), mutated by
hypothesis and fed through `gradscope stability`: .npy headers, dtypes, shapes and values, .npz members,
labels, flags and compression, deflate bombs, and counts files of text or arrays. Every mutation must end
in exit 0 with the right output (numpy's own reading is the oracle), or exit 2 with one `error:` line;
never a traceback, never a partial or replaced output. Also: the probes drawn, triplets and conditions
(SPEC §4).
"""

from __future__ import annotations

import io
import math
import os
import struct
import warnings
import zipfile
import zlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from tests.helpers.fuzzkit import assert_clean, assert_untouched, count, invoke, leftovers, snapshot
from tests.helpers.hardening import FAST, FUZZ, K, L, Work, input_runs
from gradscope.store import read_store
import torch
from gradscope.errors import GradscopeError
from gradscope.tasks.probes import make_probes, make_triplets, vocabulary_groups

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Small trained checkpoints: "first" (the default core), "other" and a factory's "lm" (vocabulary 12)."""
    return input_runs(tmp_path_factory)


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


# ---- the probes drawn ----------------------------------------------------------------------------

def test_triplet_structure() -> None:
    L, p, K = 7, 3, 10
    t = make_triplets(200, L, p, vocabulary_groups(K), "rare", "frequent", torch.Generator().manual_seed(0))
    base, same_target, same_suffix = t[:, 0], t[:, 1], t[:, 2]
    i = p - 1
    assert torch.equal(base[:, :p], same_target[:, :p])  # shares prefix and target
    assert torch.equal(base[:, p:], same_suffix[:, p:])  # shares the suffix
    assert bool((base[:, i] != same_suffix[:, i]).all())  # a different target
    assert (base[:, p:] != same_target[:, p:]).any(dim=1).float().mean() > 0.95
    assert (base[:, :i] != same_suffix[:, :i]).any(dim=1).float().mean() > 0.95
    assert bool((t[:, :, i] >= 5).all())  # rare targets
    mask = torch.ones(L, dtype=torch.bool)
    mask[i] = False
    assert bool((t[:, :, mask] < 5).all())  # frequent disturbants


def test_probes_are_balanced_and_seeded() -> None:
    conds = [("frequent", "rare"), ("rare", "rare")]
    a = make_probes(5, 6, 2, 8, conds, seed=3)
    assert len(a) == 10 and a.conditions == ("frequent/rare",) * 5 + ("rare/rare",) * 5
    assert torch.equal(a.tokens, make_probes(5, 6, 2, 8, conds, seed=3).tokens)
    assert not torch.equal(a.tokens, make_probes(5, 6, 2, 8, conds, seed=4).tokens)
    with pytest.raises(GradscopeError, match="position: got 7"):
        make_probes(5, 6, 7, 8, conds, seed=3)
