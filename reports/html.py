"""Assemble one self-contained HTML page: header, table of contents, figures, provenance.

plotly.js is embedded once, inline, with the first figure (``include_plotlyjs=True``, ~4.8 MB); the
other figures reuse it (``False``). Nothing is loaded from the network.
"""

from __future__ import annotations

import html
import json
from dataclasses import dataclass

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


def _short(text: str, n: int = 12) -> str:
    return f'<code title="{html.escape(text)}">{html.escape(text[:n])}</code>' if text else ""


def _task_text(task: dict) -> str:
    if not task:
        return ""
    dist = task.get("distribution", "")
    dist = f"dual-frequency, rarity {task.get('rarity')}" if dist == "dual" else dist
    return f"{task.get('name')} K={task.get('vocab_size')} L={task.get('length')} ({dist})"


def _checkpoints(item: Input) -> str:
    rows = []
    for c in item.meta.get("checkpoints", []):
        it = c.get("iteration")
        rows.append(f"{'' if it is None else it}: {_short(c.get('sha256', '')) or html.escape(c.get('path', ''))}")
    if len(rows) > 6:
        rows = rows[:2] + [f"… {len(rows) - 4} more …"] + rows[-2:]
    return "<br>".join(rows)


def _summary_text(item: Input) -> str:
    ds = item.ds
    by = ds.attrs.get("by", "")
    return (f"{ds.sizes.get('group', 0)} groups by {html.escape(', '.join(json.loads(by)) if by else '?')}; "
            f"unit {html.escape(str(ds.attrs.get('unit', '')))}, {html.escape(str(ds.attrs.get('method', '')))} "
            f"{html.escape(str(ds.attrs.get('confidence', '')))} CI, {html.escape(str(ds.attrs.get('resamples', '')))} "
            f"resamples")


def provenance_html(items: list[Input]) -> str:
    """A table with one row per input (configuration, task, seed, checkpoint hashes, versions, command)
    and the full configurations as JSON in collapsible blocks."""
    head = ("<tr><th>input</th><th>kind</th><th>configuration</th><th>task</th><th>seed</th>"
            "<th>checkpoints (iteration: sha256)</th><th>versions</th><th>created</th><th>command</th></tr>")
    rows, details = [], []
    for item in items:
        m = item.meta
        label = html.escape(item.label) if item.kind != "summary" else _summary_text(item)
        versions = " ".join(f"{k} {html.escape(str(m[v]))}" for k, v in (("gradscope", "gradscope_version"),
                                                                           ("torch", "torch_version")) if m.get(v))
        seed = "" if item.seed is None else str(item.seed)
        rows.append(f"<tr><td><code>{html.escape(str(item.path))}</code></td><td>{item.kind}</td><td>{label}</td>"
                    f"<td>{html.escape(_task_text(item.task))}</td><td>{seed}</td><td>{_checkpoints(item)}</td>"
                    f"<td>{versions}</td><td>{html.escape(str(m.get('created', '')))}</td>"
                    f"<td><code>{html.escape(str(m.get('command', '')))}</code></td></tr>")
        if item.model or item.task or item.train:
            config = json.dumps({"model": item.model, "task": item.task, "train": item.train}, indent=1)
            details.append(f"<details><summary>{html.escape(str(item.path))}: configuration</summary>"
                           f"<pre>{html.escape(config)}</pre></details>")
    return f"<table>{head}{''.join(rows)}</table>{''.join(details)}"
