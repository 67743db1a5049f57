"""Thin Typer CLI (installed as ``gradscope.cli``)."""
