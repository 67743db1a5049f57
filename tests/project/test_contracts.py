"""Every registered core and task family meets its contract (tests/helpers/contracts.py): no core or
family is named here, but for a throwaway family that exists only in this module."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Mapping, Sequence

import numpy as np
import pytest
import torch

from gradscope.models import CORES
from gradscope.store import read_store
from gradscope.tasks import IGNORE, Batch, Task
from gradscope.tasks.family import FLOAT, STR, Metrics, Panel, Part, ReportSection, Variable, ratio, stack
from gradscope.tasks.registry import TASKS
from tests.helpers.contracts import check_core, check_family


@pytest.mark.parametrize("name", list(CORES))
def test_every_registered_core_meets_the_contract(name: str, tmp_path: Path) -> None:
    check_core(name, tmp_path)


def test_the_contract_fails_a_core_whose_step_jacobian_is_wrong(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The contract can fail: a registered core whose analytic step Jacobian is off by a factor."""
    base = CORES[next(iter(CORES))]

    class Broken(base):  # type: ignore[valid-type, misc]
        def step_jacobian(self, *args):  # noqa: ANN002, ANN201
            return 2 * super().step_jacobian(*args)

    monkeypatch.setitem(CORES, "broken", Broken)
    with pytest.raises(AssertionError):
        check_core("broken", tmp_path)


# --- task families -------------------------------------------------------------------------------

class Echo(Task):
    """A throwaway family, registered only inside these tests: L tokens, then L query tokens during
    which the tokens are repeated in order. Its own part: accuracy at the first and the last output
    position; one summary metric per end; a report panel."""

    name: ClassVar[str] = "echo"
    probes: ClassVar[bool] = True
    layout = {"end_accuracy": Variable(dims=("checkpoint", "end"), kind=FLOAT),
              "end": Variable(dims=("end",), kind=STR)}
    needs = {"end": ("end",)}
    report = ReportSection(heading="Echo: first and last output", text="Accuracy at each end.",
                           panels=(Panel(variable="end_accuracy", x="end", title="by end"),))

    def n_patterns(self) -> int:
        return self.cfg.vocab_size ** self.cfg.length

    def sample(self, n: int, gen: torch.Generator) -> Batch:
        x = self.tokens((n, self.cfg.length), gen)
        return Batch(torch.cat([x, self.full(n, self.cfg.length, self.query, x)], 1),
                     torch.cat([self.full(n, self.cfg.length, IGNORE, x), x], 1))

    def score(self, batch: Batch, preds: torch.Tensor) -> dict[str, np.ndarray]:
        ends = [self.cfg.length, 2 * self.cfg.length - 1]
        right = (preds[:, ends] == batch.targets[:, ends]).sum(0)
        return {"correct": right.numpy(), "total": np.full(2, len(batch))}

    @classmethod
    def accuracy_part(cls, counts: Sequence[Mapping[str, np.ndarray]]) -> tuple[Part, Part]:
        return ({"end_accuracy": (("checkpoint", "end"), ratio(stack(counts, "correct"), stack(counts, "total")))},
                {"end": np.asarray(["first", "last"], dtype=object)})

    @classmethod
    def summary_metrics(cls, last: Mapping[str, np.ndarray]) -> Metrics:
        return {f"token_accuracy/{e}": float(a) for e, a in zip(last["end"], last["end_accuracy"])}, {}


def test_a_family_registered_here_runs_through_every_layer(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """train → accuracy → stability → summarize → report on a family that exists only in this test:
    nothing outside its class names it, and its part, metrics and report section appear."""
    monkeypatch.setitem(TASKS, "echo", Echo)
    check_family("echo", tmp_path)
    summary = read_store(tmp_path / "summary.zarr")
    assert {"token_accuracy/first", "token_accuracy/last"} <= {str(m) for m in summary["metric"].values}
    assert 'id="task-echo"' in (tmp_path / "report.html").read_text()


def test_the_contract_fails_a_family_that_stores_what_it_did_not_declare(monkeypatch: pytest.MonkeyPatch,
                                                                       tmp_path: Path) -> None:
    """The family contract can fail: a part stored over other dims than its layout declares."""
    class Misdeclared(Echo):
        layout = {"end_accuracy": Variable(dims=("checkpoint", "side"), kind=FLOAT),
                  "end": Variable(dims=("end",), kind=STR)}
        report = None

    monkeypatch.setitem(TASKS, "echo", Misdeclared)
    with pytest.raises(AssertionError):
        check_family("echo", tmp_path)


class OwnEcho(Echo):
    """Echo with an evaluation of its own (gradscope.workflows.families.registry), registered only inside these
    tests: its store is its own part alone (no token part), and its evaluation reads the seed option."""

    token_part: ClassVar[bool] = False

    @classmethod
    def lines(cls, last: Mapping[str, np.ndarray]) -> list[str]:
        return [f"end accuracy: first {float(last['end_accuracy'][0]):.4f}, last {float(last['end_accuracy'][1]):.4f}"]


def _own_evaluate(loaded, opts, device):  # noqa: ANN001, ANN202 (the Evaluation's signature)
    from gradscope.store.records import FamilyResult
    from gradscope.tasks import make_task
    from gradscope.train.evaluate import predict

    held = loaded.heldout.uniform
    preds = predict(loaded.model.to(device), held.inputs, opts.batch_size).cpu()
    loaded.model.to("cpu")
    return FamilyResult(loaded.path, loaded.iteration, loaded.path.parent.name,
                        make_task(loaded.config.task).score(held, preds))


def _own_dataset(results, config, opts, command, device):  # noqa: ANN001, ANN202
    from gradscope.store.accuracy import family_dataset

    return family_dataset(list(results), config, {"seed": opts.seed}, command, device)


def test_a_family_with_an_evaluation_of_its_own_runs_through_every_layer(monkeypatch: pytest.MonkeyPatch,
                                                                        tmp_path: Path) -> None:
    """A family registered here with its own evaluation (one EVALUATIONS line, keyed by its class):
    `gradscope accuracy` calls it and stores its part alone, summarize and report read what it declares,
    and the option its evaluation reads is accepted for it and refused, naming it, for a token family."""
    from typer.testing import CliRunner

    from gradscope.cli.app import app
    from gradscope.workflows.families.registry import EVALUATIONS, Evaluation

    monkeypatch.setitem(TASKS, "echo", OwnEcho)
    monkeypatch.setitem(EVALUATIONS, OwnEcho, Evaluation(options=("seed",), evaluate=_own_evaluate,
                                                         dataset=_own_dataset))
    check_family("echo", tmp_path)
    acc = read_store(tmp_path / "accuracy.zarr")
    assert "token_accuracy" not in acc and acc["end_accuracy"].dims == ("checkpoint", "end")
    assert 'id="task-echo"' in (tmp_path / "report.html").read_text()
    runner = CliRunner()
    done = runner.invoke(app, ["accuracy", str(tmp_path / "run"), "--seed", "4", "-q", "-o", str(tmp_path / "s.zarr")])
    assert done.exit_code == 0, done.stderr
    assert read_store(tmp_path / "s.zarr").attrs["options"] == '{"seed": 4}'
    token = tmp_path / "token"  # a run of a token family (the config's default task)
    done = runner.invoke(app, ["train", "--vocab-size", "6", "--length", "4", "--embed-size", "4", "--hidden-size", "6",
                               "--iterations", "2", "--heldout-size", "8", "--batch-size", "4", "-q", "-o", str(token)])
    assert done.exit_code == 0, done.stderr
    done = runner.invoke(app, ["accuracy", str(token), "--seed", "4", "-q", "-o", str(tmp_path / "t.zarr")])
    assert done.exit_code == 2 and "--seed: got 4" in done.stderr and "echo" in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and not (tmp_path / "t.zarr").exists()


def test_the_contract_fails_a_family_without_a_token_part_evaluated_as_tokens(monkeypatch: pytest.MonkeyPatch,
                                                                              tmp_path: Path) -> None:
    """The contract can fail: a family that says its store has no token part but has no evaluation
    of its own (the default token evaluation would store one)."""
    monkeypatch.setitem(TASKS, "echo", OwnEcho)
    with pytest.raises(AssertionError, match="evaluated as tokens"):
        check_family("echo", tmp_path)


def test_a_subclass_of_a_family_is_evaluated_as_its_base() -> None:
    """evaluation_of walks the class's bases: a family derived from one with its own evaluation gets
    that evaluation, a class with none in its bases the default token evaluation."""
    from gradscope.workflows.families.registry import EVALUATIONS, TOKENS, evaluation_of

    base = next(iter(EVALUATIONS))
    derived = type("Derived", (base,), {"name": "derived"})
    assert evaluation_of(derived) is EVALUATIONS[base]
    assert evaluation_of(Echo) is TOKENS


@pytest.mark.parametrize("name", list(TASKS))
def test_every_registered_family_meets_the_contract(name: str, tmp_path: Path) -> None:
    check_family(name, tmp_path)
