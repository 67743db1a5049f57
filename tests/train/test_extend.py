"""Vocabulary extension (paper §4.2): frozen parameters stay bit-identical, the optimizer holds only
the new rows, provenance is recorded, resume is exact, and bad input is a one-line error."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import pytest
import torch

from tests.helpers.runs import COMPLEX_CORE, OTHER_CORE, small_run
from gradscope.cli.app import app
from gradscope.config import TaskConfig
from gradscope.errors import GradscopeError
from gradscope.models import SeqModel
from gradscope.tasks import make_task
from gradscope.files.checkpoint import load
from gradscope.train import extension_config, train

K, K2 = 8, 12


def _frozen_moved(parent: dict[str, torch.Tensor], child: dict[str, torch.Tensor]) -> list[str]:
    """Every frozen value of ``child`` that differs (in any bit) from ``parent``'s."""
    moved = []
    for name, value in parent.items():
        if name == "embedding.weight":
            pairs = [(value[:K], child[name][:K]), (value[K], child[name][K2])]  # old rows; the query row
        elif name.startswith("to_logits."):
            pairs = [(value, child[name][:K])]
        else:
            pairs = [(value, child[name])]
        if not all(torch.equal(a, b) for a, b in pairs):
            moved.append(name)
    return moved


@pytest.fixture(scope="module")
def parent(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("ext") / "parent"
    train(small_run(OTHER_CORE, pe="sinusoidal", iterations=10, distribution="uniform"), run)
    return run


@pytest.mark.parametrize("core", [OTHER_CORE, COMPLEX_CORE])
def test_frozen_parameters_bit_identical_and_optimizer_holds_only_new_rows(tmp_path: Path, core: str) -> None:
    base = small_run(core, pe="sinusoidal", iterations=10, distribution="uniform")
    train(base, tmp_path / "p")
    cfg = extension_config(tmp_path / "p", K2, train={"iterations": 15, "lr": 0.05})
    train(cfg, tmp_path / "e", extend_from=tmp_path / "p")
    before, after = load(tmp_path / "p").model.state_dict(), load(tmp_path / "e")
    sd = after.model.state_dict()
    assert _frozen_moved(before, sd) == []
    # the check is real: one frozen value nudged by one ulp is caught
    nudged = {k: v.clone() for k, v in sd.items()}
    nudged["embedding.weight"][K - 1, 0] = torch.nextafter(nudged["embedding.weight"][K - 1, 0], torch.tensor(1e9))
    assert _frozen_moved(before, nudged) == ["embedding.weight"]
    # the new rows did train
    fresh = load(tmp_path / "e" / "step-0000005.pt").model.state_dict()
    assert not torch.equal(fresh["embedding.weight"][K:K2], sd["embedding.weight"][K:K2])
    assert not torch.equal(fresh["to_logits.weight"][K:K2], sd["to_logits.weight"][K:K2])
    opt = after.raw["optimizer"]
    assert opt["param_groups"][0]["params"] == [0, 1, 2]
    shapes = [tuple(opt["state"][i]["exp_avg"].shape) for i in range(3)]
    E, H = base.model.embed_size, base.model.hidden_size
    assert sorted(opt["state"]) == [0, 1, 2] and shapes == [(K2 - K, E), (K2 - K, H), (K2 - K,)]
    # provenance and the frozen list
    ext = after.config.extend
    parent_file = load(tmp_path / "p").path
    assert ext.parent == parent_file.name and ext.parent_iteration == 10
    assert ext.parent_sha256 == hashlib.sha256(parent_file.read_bytes()).hexdigest()
    trainable = {n for n, _ in after.model.named_parameters()} - {"embedding.weight", "to_logits.weight", "to_logits.bias"}
    assert set(ext.frozen) == trainable | {f"embedding.weight[0:{K}]", f"embedding.weight[{K2}:{K2 + 1}]",
                                           f"to_logits.weight[0:{K}]", f"to_logits.bias[0:{K}]"}
    assert after.config.task.old_items == K and after.config.task.new_item_share is None


def test_new_rows_initialised_as_a_fresh_model(parent: Path) -> None:
    """New rows equal those of a fresh K' model built from the run's seed (N(0,1) embedding rows,
    nn.Linear's uniform output rows)."""
    from gradscope.train.extend import extended_model

    cfg = extension_config(parent, K2, train={"seed": 5})
    model = extended_model(cfg, parent)
    torch.manual_seed(5)
    fresh = SeqModel(cfg.model)
    for name in ("embedding.weight", "to_logits.weight", "to_logits.bias"):
        assert torch.equal(getattr(model, name.split(".")[0]).get_parameter(name.split(".")[1])[K:K2],
                           fresh.get_parameter(name)[K:K2])
    assert not any(p.requires_grad for p in model.parameters())


def test_extension_resume_is_bit_identical(tmp_path: Path, parent: Path) -> None:
    cfg = extension_config(parent, K2, train={"iterations": 12})
    train(cfg, tmp_path / "full", extend_from=parent)
    assert train(cfg, tmp_path / "split", stop_after=6, extend_from=parent) == {}
    train(cfg, tmp_path / "split", resume=True)
    a, b = load(tmp_path / "full"), load(tmp_path / "split")
    assert all(torch.equal(a.model.state_dict()[k], b.model.state_dict()[k]) for k in a.model.state_dict())
    sa, sb = a.raw["optimizer"]["state"], b.raw["optimizer"]["state"]
    assert all(torch.equal(sa[i][m], sb[i][m]) for i in sa for m in ("exp_avg", "exp_avg_sq"))


def test_new_item_share_sets_the_data(parent: Path) -> None:
    cfg = extension_config(parent, 16, new_item_share=0.25)
    assert cfg.task.old_items == K and cfg.task.new_item_share == 0.25
    batch = make_task(cfg.task).sample(4000, torch.Generator().manual_seed(0))
    tokens = batch.inputs[:, :cfg.task.length]
    share = float((tokens >= K).double().mean())
    assert abs(share - 0.25) < 0.01  # 16000 draws: sd 0.0034
    assert int(tokens.max()) == 15 and int(tokens.min()) == 0


def test_parent_bytes_must_match(tmp_path: Path, parent: Path) -> None:
    cfg = extension_config(parent, K2)
    other = dataclasses.replace(cfg, extend=dataclasses.replace(cfg.extend, parent_sha256="0" * 64))
    with pytest.raises(GradscopeError, match="sha256"):
        train(other, tmp_path / "e", extend_from=parent)
    assert not (tmp_path / "e").exists()


def test_task_config_refuses_share_without_split() -> None:
    with pytest.raises(GradscopeError, match="new_item_share"):
        TaskConfig(vocab_size=8, new_item_share=0.5)
    with pytest.raises(GradscopeError, match="old_items"):
        TaskConfig(vocab_size=8, old_items=8)


@pytest.mark.parametrize("args, message", [
    (["--vocab-size", "6"], "--vocab-size: got 6"),
    (["--vocab-size", "8"], "--vocab-size: got 8"),
    (["--vocab-size", "12", "--task", "sort"], "--task: got 'sort'"),
    (["--vocab-size", "12", "--dim", "4"], "--dim: got 4"),
    (["--vocab-size", "12", "--hidden-size", "4"], "--hidden-size: an extension keeps its parent's architecture"),
    (["--vocab-size", "12", "--new-item-share", "1.5"], "--new-item-share: got 1.5"),
    (["--vocab-size", "12", "--new-item-share", "1"], "--new-item-share: got 1.0; it must be > 0.0 and < 1.0"),
    (["--vocab-size", "12", "--new-item-share", "0"], "--new-item-share: got 0.0"),
])
def test_cli_bad_extension_is_one_line_exit_2(runner, tmp_path: Path, parent: Path, args: list[str],
                                              message: str) -> None:
    result = runner.invoke(app, ["train", "-q", "--extend-from", str(parent), "-o", str(tmp_path / "e"), *args])
    assert result.exit_code == 2, result.output
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "e").exists()


def test_cli_extends_and_records(runner, tmp_path: Path, parent: Path) -> None:
    result = runner.invoke(app, ["train", "-q", "--extend-from", str(parent), "--vocab-size", "12", "--iterations", "5",
                                 "--new-item-share", "0.5", "-o", str(tmp_path / "e")])
    assert result.exit_code == 0, result.output
    config = json.loads((tmp_path / "e" / "config.json").read_text())["config"]
    assert config["extend"]["parent_sha256"] == hashlib.sha256(load(parent).path.read_bytes()).hexdigest()
    assert config["task"]["new_item_share"] == 0.5 and config["train"]["iterations"] == 5
    assert "old items" in result.stdout and "new items" in result.stdout
    result = runner.invoke(app, ["accuracy", "-q", str(tmp_path / "e"), "-o", str(tmp_path / "a.zarr")])
    assert result.exit_code == 0, result.output
    from gradscope.store.summary import trial_record  # summarize: old and new items per seed
    import xarray as xr

    ds, metrics = xr.open_zarr(tmp_path / "a.zarr"), trial_record(tmp_path / "a.zarr").metrics
    assert [metrics["token_accuracy/old_items"], metrics["token_accuracy/new_items"]] == \
        pytest.approx(ds["item_accuracy"].values[-1].tolist())
