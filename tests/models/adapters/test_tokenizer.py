"""A library model's tokenizer: a model directory without one, a truncated, invalid or remote-code
tokenizer are one line naming --tokenizer; a tokenizer with neither BOS nor EOS scores from the second
token on. The tiny model and text come from tests/workflows/text/test_accuracy.py."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from gradscope.cli.app import app  # noqa: E402
from gradscope.corpus.text import paragraphs  # noqa: E402
from tests.workflows.text.test_accuracy import refused, save_tokenizer, saved  # noqa: E402,F401 - the fixture


def test_a_model_without_a_tokenizer_is_one_line(saved, runner, tmp_path: Path) -> None:  # noqa: ANN001
    model_dir, text = saved
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        (bare / name).write_bytes((model_dir / name).read_bytes())
    refused(runner.invoke(app, ["accuracy", str(bare), "--model", "hf", "--text", str(text), "-q",
                                "-o", str(tmp_path / "a.zarr")]), "--tokenizer", "holds no tokenizer")


@pytest.mark.parametrize("damage", ["truncated", "not json", "remote code"])
def test_a_bad_tokenizer_is_one_line(saved, runner, tmp_path: Path, damage: str) -> None:  # noqa: ANN001
    model_dir, text = saved
    tok = tmp_path / "tok"
    tok.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tok / name).write_bytes((model_dir / name).read_bytes())
    if damage == "truncated":
        data = (tok / "tokenizer.json").read_bytes()
        (tok / "tokenizer.json").write_bytes(data[:len(data) // 2])
    elif damage == "not json":
        (tok / "tokenizer_config.json").write_text("{not json")
    else:
        (tok / "tokenizer_config.json").write_text('{"auto_map": {"AutoTokenizer": ["x.Tok", null]}}')
    refused(runner.invoke(app, ["accuracy", str(model_dir), "--model", "hf", "--text", str(text), "--tokenizer",
                                str(tok), "-q", "-o", str(tmp_path / "a.zarr")]), "--tokenizer")
    assert not (tmp_path / "a.zarr").exists()


def test_without_a_start_token_the_first_token_is_context_only(saved, tmp_path: Path) -> None:  # noqa: ANN001
    """A tokenizer with neither BOS nor EOS: position 1 is never scored, every later token is, and the
    perplexity is the model's own over those tokens. A model in memory takes tokenizer=."""
    import gradscope

    model_dir, text = saved
    tok_dir = tmp_path / "tok"
    save_tokenizer(tok_dir, text.read_text(), bos=False)
    model = transformers.MambaForCausalLM.from_pretrained(str(model_dir)).eval()
    ds = gradscope.accuracy(model, text=text, tokenizer=tok_dir, max_length=64, resamples=20)
    tok = transformers.AutoTokenizer.from_pretrained(str(tok_dir), local_files_only=True)
    assert tok.bos_token_id is None and tok.eos_token_id is None
    losses = []
    with torch.no_grad():
        for p in paragraphs(text.read_text()):
            x = tok(p, add_special_tokens=False)["input_ids"]
            if len(x) >= 2:
                logp = torch.log_softmax(model(torch.tensor([x])).logits[0].double(), -1)
                losses += [-float(logp[t - 1, x[t]]) for t in range(1, len(x))]
    assert int(ds["pos_n"].values[0]) == 0 and int(ds["pos_n"].sum()) == len(losses)
    assert float(ds["perplexity"].values[0]) == pytest.approx(math.exp(sum(losses) / len(losses)), rel=1e-5)
    assert ds.attrs["options"].count('"start_token": null') == 1
