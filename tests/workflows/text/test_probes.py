"""Stability and dynamics of a pretrained LM on probes drawn from raw text (issue #38, part 3). A tiny
transformers Mamba and a BPE tokenizer trained on the test's text are saved in a temporary directory
(as tests/workflows/text/test_accuracy.py does); the stores' probe tokens are checked against the text's paragraphs as
the tokenizer encodes them here, independently of gradscope's tokenising and caching."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

import gradscope  # noqa: E402
from gradscope.cli.app import app  # noqa: E402
from gradscope.corpus.text import paragraphs  # noqa: E402
from gradscope.store.io import read_store  # noqa: E402
from tests.workflows.text.test_accuracy import make_text, refused, save_tokenizer  # noqa: E402

LENGTH = 12  # tokens per probe row, the start token included
POS = 3  # the target: paragraph token 3, row column 3 (0-based) after the start token


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> tuple[Path, Path]:  # noqa: ANN001
    root = tmp_path_factory.mktemp("text_probes")
    text = make_text(1, 60)
    (root / "text.txt").write_text(text)
    model_dir = root / "model"
    save_tokenizer(model_dir, text)
    vocab = len(transformers.AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True))
    torch.manual_seed(0)
    cfg = transformers.MambaConfig(vocab_size=vocab, hidden_size=16, state_size=4, num_hidden_layers=2, expand=2,
                                   conv_kernel=3, time_step_rank=2, use_bias=True)
    transformers.MambaForCausalLM(cfg).eval().save_pretrained(model_dir)
    return model_dir, root / "text.txt"


def encoded(model_dir: Path, text: Path) -> tuple[list[list[int]], int, np.ndarray]:
    """The paragraphs' ids, the BOS id and the counts per id, from the tokenizer itself."""
    tok = transformers.AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    ids = [tok(p, add_special_tokens=False)["input_ids"] for p in paragraphs(text.read_text())]
    return ids, tok.bos_token_id, np.bincount([i for x in ids for i in x], minlength=len(tok))


def groups_of(counts: np.ndarray) -> dict[str, set[int]]:
    """Frequent: the most frequent half (rounded up) of the seen types, ties by id; rare: the rest."""
    seen = sorted(np.flatnonzero(counts).tolist(), key=lambda i: (-counts[i], i))
    half = (len(seen) + 1) // 2
    return {"frequent": set(seen[:half]), "rare": set(seen[half:])}


def rows_of(ids: list[list[int]], bos: int) -> set[tuple[int, ...]]:
    """Every paragraph's probe row: BOS, then its first LENGTH − 1 tokens (paragraphs long enough)."""
    return {tuple([bos, *x[:LENGTH - 1]]) for x in ids if len(x) >= LENGTH - 1}


def test_accuracy_stability_dynamics_and_report_on_a_text_from_the_cli(saved, runner, tmp_path: Path) -> None:  # noqa: ANN001
    """The issue's CLI test: accuracy, stability --text, dynamics --text and report on one model
    directory and text. Every probe row is real text of the file: the base member is a paragraph's
    row; same-target keeps it through the target and continues as another paragraph's row does;
    same-suffix is another paragraph's prefix and target (a different target token) before the base's
    suffix; the target is of the asked group by the text's counts. Dynamics' sequences are paragraph
    rows, each step classed by its token's group."""
    model_dir, text = saved
    ids, bos, counts = encoded(model_dir, text)
    groups, rows = groups_of(counts), rows_of(ids, bos)
    acc, stab, dyn = tmp_path / "acc.zarr", tmp_path / "stab.zarr", tmp_path / "dyn.zarr"
    common = [str(model_dir), "--model", "hf", "--text", str(text), "-q"]
    result = runner.invoke(app, ["accuracy", *common, "--max-length", "64", "--resamples", "50", "-o", str(acc)])
    assert result.exit_code == 0, (result.stdout, result.stderr)
    result = runner.invoke(app, ["stability", *common, "--length", str(LENGTH), "--target-pos", str(POS),
                                 "--triplets", "5", "--seed", "3", "--resamples", "100", "-o", str(stab)])
    assert result.exit_code == 0, (result.stdout, result.stderr)
    assert "frequent/all" in result.stdout and "rare/all" in result.stdout
    result = runner.invoke(app, ["dynamics", *common, "--length", str(LENGTH), "--parts", "flow,spectra,lyapunov",
                                 "--sequences", "3", "--trajectories", "2", "--steps", "40", "-o", str(dyn)])
    assert result.exit_code == 0, (result.stdout, result.stderr)

    ds = read_store(stab, kind="stability")
    tokens = ds["probe_tokens"].values  # (n, 3, L)
    assert tokens.shape == (10, 3, LENGTH)
    assert list(ds["target_group"].values) == ["frequent"] * 5 + ["rare"] * 5
    assert set(ds["disturbant_group"].values) == {"all"}
    heads = {r[:POS + 1] for r in rows}
    tails = {r[POS + 1:] for r in rows}
    for (base, same_target, same_suffix), group in zip(tokens, ds["target_group"].values):
        assert tuple(base) in rows
        assert int(base[POS]) in groups[group]
        assert (same_target[:POS + 1] == base[:POS + 1]).all() and tuple(same_target[POS + 1:]) in tails
        assert (same_target[POS + 1:] != base[POS + 1:]).any()
        assert (same_suffix[POS + 1:] == base[POS + 1:]).all() and tuple(same_suffix[:POS + 1]) in heads
        assert int(same_suffix[POS]) != int(base[POS]) and int(same_suffix[POS]) in groups[group]
    assert np.isfinite(ds["score_default"].values).all()
    assert np.allclose(ds["score_default"].values[0, :, :], ds["score_default"].values[0, :, :].clip(-1, 1))
    task = __import__("json").loads(ds.attrs["task_config"])
    assert task["name"] == "text" and task["start_token"] == bos and task["length"] == LENGTH

    dd = read_store(dyn, kind="dynamics")
    seq = dd["tokens"].values  # (n, T)
    assert seq.shape == (3, LENGTH) and all(tuple(r) in rows for r in seq)
    classes = dd["token_class"].values
    assert (classes[:, 0] == "start").all()
    for r, c in zip(seq, classes):
        for token, k in zip(r[1:], c[1:]):
            assert int(token) in groups[k], (token, k)
    assert np.isfinite(dd["flow_fro"].values[..., :-1]).all() and dd["lyapunov"].shape[1] == 2

    for i, store in enumerate((acc, stab, dyn)):
        page = tmp_path / f"r{i}.html"
        report = runner.invoke(app, ["report", str(store), "-o", str(page)])
        assert report.exit_code == 0, (report.stdout, report.stderr)
        assert page.stat().st_size > 1000


def test_disturbant_groups_are_spans_of_the_group_and_the_draw_is_seeded(saved) -> None:  # noqa: ANN001
    """--disturbant frequent: the base's prefix and suffix each hold at least half frequent tokens (the
    suffix of same-target and the prefix of same-suffix too, being other candidates' spans); the same
    seed gives the same probes, another seed others."""
    model_dir, text = saved
    ids, bos, counts = encoded(model_dir, text)
    frequent = groups_of(counts)["frequent"]
    opts = dict(target_freq=("frequent",), disturbant=("frequent",), triplets=6, length=LENGTH, target_pos=POS,
                device="cpu", sv=4)
    ds = gradscope.stability(model_dir, model_factory="hf", text=text, seed=1, **opts)
    tokens = ds["probe_tokens"].values
    share = lambda span: np.mean([int(t) in frequent for t in span])  # noqa: E731
    for base, same_target, same_suffix in tokens:
        for span in (base[1:POS], base[POS + 1:], same_target[POS + 1:], same_suffix[1:POS]):
            assert share(span) >= 0.5, span
    assert list(ds["condition"].values) == ["frequent/frequent"] * 6
    again = gradscope.stability(model_dir, model_factory="hf", text=text, seed=1, **opts)["probe_tokens"].values
    other = gradscope.stability(gradscope.source(model_dir, model_factory="hf", text=text), seed=2,
                                **opts)["probe_tokens"].values
    assert (again == tokens).all() and (other != tokens).any()


def test_counts_text_defines_the_groups_and_unseen_steps_are_their_own_class(saved, tmp_path: Path) -> None:  # noqa: ANN001
    """With counts_text, the targets' group and the steps' classes follow its counts, not the probed
    text's: a type the counts text never holds is no target and its steps are class ``unseen``."""
    model_dir, text = saved
    ids, bos, _ = encoded(model_dir, text)
    counts_text = tmp_path / "counts.txt"
    counts_text.write_text("the cat sat on the mat\nthe dog ran under the tree\nthe the the a a of\n")
    _, _, counts = encoded(model_dir, counts_text)
    groups = groups_of(counts)
    ds = gradscope.stability(model_dir, model_factory="hf", text=text, counts_text=counts_text,
                             target_freq=("frequent", "rare"), triplets=4, length=LENGTH, target_pos=POS, device="cpu",
                             sv=4)
    for base, group in zip(ds["probe_tokens"].values[:, 0], ds["target_group"].values):
        assert int(base[POS]) in groups[group]
    dd = gradscope.dynamics(model_dir, model_factory="hf", text=text, counts_text=counts_text, length=LENGTH,
                            parts="flow", sequences=6, device="cpu")
    seen = groups["frequent"] | groups["rare"]
    for row, classes in zip(dd["tokens"].values, dd["token_class"].values):
        for token, k in zip(row[1:], classes[1:]):
            assert k == ("unseen" if int(token) not in seen else "frequent" if int(token) in groups["frequent"]
                         else "rare")
    assert (dd["token_class"].values == "unseen").any()


def test_text_probe_errors_are_one_line(saved, runner, tmp_path: Path) -> None:  # noqa: ANN001
    """A group the text cannot supply names the group and the candidates found; --text with
    --token-counts, without --model, or with a model directory that has no tokenizer: one line each."""
    model_dir, text = saved
    out = str(tmp_path / "s.zarr")
    common = [str(model_dir), "--model", "hf", "--text", str(text), "-q", "-o", out]
    refused(runner.invoke(app, ["stability", *common, "--length", "40", "--target-freq", "rare", "--disturbant",
                                "rare"]), "target rare with disturbant rare", "candidate paragraph(s)")
    refused(runner.invoke(app, ["stability", *common, "--length", "100000"]), "length", "no paragraph")
    refused(runner.invoke(app, ["stability", *common, "--length", "12", "--target-pos", "11"]), "--target-pos", "1…10")
    counts = tmp_path / "counts.npy"
    np.save(counts, np.ones(8, dtype=np.int64))
    refused(runner.invoke(app, ["stability", *common, "--token-counts", str(counts)]), "--token-counts")
    refused(runner.invoke(app, ["dynamics", *common, "--token-counts", str(counts)]), "--token-counts")
    refused(runner.invoke(app, ["stability", str(model_dir), "--text", str(text), "-o", out]), "--text", "tokenizer")
    refused(runner.invoke(app, ["dynamics", str(model_dir), "--text", str(text), "-o", out]), "--text", "tokenizer")
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        (bare / name).write_bytes((model_dir / name).read_bytes())
    for command in ("stability", "dynamics"):
        refused(runner.invoke(app, [command, str(bare), "--model", "hf", "--text", str(text), "-q", "-o", out]),
                "tokenizer")
    assert not Path(out).exists()
