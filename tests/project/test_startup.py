"""Start-up (issue #24): analysing a checkpoint never imports torch's compiler stack, and the help
screens import none of torch, xarray, zarr or scipy. (The timings are in bench/startup.py; these
are the causes it found, checked in a fresh interpreter each.)"""

from __future__ import annotations

import pytest

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "sample_checkpoints" / "gru-sinusoidal-s1" / "step-0006000.pt"
HEAVY = ("torch._dynamo", "torch._inductor", "sympy")


def _modules_after(code: str) -> set[str]:
    """The modules a fresh interpreter holds after running ``code``."""
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return set(json.loads(done.stdout.strip().splitlines()[-1]))


def test_loading_and_analysing_a_checkpoint_never_imports_the_compiler() -> None:
    """Validating weight shapes once built the model on the meta device, whose initialisation runs
    torch's reference kernels, which import torch._dynamo (~1.3 s of every command)."""
    mods = _modules_after(f"import gradscope\nds = gradscope.stability({str(SAMPLE)!r}, triplets=1)")
    assert "gradscope.files.validate" in mods and "torch" in mods  # the probe ran the path in question
    assert not [m for m in HEAVY if m in mods], [m for m in HEAVY if m in mods]


def test_the_template_check_leaves_no_trace() -> None:
    """model_template builds without drawing random numbers (training's initialisation depends on the
    generator's state) and gives the shapes of an initialised model."""
    import torch

    from gradscope.config import ModelConfig
    from gradscope.files.validate import model_template
    from gradscope.models import SeqModel

    for core in ("gru", "lstm", "s4d"):
        cfg = ModelConfig(core=core, pe="random", vocab_size=16, hidden_size=8, embed_size=8, max_len=10, num_layers=2)
        torch.manual_seed(3)
        state = torch.get_rng_state()
        template = model_template(cfg, "test")
        assert torch.equal(state, torch.get_rng_state())
        real = SeqModel(cfg).state_dict()
        assert {k: (tuple(v.shape), v.dtype) for k, v in template.items()} == \
            {k: (tuple(v.shape), v.dtype) for k, v in real.items()}
        assert all(v.is_meta for v in template.values())


@pytest.mark.parametrize("command", ["stability", "dynamics", "accuracy", "summarize"])
def test_help_imports_no_heavy_library(command: str) -> None:
    """Their options are generated from their options dataclasses (gradscope/workflows/options.py),
    which are torch-free: the help builds them without loading torch."""
    mods = _modules_after(f"import sys\nsys.argv = ['gradscope', '{command}', '--help']\nfrom gradscope.cli.app import app\n"
                          "try:\n    app()\nexcept SystemExit:\n    pass")
    assert f"gradscope.cli.{command}" in mods and "gradscope.workflows.options" in mods
    heavy = [m for m in ("torch", "xarray", "zarr", "scipy", "pandas", "dask") if m in mods]
    assert not heavy, heavy


@pytest.mark.parametrize("command", ["report", "reproduce", "sweep", "corpus prepare"])
def test_help_of_the_study_commands_imports_no_heavy_library(command: str) -> None:
    """Their options are generated from torch- and plotly-free dataclasses (gradscope/workflows/study/options.py)."""
    argv = ["gradscope", *command.split(), "--help"]
    mods = _modules_after(f"import sys\nsys.argv = {argv!r}\nfrom gradscope.cli.app import app\n"
                          "try:\n    app()\nexcept SystemExit:\n    pass")
    assert "gradscope.workflows.study.options" in mods and "typer" in mods  # the help was built from the dataclass
    heavy = [m for m in ("torch", "xarray", "zarr", "scipy", "pandas", "dask", "plotly") if m in mods]
    assert not heavy, heavy


def test_editors_see_every_lazy_export() -> None:
    """gradscope/__init__.py imports its exports on first use; its TYPE_CHECKING block names the same
    objects, so editors and type checkers see their types; __all__ lists them all."""
    import ast

    import gradscope

    tree = ast.parse((ROOT / "gradscope" / "__init__.py").read_text())
    block = next(n for n in tree.body if isinstance(n, ast.If) and getattr(n.test, "id", "") == "TYPE_CHECKING")
    seen = {(node.module, a.name) for node in block.body if isinstance(node, ast.ImportFrom) for a in node.names}
    assert seen == {(module, name) for name, module in gradscope._EXPORTS.items()}
    assert set(gradscope.__all__) == {"GradscopeError", *gradscope._EXPORTS}
    for name in gradscope.__all__:
        assert getattr(gradscope, name) is not None
