"""Issue #38 part 4: a small Mamba and a small RWKV, built from configs and trained briefly on
CPython's documentation help topics, for `gradscope accuracy --model hf --text` (docs/real-text.md).

The text is the lm study's tiny corpus (``gradscope.workflows.study.lm.tiny_raw_text``: this Python's
``pydoc_data/topics.py``, part of CPython, PSF License Agreement), split by paragraph exactly as that
study splits it (``split_paragraphs(n, 0.05, 0.05, seed=0)``): the train split trains the tokenizer
and the model; the valid and test splits together are the held-out text that is only evaluated.

    python experiments/text_models/train.py data                 # runs/text_models/{train,heldout}.txt
    python experiments/text_models/train.py tokenizer            # runs/text_models/tokenizer/
    python experiments/text_models/train.py counts               # runs/text_models/counts.npy (train-text counts per id)
    python experiments/text_models/train.py model mamba --steps 1000 --minutes 16   # docs/real-text.md: 834 s
    python experiments/text_models/train.py model rwkv --steps 1000 --minutes 16    # 348 s
    python experiments/text_models/train.py model mamba2 --steps 1000 --minutes 16  # issue #48
    python experiments/text_models/train.py model gdn --steps 1000 --minutes 30     # issue #49: Qwen3-Next hybrid
    python experiments/text_models/train.py model llama --steps 1000 --minutes 30   # issue #49: a transformer

Every step is deterministic given its seed except where the wall-time bound stops training: the
learning-rate schedule is laid out over ``--steps`` and training stops at ``--steps`` or after
``--minutes``, whichever comes first (``train_log.json`` records which, and the step reached).
One torch thread by default (``--threads``). Outputs are written to a temporary folder beside the
target and renamed into place, so a crash never leaves a half-written model directory.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from gradscope.corpus.text import paragraphs, split_paragraphs
from gradscope.workflows.study.lm import TINY_SOURCE, tiny_raw_text

ROOT = Path(__file__).resolve().parents[2] / "runs" / "text_models"
EOT = "<|endoftext|>"  # the start (BOS) and end (EOS) token: GPT-style, one document separator


@dataclasses.dataclass(frozen=True)
class TrainSettings:
    """One training run: the model's sizes and the optimisation (AdamW, warm-up then cosine)."""

    arch: str
    hidden: int = 128
    layers: int = 2
    state: int = 16  # Mamba's SSM state size (unused by RWKV)
    max_length: int = 128  # tokens per training row, the start token included
    batch: int = 16  # paragraphs per step
    lr: float = 3e-3
    weight_decay: float = 0.01
    warmup: int = 50
    steps: int = 3000  # the schedule's length; training may stop earlier at --minutes
    minutes: float = 12.0
    clip: float = 1.0
    seed: int = 0
    threads: int = 1
    log_every: int = 25


def atomic_write_text(path: Path, text: str) -> None:
    """``text`` to ``path`` through a temporary file in the same folder and a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def replace_dir(tmp: Path, target: Path) -> None:
    """Move the finished folder ``tmp`` to ``target``, replacing an older ``target``."""
    old = target.with_name(f".{target.name}.old")
    if old.exists():
        shutil.rmtree(old)
    if target.exists():
        os.replace(target, old)
    os.replace(tmp, target)
    if old.exists():
        shutil.rmtree(old)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def make_data(root: Path) -> None:
    """``train.txt`` and ``heldout.txt``: one paragraph per line, the lm study's seed-0 split."""
    paras = paragraphs(tiny_raw_text())
    parts = split_paragraphs(len(paras), 0.05, 0.05, seed=0)
    heldout = np.sort(np.concatenate([parts["valid"], parts["test"]]))
    for name, idx in (("train", parts["train"]), ("heldout", heldout)):
        atomic_write_text(root / f"{name}.txt", "".join(paras[i] + "\n" for i in idx))
        print(f"{name}: {len(idx)} paragraphs -> {root / f'{name}.txt'}")


def make_tokenizer(root: Path, vocab: int) -> None:
    """A byte-level BPE of ``vocab`` types (EOT included) trained on the train paragraphs, saved as a
    ``PreTrainedTokenizerFast`` whose BOS and EOS token is EOT."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=[EOT], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    lines = (root / "train.txt").read_text(encoding="utf-8").splitlines()
    tok.train_from_iterator(lines, trainer=trainer)  # the BPE trainer is deterministic for a given input
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=EOT, eos_token=EOT, pad_token=EOT)
    tmp = Path(tempfile.mkdtemp(dir=root, prefix=".tokenizer."))
    fast.save_pretrained(tmp)
    replace_dir(tmp, root / "tokenizer")
    print(f"tokenizer: {tok.get_vocab_size()} types -> {root / 'tokenizer'}")


def make_counts(root: Path) -> None:
    """``counts.npy``: int64 occurrences of each token id in the train paragraphs, encoded by the
    models' own tokenizer without special tokens (what ``--token-counts`` of stability/dynamics reads)."""
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast.from_pretrained(root / "tokenizer", local_files_only=True)
    lines = (root / "train.txt").read_text(encoding="utf-8").splitlines()
    ids = np.concatenate([np.asarray(r, dtype=np.int64) for r in tokenizer(lines, add_special_tokens=False)["input_ids"]])
    counts = np.bincount(ids, minlength=len(tokenizer)).astype(np.int64)  # (V,)
    fd, tmp = tempfile.mkstemp(dir=root, prefix=".counts.", suffix=".npy")
    os.close(fd)
    np.save(tmp, counts)
    os.replace(tmp, root / "counts.npy")
    print(f"counts: {int(counts.sum()):,} tokens, {int((counts > 0).sum())} of {len(counts)} types seen "
          f"-> {root / 'counts.npy'}")


def build_model(s: TrainSettings, vocab: int, eot: int) -> torch.nn.Module:
    """A small ``MambaForCausalLM``, ``Mamba2ForCausalLM``, ``RwkvForCausalLM``, ``Qwen3NextForCausalLM`` (a Gated
    DeltaNet layer, then an attention layer) or ``LlamaForCausalLM`` from its config, initialised from ``s.seed``."""
    from transformers import MambaConfig, MambaForCausalLM, RwkvConfig, RwkvForCausalLM

    torch.manual_seed(s.seed)  # transformers initialises from the global generator
    if s.arch == "mamba":
        cfg = MambaConfig(vocab_size=vocab, hidden_size=s.hidden, state_size=s.state, num_hidden_layers=s.layers,
                          pad_token_id=eot, bos_token_id=eot, eos_token_id=eot,
                          use_mambapy=True)  # mambapy's parallel scan for training: ~the sequential loop's maths, faster

        return MambaForCausalLM(cfg)
    if s.arch == "mamba2":  # issue #48: Mamba-2 (SSD) of the same width, depth and state size; heads of 32
        from transformers import Mamba2Config, Mamba2ForCausalLM

        cfg = Mamba2Config(vocab_size=vocab, hidden_size=s.hidden, state_size=s.state, num_hidden_layers=s.layers,
                           expand=2, head_dim=32, num_heads=2 * s.hidden // 32, n_groups=1, conv_kernel=4,
                           chunk_size=64, pad_token_id=eot, bos_token_id=eot, eos_token_id=eot)
        return Mamba2ForCausalLM(cfg)
    if s.arch == "gdn":  # issue #49: a Gated DeltaNet hybrid (Qwen3-Next's layers): delta rule, then gated attention
        from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

        types = ["linear_attention"] * (s.layers - 1) + ["full_attention"]
        cfg = Qwen3NextConfig(vocab_size=vocab, hidden_size=s.hidden, intermediate_size=2 * s.hidden,
                              num_hidden_layers=s.layers, layer_types=types, num_attention_heads=4,
                              num_key_value_heads=2, head_dim=32, linear_num_value_heads=4, linear_num_key_heads=2,
                              linear_key_head_dim=32, linear_value_head_dim=32, linear_conv_kernel_dim=4,
                              num_experts=0, max_position_embeddings=4 * s.max_length, tie_word_embeddings=True,
                              pad_token_id=eot, bos_token_id=eot, eos_token_id=eot)
        return Qwen3NextForCausalLM(cfg)
    if s.arch == "llama":  # issue #49: a Llama-style transformer of the same width and depth
        from transformers import LlamaConfig, LlamaForCausalLM

        cfg = LlamaConfig(vocab_size=vocab, hidden_size=s.hidden, intermediate_size=2 * s.hidden,
                          num_hidden_layers=s.layers, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                          max_position_embeddings=4 * s.max_length, tie_word_embeddings=True,
                          pad_token_id=eot, bos_token_id=eot, eos_token_id=eot)
        return LlamaForCausalLM(cfg)
    cfg = RwkvConfig(vocab_size=vocab, hidden_size=s.hidden, num_hidden_layers=s.layers, context_length=s.max_length,
                     bos_token_id=eot, eos_token_id=eot, rescale_every=0)
    return RwkvForCausalLM(cfg)


def encode_rows(root: Path, tokenizer, max_length: int) -> list[list[int]]:  # noqa: ANN001
    """Each train paragraph as [EOT, w_1, …] cut to ``max_length`` tokens (the first tokens kept)."""
    eot = tokenizer.convert_tokens_to_ids(EOT)
    lines = (root / "train.txt").read_text(encoding="utf-8").splitlines()
    ids = tokenizer(lines, add_special_tokens=False)["input_ids"]
    return [([eot] + row)[:max_length] for row in ids if row]


def batch_of(rows: list[list[int]], pick: torch.Tensor, pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs (B, T) right-padded with ``pad`` and targets (B, T) with -100 where nothing is predicted."""
    chosen = [rows[i] for i in pick.tolist()]
    width = max(len(r) for r in chosen)
    x = torch.full((len(chosen), width), pad, dtype=torch.long)  # (B T)
    y = torch.full((len(chosen), width), -100, dtype=torch.long)  # (B T)
    for b, r in enumerate(chosen):
        x[b, :len(r)] = torch.tensor(r)
        y[b, :len(r) - 1] = torch.tensor(r[1:])
    return x, y


def lr_at(step: int, s: TrainSettings) -> float:
    if step < s.warmup:
        return s.lr * (step + 1) / s.warmup
    frac = (step - s.warmup) / max(1, s.steps - s.warmup)
    return s.lr * 0.5 * (1 + math.cos(math.pi * min(1.0, frac)))


def train_model(root: Path, s: TrainSettings) -> None:
    """Train ``s.arch`` on the train paragraphs and save model + tokenizer to ``root/<arch>``."""
    from transformers import PreTrainedTokenizerFast

    torch.set_num_threads(s.threads)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(root / "tokenizer", local_files_only=True)
    eot = tokenizer.convert_tokens_to_ids(EOT)
    rows = encode_rows(root, tokenizer, s.max_length)
    model = build_model(s, len(tokenizer), eot)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"{s.arch}: {n_params:,} parameters, {len(rows)} train rows, "
          f"{sum(len(r) - 1 for r in rows):,} target tokens per pass", flush=True)
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": s.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=s.lr, betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(s.seed + 1)  # batches
    log: list[dict] = []
    start = time.monotonic()
    step, seen, window, stopped = 0, 0, [], "steps"
    model.train()
    while step < s.steps:
        if time.monotonic() - start > 60 * s.minutes:
            stopped = "minutes"
            break
        for group in opt.param_groups:
            group["lr"] = lr_at(step, s)
        x, y = batch_of(rows, torch.randint(len(rows), (s.batch,), generator=gen), eot)
        logits = model(input_ids=x, use_cache=False).logits  # (B T V)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), y.reshape(-1),
                                                 ignore_index=-100)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), s.clip)
        opt.step()
        step += 1
        seen += int((y != -100).sum())
        window.append(float(loss.detach()))
        if step % s.log_every == 0:
            entry = {"step": step, "loss": sum(window) / len(window), "lr": lr_at(step - 1, s),
                     "tokens": seen, "seconds": round(time.monotonic() - start, 1)}
            log.append(entry)
            window = []
            print(json.dumps(entry), flush=True)
    wall = time.monotonic() - start
    model.eval()
    if s.arch == "mamba":
        model.config.use_mambapy = False  # the saved model runs transformers' reference sequential scan
    out = root / s.arch
    tmp = Path(tempfile.mkdtemp(dir=root, prefix=f".{s.arch}."))
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    summary = {"settings": dataclasses.asdict(s), "parameters": n_params, "steps_done": step, "stopped_by": stopped,
               "target_tokens_seen": seen, "wall_seconds": round(wall, 1), "final_loss": log[-1]["loss"] if log else None,
               "text": TINY_SOURCE, "train_sha256": sha256(root / "train.txt"),
               "torch": torch.__version__, "python": sys.version.split()[0], "log": log}
    (tmp / "train_log.json").write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    replace_dir(tmp, out)
    print(f"{s.arch}: {step} steps in {wall:.0f} s (stopped by {stopped}), final loss "
          f"{summary['final_loss']} -> {out}", flush=True)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("what", choices=["data", "tokenizer", "counts", "model"])
    p.add_argument("arch", nargs="?", choices=["mamba", "mamba2", "rwkv", "gdn", "llama"])
    p.add_argument("--root", type=Path, default=ROOT, help=f"output folder (default {ROOT})")
    p.add_argument("--vocab", type=int, default=2048, help="tokenizer: BPE types, EOT included")
    for f in dataclasses.fields(TrainSettings):
        if f.name != "arch":
            p.add_argument(f"--{f.name.replace('_', '-')}", type=type(f.default), default=f.default)
    a = p.parse_args(argv)
    a.root.mkdir(parents=True, exist_ok=True)
    if a.what == "data":
        make_data(a.root)
    elif a.what == "tokenizer":
        make_tokenizer(a.root, a.vocab)
    elif a.what == "counts":
        make_counts(a.root)
    else:
        if a.arch is None:
            p.error("model: name the architecture, mamba, mamba2, rwkv, gdn or llama")
        s = TrainSettings(**{f.name: getattr(a, f.name) for f in dataclasses.fields(TrainSettings)})
        train_model(a.root, s)


if __name__ == "__main__":
    main()
