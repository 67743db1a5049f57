"""From loaded inputs to the report: which figures exist, the header, the page, static images."""

from __future__ import annotations

import html
import importlib.metadata
from pathlib import Path
from typing import Any

from gradscope.errors import GradscopeError
from gradscope.files.publish import publish, remove_stale_temporaries, temp_path
from gradscope.version import __version__
from gradscope.store.dynamics import (flow_curves, gate_means, grid_means, lyapunov_convergence, lyapunov_error_bars,
                                      lyapunov_spectra, radius_samples)
from gradscope.store.accuracy import family_sections, store_family
from gradscope.store.inputs import Input, mean_spectra, stability_curves, stability_samples
from gradscope.fields import with_overrides
from gradscope.workflows.study.options import STATIC_FORMATS, ReportOptions  # declared torch-free (report --help)

from .accuracy_figures import grid_figure_accuracy, grid_figure_summary, training_figure, vocab_figure
from .experiment_figures import KINDS as EXPERIMENT_KINDS, position_figure
from .family_figures import family_figure
from .dynamics_figures import flow_figure, gate_figure, grid_figure, lyapunov_figure, radius_figure
from .html import Section, provenance_html, public_command, public_path, render_page
from .style import colors
from .stability_figures import distribution_figure, spectra_figure, stability_figure

def _of(items: list[Input], kind: str) -> list[Input]:
    return [i for i in items if i.kind == kind]


def build_sections(items: list[Input], opts: ReportOptions) -> list[Section]:
    """Every figure whose data is present, in the paper's order, then the provenance table."""
    stability, accuracy = _of(items, "stability"), _of(items, "accuracy")
    summaries, runs = _of(items, "summary"), _of(items, "run")
    where = f"iteration {opts.iteration}" if opts.iteration is not None else "last checkpoint"
    palette = report_palette(items)
    details = {i.label: i.detail or i.label for i in items if i.kind != "summary"}
    out: list[Section] = []
    for i, s in enumerate(summaries):
        suffix = f" ({s.path.name})" if len(summaries) > 1 else ""
        fig = vocab_figure(s.ds)
        if fig is not None:
            out.append(Section(f"vocab-{i}", f"Accuracy vs vocabulary size{suffix}",
                               f"From the summary store <code>{html.escape(public_path(s.path))}</code> (metric "
                               f"token_accuracy, grouped by core, PE and K). Error bars: the store's CI over trials.",
                               fig))
    grids = [(i, s, grid_figure_summary(s.ds)) for i, s in enumerate(summaries)]
    grids = [(i, s, f) for i, s, f in grids if f is not None]
    for i, s, fig in grids:
        out.append(Section(f"grid-{i}", f"Frequency grid{f' ({s.path.name})' if len(grids) > 1 else ''}",
                           f"From the summary store <code>{html.escape(public_path(s.path))}</code> (metrics "
                           f"grid/&lt;target&gt;/&lt;disturbant&gt;/bin&lt;k&gt;). Error bars: the store's CI.", fig))
    if not grids and (fig := grid_figure_accuracy(accuracy, opts.iteration, palette)) is not None:
        out.append(Section("grid", "Frequency grid", f"From accuracy stores (grid_bin_accuracy at the {where}); a "
                                                     "single store has no CI — summarize several seeds for one.", fig))
    for name, family, section in family_sections():  # each task family's own section, as it declares it
        own = [s for s in accuracy if store_family(s.ds) is family]
        if (fig := family_figure(section, own, opts.iteration, palette)) is not None:
            out.append(Section(f"task-{name}", section.heading,
                               f"From {name} accuracy stores (at the {where}). {section.text}", fig))
    headings = {"decoding": "Decoding: self-fed beside ground-truth fed accuracy",
                "item": "Vocabulary extension: accuracy on old and new items"}
    for kind, (var, *_) in EXPERIMENT_KINDS.items():
        if (fig := position_figure(kind, accuracy, opts.iteration, palette)) is not None:
            out.append(Section(kind, headings[kind], f"From accuracy stores ({var} at the {where}; docs/experiments.md). "
                                                     "Lines: mean over seeds; bars: lowest to highest seed.", fig))
    if stability:
        points = stability_curves(stability, opts.score, opts.resamples, opts.seed, opts.band)
        units = {p.unit for p in points}
        seeds_text = ("a configuration with stores of several seeds: the mean of the seeds' mean scores and the 95% "
                      "Student t-interval over seeds (seeds are the trials; each seed's dotted line appears when its "
                      "legend entry is clicked)")
        triplets_text = (f"the mean score and 95% percentile-bootstrap CI ({opts.resamples} resamples, seed "
                         f"{opts.seed}) over the triplets" + ("; stores of one configuration (seeds) are pooled"
                                                              if opts.band == "triplets" else " of one seed"))
        how = (seeds_text if units == {"seed"} else triplets_text if units == {"triplet"}
               else f"{seeds_text}; a configuration of one seed: {triplets_text}")
        out.append(Section("stability", "Gradient stability over training",
                           f"From {len(stability)} stability store(s). Per checkpoint and condition: {how}.",
                           stability_figure(points, opts.score, palette=palette, details=details)))
        out.append(Section("distribution", "Stability distributions",
                           f"Per-triplet scores at the {where} of each store, same-target vs same-suffix pairs.",
                           distribution_figure(stability_samples(stability, opts.score, opts.iteration),
                                               opts.score, where, palette, details)))
        spectra = mean_spectra(stability, opts.iteration)
        if spectra:
            out.append(Section("spectra", "Singular-value spectra",
                               "Top singular values of each Jacobian (variable singular_values), averaged per "
                               "condition over triplets, members and seeds.",
                               spectra_figure(spectra, where, palette, details)))
    out.extend(dynamics_sections(_of(items, "dynamics"), palette))
    if (fig := training_figure(runs, palette)) is not None:
        out.append(Section("training", "Training curves", f"From metrics.jsonl of {len(runs)} run(s).", fig))
    out.append(Section("provenance", "Provenance", "Every input with its configuration, checkpoint hashes, "
                                                   "versions and the command that made it.", None,
                       provenance_html(items)))
    return out


def report_palette(items: list[Input]) -> dict[str, str]:
    """One colour per configuration for the whole report; those of the stability stores (Figure 5)
    take the first colours of the palette."""
    labels = [i.label for i in items if i.kind != "summary"]
    return colors(labels, first=[i.label for i in items if i.kind == "stability"])


def dynamics_sections(stores: list[Input], palette: dict[str, str] | None = None) -> list[Section]:
    """The dynamics view (docs/definitions.md §7) of every dynamics store, each figure over its checkpoints."""
    if not stores:
        return []
    src = f"From {len(stores)} dynamics store(s)"
    out = []
    if curves := flow_curves(stores):
        out.append(Section("flow", "Gradient flow", f"{src}: log10 ‖∂y_T/∂z_k‖_F against the distance T − k, by "
                           "the class of the token read at step k; bands: 95% t-intervals over the probe sequences.",
                           flow_figure(curves)))
    if grids := grid_means(stores):
        out.append(Section("tT-grid", "The (t, T) grid", f"{src}: mean log10 ‖∂z_T/∂z_t‖_F over the grid "
                           "sequences, for every t ≤ T.", grid_figure(grids)))
    if radii := radius_samples(stores):
        out.append(Section("radius", "Step spectral radius", f"{src}: ρ(J_t) of every step Jacobian, by the token "
                           "read; the dotted line is ρ = 1 (above: locally expanding).", radius_figure(radii)))
    if spectra := lyapunov_spectra(stores):
        out.append(Section("lyapunov", "Lyapunov spectra", f"{src}: all D exponents (Benettin/QR, natural log per "
                           "step) with 95% t-intervals over trajectories and a band of ±2 batch-means standard "
                           "errors, and the running estimate with ±2 standard errors over trajectories.",
                           lyapunov_figure(spectra, lyapunov_convergence(stores), palette,
                                           lyapunov_error_bars(stores))))
    if gates := gate_means(stores):
        out.append(Section("gates", "Gate terms", f"{src}: mean ‖term‖_F of each path through the cell (the terms "
                           "sum to J_t), after frequent, rare and query tokens.", gate_figure(gates)))
    return out


def _seeds_text(seeds: set[int]) -> str:
    return f"; seed{'s' * (len(seeds) > 1)} {', '.join(map(str, sorted(seeds)))}" if seeds else ""


def header_html(items: list[Input], command: str = "") -> str:
    """What was compared: configurations (with their seeds and input kinds) and the tasks."""
    configs: dict[str, dict[str, set]] = {}
    for item in items:
        if item.kind == "summary":
            continue
        entry = configs.setdefault(item.label, {"kinds": set(), "seeds": set()})
        entry["kinds"].add(item.kind)
        if item.seed is not None:
            entry["seeds"].add(item.seed)
    full = {i.label: i.detail for i in items if i.kind != "summary" and i.detail and i.detail != i.label}
    titles = {label: f' title="{html.escape(text)}"' for label, text in full.items()}
    lis = "".join(f"<li{titles.get(label, '')}>{html.escape(label)} — {', '.join(sorted(e['kinds']))}"
                  f"{_seeds_text(e['seeds'])}</li>"
                  for label, e in configs.items())
    summaries = [i for i in items if i.kind == "summary"]
    lis += "".join(f"<li>summary <code>{html.escape(s.path.name)}</code>: groups "
                   f"{html.escape('; '.join(map(str, s.ds['label'].values)))}</li>" for s in summaries)
    tasks = sorted({f"{t.get('name')} (K={t.get('vocab_size')}, L={t.get('length')}, {t.get('distribution')})"
                    for t in (i.task for i in items) if t})
    counts = ", ".join(f"{sum(i.kind == k for i in items)} {k}{'' if k == 'run' else ' store'}(s)"
                       for k in ("stability", "accuracy", "dynamics", "summary", "run") if any(i.kind == k for i in items))
    task_text = f" on {html.escape('; '.join(tasks))}" if tasks else ""
    return (f"<p>Compared{task_text}, from {counts}:</p><ul>{lis}</ul>"
            f'<p class="meta">“vanilla” = no positional encoding; “PE (kind)” = with one. Made by gradscope '
            f"{__version__}{f' with <code>{html.escape(public_command(command))}</code>' if command else ''}.</p>")


def render_report(items: list[Input], *, opts: ReportOptions | None = None,
                  **overrides: Any) -> tuple[str, list[Section]]:
    """The page and its sections (the figures, for static export) of ``items`` (:func:`gradscope.store.inputs.
    load_inputs`); ``opts``: :class:`ReportOptions` (None: its defaults), ``overrides`` its fields, named as the
    flags."""
    opts = with_overrides(ReportOptions, opts, overrides, "render_report")
    sections = build_sections(items, opts)
    return render_page(opts.title, header_html(items, opts.command), sections), sections


def _kaleido_major() -> int:
    try:
        import kaleido  # noqa: F401
        return int(importlib.metadata.version("kaleido").split(".")[0])
    except (ImportError, importlib.metadata.PackageNotFoundError, ValueError):
        return 0


def export_static(sections: list[Section], html_path: Path, fmt: str, overwrite: bool = True) -> list[Path]:
    """Each figure as <html stem>-<section id>.<fmt> beside the page, via kaleido 1.x (which drives a
    Chrome/Chromium found on PATH). Each image is written to a temporary sibling and renamed into
    place (:func:`gradscope.files.publish.publish`): a killed export leaves no half-written image,
    and the next one removes its temporaries. Missing kaleido or browser: a user error; so is an
    existing image without ``overwrite``."""
    if fmt not in STATIC_FORMATS:
        raise GradscopeError(f"--static: got {fmt!r}; valid formats are {', '.join(STATIC_FORMATS)}")
    import plotly.io as pio

    figs = [(s.figure, html_path.with_name(f"{html_path.stem}-{s.id}.{fmt}")) for s in sections if s.figure]
    existing = [p for _, p in figs if p.exists() or p.is_symlink()]
    if existing and not overwrite:
        raise GradscopeError(f"--static: {existing[0]} already exists; choose another --out or pass --overwrite")
    if _kaleido_major() < 1:
        raise GradscopeError("--static: needs the kaleido package, version 1 or later (pip install 'kaleido>=1')")
    from kaleido.errors import ChromeNotFoundError

    for _, path in figs:
        remove_stale_temporaries(path.parent, path.name)
    tmps = [temp_path(path) for _, path in figs]  # each image is written aside, then renamed into place
    try:
        pio.write_images([f for f, _ in figs], tmps, format=fmt, width=1100,
                         height=[int(f.layout.height or 500) for f, _ in figs])
        for tmp, (_, path) in zip(tmps, figs):
            publish(tmp, path, overwrite=overwrite, what="--static")
    except (ChromeNotFoundError, RuntimeError) as exc:
        if isinstance(exc, ChromeNotFoundError) or "Chrome" in str(exc):
            raise GradscopeError("--static: kaleido needs Chrome or Chromium, and none was found on PATH "
                                 "(install one, e.g. apt-get install chromium, or run plotly_get_chrome)") from None
        raise
    finally:
        for tmp in tmps:
            tmp.unlink(missing_ok=True)
    return [p for _, p in figs]
