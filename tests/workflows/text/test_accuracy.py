"""A pretrained LM, its own tokenizer and raw text → perplexity and accuracy by token frequency
(issue #38, parts 1 and 2). A tiny transformers Mamba and a BPE tokenizer trained on the test's text
are saved in a temporary directory (nothing is downloaded); the numbers are checked against an
independent computation from the model's own forward, one paragraph at a time, in float64."""

from __future__ import annotations

import math
import random
from pathlib import Path

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

from gradscope.cli.app import app  # noqa: E402
from gradscope.corpus.text import paragraphs  # noqa: E402
from gradscope.errors import GradscopeError  # noqa: E402
from gradscope.store.io import read_store  # noqa: E402
from gradscope.workflows.text.tokenize import tokenize_text  # noqa: E402

WORDS = ("the a of cat dog bird sat ran flew on in under mat house tree big small red blue quick slow old new "
         "river stone lantern").split()


def make_text(seed: int, n: int) -> str:
    """Zipf-like words, paragraphs of 3–40 words, WikiText headings and blank lines between some."""
    rng = random.Random(seed)
    weights = [1 / (i + 1) for i in range(len(WORDS))]
    lines = []
    for i in range(n):
        lines.append(" ".join(rng.choices(WORDS, weights, k=rng.randint(3, 40))))
        if i % 9 == 0:
            lines += ["", f" = Part {i} = ", ""]
    return "\n".join(lines) + "\n"


def save_tokenizer(folder: Path, text: str, bos: bool = True) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())  # no unk token: characters it never saw encode to nothing
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(text.splitlines(), trainers.BpeTrainer(vocab_size=60, special_tokens=["<s>"]))
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, **({"bos_token": "<s>"} if bos else {}))
    fast.save_pretrained(folder)


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> tuple[Path, Path]:  # noqa: ANN001
    root = tmp_path_factory.mktemp("text")
    text = make_text(0, 40)
    (root / "text.txt").write_text(text)
    model_dir = root / "model"
    save_tokenizer(model_dir, text)
    vocab = transformers.AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True).__len__()
    torch.manual_seed(0)
    cfg = transformers.MambaConfig(vocab_size=vocab, hidden_size=16, state_size=4, num_hidden_layers=2, expand=2,
                                   conv_kernel=3, time_step_rank=2, use_bias=True)
    model = transformers.MambaForCausalLM(cfg).eval()
    with torch.no_grad():  # logits far from uniform, so that bins differ and an error would show
        model.lm_head.weight.mul_(20)
    model.save_pretrained(model_dir)
    return model_dir, root / "text.txt"


def refused(result, *words: str) -> None:  # noqa: ANN001
    assert result.exit_code == 2, (result.exit_code, result.stdout, result.stderr, result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for w in words:
        assert w in lines[0], (w, lines[0])


def independent(model_dir: Path, text: Path, counts_from: Path | None = None) -> dict[str, tuple[float, int]]:
    """Perplexity and token count per frequency bin from the model's own forward, one paragraph at a
    time (the BOS token, then the paragraph), float64 log-softmax; bins from sorted counts."""
    tok = transformers.AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    model = transformers.MambaForCausalLM.from_pretrained(str(model_dir)).eval()
    paras = paragraphs(text.read_text())
    ids = [tok(p, add_special_tokens=False)["input_ids"] for p in paras]
    ref = [tok(p, add_special_tokens=False)["input_ids"] for p in paragraphs((counts_from or text).read_text())]
    vocab = model.config.vocab_size
    counts = np.bincount([i for x in ref for i in x], minlength=vocab)
    seen = [int(i) for i in np.flatnonzero(counts)]
    order = sorted(seen, key=lambda i: (-counts[i], i))
    k = len(order)
    bin_of: dict[int, list[str]] = {i: [] for i in range(vocab)}
    for r, i in enumerate(order):
        bin_of[i] += ["frequent" if 2 * r < k else "rare", f"decile{10 * r // k + 1}"]
    for i in set(range(vocab)) - set(seen):
        bin_of[i] = ["unseen"]
    sums: dict[str, list[float]] = {}
    with torch.no_grad():
        for x in ids:
            if not x:
                continue
            row = torch.tensor([[tok.bos_token_id, *x]])
            logp = torch.log_softmax(model(row).logits[0].double(), -1)  # (T, V)
            for t, target in enumerate(x):
                for b in ["all", *bin_of[target]]:
                    sums.setdefault(b, []).append(-float(logp[t, target]))
    return {b: (math.exp(sum(v) / len(v)), len(v)) for b, v in sums.items()}


def test_perplexity_by_frequency_bin_equals_the_models_own_cross_entropy(saved, runner, tmp_path: Path) -> None:  # noqa: ANN001
    """From the CLI: the store's perplexity per frequency bin (and overall) is exp(mean CE) of those
    tokens from the model's own forward; then report and summarize read the store."""
    model_dir, text = saved
    out = tmp_path / "acc.zarr"
    result = runner.invoke(app, ["accuracy", str(model_dir), "--model", "hf", "--text", str(text), "--max-length",
                                 "64", "--resamples", "200", "-o", str(out), "-q"])
    assert result.exit_code == 0, (result.stdout, result.stderr)
    assert result.stderr == "", result.stderr
    ds = read_store(out, kind="accuracy")
    want = independent(model_dir, text)
    last = ds.isel(checkpoint=0)
    assert float(last["perplexity"]) == pytest.approx(want["all"][0], rel=1e-5)
    assert int(ds["pos_n"].sum()) == want["all"][1]
    checked = 0
    for label, ppl, n in zip(ds["freq_bin"].values, last["freq_perplexity"].values, ds["freq_n"].values):
        if label in want:
            assert int(n) == want[label][1], label
            assert float(ppl) == pytest.approx(want[label][0], rel=1e-5), label
            checked += 1
        else:
            assert n == 0 and np.isnan(ppl), label
    assert checked >= 11  # both halves and nearly every decile held tokens
    assert len({round(float(p), 3) for p in last["freq_perplexity"].values if np.isfinite(p)}) > 5
    low, high = float(last["perplexity_low"]), float(last["perplexity_high"])
    assert low < float(last["perplexity"]) < high
    report = runner.invoke(app, ["report", str(out), "-o", str(tmp_path / "r.html")])
    assert report.exit_code == 0, report.stderr
    assert "lm" in report.stdout
    summary = runner.invoke(app, ["summarize", str(out), "-o", str(tmp_path / "s.zarr")])
    assert summary.exit_code == 0, summary.stderr
    assert "perplexity/decile1" in summary.stdout


def test_counts_text_sets_the_bins_and_unseen_types_have_their_own(saved, tmp_path: Path) -> None:  # noqa: ANN001
    """--counts-text: bins from another text's counts; a type it never holds is 'unseen'."""
    import gradscope

    model_dir, text = saved
    counts = tmp_path / "ref.txt"
    counts.write_text("\n".join(" ".join(["the cat sat on the mat"] * 5) for _ in range(30)) + "\n")
    ds = gradscope.accuracy(model_dir, model_factory="hf", text=text, counts_text=counts, max_length=64, resamples=50)
    want = independent(model_dir, text, counts)
    last = ds.isel(checkpoint=0)
    for label, ppl, n in zip(ds["freq_bin"].values, last["freq_perplexity"].values, ds["freq_n"].values):
        if label in want:
            assert int(n) == want[label][1] and float(ppl) == pytest.approx(want[label][0], rel=1e-5), label
    assert want["unseen"][1] > 0 and int(ds["freq_n"].sel(freq_bin="unseen")) == want["unseen"][1]


def test_a_tokenizer_of_another_vocabulary_is_one_line(saved, runner, tmp_path: Path) -> None:  # noqa: ANN001
    model_dir, text = saved
    big = tmp_path / "big"
    from tokenizers import Tokenizer, models, pre_tokenizers

    names = ["<unk>", *(f"w{i}" for i in range(500)), *WORDS]  # the text's words get ids beyond the model's 60
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(names)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>").save_pretrained(big)
    refused(runner.invoke(app, ["accuracy", str(model_dir), "--model", "hf", "--text", str(text), "--tokenizer",
                                str(big), "-q", "-o", str(tmp_path / "a.zarr")]), "--tokenizer", "vocabulary")


@pytest.mark.parametrize("content", [" = Only = \n\n = A heading = \n", "ζζζ ωω\nψψ\n"], ids=["no paragraph", "no token"])
def test_a_text_that_encodes_to_nothing_is_one_line(saved, runner, tmp_path: Path, content: str) -> None:  # noqa: ANN001
    model_dir, _ = saved
    text = tmp_path / "t.txt"
    text.write_text(content)
    refused(runner.invoke(app, ["accuracy", str(model_dir), "--model", "hf", "--text", str(text), "-q",
                                "-o", str(tmp_path / "a.zarr")]), "--text", str(text))


def test_a_non_utf8_or_huge_text_is_one_line(saved, runner, tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    model_dir, _ = saved
    text = tmp_path / "t.txt"
    text.write_bytes(b"the cat sat\nthe \xff dog\n")
    refused(runner.invoke(app, ["accuracy", str(model_dir), "--model", "hf", "--text", str(text), "-q",
                                "-o", str(tmp_path / "a.zarr")]), "--text", "not UTF-8", "byte 16")
    huge = tmp_path / "huge.txt"
    with open(huge, "wb") as fh:  # sparse: 50 GB on paper, nothing on disk
        fh.truncate(50 << 30)
    refused(runner.invoke(app, ["accuracy", str(model_dir), "--model", "hf", "--text", str(huge), "-q",
                                "-o", str(tmp_path / "a.zarr")]), "--text", "memory")
    monkeypatch.setenv("GRADSCOPE_MEMORY_BUDGET", "100")
    with pytest.raises(GradscopeError, match="counts_text: tokenising"):
        tokenize_text(text, model_dir, what="counts_text")


def test_options_that_do_not_apply_to_text_are_refused(saved, runner, tmp_path: Path) -> None:  # noqa: ANN001
    model_dir, text = saved
    out = str(tmp_path / "a.zarr")
    refused(runner.invoke(app, ["accuracy", str(model_dir), "--model", "hf", "--text", str(text), "--bins", "2",
                                "-o", out]), "--bins")
    refused(runner.invoke(app, ["accuracy", str(model_dir), "--text", str(text), "-o", out]), "--model")
    refused(runner.invoke(app, ["accuracy", str(model_dir), "--max-length", "8", "-o", out]), "--max-length")
    refused(runner.invoke(app, ["accuracy", str(model_dir), "--model", "hf", "--text", str(text), "--max-length",
                                "1", "-o", out]), "--max-length")


def test_a_start_token_beyond_the_models_vocabulary_is_one_line(saved, runner, tmp_path: Path) -> None:  # noqa: ANN001
    """The text's words lie within the model's vocabulary, but the tokenizer's start token does not: one
    line naming it (it was an IndexError traceback from the embedding)."""
    model_dir, text = saved
    vocab = transformers.AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True).__len__()
    from tokenizers import Tokenizer, models, pre_tokenizers

    ids = {"<unk>": 0, **{w: i + 1 for i, w in enumerate(WORDS)}, "<s>": vocab + 500}
    assert len(WORDS) + 1 < vocab
    tok = Tokenizer(models.WordLevel(ids, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    far = tmp_path / "far"
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>").save_pretrained(far)
    refused(runner.invoke(app, ["accuracy", str(model_dir), "--model", "hf", "--text", str(text), "--tokenizer",
                                str(far), "-q", "-o", str(tmp_path / "a.zarr")]), "start token", "vocabulary")
    assert not (tmp_path / "a.zarr").exists()
