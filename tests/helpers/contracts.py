"""The contract every registered core meets (issue #39 part 3), in the manner of scikit-learn's
``check_estimator``: :func:`check_core` runs a core through every layer — its config and registry line,
training from the command line (and resuming), the checkpoint's loading, its step Jacobian against
float64 autograd, stability, accuracy, dynamics with the plan, summarize and report — on real files.
A new core passes it with nothing but its file and its registry line; no test here names a core.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from typer.testing import CliRunner

import gradscope
from gradscope.cli.app import app
from gradscope.errors import GradscopeError
from gradscope.models import CORES, SeqModel
from gradscope.models.core import step_at, step_jacobian
from gradscope.store import read_store

SMALL = ["--vocab-size", "6", "--length", "4", "--embed-size", "4", "--hidden-size", "6", "--iterations", "12",
         "--checkpoint-every", "6", "--heldout-size", "32", "--grid-per-cell", "2", "--batch-size", "8", "-q"]


def _run(runner: CliRunner, args: list[str]) -> None:
    done = runner.invoke(app, args)
    assert done.exit_code == 0, (args[0], done.stderr or done.stdout)


def check_step_jacobian(name: str) -> None:
    """The core's step Jacobian (analytic or generic) equals float64 autograd through its step."""
    from gradscope.config import ModelConfig

    cls = CORES[name]
    torch.manual_seed(0)
    model = SeqModel(ModelConfig(core=name, vocab_size=6, embed_size=4, hidden_size=6,
                                 core_config=dict(cls.tiny_config))).double()
    core = model.core
    with torch.no_grad():
        x = model.core_inputs(torch.tensor([[1, 2, 3]]))[:, 1]
    z = torch.randn(1, core.state_dim, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    got = step_jacobian(core, x, z, 1)
    want = torch.autograd.functional.jacobian(lambda s: step_at(core, x, s, 1)[1], z)[0, :, 0]
    torch.testing.assert_close(got[0], want, rtol=1e-9, atol=1e-10)


def check_core(name: str, tmp_path: Path) -> None:
    """Every layer on the registered core ``name`` (a key of :data:`gradscope.models.CORES`)."""
    runner = CliRunner()
    assert name in CORES and CORES[name].tiny_config is not None
    check_step_jacobian(name)
    run = tmp_path / "run"
    _run(runner, ["train", "--core", name, *SMALL, "--stop-after", "6", "-o", str(run)])
    _run(runner, ["train", "--resume", str(run), "-q"])  # resumed where it stopped
    loaded = gradscope.load(run)
    assert loaded.iteration == 12 and loaded.config.model.core == name
    assert json.loads((run / "config.json").read_text())["config"]["model"]["core"] == name
    stab, acc, dyn = tmp_path / "stability.zarr", tmp_path / "accuracy.zarr", tmp_path / "dynamics.zarr"
    _run(runner, ["stability", str(run), "--triplets", "3", "-o", str(stab), "-q"])
    _run(runner, ["accuracy", str(run), "-o", str(acc), "-q"])
    _run(runner, ["dynamics", str(run), "--sequences", "2", "--grid-sequences", "1", "--trajectories", "2",
                  "--steps", "30", "--lyap-warmup", "5", "--sv", "3", "-o", str(dyn), "-q"])
    s, a, d = read_store(stab), read_store(acc), read_store(dyn, kind="dynamics")
    assert s.sizes["checkpoint"] == 2 and np.isfinite(s["score_default"].values).all()
    assert 0.0 <= float(a["token_accuracy"].values[-1]) <= 1.0
    assert np.isfinite(d["lyapunov"].values[..., 0]).all() and np.isfinite(d["flow_fro"].values[..., :-1]).all()
    _run(runner, ["summarize", str(stab), "--resamples", "50", "-o", str(tmp_path / "summary.zarr")])
    html = tmp_path / "report.html"
    _run(runner, ["report", str(run), str(stab), str(acc), str(dyn), "-o", str(html)])
    assert html.stat().st_size > 100_000


# a small run of any family: the family adds its own settings (its ``tiny``); the first registered core
FAMILY_RUN = ["--vocab-size", "6", "--length", "4", "--embed-size", "4", "--hidden-size", "6", "--iterations", "6",
              "--heldout-size", "32", "--batch-size", "8", "-q"]


def check_declarations(name: str) -> None:
    """The family's declared store part agrees with the store's own layout and every other family's
    (a variable of one name has one layout), and its report panels draw declared variables."""
    from gradscope.store.schema import LAYOUTS
    from gradscope.tasks.registry import TASKS

    cls = TASKS[name]
    static = LAYOUTS["accuracy"]
    for var, v in cls.layout.items():
        assert static.get(var, (v.dims, v.kind)) == (v.dims, v.kind), f"{name}: {var} clashes with the store layout"
        for other, ocls in TASKS.items():
            if var in ocls.layout:
                o = ocls.layout[var]
                assert (o.dims, o.kind) == (v.dims, v.kind), f"{name}: {var} clashes with the {other} family's"
    for dim, coords in cls.needs.items():
        assert all(c in cls.layout for c in coords), f"{name}: needs undeclared coordinates of {dim}"
    if cls.report is not None:
        for panel in cls.report.panels:
            dims = cls.layout[panel.variable].dims
            assert panel.x in dims and (panel.split is None or panel.split in dims), (name, panel)
            for tick in panel.x_ticks or ():  # tick labels: coordinates over x
                assert cls.layout[tick].dims == (panel.x,), (name, panel, tick)
            for bound in panel.bounds or ():  # a single store's own interval: shaped as the variable
                assert cls.layout[bound].dims == dims, (name, panel, bound)
    check_evaluation(name)


def check_evaluation(name: str) -> None:
    """The family's evaluation (its own line in gradscope.workflows.families.registry, or the default) reads
    options that exist, and a family whose store is its own part alone has an evaluation of its own."""
    from dataclasses import fields

    from gradscope.tasks.registry import TASKS
    from gradscope.workflows.families.registry import TOKENS, Evaluation, evaluation_of
    from gradscope.workflows.options import AccuracyOptions

    cls = TASKS[name]
    evaluation = evaluation_of(cls)
    assert isinstance(evaluation, Evaluation)
    assert set(evaluation.options) <= {f.name for f in fields(AccuracyOptions)}, (name, evaluation.options)
    assert cls.token_part or evaluation is not TOKENS, f"{name}: no token part, but evaluated as tokens"


def check_sampling(name: str) -> None:
    """Batches are seeded (same generator seed, same batch), of the task's shape, and scored only
    where targets are classes of the model."""
    from gradscope.tasks import IGNORE, make_task
    from gradscope.tasks.config import TaskConfig
    from gradscope.tasks.registry import TASKS

    cls = TASKS[name]
    assert cls.tiny is not None
    task = make_task(TaskConfig(name=name, vocab_size=6, length=4, heldout_size=32, **cls.tiny))
    a, b = (task.sample(16, torch.Generator().manual_seed(3)) for _ in range(2))
    for x, y in ((a.inputs, b.inputs), (a.targets, b.targets)):  # bit-identical (a vector task's NaN: unscored)
        torch.testing.assert_close(x, y, rtol=0, atol=0, equal_nan=True)
    assert a.inputs.shape[:2] == a.targets.shape[:2] == (16, task.total_len)
    if task.inputs == "tokens":
        assert int(a.inputs.min()) >= 0 and int(a.inputs.max()) <= task.query
        scored = a.targets[a.targets != IGNORE]
        assert scored.numel() > 0 and int(scored.min()) >= 0 and int(scored.max()) < task.num_classes


def check_family(name: str, tmp_path: Path) -> None:
    """Every layer on the registered task family ``name`` (a key of gradscope.tasks.registry.TASKS):
    its declarations, its batches, then from the command line training, accuracy (its declared
    variables stored with their dims), stability and dynamics where probes are defined, summarize (its
    declared metrics) and the report (its declared section). A family whose small run needs outside data
    (``tiny = None``) is checked on its declarations only; its own tests train it."""
    from gradscope.store.accuracy import family_values
    from gradscope.tasks.registry import TASKS

    cls = TASKS[name]
    check_declarations(name)
    if cls.tiny is None:
        return
    check_sampling(name)
    runner = CliRunner()
    run = tmp_path / "run"
    own = [a for k, v in cls.tiny.items() for a in (f"--{k.replace('_', '-')}", str(v))]
    shared = FAMILY_RUN[2:] if cls.inputs == "vectors" else FAMILY_RUN  # vectors: a width (dim), no vocabulary
    _run(runner, ["train", "--task", name, *shared, *own, "-o", str(run)])
    assert gradscope.load(run).config.task.name == name
    acc = tmp_path / "accuracy.zarr"
    printed = runner.invoke(app, ["accuracy", str(run), "-o", str(acc), "-q"])
    assert printed.exit_code == 0, (name, printed.stderr or printed.stdout)
    try:
        ds = read_store(acc)
    except GradscopeError as exc:
        raise AssertionError(f"{name}: its accuracy store breaks the declared layout: {exc}") from None
    family, values = family_values(ds)
    assert family is cls
    for var, v in cls.layout.items():
        assert var in ds.variables and ds[var].dims == v.dims, f"{name}: {var} not stored as declared"
    assert ("token_accuracy" in ds) == cls.token_part, f"{name}: the token part is stored iff token_part"
    words = " ".join(printed.stdout.split())
    for line in cls.lines(values):  # what `gradscope accuracy` prints of its part, from the stored values
        assert " ".join(line.split()) in words, (name, line)
    again = gradscope.accuracy(run)  # the Python function: the family's evaluation again, the same numbers
    for var in cls.layout:
        np.testing.assert_array_equal(again[var].values, ds[var].values, err_msg=f"{name}: {var}")
    stores = [str(acc)]
    if cls.probes:
        stab = tmp_path / "stability.zarr"
        _run(runner, ["stability", str(run), "--triplets", "2", "-o", str(stab), "-q"])
        assert np.isfinite(read_store(stab)["score_default"].values).all()
        stores.append(str(stab))
        dyn = tmp_path / "dynamics.zarr"  # the dynamics view on its probe source and its episodes
        _run(runner, ["dynamics", str(run), "--parts", "flow,lyapunov", "--sequences", "1", "--trajectories", "1",
                      "--steps", "12", "--lyap-warmup", "2", "-o", str(dyn), "-q"])
        d = read_store(dyn, kind="dynamics")
        assert np.isfinite(d["flow_fro"].values).all() and not np.isnan(d["lyapunov"].values).any(), name
        stores.append(str(dyn))
    summary = tmp_path / "summary.zarr"
    _run(runner, ["summarize", str(acc), "--resamples", "50", "-o", str(summary)])
    metrics = {str(m) for m in read_store(summary)["metric"].values}
    assert set(cls.summary_metrics(values)[0]) <= metrics
    html = tmp_path / "report.html"
    _run(runner, ["report", str(run), *stores, "-o", str(html)])
    page = html.read_text()
    assert (f'id="task-{name}"' in page) == (cls.report is not None)
