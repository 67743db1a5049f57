"""Storage of analysis results (the only package that imports xarray/zarr)."""
