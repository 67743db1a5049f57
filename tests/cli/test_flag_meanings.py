"""One flag, one meaning across commands (issue #39, part 2). The app is walked (every command and
sub-command, generated options included) and every flag that more than one command shows is compared:
its help must read the same in each, or the flag is listed below with the reason its help differs.
A reason that no longer applies (the helps now agree, or the flag is no longer shared) fails too, so
the list stays what is true. Hidden options (the old names kept for one release) are left out: each
warns and names its new flag."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import typer
from typer.testing import CliRunner

from gradscope.cli.app import app

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "sample_checkpoints" / "gru-sinusoidal-s1" / "step-0006000.pt"

# one meaning, worded for each command: the help names what that command writes, samples or bounds
SAME_MEANING = {
    "--out": "where the command writes: a store, a run or study directory, a report, a corpus",
    "--overwrite": "replace what --out names (a store, a CSV, a report)",
    "--no-overwrite": "the other side of --overwrite",
    "--quiet": "no progress display (a bar, bars, or corpus prepare's spinner)",
    "--seed": "the seed of the command's own random draws (its probes, bootstrap, batches), each named",
    "--resamples": "bootstrap resamples of the CIs the command computes, each named",
    "--score": "the stability score (default, frobenius, l1) the command shows, summarizes or plots",
    "--batch-size": "items per batch, bounding memory: training sequences, Jacobian triplets, scored sequences",
    "--budget-seconds": "the time budget of the whole command (reproduce --text: of its dynamics step), estimated "
                        "before any work; stability's, per checkpoint, is --checkpoint-budget-seconds since issue #39",
    "--length": "the sequence (probe) length L; with --text, the row length",
    "--max-length": "tokens per row of text (train lm: per paragraph; accuracy/reproduce --text: per window)",
    "--iterations": "training iterations (reproduce: overriding the scale's)",
    "--threads": "torch CPU threads (sweep: per task)",
    "--corpus": "the lm corpus directory (train: the one to train on; analyses: where it moved)",
    "--tokenizer": "the model's tokenizer folder (reproduce names its --model-dir)",
    "--text": "the raw text a pretrained LM is analysed on; each command says what it draws from it",
    "--model-factory": "how a model is loaded: hf[:CLASS] (or FILE.py:FUNC where the command takes your own)",
    "--decoding": "a feedback model's decoding: train chooses how it is fed, accuracy which decodings are scored",
    "--disturbant": "probe disturbant groups; dynamics refers to stability's",
    "--target-freq": "probe target groups; dynamics refers to stability's",
    "--token-counts": "counts per token id for a --model-factory model; each command says what they class",
    "--sv": "singular values kept per Jacobian (dynamics: per step Jacobian)",
    "--target-pos": "the stability probes' target position (reproduce: for --study lm or --text)",
    "--triplets": "stability probe triplets per condition",
    "--valid-file": "a separate valid split of a raw text (reproduce: for --study lm --scale paper)",
    "--test-file": "a separate test split of a raw text (reproduce: for --study lm --scale paper)",
    "--dry-run": "say what would run and run nothing (the plan of a study, the grid of a sweep)",
    "--no-dry-run": "run (the default), as --dry-run's other side",
}
# two meanings under one name: none. --method (stability's Jacobian engine) was also summarize's interval method, now
# --interval; --warmup (train's learning-rate warm-up) was also dynamics' Lyapunov warm-up, now --lyap-warmup;
# --budget-seconds (dynamics: the whole command's) was stability's per checkpoint, now --checkpoint-budget-seconds.
# The old names are gone (nothing was released): each is an unknown option (tests/workflows/test_api.py)
TWO_MEANINGS: dict[str, str] = {}


def visible_options() -> list[tuple[str, list[str], str]]:
    """(command, the option's long names, its help) for every visible option of every command."""
    def commands(group: typer.core.TyperGroup, prefix: str = "") -> list[tuple[str, typer.core.TyperCommand]]:
        found = []
        for name, command in group.commands.items():
            found += commands(command, f"{prefix}{name} ") if hasattr(command, "commands") else [(prefix + name, command)]
        return found

    walked = commands(typer.main.get_command(app))
    assert {"train", "stability", "report", "reproduce", "sweep", "corpus prepare"} <= {n for n, _ in walked}
    return [(name, [f for f in [*p.opts, *p.secondary_opts] if f.startswith("--") and f != "--help"], p.help or "")
            for name, command in walked for p in command.get_params(typer.Context(command, info_name=name))
            if p.param_type_name == "option" and not getattr(p, "hidden", False)]


def shared_flags() -> dict[str, dict[str, str]]:
    """flag → {command: help} for every visible flag that more than one command has."""
    uses: dict[str, dict[str, str]] = defaultdict(dict)
    for name, flags, help_text in visible_options():
        for flag in flags:
            uses[flag][name] = help_text
    return {flag: by for flag, by in uses.items() if len(by) > 1}


def test_a_short_name_names_the_same_option_in_every_command() -> None:
    """A flag that is another option's second name in one command (stability's --model is --model-factory) is
    that option's name wherever it is shown: reproduce's --model named a directory."""
    first: dict[str, dict[str, str]] = defaultdict(dict)  # flag → {command: the first name of its option}
    for name, flags, _ in visible_options():
        for flag in flags:
            first[flag][name] = flags[0]
    aliases = {flag: by for flag, by in first.items() if any(head != flag for head in by.values())}
    assert "--model" in aliases  # the check sees the short names it is about
    mixed = {flag: by for flag, by in aliases.items() if len(set(by.values())) > 1}
    assert not mixed, mixed


def test_a_flag_shared_by_commands_reads_the_same_or_says_why_not() -> None:
    shared = shared_flags()
    assert len(shared) >= 20 and "--seed" in shared  # the walk sees the generated options too
    differing = {flag: by for flag, by in shared.items() if len(set(by.values())) > 1}
    listed = {**SAME_MEANING, **TWO_MEANINGS}
    unexplained = sorted(set(differing) - set(listed))
    assert not unexplained, "\n".join(f"{f}: " + "; ".join(f"{c}: {h}" for c, h in differing[f].items())
                                      for f in unexplained)
    stale = sorted(set(listed) - set(differing))
    assert not stale, f"listed, but now read the same or are no longer shared: {stale}"


def test_reproduce_model_dir_is_no_longer_named_like_a_model_factory(tmp_path: Path) -> None:
    """`reproduce --model DIR` named a directory, while `--model` is --model-factory's short name in stability,
    dynamics and accuracy: it is --model-dir now, and --model is no option of reproduce."""
    runner = CliRunner()
    old = runner.invoke(app, ["reproduce", "--model", str(tmp_path), "-o", str(tmp_path / "study")])
    assert old.exit_code == 2 and "No such option: --model" in old.stderr, old.stderr
    assert not (tmp_path / "study").exists()


def test_a_refusal_names_the_option_as_the_user_typed_it(tmp_path: Path) -> None:
    """`accuracy --seed 3` on a token task said "…; remove seed": the library named its parameter inside the
    sentence, where the CLI (which writes only the leading name as a flag) cannot see it."""
    done = CliRunner().invoke(app, ["accuracy", str(SAMPLE), "--seed", "3", "-q", "-o", str(tmp_path / "a.zarr")])
    assert done.exit_code == 2 and len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr.startswith("error: --seed: got 3, but ") and done.stderr.endswith(
        "; it applies to reverse-continuous runs only (leave it out)\n"), done.stderr
    assert not (tmp_path / "a.zarr").exists()


def test_stability_budget_per_checkpoint_has_its_own_name(tmp_path: Path) -> None:
    """`stability --budget-seconds` was per checkpoint while `dynamics --budget-seconds` is the whole command's
    (found in review): stability's is --checkpoint-budget-seconds."""
    runner = CliRunner()
    args = ["stability", str(SAMPLE), "--triplets", "2", "--target-freq", "rare", "--disturbant", "rare", "-q"]
    new = runner.invoke(app, [*args, "--checkpoint-budget-seconds", "0.001", "-o", str(tmp_path / "a.zarr")])
    old = runner.invoke(app, [*args, "--budget-seconds", "0.001", "-o", str(tmp_path / "b.zarr")])
    assert new.exit_code == old.exit_code == 2, (new.stderr, old.stderr)
    assert new.stderr.startswith("error: --checkpoint-budget-seconds: exact J"), new.stderr
    assert new.stdout == ""  # no bar was shown, so none of rich's empty line after the bars either
    assert "No such option: --budget-seconds" in old.stderr, old.stderr
