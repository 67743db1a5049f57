"""``gradscope reproduce --model-dir DIR --text FILE -o OUT``: the study's question on a
pretrained LM and a raw text in one command — perplexity and accuracy by token frequency
(:mod:`gradscope.workflows.text.accuracy`), gradient stability on probes drawn from the text and
dynamics on its paragraphs (:mod:`gradscope.workflows.text.probes`), into ``OUT/accuracy.zarr``,
``OUT/stability.zarr`` and ``OUT/dynamics.zarr``; the command line adds ``OUT/report.html`` (reports
sit above workflows: docs/architecture.md).

Resumable: a step whose store exists is skipped when the store records the same study (the
``text_study`` attribute: model, texts' and tokenizer's sha256, every option); a store of another
study is refused, never overwritten or mixed in.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import xarray as xr

from gradscope.fields import with_overrides
from gradscope.errors import GradscopeError, check
from gradscope.files.io import sha256_file
from gradscope.guard import check_bytes
from gradscope.models.adapters.tokenizer import tokenizer_files, tokenizer_sha256
from gradscope.store.io import read_store, write_store
from gradscope.workflows.dynamics import DynamicsOptions
from gradscope.workflows.stability import StabilityOptions
from gradscope.workflows.text.tokenize import BYTES_PER_TEXT_BYTE, tokenize_text
from gradscope.workflows.text.accuracy import TextAccuracyOptions, run_text_accuracy
from gradscope.workflows.study.options import TextStudyOptions  # declared torch-free (reproduce --help)
from gradscope.workflows.sources import TextSource
from gradscope.workflows.text.probes import run_text_dynamics, run_text_stability

STEPS = ("accuracy", "stability", "dynamics")


@dataclass(frozen=True)
class TextStudy:
    """Where the study's stores are, and which steps ran now (the others were finished before)."""

    out: Path
    stores: dict[str, Path]
    ran: tuple[str, ...]


MODEL_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".json")  # weights and configuration


def model_files(model: Path) -> list[Path]:
    """The files that make the model: a weights file itself, or a folder's weights (``.safetensors``,
    ``.bin``, ``.pt``, …) and JSON configuration; other files in the folder (notes, logs, a stray large file)
    are not the model and are not read."""
    if not model.is_dir():
        return [model]
    return sorted(p for p in model.iterdir() if p.is_file() and p.suffix in MODEL_SUFFIXES)


def study_key(model: Path, opts: TextStudyOptions) -> dict[str, Any]:
    """What makes two runs the same study, by content, never by path: the sha256 of the model's weights and
    configuration (:func:`model_files`), of the text, the counts text and the tokenizer's files, and every
    other option. Every size is checked (against the memory budget, as tokenising would) before anything is
    hashed, so a 64 GiB text is refused at once."""
    texts = {"text": Path(opts.text), **({"counts_text": Path(opts.counts_text)} if opts.counts_text else {})}
    for what, path in texts.items():
        check(path.is_file(), f"{what}: {path} is not a file")
        check_bytes(BYTES_PER_TEXT_BYTE * path.stat().st_size, f"{what}: tokenising {path} "
                                                               f"({path.stat().st_size} bytes)")
    tok_files = tokenizer_files(Path(opts.tokenizer) if opts.tokenizer is not None else model,
                                "tokenizer" if opts.tokenizer is not None else "model_dir")
    files = model_files(model)
    check(bool(files), f"model_dir: {model} holds no weights or configuration files")
    for f in files:
        check_bytes(f.stat().st_size, f"model_dir: {f}")  # read whole when loaded
    key = {k: v for k, v in dataclasses.asdict(opts).items() if k not in ("text", "counts_text", "tokenizer", "device")}
    key.update({"model_sha256": {p.name: sha256_file(p) for p in files},
                "text_sha256": sha256_file(texts["text"]), "tokenizer_sha256": tokenizer_sha256(tok_files)})
    if "counts_text" in texts:
        key["counts_sha256"] = sha256_file(texts["counts_text"])
    return key


def _finished(path: Path, kind: str, key: str) -> bool:
    """Whether ``path`` holds this study's ``kind`` store (True), or nothing (False); another is refused."""
    if not path.exists():
        return False
    ds = read_store(path, kind=kind)
    check(ds.attrs.get("text_study") == key,
          f"out: {path} is the {kind} store of another study (another model, text or option); choose another "
          f"--out, or remove it")
    return True


class _Planned(Exception):
    """Raised from a step's on_plan: its plan is made, no work is done."""


def _stop(plan: Any) -> None:
    raise _Planned


def _plans_fit(folder: Path, stab_opts: StabilityOptions, dyn_opts: DynamicsOptions, source: TextSource,
               probe_length: int, model_factory: str, todo: list[str]) -> None:
    """The stability and dynamics steps planned (model, tokens and probes made, no work done) before the
    first store is written, so an option they would refuse is refused now, named as the study's option."""
    planners = {"stability": lambda: run_text_stability(folder, stab_opts, source, model_factory=model_factory,
                                                        on_plan=_stop),
                "dynamics": lambda: run_text_dynamics(folder, dyn_opts, source,
                                                      model_factory=model_factory, on_plan=_stop)}
    for step in (s for s in ("stability", "dynamics") if s in todo):
        try:
            planners[step]()
        except _Planned:
            continue
        except GradscopeError as exc:
            text = str(exc)
            if text.startswith("checkpoint_budget_seconds:"):  # the study gives stability ten times its budget
                text = "budget_seconds: stability's budget is ten times it;" + text[len("checkpoint_budget_seconds:"):]
            raise GradscopeError(text) from None


def reproduce_text(model_dir: str | Path, *, out: str | Path, opts: TextStudyOptions | None = None,
                   command: str = "", on_step: Callable[[str, str], None] | None = None,
                   **overrides: Any) -> TextStudy:
    """Accuracy, stability and dynamics by token frequency of the ``save_pretrained`` directory
    ``model_dir`` (loaded as ``opts.model_factory``) on ``opts.text`` (module docstring), into ``out``; ``opts``:
    :class:`TextStudyOptions` (``text`` is required), ``overrides`` its fields, named as the flags;
    ``on_step(step, note)`` says what is done. The report: ``gradscope report OUT/*.zarr`` (or
    ``gradscope.reports.build.render_report``)."""
    check(opts is not None or "text" in overrides, "text: give the text the study runs on (text=FILE)")
    opts = with_overrides(TextStudyOptions, opts, overrides, "reproduce_text")
    triplets, target_pos, probe_length = opts.triplets, opts.target_pos, opts.probe_length
    max_length, resamples, seed, device = opts.max_length, opts.resamples, opts.seed, opts.device
    budget_seconds = opts.budget_seconds
    folder, where = Path(model_dir), Path(out)
    check(folder.exists(), f"model_dir: {folder} does not exist")
    check(Path(opts.text).is_file(), f"text: {opts.text} is not a file")
    check(opts.counts_text is None or Path(opts.counts_text).is_file(), f"counts_text: {opts.counts_text} is not a file")
    check(not where.exists() or where.is_dir(), f"out: {where} exists and is not a directory")
    key = json.dumps(study_key(folder, opts), sort_keys=True)
    model_factory = opts.model_factory
    acc_opts = TextAccuracyOptions(text=opts.text, counts_text=opts.counts_text, tokenizer=opts.tokenizer,
                                   max_length=max_length, resamples=resamples,
                                   seed=seed, device=device)
    stab_opts = StabilityOptions(triplets=triplets, target_pos=target_pos, length=probe_length, seed=seed,
                                 device=device, checkpoint_budget_seconds=10 * budget_seconds)
    dyn_opts = DynamicsOptions(seed=seed, device=device, budget_seconds=budget_seconds, length=probe_length)
    source = TextSource(opts.text, opts.counts_text, opts.tokenizer)
    makers: dict[str, Callable[[], xr.Dataset]] = {
        "accuracy": lambda: run_text_accuracy(folder, acc_opts, model_factory=model_factory, command=command).to_xarray(),
        "stability": lambda: run_text_stability(folder, stab_opts, source, model_factory=model_factory,
                                                command=command).to_xarray(),
        "dynamics": lambda: run_text_dynamics(folder, dyn_opts, source,
                                              model_factory=model_factory, command=command).to_xarray(),
    }
    stores = {step: where / f"{step}.zarr" for step in STEPS}
    todo = [step for step in STEPS if not _finished(stores[step], step, key)]
    if todo:  # the text's own limits before any work (tokenised once: the steps read the cache)
        tokens = tokenize_text(opts.text, Path(opts.tokenizer) if opts.tokenizer is not None else folder, what="text")
        shift = 1 if tokens.start is not None else 0
        need = probe_length - shift
        longest = int(tokens.lengths.max())
        check(longest >= need, f"probe_length: got {probe_length}; no paragraph of {opts.text} has the {need} tokens "
                               f"a row of {probe_length} needs (its longest has {longest}); give a smaller one")
        check(target_pos <= probe_length - shift - 1,
              f"target_pos: got {target_pos}; a probe row of probe_length {probe_length} holds paragraph tokens "
              f"1…{probe_length - shift - 1}{' after the start token' if shift else ''}, before its last (give a smaller "
              f"target_pos or a larger probe_length)")
        _plans_fit(folder, stab_opts, dyn_opts, source, probe_length, model_factory, todo)
    for step in STEPS:
        if step not in todo:
            if on_step is not None:
                on_step(step, f"{stores[step]} is finished; skipped")
            continue
        ds = makers[step]()
        ds.attrs["text_study"] = key
        where.mkdir(parents=True, exist_ok=True)  # only once a store is made: a refused input leaves nothing
        write_store(ds, stores[step])
        if on_step is not None:
            on_step(step, f"wrote {stores[step]}")
    return TextStudy(where, stores, tuple(todo))
