"""The validation studies' raw data as self-describing NetCDF4/CF files (issue #20 item 7).

Each study declares a schema for its data files: for every variable its dimension names, ``long_name``
and ``units``. :func:`save` writes the arrays as an ``xarray.Dataset`` (engine h5netcdf, the same NetCDF4
on HDF5 as the results files; CF-1.8 attributes, the software versions) with the schema's dimension
coordinate (``time``) as a coordinate, strings as global attributes, and optional zlib compression of
the large arrays. A variable without a schema entry is an error, so no file is written undescribed.
:func:`load` reads it back as the dict of arrays that the studies' analysis code indexes (``r["w2"]``,
``float(r["cpu"])``), keys as they were saved. Any NetCDF reader opens the files without spherepde:
``xarray.open_dataset(path)``, ``netCDF4.Dataset(path)``, ``ncdump -h``.
"""
from __future__ import annotations

import numpy as np

#: the CF convention the files follow
CONVENTIONS = "CF-1.8"


class SchemaError(ValueError):
    """A variable was given without a schema entry, or with a shape its dimensions do not allow."""


def save(path, data: dict, schema: dict, title: str, coords: dict | None = None, compress=(), attrs=None):
    """Write ``data`` (name -> array, number or string) to the NetCDF4 file ``path``.

    ``schema[name] = (dims, long_name, units)`` describes each non-string variable; ``dims`` is a tuple
    of dimension names (``()`` for a scalar). ``coords`` maps a dimension to the variable holding its
    values (``{"time": "times"}``): that variable becomes the dimension coordinate, named after the
    dimension in the file, and :func:`load` returns it under its own key again. Names in ``compress``
    are stored zlib-compressed (level 4, shuffle). Strings become global attributes; ``attrs`` are
    added as global attributes as well.
    """
    import xarray as xr

    from spherepde.io import versions

    coords = dict(coords or {})
    renamed = {v: d for d, v in coords.items()}
    variables, gattrs = {}, {"Conventions": CONVENTIONS, "title": title}
    for name, value in data.items():
        if isinstance(value, (str, np.str_)) or (isinstance(value, np.ndarray) and value.dtype.kind == "U"
                                                  and value.ndim == 0):
            gattrs[name] = str(value)
            continue
        if name not in schema:
            raise SchemaError(f"{path}: variable {name!r} has no schema entry (dims, long_name, units)")
        dims, long_name, units = schema[name]
        a = np.asarray(value)
        if a.ndim != len(dims):
            raise SchemaError(f"{path}: variable {name!r} has shape {a.shape}, its dims are {dims}")
        var_attrs = {"long_name": long_name, "units": units}
        if name in renamed:
            var_attrs["spherepde_key"] = name
        variables[renamed.get(name, name)] = (dims, a, var_attrs)
    missing = [d for d, v in coords.items() if v not in data]
    if missing:
        raise SchemaError(f"{path}: coordinate variables missing for dims {missing}")
    cvars = {d: variables.pop(d) for d in coords}
    ds = xr.Dataset(data_vars=variables, coords=cvars,
                    attrs={**gattrs, **{f"version_{k}": str(v) for k, v in versions().items()},
                           **(attrs or {})})
    enc = {renamed.get(n, n): {"zlib": True, "complevel": 4, "shuffle": True} for n in compress}
    ds.to_netcdf(path, engine="h5netcdf", encoding=enc)


def load(path) -> dict:
    """The variables of a file written by :func:`save` (numpy arrays, 0-d for scalars) under the keys
    they were saved with, plus its string attributes (not the CF and version attributes)."""
    import xarray as xr

    with xr.open_dataset(path, engine="h5netcdf") as ds:
        out = {}
        for name, var in ds.variables.items():
            out[var.attrs.get("spherepde_key", name)] = var.values
        for k, v in ds.attrs.items():
            if k not in ("Conventions", "title") and not k.startswith("version_"):
                out[k] = v
    return out
