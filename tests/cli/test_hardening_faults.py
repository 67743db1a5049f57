"""The commands under faults: kill -9 at random moments, a full disk, and concurrent writers.

Every command here runs in a real child process (``faultkit``: forked from this one, so it starts
warm). The promises checked:

- **kill -9, then run again:** a killed ``train`` resumed to the end gives the same run as an
  uninterrupted one: every checkpoint equal in every field (no field is exempt: a checkpoint holds
  no wall-clock value), the same ``metrics.jsonl`` except its wall-clock ``tokens_per_s``, the same
  ``eval.json`` and ``config.json``; a killed ``stability -o`` run again writes the complete store; a
  killed sweep point run again finishes it. No temporary is left anywhere, and a kill never leaves
  a partial file under a real name.
- **A full disk** (RLIMIT_FSIZE: writes fail with EFBIG; ENOSPC on a small tmpfs, where this test
  may mount one): exit 2 with one ``error:`` line, no partial output, no temporary, an existing
  output that ``--overwrite`` was to replace intact.
- **Two writers at once** without ``--overwrite``: exactly one exits 0, the other exits 2 with one
  line; the output is the winner's, complete; nothing is left behind. (Two ``write_store`` calls
  at once, the library's side of this, are in tests/store/test_io.py.)

The kill moments are drawn from seeded generators; where a moment must fall inside a write, the
child's writes are made slow (``faultkit.slow``: same bytes, a pause in the middle) and the kill
waits for the temporary to appear.

Not covered: killing ``gradscope sweep`` itself. Each sweep starts a dask cluster whose workers
import torch afresh (~10 s each on the 2-core test machine), and a killed CLI orphans them; the
per-point runner, which is where a sweep's files are written, is killed here instead, and
``test_sweep.py`` kills a worker of a real cluster.
"""

from __future__ import annotations

import errno
import json
import os
import random
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pytest
import xarray as xr

from tests.helpers.faultkit import Child, Gate, fork_call, slow, spawn, temporaries, wait_for, writing
from tests.helpers.fuzzkit import Outcome, count, snapshot
from tests.helpers.hardening import metrics, raw, run_differences, warm
from tests.helpers.runs import DEFAULT_CORE, TINY_POINT_SETTINGS

TRAIN_OPTS = ["--core", DEFAULT_CORE, "--hidden-size", "16", "--embed-size", "8", "--vocab-size", "8", "--length", "4", "--heldout-size", "64",
              "--grid-per-cell", "2", "--batch-size", "16", "--iterations", "40", "--warmup", "3", "--threads", "1",
              # checkpoints at 4, 8, 12…, log lines at 10, 20…: a resume between two log lines is possible
              "--checkpoint-every", "4", "--log-every", "10", "-q"]
ITERATIONS, EVERY = 40, 4
STAB_OPTS = ["--triplets", "8", "--resamples", "200", "-q"]
WALL_CLOCK_ATTRS = {"created"}  # store attributes that record when, not what


def train_args(out: str = "run", seed: int = 7) -> list[str]:
    return ["train", "-o", out, *TRAIN_OPTS, "--seed", str(seed)]


PROVENANCE_COORDS = {"checkpoint_path", "sha256"}  # where the input checkpoint lay, and its file's hash
PROVENANCE_ATTRS = {"checkpoints", "integrity"}  # the same again, and the hashes of the variables with them


def store_differences(ref: Path, got: Path, *, other_inputs: bool = False, ignore: set[str] = set()) -> list[str]:
    """How the store ``got`` differs from ``ref`` (values, coordinates, attributes less wall-clock and
    less ``ignore``).
    ``other_inputs``: the stores were computed from equal checkpoints in other files, so the inputs'
    paths and file hashes (a checkpoint file embeds its temporary's name) are not compared."""
    from gradscope.store.io import read_store
    a, b = read_store(ref), read_store(got)
    if other_inputs:
        a, b = (x.drop_vars([c for c in PROVENANCE_COORDS if c in x.variables]) for x in (a, b))
        for x in (a, b):
            x.attrs = {k: v for k, v in x.attrs.items() if k not in PROVENANCE_ATTRS}
    found = []
    try:
        xr.testing.assert_equal(a, b)
    except AssertionError as exc:
        found.append(f"values: {str(exc)[:600]}")
    for key in sorted((set(a.attrs) | set(b.attrs)) - WALL_CLOCK_ATTRS - ignore):
        if a.attrs.get(key) != b.attrs.get(key):
            found.append(f"attribute {key}: {str(b.attrs.get(key))[:120]} != {str(a.attrs.get(key))[:120]}")
    return found


def ending(o: Outcome) -> str:
    return f"exit {o.rc}; stderr: {o.err.strip()[-1500:]!r}"


def one_line_error(o: Outcome) -> str | None:
    """None if ``o`` is exit 2 with exactly one ``error:`` line, else what it was."""
    if o.rc == 2 and o.problem() is None:
        return None
    return ending(o)


# ---- the reference runs, computed once, uninterrupted ------------------------------------------

@dataclass
class Ref:
    root: Path
    run: Path  # seed 7
    run8: Path  # seed 8
    store: Path  # stability, seed 0
    store1: Path  # stability, seed 1
    stability_seconds: float
    summary: Path = Path()  # summarize --metric all (from the summaries fixture)
    csv: Path = Path()  # summarize --csv (main metrics)
    csv_all: Path = Path()  # summarize --csv --metric all
    csv_model: Path = Path()  # summarize --csv --by model
    report: Path = Path()  # from the report fixture

    @property
    def ckpt(self) -> Path:
        return self.run / f"step-{ITERATIONS:07d}.pt"


def ok(child: Child, what: str, timeout: float = 120) -> Outcome:
    o = child.outcome(timeout)
    assert o.rc == 0, f"{what}: {ending(o)}"
    return o


@pytest.fixture(scope="module")
def ref(tmp_path_factory: pytest.TempPathFactory) -> Ref:
    """Uninterrupted runs (seeds 7 and 8) and stability stores of the first (probe seeds 0 and 1)."""
    warm()
    root = tmp_path_factory.mktemp("faults-ref")
    logs = root / "logs"
    a, b = spawn(train_args("run"), cwd=root, logs=logs), spawn(train_args("run8", seed=8), cwd=root, logs=logs)
    ok(a, "reference train"), ok(b, "reference train, seed 8")
    ckpt = root / "run" / f"step-{ITERATIONS:07d}.pt"
    tic = time.monotonic()
    a = spawn(["stability", ckpt, *STAB_OPTS, "-o", "k.zarr"], cwd=root, logs=logs)
    b = spawn(["stability", ckpt, *STAB_OPTS, "--seed", "1", "-o", "k1.zarr"], cwd=root, logs=logs)
    ok(a, "reference stability")
    seconds = time.monotonic() - tic
    ok(b, "reference stability, seed 1")
    return Ref(root, root / "run", root / "run8", root / "k.zarr", root / "k1.zarr", seconds)


@pytest.fixture(scope="module")
def summaries(ref: Ref) -> Ref:
    """``summarize --csv`` of the stability store: main metrics, and --metric all."""
    root, logs = ref.root, ref.root / "logs"
    summarize = ["summarize", ref.store, "--resamples", "200"]
    a = spawn([*summarize, "-o", "s.zarr", "--csv", "s.csv"], cwd=root, logs=logs)
    b = spawn([*summarize, "--metric", "all", "-o", "s-all.zarr", "--csv", "s-all.csv"], cwd=root, logs=logs)
    ok(a, "reference summarize"), ok(b, "reference summarize --metric all")
    ok(spawn([*summarize, "--by", "model", "-o", "s-model.zarr", "--csv", "s-model.csv"], cwd=root, logs=logs),
       "reference summarize --by model")
    ref.summary, ref.csv, ref.csv_all, ref.csv_model = (root / n for n in ("s-all.zarr", "s.csv", "s-all.csv", "s-model.csv"))
    return ref


@pytest.fixture(scope="module")
def report(ref: Ref) -> Ref:
    ok(spawn(["report", ref.store, ref.run, "--resamples", "200", "-o", "r.html"], cwd=ref.root, logs=ref.root / "logs"),
       "reference report")
    ref.report = ref.root / "r.html"
    return ref


# ---- 1. kill -9 at random moments ------------------------------------------------------------

def _steps(run: Path) -> list[int]:
    return sorted(int(p.name[5:12]) for p in run.glob("step-*.pt"))


def _check_after_kill(run: Path, ref: Ref, when: str) -> None:
    """What a kill may leave: whole checkpoints (each loads) and complete log lines that agree with the
    uninterrupted run's; never a partial file under a real name."""
    for p in run.glob("step-*.pt"):
        try:
            raw(p)
        except Exception as exc:  # noqa: BLE001
            raise AssertionError(f"{when}: {p.name} is a partial checkpoint under its final name ({exc})") from None
    if (run / "metrics.jsonl").exists():
        expected = {m["iteration"]: m for m in metrics(ref.run)}
        for m in metrics(run):
            assert expected.get(m["iteration"]) == m, f"{when}: log line {m} != uninterrupted {expected.get(m['iteration'])}"
    json.loads((run / "config.json").read_text())


def test_train_killed_at_random_moments_resumes_to_the_uninterrupted_run(ref: Ref, tmp_path: Path) -> None:
    rng = random.Random(0)
    run, logs, kills = tmp_path / "run", tmp_path / "logs", []
    resume = ["train", "--resume", "run", "-q"]
    marker = tmp_path / "writing"

    missed: list[str] = []

    def kill_inside(child: Child, name: str, what: str, also: Callable[[], bool] = lambda: True) -> None:
        """Kill ``child`` while it is inside a (slowed) write of a file named ``name``."""
        if wait_for(lambda: also() and writing(marker, name), child, what=what):
            child.kill()
        if child.status != -9:  # it ended without such a write: one fewer kill (counted below)
            assert child.status == 0, f"{what}: {ending(child.outcome())}"
            missed.append(f"{what} (no slowed write of {name} was seen)")
            return
        marker.unlink()
        kills.append(what)
        _check_after_kill(run, ref, what)

    # the fresh run, killed halfway through writing its k-th checkpoint
    k = rng.randint(2, 5)
    child = spawn(train_args(), cwd=tmp_path, logs=logs, setup=slow(0.1, torch_save=True, marker=marker))
    kill_inside(child, "step-", f"fresh run, writing checkpoint {k}", lambda: len(_steps(run)) >= k - 1)

    # resumes, killed at random moments: a random time after a random checkpoint (training, or a write)
    for _ in range(2):
        target = rng.choice([i for i in range(EVERY, ITERATIONS + 1, EVERY) if i > max(_steps(run))][:3])
        delay = rng.uniform(0.0, 0.06)
        child = spawn(resume, cwd=tmp_path, logs=logs, setup=slow(0.03, torch_save=True))
        wait_for(lambda: max(_steps(run)) >= target, child, what=f"checkpoint {target}")
        time.sleep(delay)
        child.kill()
        if child.status == -9:
            kills.append(f"resume, {delay:.3f} s after checkpoint {target}")
            _check_after_kill(run, ref, kills[-1])
        else:
            assert child.status == 0, f"resume: {child.err[-1500:]}"

    # a resume killed while it rewrites metrics.jsonl (it drops lines logged after the checkpoint)
    child = spawn(resume, cwd=tmp_path, logs=logs, setup=slow(0.2, write_text=True, marker=marker))
    kill_inside(child, "metrics.jsonl", "resume, rewriting metrics.jsonl")
    # a resume killed while it writes eval.json at the end
    child = spawn(resume, cwd=tmp_path, logs=logs, setup=slow(0.2, write_text=True, marker=marker))
    kill_inside(child, "eval.json", "resume, writing eval.json")
    count("kill: train", len(kills))
    assert len(kills) >= 4, f"too few kills landed: {kills}; missed: {missed}"

    last = spawn(resume, cwd=tmp_path, logs=logs).outcome()
    assert last.rc == 0 and last.clean(), f"final resume after kills {kills}: {ending(last)}"
    problems = [f"temporaries left: {temporaries(run)}"] if temporaries(run) else []
    problems += run_differences(ref.run, run)
    assert not problems, f"after kills ({'; '.join(kills)}), the resumed run differs from the uninterrupted one:\n" + \
        "\n".join(problems[:12])


def test_stability_killed_mid_run_then_run_again_writes_the_complete_store(ref: Ref, tmp_path: Path) -> None:
    rng = random.Random(1)
    logs, out = tmp_path / "logs", tmp_path / "k.zarr"
    args = ["stability", ref.ckpt, *STAB_OPTS, "-o", "k.zarr"]
    kills = []
    # halfway through writing the store (each file of it written slowly)
    marker = tmp_path / "writing"
    child = spawn(args, cwd=tmp_path, logs=logs, setup=slow(0.02, zarr=True, marker=marker))
    if wait_for(lambda: writing(marker), child, what="the store write"):
        time.sleep(rng.uniform(0.0, 0.2))
        child.kill()
    assert child.status == -9, f"the store write was meant to be killed: {ending(child.outcome())}"
    kills.append("writing the store")
    assert not out.exists(), "a store killed mid-write was published"
    # at random moments (loading, Jacobians, bootstrap, writing); a run that ends before its moment
    # shortens the span the next moment is drawn from
    span = 0.6 * ref.stability_seconds
    for _ in range(5):
        if len(kills) == 3:
            break
        delay = rng.uniform(0.05, span)
        child = spawn(args, cwd=tmp_path, logs=logs)
        time.sleep(delay)
        child.kill()
        if child.status == -9 and out.exists():  # the kill landed after the store was published: it is complete
            assert not store_differences(ref.store, out), f"killed {delay:.2f} s in: a store was published incomplete"
            shutil.rmtree(out)
            span = 0.7 * delay
        elif child.status == -9:
            kills.append(f"{delay:.2f} s in")
        else:  # it finished first: start from nothing again
            assert child.status == 0, ending(child.outcome())
            shutil.rmtree(out)
            span = 0.7 * delay
    count("kill: stability", len(kills))
    assert len(kills) >= 3, f"too few kills landed: {kills}"
    again = spawn(args, cwd=tmp_path, logs=logs).outcome()
    assert again.rc == 0 and again.clean(), f"re-run after kills {kills}: {ending(again)}"
    problems = [f"temporaries left: {temporaries(tmp_path)}"] if temporaries(tmp_path) else []
    problems += store_differences(ref.store, out)
    assert not problems, f"after kills ({'; '.join(kills)}): " + "\n".join(problems)


SPEC = """
name = "faults"
preset = "tiny"
[settings]
""" + TINY_POINT_SETTINGS + """iterations = 40
checkpoint_every = 4
log_every = 10
warmup = 3
[axes]
seed = [7]
[accuracy]
checkpoints = "last"
[stability]
checkpoints = "last"
triplets = 2
"""


def test_a_sweep_point_killed_at_random_moments_finishes_as_if_never_killed(ref: Ref, tmp_path: Path) -> None:
    """The sweep's per-point runner (what each dask task runs), killed in a checkpoint write, in each
    store write and at a random moment, then run again: the point's lock left by the dead runner is
    taken over, and its run and stores equal an uninterrupted runner's."""
    from gradscope.workflows.study.reproduce import Layout
    from gradscope.workflows.sweep.grid import parse_spec, plan_points, run_point

    spec = parse_spec(SPEC)
    point = plan_points(spec)[0]
    rng = random.Random(2)
    logs = tmp_path / "logs"

    def runner(root: Path) -> Callable[[], object]:
        return lambda: run_point(point, str(root), spec.analyses, threads=1)

    clean, killed = Layout(tmp_path / "clean"), Layout(tmp_path / "killed")
    reference = fork_call(runner(clean.root), cwd=tmp_path, logs=logs)
    run = killed.run(point.run)
    kills = []
    rng_k = rng.randint(2, 6)
    marker = tmp_path / "writing"
    moments: list[tuple[str, Callable[[], None], Callable[[], bool]]] = [
        ("writing a checkpoint", slow(0.1, torch_save=True, marker=marker),
         lambda: len(_steps(run)) >= rng_k and writing(marker, "step-")),
        ("writing the accuracy store", slow(0.02, zarr=True, marker=marker), lambda: writing(marker, "accuracy-")),
        ("writing the stability store", slow(0.02, zarr=True, marker=marker), lambda: writing(marker, "stability-")),
    ]
    for what, setup, moment in moments:
        child = fork_call(runner(killed.root), cwd=tmp_path, logs=logs, setup=setup)
        if wait_for(moment, child, timeout=60, what=what):
            time.sleep(rng.uniform(0.0, 0.05))
            child.kill()
        if child.status == -9:
            kills.append(what)
        else:
            assert child.status == 0, f"{what}: {child.err[-1500:]}"
        marker.unlink(missing_ok=True)
    count("kill: sweep point", len(kills))
    assert len(kills) >= 2, f"too few kills landed: {kills}"
    ok(reference, "uninterrupted point")
    last = fork_call(runner(killed.root), cwd=tmp_path, logs=logs)
    ok(last, f"point run again after kills {kills}")
    problems = [f"temporaries left: {temporaries(killed.root)}"] if temporaries(killed.root) else []
    problems += [f"lock left: {p}" for p in killed.root.rglob("*.lock")]
    problems += run_differences(clean.run(point.run), run)
    for which in (Layout.accuracy, Layout.stability):
        problems += [f"{which.__name__}: {d}" for d in store_differences(which(clean, point.run), which(killed, point.run),
                                                                          other_inputs=True)]
    assert not problems, f"after kills ({'; '.join(kills)}):\n" + "\n".join(problems[:12])


# ---- 2. a full disk: RLIMIT_FSIZE (EFBIG) and ENOSPC on a small tmpfs ---------------------------

@pytest.fixture(scope="module")
def tmpfs(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A 16 MB tmpfs (needs root and a mount permission; otherwise the ENOSPC cases are skipped)."""
    mount = tmp_path_factory.mktemp("tmpfs")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mount)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip() or done.returncode}); ENOSPC is covered by "
                    f"the RLIMIT_FSIZE cases only")
    try:
        yield mount
    finally:
        if subprocess.run(["umount", str(mount)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def fill(mount: Path, leave: int) -> None:
    """Fill the file system at ``mount`` until about ``leave`` bytes are free (0: full)."""
    st = os.statvfs(mount)
    todo = st.f_bavail * st.f_frsize - leave
    with open(mount / "filler", "ab") as fh:
        block = b"\0" * (1 << 20)
        try:
            while todo > 0:
                todo -= fh.write(block[:todo])
                fh.flush()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc


@dataclass
class WriteCase:
    """A command whose output write fails midway. ``fsize``: the RLIMIT_FSIZE that cuts it (from the
    reference outputs); ``leave``: the bytes left free on the tmpfs for it; ``args(ref, work, scratch)``:
    the command (``scratch`` is off the tmpfs); ``before``: put an
    existing output (and other inputs) in place; ``out``: the output's name in the work folder."""

    args: Callable[[Ref, Path, Path], list[object]]
    out: str
    fsize: Callable[[Ref], int]
    leave: Callable[[Ref], int]
    before: Callable[[Ref, Path], None] = lambda ref, w: None
    existing: bool = False


def _references(request: pytest.FixtureRequest, name: str) -> None:
    """Compute the reference outputs that case ``name`` is sized by (summaries, report), if any."""
    fixture = {"summarize": "summaries", "report": "report"}.get(name.split()[0])
    if fixture is not None:
        request.getfixturevalue(fixture)

def _partial_run(ref: Ref, w: Path) -> None:
    """The reference run as it was at iteration 8 (a run stopped there: no log line before 10)."""
    (w / "run").mkdir()
    for name in ("config.json", "step-0000004.pt", "step-0000008.pt"):
        shutil.copy2(ref.run / name, w / "run" / name)
    (w / "run" / "metrics.jsonl").write_text("")


def _largest_file(store: Path) -> int:
    return max(p.stat().st_size for p in store.rglob("*") if p.is_file())


def _usage(path: Path) -> int:
    return sum(-(-p.stat().st_size // 4096) * 4096 for p in path.rglob("*") if p.is_file()) if path.is_dir() \
        else -(-path.stat().st_size // 4096) * 4096


_summarize = lambda ref, w, scratch: ["summarize", ref.store, "--resamples", "200", "--metric", "all",  # noqa: E731
                             "-o", scratch / f"summary-{time.monotonic_ns()}.zarr", "--csv", "s.csv"]
CASES = {
    "train": WriteCase(lambda ref, w, scratch: train_args("run"), "run/step-0000004.pt", lambda ref: 20_000,
                       lambda ref: 24_576),
    "train --resume": WriteCase(lambda ref, w, scratch: ["train", "--resume", "run", "-q"], "run/step-0000012.pt",
                                lambda ref: 20_000, lambda ref: 24_576, _partial_run),
    "stability -o": WriteCase(lambda ref, w, scratch: ["stability", ref.ckpt, *STAB_OPTS, "-o", "k.zarr"], "k.zarr",
                              lambda ref: _largest_file(ref.store) - 1, lambda ref: _usage(ref.store) // 2),
    "stability -o --overwrite": WriteCase(
        lambda ref, w, scratch: ["stability", ref.ckpt, *STAB_OPTS, "-o", "k.zarr", "--overwrite"], "k.zarr",
        lambda ref: _largest_file(ref.store) - 1, lambda ref: _usage(ref.store) // 2,
        lambda ref, w: shutil.copytree(ref.store1, w / "k.zarr") and None, existing=True),
    "report -o": WriteCase(lambda ref, w, scratch: ["report", ref.store, ref.run, "--resamples", "200", "-o", "r.html"],
                           "r.html", lambda ref: ref.report.stat().st_size // 2, lambda ref: ref.report.stat().st_size // 2),
    "report -o --overwrite": WriteCase(
        lambda ref, w, scratch: ["report", ref.store, ref.run, "--resamples", "200", "-o", "r.html", "--overwrite"], "r.html",
        lambda ref: ref.report.stat().st_size // 2, lambda ref: ref.report.stat().st_size // 2,
        lambda ref, w: shutil.copy2(ref.report, w / "r.html") and None, existing=True),
    # the summary store goes elsewhere (off the tmpfs; its files are all smaller than the limit)
    "summarize --csv": WriteCase(_summarize, "s.csv", lambda ref: (_largest_file(ref.summary) + ref.csv_all.stat().st_size) // 2,
                                 lambda ref: 0),
    "summarize --csv --overwrite": WriteCase(
        lambda ref, w, scratch: [*_summarize(ref, w, scratch), "--overwrite"], "s.csv",
        lambda ref: (_largest_file(ref.summary) + ref.csv_all.stat().st_size) // 2, lambda ref: 0,
        lambda ref, w: (w / "s.csv").write_text("an,existing,table\n") and None, existing=True),
}


def _failed_write(ref: Ref, case: WriteCase, w: Path, scratch: Path, fsize: int | None) -> list[str]:
    """Run the case in ``w`` (ready: inputs placed, space filled); what went wrong, if anything."""
    before = snapshot(w)
    o = spawn(case.args(ref, w, scratch), cwd=w, logs=scratch / "logs", fsize=fsize).outcome()
    problems = [f"ending: {bad}"] if (bad := one_line_error(o)) else []
    problems += [f"temporaries left: {t}" for t in temporaries(w)]
    out = w / case.out
    after = snapshot(w)
    if case.existing:
        changed = [k for k, v in before.items() if (k == case.out or k.startswith(case.out + "/")) and after.get(k) != v]
        changed += [k for k in after if k.startswith(case.out + "/") and k not in before]
        problems += [f"the existing {case.out} was changed: {changed[:4]}"] if changed else []
    elif out.exists():
        problems.append(f"a partial {case.out} was left ({_usage(out)} bytes)")
    return problems


@pytest.mark.parametrize("name", list(CASES))
def test_a_file_size_limit_midway_through_a_write_is_a_one_line_error_and_leaves_nothing(
        ref: Ref, tmp_path: Path, name: str, request: pytest.FixtureRequest) -> None:
    case = CASES[name]
    _references(request, name)
    w = tmp_path / "w"
    w.mkdir()
    case.before(ref, w)
    limit = case.fsize(ref)
    problems = _failed_write(ref, case, w, tmp_path, limit)
    count("disk full: RLIMIT_FSIZE")
    assert not problems, f"{name} under RLIMIT_FSIZE={limit}:\n" + "\n".join(problems)
    if name == "train --resume":  # the failed write left a run that resumes to the uninterrupted result
        ok(spawn(["train", "--resume", "run", "-q"], cwd=w, logs=tmp_path / "logs"), "resume after EFBIG")
        assert not (diff := run_differences(ref.run, w / "run")), "\n".join(diff[:8])


@pytest.mark.parametrize("name", list(CASES))
def test_a_full_disk_midway_through_a_write_is_a_one_line_error_and_leaves_nothing(
        ref: Ref, tmpfs: Path, tmp_path: Path, name: str, request: pytest.FixtureRequest) -> None:
    case = CASES[name]
    _references(request, name)
    for p in list(tmpfs.iterdir()):
        shutil.rmtree(p) if p.is_dir() else p.unlink()
    w = tmpfs / "w"
    w.mkdir()
    case.before(ref, w)
    leave = case.leave(ref)
    fill(tmpfs, leave)
    problems = _failed_write(ref, case, w, tmp_path, None)
    count("disk full: ENOSPC")
    assert not problems, f"{name} with {leave} bytes free on a tmpfs:\n" + "\n".join(problems)
    if name == "train --resume":
        (tmpfs / "filler").unlink()
        ok(spawn(["train", "--resume", "run", "-q"], cwd=w, logs=tmp_path / "logs"), "resume after ENOSPC")
        assert not (diff := run_differences(ref.run, w / "run")), "\n".join(diff[:8])


# ---- 3. concurrent writers -----------------------------------------------------------------------

def race(commands: list[list[object]], cwd: Path, setup: Callable[[], None] | None = None) -> list[Outcome]:
    """Start the commands in children released together from one barrier; their endings."""
    gate = Gate()
    children = [spawn(c, cwd=cwd, logs=cwd / "logs", gate=gate, setup=setup) for c in commands]
    gate.open()
    return [c.outcome(120) for c in children]


def one_winner(outcomes: list[Outcome], what: str) -> int:
    """The index of the one writer that exited 0 (the other must exit 2 with one line)."""
    winners = [i for i, o in enumerate(outcomes) if o.rc == 0]
    losers = [one_line_error(o) for i, o in enumerate(outcomes) if i not in winners]
    assert len(winners) == 1 and not any(losers), \
        f"{what}: expected one writer to exit 0 and the other to exit 2 with one line; got " + \
        "; ".join(f"writer {i}: {ending(o)}" for i, o in enumerate(outcomes))
    return winners[0]


def test_two_stability_runs_on_one_store_at_once_one_wins_the_other_refuses(ref: Ref, tmp_path: Path) -> None:
    count("concurrent: stability -o")
    outcomes = race([["stability", ref.ckpt, *STAB_OPTS, "-o", "X.zarr"],
                     ["stability", ref.ckpt, *STAB_OPTS, "--seed", "1", "-o", "X.zarr"]],
                    tmp_path, setup=slow(0.01, zarr=True))
    winner = one_winner(outcomes, "two `stability -o X.zarr` at once")
    assert not temporaries(tmp_path), temporaries(tmp_path)
    diff = store_differences((ref.store, ref.store1)[winner], tmp_path / "X.zarr", ignore={"command"})
    from gradscope.store.io import read_store
    command = read_store(tmp_path / "X.zarr").attrs["command"]
    diff += [] if ("--seed 1" in command) == (winner == 1) else [f"its command is the loser's: {command}"]
    assert not diff, f"X.zarr is not the winner's (seed {winner}) store: {diff}"


def test_two_summarize_csv_on_one_file_at_once_one_wins_the_other_refuses(summaries: Ref, tmp_path: Path) -> None:
    ref = summaries
    count("concurrent: summarize --csv")
    base = ["summarize", ref.store, "--resamples", "200", "--csv", "X.csv"]
    # the same work (so they reach the CSV together), told apart by the group labels of --by
    outcomes = race([[*base, "-o", "a.zarr"], [*base, "--by", "model", "-o", "b.zarr"]], tmp_path,
                    setup=slow(0.5, fsync=True))
    winner = one_winner(outcomes, "two `summarize --csv X.csv` at once")
    assert not temporaries(tmp_path), temporaries(tmp_path)
    assert (tmp_path / "X.csv").read_text() == (ref.csv, ref.csv_model)[winner].read_text(), "X.csv is not the winner's"


def test_two_reports_on_one_file_at_once_one_wins_the_other_refuses(ref: Ref, tmp_path: Path) -> None:
    count("concurrent: report -o")
    base = ["report", ref.store, "--resamples", "200", "-o", "X.html"]
    outcomes = race([[*base, "--title", "writer-0"], [*base, "--title", "writer-1"]], tmp_path,
                    setup=slow(0.3, fsync=True))
    winner = one_winner(outcomes, "two `report -o X.html` at once")
    assert not temporaries(tmp_path), temporaries(tmp_path)
    page = (tmp_path / "X.html").read_text()
    assert f"writer-{winner}" in page and f"writer-{1 - winner}" not in page, "X.html is not the winner's report"


def test_two_trainings_into_one_run_directory_at_once_one_wins_the_other_refuses(ref: Ref, tmp_path: Path) -> None:
    count("concurrent: train -o")
    # both find run/ new before either creates it (a pause before each mkdir); then they overlap
    outcomes = race([train_args("run", seed=7), train_args("run", seed=8)], tmp_path, setup=slow(0.3, mkdir=True))
    winner = one_winner(outcomes, "two `train -o run` at once")
    problems = [f"temporaries left: {temporaries(tmp_path / 'run')}"] if temporaries(tmp_path / "run") else []
    problems += [f"lock left: {p}" for p in (tmp_path / "run").glob("*.lock")]
    expected = (ref.run, ref.run8)[winner]
    diff = run_differences(expected, tmp_path / "run")
    # the reference run of seed 8 was written as `-o run8`; the command in config.json says so
    diff = [d for d in diff if not (winner == 1 and d.startswith("config.json"))]
    if winner == 1:
        a, b = (json.loads((p / "config.json").read_text()) for p in (expected, tmp_path / "run"))
        if a["config"] != b["config"]:
            diff.append(f"config.json: {b['config']} != {a['config']}")
    assert not problems + diff, f"run/ is not the winner's (seed {7 + winner}) run:\n" + "\n".join((problems + diff)[:10])
