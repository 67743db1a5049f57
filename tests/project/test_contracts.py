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


@pytest.mark.parametrize("name", list(TASKS))
def test_every_registered_family_meets_the_contract(name: str, tmp_path: Path) -> None:
    check_family(name, tmp_path)
