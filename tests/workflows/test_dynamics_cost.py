"""The dynamics plan (issue #37 part 2): one estimate of time and memory from the declared structure
decides; defaults shrink to fit the budget, and say so, instead of refusing."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

from gradscope.errors import GradscopeError
from gradscope.models.structure import JacobianStructure, StateBlock
from gradscope.workflows.dynamics import DynamicsOptions, core_shape, plan_bytes, plan_dynamics, run_checkpoint_dynamics
from gradscope.workflows.dynamics_cost import CoreShape

SAMPLES = Path(__file__).resolve().parents[2] / "sample_checkpoints"


class Planned(Exception):
    """Raised from on_plan: the plan is made, no work is done."""


@pytest.mark.parametrize("name", ["mamba-none-s1", "lstm-none-s1", "s4d-none-s1", "gru-none-s1"])
def test_defaults_plan_work_that_fits_the_budget_on_the_shipped_samples(name: str) -> None:
    plans = []

    def stop(plan) -> None:  # noqa: ANN001
        plans.append(plan)
        raise Planned

    with pytest.raises(Planned):
        run_checkpoint_dynamics([SAMPLES / name], DynamicsOptions(), on_plan=stop)
    plan = plans[0]
    assert sum(plan.seconds.values()) * plan.checkpoints <= DynamicsOptions().budget_seconds
    assert plan.options.resolved and "lyapunov" in plan.options.parts and plan.lines
    assert "plan:" in plan.describe()


def test_explicit_work_over_the_budget_names_budget_seconds() -> None:
    with pytest.raises(GradscopeError, match="--budget-seconds"):
        run_checkpoint_dynamics([SAMPLES / "lstm-none-s1"], DynamicsOptions(trajectories=8, steps=1000, exponents=256))
    big = DynamicsOptions(trajectories=8, steps=1000, budget_seconds=1e6)  # the defaults before #37, exactly
    with pytest.raises(Planned):
        run_checkpoint_dynamics([SAMPLES / "lstm-none-s1"], big, on_plan=lambda plan: (_ for _ in ()).throw(Planned()))


def _mamba130m() -> JacobianStructure:
    """mamba-130m's declared structure: per layer a conv shift register (3 × 1536, per-channel 3 × 3
    blocks) and 1536 × 16 diagonal SSM modes; D = 700,416."""
    blocks, at = [], 0
    for layer in range(24):
        blocks.append(StateBlock(f"l{layer}/conv", at, at + 4608, "block_diagonal", 3))
        blocks.append(StateBlock(f"l{layer}/ssm", at + 4608, at + 29184, "diagonal"))
        at += 29184
    return JacobianStructure(tuple(blocks))


def test_lyapunov_memory_uses_the_declared_structure() -> None:
    structure = _mamba130m()
    D = structure.state_dim
    assert D == 700_416
    shape = CoreShape(D, 768, 768, 1, structure, 2.0 * 130e6, False)
    opts = DynamicsOptions(parts="lyapunov", budget_seconds=3600)
    plan = plan_dynamics(opts, 1, 4, D, 768, structure, 1, 1000, 1, shape=shape)
    assert plan.engine == "structured" and plan.exponents == D
    assert plan_bytes(plan, 1, 4, shape) < 8 * 2**30  # 62,808.7 GB before: D × D


def test_the_flow_is_priced_by_a_cores_own_span_factor() -> None:
    """A core that pulls a span of steps back at once (own "span", with its declared factor) has the flow's
    reverse chain priced by that factor; the step spectra's VJPs keep the "vjp" factor; without a declared
    span factor the flow keeps "vjp" too."""
    from gradscope.workflows.dynamics_cost import estimator_seconds

    structure = _mamba130m()
    D = structure.state_dim

    def shape(own: frozenset[str], cost: tuple[tuple[str, float], ...]) -> CoreShape:
        return CoreShape(D, 768, 768, 1, structure, 2.0 * 130e6, False, 221, 129_000_000, own=own, own_cost=cost)

    est = dict(n=1, T=256, grid_sequences=1, sv=4, probes=16, iterations=3)
    vjp = shape(frozenset({"vjp"}), (("vjp", 0.08),))
    span = shape(frozenset({"vjp", "span"}), (("span", 0.02), ("vjp", 0.08)))
    undeclared = shape(frozenset({"vjp", "span"}), (("vjp", 0.08),))
    assert span.products_seconds("vjp", 256, 16, own="span") == pytest.approx(
        vjp.products_seconds("vjp", 256, 16) * 0.02 / 0.08)
    a, b, c = (estimator_seconds(s, **est) for s in (vjp, span, undeclared))
    assert b["flow"] < a["flow"] and c["flow"] == pytest.approx(a["flow"])
    assert b["spectra"] == pytest.approx(a["spectra"])
    assert a["flow"] - b["flow"] == pytest.approx(vjp.products_seconds("vjp", 256, 16) * (1 - 0.02 / 0.08))


def test_a_repeated_block_is_priced_and_held_once_a_run() -> None:
    """A gated-delta-rule-size block (heads of M_t ⊗ I: d_k = 128, d_v = 128, 16 heads): declared with
    its repeat, the Lyapunov estimate prices one 128 × 128 QR a head, not d_v of them, and holds one
    frame a head; the same state declared without the repeat costs d_v = 128 times as much in QRs (here
    23× the whole estimate, the step's own cost included)."""
    from gradscope.workflows.dynamics_cost import lyapunov_seconds, part_bytes

    def shape(repeat: int) -> CoreShape:
        structure = JacobianStructure((StateBlock("s", 0, 16 * 128 * 128, "block_diagonal", 128, repeat),))
        return CoreShape(structure.state_dim, 2048, 2048, 1, structure, 2.0 * 1e8, False)

    once, every = shape(128), shape(1)
    t1, t128 = lyapunov_seconds(once, 1, 100, once.D), lyapunov_seconds(every, 1, 100, every.D)
    assert 10 < t128 / t1 <= 128  # the QRs go from 2,048 to 16 a step; the step itself costs the same
    kw = dict(n=1, T=4, grid_sequences=1, sv=1, trajectories=1, steps=100, exponents=once.D, flow_method="estimate")
    work1, work128 = part_bytes(once, **kw)[0]["lyapunov"], part_bytes(every, **kw)[0]["lyapunov"]
    assert work1 < work128


def test_a_block_triangular_sample_is_estimated_matrix_free_with_error_bars_stored(tmp_path) -> None:
    """The shipped Mamba sample (D = 1,536, block-triangular): grid, step singular values and ‖J_t‖_F
    would form D × D (minutes); the plan estimates them from JVPs and the store keeps their errors."""
    import gradscope
    from gradscope.store.io import write_store

    opts = DynamicsOptions(parts="grid,spectra", sequences=1, grid_sequences=1, sv=2, budget_seconds=40)
    run = run_checkpoint_dynamics([SAMPLES / "mamba-none-s1" / "step-0006000.pt"], opts)
    assert run.plan.methods == {"grid": "estimate", "spectra": "estimate"}
    write_store(run.to_xarray(), tmp_path / "d.zarr")
    ds = gradscope.open_store(tmp_path / "d.zarr") if hasattr(gradscope, "open_store") else run.to_xarray()
    for name in ("tT_grid_se", "step_sv_bound"):
        assert name in ds
    assert not any(run.nonfinite.values())
    upper = np.triu(np.ones(ds.sizes["t"], dtype=bool), k=1)
    assert (ds["tT_grid_se"].values[0, 0][upper] > 0).all()


def test_flow_of_a_real_size_structure_is_estimated_from_vjps_and_stores_its_error(tmp_path) -> None:
    """At mamba-130m's size the exact flow carries all H = 768 output rows through every step (hours); the
    plan estimates it from probe rows instead, within the memory of a laptop, and the store keeps the
    standard error beside each value (and no spectral norm, which is not estimated)."""
    from gradscope.store.io import write_store
    from gradscope.workflows.dynamics import run_model_dynamics

    structure = _mamba130m()
    D = structure.state_dim
    shape = CoreShape(D, 768, 768, 1, structure, 2.0 * 130e6, False, 221, 129_000_000)
    plan = plan_dynamics(DynamicsOptions(parts="flow", budget_seconds=3600), 1, 256, D, 768, structure, 1, shape=shape)
    assert plan.methods == {"flow": "estimate"} and "flow_fro_se" in plan.describe()
    assert plan_bytes(plan, 1, 256, shape) < 2 * 2**30  # probes × D and a state tape, never 768 × D per step

    from tests.helpers.cores import tiny_model

    model = tiny_model("gru", 12, 4, 24)  # H = 24 > 16 probes
    tokens = torch.randint(0, 12, (2, 12), generator=torch.Generator().manual_seed(0))
    exact = run_model_dynamics(model, tokens, DynamicsOptions(parts="flow", sequences=2))
    assert exact.plan.methods == {"flow": "exact"}  # exact wherever it fits: stored numbers unchanged
    import gradscope.workflows.dynamics as wd
    est = wd.analyse_model(model, tokens, None, DynamicsOptions(parts="flow", sequences=2), methods={"flow": "estimate"})[0]
    fro, se = est["flow_fro"], est["flow_fro_se"]
    assert "flow_spectral" not in est and (se[:, :-1] > 0).all()
    want = exact.results[0].parts["flow_fro"]
    assert np.mean(np.abs(fro - want)[:, :-1] <= 3 * se[:, :-1]) > 0.9
    run = wd.DynamicsRun(**{**exact.__dict__, "results": [wd.DynamicsResult(Path("x"), 0, "r", est)]})
    write_store(run.to_xarray(), tmp_path / "d.zarr")
    from typer.testing import CliRunner

    from gradscope.cli.app import app
    out = CliRunner().invoke(app, ["report", str(tmp_path / "d.zarr"), "-o", str(tmp_path / "r.html")])
    assert out.exit_code == 0, out.output


def test_a_part_is_estimated_only_where_the_estimator_is_cheaper() -> None:
    """At a tiny D exact step spectra cost less than subspace iteration; a tight budget that makes exact
    'a quarter of the budget' must not switch to the dearer estimate and then refuse the plan's own sizes."""
    import transformers

    import gradscope

    torch.manual_seed(0)
    cfg = transformers.MambaConfig(vocab_size=40, hidden_size=16, state_size=4, num_hidden_layers=2, expand=2,
                                   conv_kernel=3, time_step_rank=2)
    model = gradscope.wrap(transformers.MambaForCausalLM(cfg).eval())
    shape = core_shape(model.core, 16)
    opts = DynamicsOptions(sequences=4, budget_seconds=5)
    plan = plan_dynamics(opts, 4, 12, shape.D, shape.H, shape.structure, shape.gates, shape=shape)
    estimated = [p for p, m in plan.methods.items() if m == "estimate"]
    from gradscope.workflows.dynamics_cost import estimator_seconds, part_seconds

    exact = part_seconds(shape, n=4, T=12, grid_sequences=plan.options.grid_sequences, sv=8,
                         trajectories=plan.options.trajectories, steps=plan.options.steps, exponents=shape.D,
                         flow_method="vjp")
    est = estimator_seconds(shape, n=4, T=12, grid_sequences=plan.options.grid_sequences, sv=8, probes=16, iterations=30)
    assert all(est[p] < exact[p] for p in estimated)
    assert "spectra" in plan.options.parts and plan.methods["spectra"] == "exact"


def test_a_real_size_structure_is_described_in_one_readable_line() -> None:
    """The plan's Lyapunov line named all 48 blocks of mamba-130m; layers alike are said once."""
    assert _mamba130m().describe() == "lower-triangular over 48 blocks: 24 layers × (conv block_diagonal(3), ssm diagonal)"
    mixed = JacobianStructure((StateBlock("l0/conv", 0, 3, "block_diagonal", 3), StateBlock("l1/ssm", 3, 5, "diagonal")))
    assert mixed.describe() == "lower-triangular over 2 blocks: l0/conv block_diagonal(3), l1/ssm diagonal"


def test_options_of_a_part_the_plan_drops_do_not_reach_the_store(tmp_path: Path) -> None:
    """--sv 4 with a budget that leaves the spectra out: the store records no sv (nothing that was not
    applied reaches a store); the parts kept keep theirs."""
    from gradscope.store import read_store
    from gradscope.workflows.options import applied_options

    kept = applied_options(DynamicsOptions(parts=("flow", "lyapunov"), sv=4, lyap_warmup=3, steps=30))
    assert "sv" not in kept and "grid_sequences" not in kept and kept["lyap_warmup"] == 3
    assert "sequences" in kept
    gone = applied_options(DynamicsOptions(parts=("lyapunov",), sv=4, steps=30))
    assert not {"sv", "sequences", "target_freq", "disturbant"} & set(gone)
    plans = []
    run = run_checkpoint_dynamics([SAMPLES / "gru-none-s1" / "step-0006000.pt"],
                       DynamicsOptions(sv=4, sequences=1, grid_sequences=1, trajectories=1, steps=20, lyap_warmup=2,
                                       parts=("flow", "lyapunov")), on_plan=plans.append)
    out = tmp_path / "d.zarr"
    from gradscope.store import write_store
    write_store(run.to_xarray(), out)
    import json
    options = json.loads(read_store(out).attrs["options"])
    assert "sv" not in options and options["lyap_warmup"] == 2 and plans[0].options.parts == ("flow", "lyapunov")


def _mamba2_like(layers: int = 24) -> tuple[JacobianStructure, CoreShape]:
    """mamba2-130m's state: per layer a conv window (1,792 channels × 3, shift) and 24 heads' 64 × 128
    states (diagonal); D = 4,847,616."""
    blocks, start = [], 0
    for i in range(layers):
        blocks.append(StateBlock(f"l{i}/conv", start, start + 1792 * 3, "block_diagonal", 3))
        start += 1792 * 3
        blocks.append(StateBlock(f"l{i}/ssm", start, start + 24 * 64 * 128, "diagonal", 1))
        start += 24 * 64 * 128
    structure = JacobianStructure(tuple(blocks))
    return structure, CoreShape(start, 768, 768, 1, structure, 5e8, False, modules=170, params=129_000_000)


def test_the_plan_shrinks_what_does_not_fit_the_memory_and_says_so(monkeypatch) -> None:
    """Issue #48: at mamba2-130m's size all 4.8 M exponents with their (bounded) history take ~2.7 GB; on
    a machine with 1.5 GB to spare they would not fit, and the plan keeps the top k that fit (and says
    why) instead of refusing after planning; given options that cannot fit are one line naming the
    memory. With 4 GB all of them fit."""
    import gradscope.workflows.dynamics as dynamics

    structure, shape = _mamba2_like()
    D = shape.D
    assert D == 4_847_616
    opts = DynamicsOptions(parts=("lyapunov",), budget_seconds=1e6)
    monkeypatch.setattr(dynamics, "memory_budget", lambda: 4 * 2**30)
    roomy = plan_dynamics(opts, 1, 4, D, 768, structure, 1, steps=1000, trajectories=1, shape=shape)
    assert roomy.exponents == D and plan_bytes(roomy, 1, 4, shape) <= 4 * 2**30
    budget = 3 * 2**29  # 1.5 GiB
    monkeypatch.setattr(dynamics, "memory_budget", lambda: budget)
    plan = plan_dynamics(opts, 1, 4, D, 768, structure, 1, steps=1000, trajectories=1, shape=shape)
    assert plan.engine == "structured" and 1 <= plan.exponents < D
    assert plan_bytes(plan, 1, 4, shape) <= budget
    assert "would not fit the memory" in plan.note
    bigger = dataclasses_replace_exponents(plan, 2 * plan.exponents)
    assert bigger > budget or plan.exponents * 2 > D  # the largest k that fits (within a factor of 2)
    with pytest.raises(GradscopeError, match="^memory: .*--exponents") as err:
        plan_dynamics(DynamicsOptions(parts=("lyapunov",), budget_seconds=1e6, exponents=D), 1, 4, D, 768, structure, 1,
                      steps=1000, trajectories=1, shape=shape)
    assert "\n" not in str(err.value)


def dataclasses_replace_exponents(plan, k: int) -> int:  # noqa: ANN001
    """The bytes of ``plan`` with ``k`` exponents kept (the same plan otherwise)."""
    import dataclasses

    structure, shape = _mamba2_like()
    return plan_bytes(dataclasses.replace(plan, exponents=k), 1, 4, shape)


def test_the_structured_engine_keeps_only_the_top_k_history() -> None:
    """Asking for the top k keeps a k-wide running history, equal to the full run's history sorted and cut
    (what the result held before issue #48 built only that): the shipped Mamba sample's structured core."""
    import gradscope
    from gradscope.analysis.lyapunov import lyapunov_spectrum

    loaded = gradscope.load(SAMPLES / "mamba-none-s1")
    core = loaded.model.core
    tokens = torch.randint(0, 64, (2, 30), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        x = loaded.model.core_inputs(tokens)
    full = lyapunov_spectrum(core, x, warmup=5)
    top = lyapunov_spectrum(core, x, warmup=5, exponents=7)
    assert top.engine == "structured" and top.running.shape[-1] == 7
    assert torch.equal(top.running, full.running[..., :7]) and torch.equal(top.exponents, full.exponents[:, :7])


def test_a_hybrids_lyapunov_prices_the_recurrent_view() -> None:
    """A hybrid's Lyapunov spectrum runs on the recurrent view (analysis.held): its held caches cost nothing in
    the engine, but the view scans the trajectory once to fill them, at the trajectory's length, and assembles a
    full state at every step. The estimate grows by exactly that, with the caches as wide as the trajectory
    is long once it outgrows their slots."""
    from gradscope.workflows.dynamics_cost import ELEMENT, STEP_FLOP, lyapunov_seconds

    structure = JacobianStructure((StateBlock("l0/s", 0, 1000, "diagonal"),
                                   StateBlock("l1/keys", 1000, 1640, "diagonal", held=True)))
    flops = 2.0 * 1e7
    view = CoreShape(1640, 64, 64, 1, structure, flops, False, held=640, positions=64)
    unpriced = dataclasses.replace(view, held=0)  # the same core, its view's own work left out
    for steps, full in ((50, 1640), (640, 1000 + 6400)):  # within the 64 slots; 640 steps: caches 10× as wide
        scan = 2 * steps * (flops * STEP_FLOP + ELEMENT * 2 * full) + steps * view.overhead
        assembled = 2 * steps * ELEMENT * 4 * full
        assert lyapunov_seconds(view, 2, steps, 1000) == pytest.approx(
            lyapunov_seconds(unpriced, 2, steps, 1000) + scan + assembled)
    # the held block is never the engine's: declaring it recurrent instead prices its accumulator
    recurrent = dataclasses.replace(unpriced, structure=JacobianStructure((
        structure.blocks[0], StateBlock("l1/keys", 1000, 1640, "diagonal"))))
    assert lyapunov_seconds(recurrent, 2, 50, 1000) - lyapunov_seconds(unpriced, 2, 50, 1000) == pytest.approx(
        2 * 50 * ELEMENT * 4 * 640)


def test_the_estimators_probe_draws_and_the_recurrent_views_columns_are_priced(monkeypatch) -> None:
    """The matrix-free estimators draw their Gaussian probes in float64 (B × probes × D a step for the gates, B × D
    × width for the spectra's start, B × probes × D a start for the grid), and a hybrid's spectra and gates run on
    the recurrent view, which moves a full state around each product column: both are priced, by exactly these
    terms (qwen3next-125m's gates were priced at 44.6 s and took 214 s before)."""
    from gradscope.workflows import dynamics_cost as dc

    structure = JacobianStructure((StateBlock("l0/s", 0, 4096, "block_diagonal", 64),
                                   StateBlock("l1/keys", 4096, 5120, "diagonal", held=True)))
    hybrid = CoreShape(5120, 256, 256, 1, structure, 2.0 * 1e7, False, held=1024, positions=32)
    sizes = dict(n=8, T=32, grid_sequences=2, sv=4, probes=16, iterations=3)
    width = min(hybrid.D, 4 + 8)
    priced = dc.estimator_seconds(hybrid, **sizes)
    unviewed = dc.estimator_seconds(dataclasses.replace(hybrid, held=0), **sizes)
    view = dc.VIEW_COLUMN * hybrid.D
    assert priced["gates"] - unviewed["gates"] == pytest.approx(8 * 32 * 16 * view)
    assert priced["spectra"] - unviewed["spectra"] == pytest.approx(4 * 2 * 32 * 8 * width * view)
    assert priced["grid"] == pytest.approx(unviewed["grid"])  # the grid runs on the whole state
    monkeypatch.setattr(dc, "RANDN64", 0.0)
    undrawn = dc.estimator_seconds(hybrid, **sizes)
    draw = 2.3e-8 * hybrid.D
    assert priced["gates"] - undrawn["gates"] == pytest.approx(8 * 32 * 16 * draw)
    assert priced["spectra"] - undrawn["spectra"] == pytest.approx(8 * 32 * width * draw)
    assert priced["grid"] - undrawn["grid"] == pytest.approx(2 * 32 * 16 * draw)
