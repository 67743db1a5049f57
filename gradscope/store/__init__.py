"""Storage of analysis results: the stores' layouts, their checks, and reading and writing them (the only
package that imports zarr; workflows, reports and cli read and build xarray datasets too)."""

from gradscope.store.io import STORE_KINDS, attr_json, provenance, read_store, write_store

__all__ = ["STORE_KINDS", "attr_json", "provenance", "read_store", "write_store"]
