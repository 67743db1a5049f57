"""Plotly report builders (installed as ``gradscope.reports``; the only package that imports plotly).

Figure builders are pure functions (stores/aggregates → ``plotly.graph_objects.Figure``);
``render_report`` assembles them into one offline HTML page, ``export_static`` writes PNG/SVG files.
"""

from .accuracy_figures import grid_figure_accuracy, grid_figure_summary, training_figure, vocab_figure
from .build import STATIC_FORMATS, ReportOptions, build_sections, export_static, header_html, render_report
from .html import Section, provenance_html, render_page
from .stability_figures import distribution_figure, spectra_figure, stability_figure

__all__ = [
    "STATIC_FORMATS", "ReportOptions", "Section", "build_sections", "distribution_figure", "export_static",
    "grid_figure_accuracy", "grid_figure_summary", "header_html", "provenance_html", "render_page", "render_report",
    "spectra_figure", "stability_figure", "training_figure", "vocab_figure",
]
