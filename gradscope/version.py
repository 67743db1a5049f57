"""The package version (single source: the installed distribution's metadata)."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("gradscope")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0+source"
