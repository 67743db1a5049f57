"""Storage of analysis results (the only package that imports xarray/zarr)."""

from gradscope.store.io import STORE_KINDS, attr_json, provenance, read_store, sha256_file, write_store

__all__ = ["STORE_KINDS", "attr_json", "provenance", "read_store", "sha256_file", "write_store"]
