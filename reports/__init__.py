"""Plotly report builders (installed as ``gradscope.reports``)."""
