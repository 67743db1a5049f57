"""Assemble one self-contained HTML page: header, table of contents, figures, provenance.

plotly.js is embedded once, inline, with the first figure (``include_plotlyjs=True``, ~4.8 MB); the
other figures reuse it (``False``). Nothing is loaded from the network.
"""

from __future__ import annotations

import html
import json
import os
import shlex
from dataclasses import dataclass
from pathlib import Path

import plotly.graph_objects as go

from gradscope.store.inputs import Input

PLOT_CONFIG = {"displaylogo": False, "responsive": True, "toImageButtonOptions": {"format": "svg"}}
CSS = """
body { font-family: system-ui, -apple-system, 'Segoe UI', Helvetica, Arial, sans-serif; margin: 0 auto;
       max-width: 1200px; padding: 1em 2em; color: #222; }
h1 { margin-bottom: 0.2em; } h2 { border-bottom: 1px solid #ddd; padding-bottom: 0.2em; margin-top: 2em; }
.caption { color: #444; max-width: 70em; } .meta { color: #666; font-size: 0.9em; }
nav ol { columns: 2; } table { border-collapse: collapse; font-size: 0.85em; }
td, th { border: 1px solid #ddd; padding: 0.3em 0.5em; vertical-align: top; text-align: left; }
td code { overflow-wrap: anywhere; } table { width: 100%; } td details summary { color: #555; cursor: pointer; }
th { background: #f4f4f4; } code, pre { font-size: 0.9em; } pre { white-space: pre-wrap; }
details { margin: 0.3em 0; }
"""


@dataclass(frozen=True)
class Section:
    """One part of the report: an anchor id, a heading, a caption (HTML) and a figure or raw HTML."""

    id: str
    title: str
    caption: str
    figure: go.Figure | None = None
    body: str = ""


def figure_html(fig: go.Figure, div_id: str, first: bool) -> str:
    """A figure's div and script; the first one carries plotly.js inline."""
    return fig.to_html(full_html=False, include_plotlyjs=True if first else False, include_mathjax=False,
                       div_id=div_id, config=PLOT_CONFIG)


def render_page(title: str, header: str, sections: list[Section], footer: str = "") -> str:
    """The complete page (a string of HTML)."""
    toc = "".join(f'<li><a href="#{s.id}">{html.escape(s.title)}</a></li>' for s in sections)
    parts, first = [], True
    for s in sections:
        content = s.body
        if s.figure is not None:
            content = figure_html(s.figure, f"plot-{s.id}", first) + content
            first = False
        parts.append(f'<section id="{s.id}"><h2>{html.escape(s.title)}</h2>'
                     f'<p class="caption">{s.caption}</p>{content}</section>')
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f'<title>{html.escape(title)}</title><style>{CSS}</style></head><body>'
            f'<header><h1>{html.escape(title)}</h1>{header}</header>'
            f'<nav><h2>Contents</h2><ol>{toc}</ol></nav>{"".join(parts)}'
            f'<footer class="meta">{footer}</footer></body></html>\n')


def public_path(path: str | Path, cwd: Path | None = None) -> str:
    """A path as the report shows it: relative to the working directory when inside it, as given
    when relative, else by its last two parts ('…/runs/gru-none-s1'), so a report never shows
    the home or work directory of the machine that made it."""
    text = str(path)
    if not os.path.isabs(os.path.expanduser(text)):
        return text
    cwd = Path(cwd or Path.cwd()).absolute()
    full = Path(os.path.abspath(os.path.expanduser(text)))
    if full == cwd or cwd in full.parents:
        return os.path.relpath(full, cwd)
    return "…/" + "/".join(full.parts[-2:]) if len(full.parts) > 2 else full.name


def public_command(command: str, cwd: Path | None = None) -> str:
    """A recorded command with every absolute path argument shown by :func:`public_path`."""
    try:
        words = shlex.split(command)
    except ValueError:
        words = command.split()
    if not any(os.path.isabs(os.path.expanduser(w)) or w.startswith("~") for w in words):
        return command
    shown = (public_path(w, cwd) if not w.startswith("-") else w for w in words)
    return " ".join(w if w and not any(c in w for c in " '\"$;&|<>") else shlex.quote(w) for w in shown)


def _short(text: str, n: int = 12) -> str:
    return f'<code title="{html.escape(text)}">{html.escape(text[:n])}</code>' if text else ""


def _task_text(task: dict) -> str:
    if not task:
        return ""
    dist = task.get("distribution", "")
    dist = f"dual-frequency, rarity {task.get('rarity')}" if dist == "dual" else dist
    return f"{task.get('name')} K={task.get('vocab_size')} L={task.get('length')} ({dist})"


def _checkpoints(item: Input) -> str:
    """'4: 15000–60000', the last one's hash, and the per-checkpoint list (iteration, file, sha256)
    in a collapsible block."""
    found = item.meta.get("checkpoints", [])
    if not found:
        return ""
    its = [c.get("iteration") for c in found if c.get("iteration") is not None]
    span = f"{min(its)}–{max(its)}" if len(its) > 1 else (str(its[0]) if its else "?")
    last = found[-1].get("sha256", "")
    rows = "".join(f"<li>{'' if c.get('iteration') is None else c.get('iteration')}: "
                   f"{html.escape(Path(str(c.get('path', ''))).name)} {_short(c.get('sha256', ''))}</li>"
                   for c in found)
    return (f"{len(found)} at {span}" + (f"; last {_short(last)}" if last else "")
            + f"<details><summary>each checkpoint</summary><ul>{rows}</ul></details>")


def _summary_text(item: Input) -> str:
    ds = item.ds
    by = ds.attrs.get("by", "")
    return (f"{ds.sizes.get('group', 0)} groups by {html.escape(', '.join(json.loads(by)) if by else '?')}; "
            f"unit {html.escape(str(ds.attrs.get('unit', '')))}, {html.escape(str(ds.attrs.get('method', '')))} "
            f"{html.escape(str(ds.attrs.get('confidence', '')))} CI, {html.escape(str(ds.attrs.get('resamples', '')))} "
            f"resamples")


def provenance_html(items: list[Input]) -> str:
    """A table with one row per input (path, configuration: short and full label, task, seed,
    checkpoints with hashes, versions, command), paths relative to the working directory (never
    the machine's home or work directory), and the full configurations as JSON in collapsible
    blocks."""
    head = ("<tr><th>input</th><th>kind</th><th>configuration</th><th>task</th><th>seed</th>"
            "<th>checkpoints (iteration: sha256)</th><th>versions</th><th>created</th><th>command</th></tr>")
    rows, details = [], []
    for item in items:
        m = item.meta
        path = html.escape(public_path(item.path)).replace("/", "/<wbr>")  # paths break at their slashes
        if item.kind == "summary":
            label = _summary_text(item)
        else:
            label = f"<b>{html.escape(item.label)}</b>"
            if item.detail and item.detail != item.label:
                label += f'<br><span class="meta">{html.escape(item.detail)}</span>'
        versions = " ".join(f"{k} {html.escape(str(m[v]))}" for k, v in (("gradscope", "gradscope_version"),
                                                                           ("torch", "torch_version")) if m.get(v))
        seed = "" if item.seed is None else str(item.seed)
        rows.append(f"<tr><td><code>{path}</code></td><td>{item.kind}</td><td>{label}</td>"
                    f"<td>{html.escape(_task_text(item.task))}</td><td>{seed}</td><td>{_checkpoints(item)}</td>"
                    f"<td>{versions}</td><td>{html.escape(str(m.get('created', '')))}</td>"
                    f"<td><code>{html.escape(public_command(str(m.get('command', ''))))}</code></td></tr>")
        if item.model or item.task or item.train:
            config = json.dumps({"model": item.model, "task": item.task, "train": item.train}, indent=1)
            details.append(f"<details><summary>{html.escape(public_path(item.path))}: configuration</summary>"
                           f"<pre>{html.escape(config)}</pre></details>")
    return f"<table>{head}{''.join(rows)}</table>{''.join(details)}"
