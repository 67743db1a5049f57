"""Options either apply or are refused, in every command. Every refusal here is one `error:` line
naming the flag, exit 2, before any work: no run directory, store, study or corpus is left behind,
and nothing that was not applied is recorded. One test per class of defect:

- an empty list is an error, never "all" or the default;
- a study's --scale is checked before anything else;
- an option that does not apply to the task, core or command is refused (given, not defaulted);
- stability --probes STORE on a vector-task checkpoint reads the store's sphere table, or refuses;
- sizes that make no sense for the input (a convolution wider than the sequence, a scan state that
  does not fit in memory, more Lyapunov exponents than state dimensions) are refused up front.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.fuzzkit import invoke

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "sample_checkpoints" / "gru-none-s1" / "step-0001500.pt"  # dual reverse, K = 64, L = 16, H = 128


@pytest.fixture
def work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty working directory: a refused command must leave it empty."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GRADSCOPE_MEMORY_BUDGET", str(2 << 30))  # the same refusals on any machine
    return tmp_path


def refused(args: list[str | Path], flag: str, where: Path, *words: str) -> str:
    """``gradscope ARGS`` ends with one `error: FLAG…` line, exit 2, and leaves ``where`` as it was."""
    before = sorted(p.name for p in where.iterdir())
    out = invoke(args)
    assert out.exc is None or isinstance(out.exc, SystemExit), out.tb
    lines = out.err.strip().splitlines()
    assert out.rc == 2 and len(lines) == 1 and lines[0].startswith(f"error: {flag}"), (out.rc, out.err)
    for word in words:
        assert word in lines[0], lines[0]
    assert sorted(p.name for p in where.iterdir()) == before, "a refused command left files behind"
    return lines[0]


# --- an empty list is an error, never "all" --------------------------------------------------------

@pytest.mark.parametrize("args, flag", [
    (["--models", ""], "--models"),
    (["--seeds", ""], "--seeds"),
    (["--models", " , "], "--models"),
    (["--seeds", "1,,2"], "--seeds"),
    (["--seeds", "1,1"], "--seeds"),
    (["--study", "lm", "--seeds", ""], "--seeds"),
])
def test_reproduce_refuses_an_empty_list(work: Path, args: list[str], flag: str) -> None:
    # Before: '' fell back to the defaults (gru,lstm,s4d × 1,2,3: hours of training); the lm study
    # built its corpus first.
    refused(["reproduce", "--dry-run", "--no-measure", "-o", "study", *args], flag, work)


@pytest.fixture(scope="module")
def accuracy_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An accuracy store of the sample checkpoint (a token task: no stability results)."""
    out = tmp_path_factory.mktemp("stores") / "acc.zarr"
    assert invoke(["accuracy", "-q", SAMPLE, "-o", out]).rc == 0
    return out


def test_summarize_refuses_an_empty_by(work: Path, accuracy_store: Path) -> None:
    """Before: --by '' pooled every configuration into one group, exit 0."""
    refused(["summarize", accuracy_store, "--by", "", "-o", "s.zarr"], "--by", work, "empty")


# --- a study's scale is checked first --------------------------------------------------------------

def test_reproduce_lm_refuses_an_unknown_scale_first(work: Path) -> None:
    """Before: `--study lm --scale bogus` complained that the paper-scale corpus needs raw text."""
    refused(["reproduce", "--study", "lm", "--scale", "bogus", "-o", "study"], "--scale", work, "bogus", "tiny")


# --- an option that does not apply is refused ------------------------------------------------------

# a value for each optional setting (gradscope.tasks.base.OPTIONAL_SETTINGS) that a family may not read
GIVEN = {"distribution": "dual", "rarity": "0.3", "grid_per_cell": "3", "min_length": "3", "hold_min": "3",
         "hold_max": "70", "dim": "4", "corpus": "somewhere"}


def _not_read() -> list[tuple[list[str], str]]:
    """For every registered family, each optional setting it does not read, given to it (with the settings its
    small run needs, or a corpus path): taken from the registry, so a new family is covered unedited."""
    from gradscope.tasks.base import OPTIONAL_SETTINGS
    from gradscope.tasks.registry import TASKS

    assert set(GIVEN) == set(OPTIONAL_SETTINGS)
    cases = []
    for name, cls in TASKS.items():
        base = ["--task", name, *(a for k, v in (cls.tiny if cls.tiny is not None else {"corpus": "somewhere"}).items()
                                  for a in (f"--{k.replace('_', '-')}", str(v)))]
        for setting in OPTIONAL_SETTINGS:
            if setting not in cls.settings:
                flag = f"--{setting.replace('_', '-')}"
                cases.append(([*base, flag, GIVEN[setting]], flag))
    assert len(cases) >= 2 * len(TASKS)
    return cases


@pytest.mark.parametrize("args, flag", [
    *_not_read(),
    (["--distribution", "uniform", "--rarity", "0.3"], "--rarity"),  # rarity is the dual distribution's
    (["--pe", "none", "--pe-combine", "add"], "--pe-combine"),
    (["--pe", "sinusoidal", "--max-len", "100"], "--max-len"),
    (["--max-len", "1e9"], "--max-len"),
])
def test_train_refuses_a_task_option_that_does_not_apply(work: Path, args: list[str], flag: str) -> None:
    # Before: each was accepted, recorded in config.json and ignored (lm forced uniform silently).
    refused(["train", "-q", "--iterations", "1", "-o", "run", *args], flag, work)


@pytest.mark.parametrize("flag", ["--lr", "--eps"])
def test_train_refuses_a_step_size_beyond_float32(work: Path, flag: str) -> None:
    """Before: --lr 1e300 passed the config check, then Adam's step raised a RuntimeError traceback
    (exit 1) and left the run directory behind."""
    refused(["train", "-q", "--iterations", "1", flag, "1e300", "-o", "run"], flag, work)


def test_an_option_left_at_its_default_is_not_refused(work: Path) -> None:
    """Only options that were given are refused: the tiny preset's dual distribution does not stop a
    continuous run, and `--distribution uniform` states what a one-class task does."""
    out = invoke(["train", "-q", "--task", "reverse-continuous", "--dim", "3", "--distribution", "uniform",
                  "--iterations", "2", "--heldout-size", "8", "-o", "run"])
    assert out.rc == 0, out.err
    task = json.loads((work / "run" / "config.json").read_text())["config"]["task"]
    assert task["distribution"] == "uniform" and task["corpus"] == ""


def test_extension_refuses_a_task_option_that_does_not_apply(work: Path) -> None:
    refused(["train", "-q", "--extend-from", SAMPLE, "--vocab-size", "80", "--hold-min", "2", "--iterations", "1", "-o", "ext"],
            "--hold-min", work)


@pytest.mark.parametrize("args, flag", [
    (["--resamples", "100"], "--resamples"),
    (["--seed", "3"], "--seed"),
    (["--corpus", "."], "--corpus"),
])
def test_accuracy_refuses_vector_and_lm_options_on_a_token_checkpoint(work: Path, args: list[str], flag: str) -> None:
    # Before: exit 0; the options were ignored (--resamples and --seed bootstrap a vector task's cosine).
    refused(["accuracy", "-q", SAMPLE, "-o", "acc.zarr", *args], flag, work)


@pytest.mark.parametrize("args, flag", [
    (["--parts", "flow", "--exponents", "4"], "--exponents"),
    (["--parts", "flow", "--trajectories", "2"], "--trajectories"),
    (["--parts", "lyapunov", "--grid-sequences", "2", "--steps", "20"], "--grid-sequences"),
    (["--parts", "flow", "--sv", "2"], "--sv"),
    (["--parts", "lyapunov", "--sequences", "2", "--steps", "20"], "--sequences"),
])
def test_dynamics_refuses_an_option_of_a_part_left_out(work: Path, args: list[str], flag: str) -> None:
    refused(["dynamics", "-q", SAMPLE, "-o", "d.zarr", *args], flag, work)


def test_corpus_prepare_refuses_split_fractions_with_split_files(work: Path) -> None:
    """--valid/--test/--split-seed split one file; with split files they were ignored (and recorded)."""
    text = "".join(f"paragraph {i} has some words and more words in it\n" for i in range(50))
    for name in ("train.txt", "valid.txt", "test.txt"):
        (work / name).write_text(text)
    refused(["corpus", "prepare", "-q", "train.txt", "-o", "corpus", "--vocab", "30", "--valid-file", "valid.txt",
             "--test-file", "test.txt", "--valid", "0.2"], "--valid", work)


def test_report_and_summarize_refuse_stability_options_without_stability_stores(work: Path,
                                                                                accuracy_store: Path) -> None:
    run = ROOT / "sample_checkpoints" / "gru-none-s1"
    refused(["report", run, "-o", "r.html", "--resamples", "10"], "--resamples", work)
    refused(["summarize", accuracy_store, "--score", "l1", "-o", "s.zarr"], "--score", work)


def test_stability_refuses_a_corpus_on_a_checkpoint_that_is_not_lm(work: Path) -> None:
    refused(["stability", "-q", SAMPLE, "--corpus", ".", "--triplets", "2", "-o", "s.zarr"], "--corpus", work, "lm")


def test_reproduce_refuses_lm_options_on_the_reverse_study(work: Path) -> None:
    refused(["reproduce", "--dry-run", "--no-measure", "--target-pos", "3", "-o", "study"], "--target-pos", work)
    refused(["reproduce", "--no-measure", "--iterations", "0", "-o", "study"], "--measure", work, "--dry-run")


# --- probes from a store on a vector-task checkpoint -----------------------------------------------

def test_stability_probes_store_of_a_vector_checkpoint_keeps_its_seed(work: Path) -> None:
    """Before: --probes STORE rebuilt the sphere table from --seed, so another seed silently scored
    other vectors with exit 0."""
    assert invoke(["train", "-q", "--task", "reverse-continuous", "--dim", "3", "--length", "4", "--hidden-size", "8",
                   "--embed-size", "8", "--iterations", "2", "--heldout-size", "8", "-o", "cont"]).rc == 0
    fast = ["-q", "--triplets", "2", "--resamples", "10"]
    assert invoke(["stability", "cont", "-o", "first.zarr", "--seed", "5", *fast]).rc == 0
    refused(["stability", "cont", "--probes", "first.zarr", "-o", "again.zarr", *fast], "--seed", work, "5")
    out = invoke(["stability", "cont", "--probes", "first.zarr", "--seed", "5", "-o", "again.zarr", *fast])
    assert out.rc == 0, out.err
    import xarray as xr
    with xr.open_zarr(work / "first.zarr", consolidated=False) as a, xr.open_zarr(work / "again.zarr",
                                                                                consolidated=False) as b:
        assert (a["probe_tokens"].values == b["probe_tokens"].values).all()
        assert (a["score_default"].values == b["score_default"].values).all()


def test_stability_probes_store_of_a_token_model_on_a_vector_checkpoint(work: Path, tmp_path_factory) -> None:
    """A token model's probe ids are vocabulary items, not indices of the sphere table."""
    assert invoke(["train", "-q", "--task", "reverse-continuous", "--dim", "3", "--length", "16", "--hidden-size", "8",
                   "--embed-size", "8", "--iterations", "2", "--heldout-size", "8", "-o", "cont"]).rc == 0
    tokens = tmp_path_factory.mktemp("tokens") / "st.zarr"
    assert invoke(["stability", "-q", SAMPLE, "--triplets", "2", "--resamples", "10", "-o", tokens]).rc == 0
    refused(["stability", "-q", "cont", "--probes", tokens, "-o", "again.zarr"], "--probes", work, "tokens")


# --- sizes that make no sense for the input --------------------------------------------------------

def test_mamba_scan_state_is_in_the_memory_estimate(work: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: `--state-size 100000` gave a RuntimeError from a 26 GB allocation, and a run directory
    left behind: the estimate omitted the scan's B × T × E × N state. Here N = 1000 under a 256 MB
    budget: 64 sequences × 16 steps × 4 × 64 × 1000 floats = 1 GB of scan state (before: it trained)."""
    monkeypatch.setenv("GRADSCOPE_MEMORY_BUDGET", str(256 << 20))
    refused(["train", "-q", "--core", "mamba", "--state-size", "1000", "--iterations", "1", "--heldout-size", "8",
             "-o", "run"], "train", work, "mamba core's own state", "memory")
    out = invoke(["train", "-q", "--core", "mamba", "--state-size", "16", "--iterations", "1", "--heldout-size", "8",
                  "--grid-per-cell", "1", "-o", "run"])
    assert out.rc == 0, out.err  # N = 16 (16 MB of scan state) fits


@pytest.mark.parametrize("width", ["17", "64", "1e9"])
def test_mamba_convolution_wider_than_the_sequence_is_refused(work: Path, width: str) -> None:
    """Before: accepted (1e5 never finished; 1e9 was refused only as a model too large to build). The
    tiny preset's sequences are 2 × 8 = 16 steps."""
    refused(["train", "-q", "--core", "mamba", "--conv-width", width, "--iterations", "1", "--heldout-size", "8",
             "--grid-per-cell", "1", "-o", "run"], "--conv-width", work, "16")


def test_mamba_convolution_as_wide_as_the_sequence_trains(work: Path) -> None:
    out = invoke(["train", "-q", "--core", "mamba", "--conv-width", "16", "--iterations", "1", "--hidden-size", "8",
                  "--embed-size", "8", "--heldout-size", "8", "--grid-per-cell", "1", "-o", "run"])
    assert out.rc == 0, out.err


def test_dynamics_refuses_more_exponents_than_state_dimensions(work: Path) -> None:
    """Before: --exponents 500 on D = 128 was clamped to 128 silently."""
    refused(["dynamics", "-q", SAMPLE, "-o", "d.zarr", "--parts", "lyapunov", "--steps", "20", "--trajectories",
             "1", "--exponents", "500"], "--exponents", work, "128")
