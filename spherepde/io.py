"""Results files: one self-describing HDF5 file per run, checkpoints, and HEALPix FITS export.

Functions
---------
ResultsWriter(path, config, grid, save_times)
    Incremental writer: densities appended at each saved time (resizable dataset, flushed), diagnostics
    rewritten at each save, so a crash loses at most the last interval.
save_result(result, path, config=None)
    Write a complete :class:`spherepde.solver.Result` in one go.
load(path) -> Result
    Read a results file back; the grid and model are rebuilt from the stored configuration.
write_checkpoint(path, state, extra) / read_checkpoint(path)
    A solver state (``Solver.get_state()``) written atomically (temporary file + ``os.replace``).
write_fits(result, path, index=-1)
    The density at one saved time as a HEALPix map (RING order) through healpy.
versions() -> dict
    Versions of Python, spherepde and its dependencies.

Layout of a results file (``h5dump -A`` shows it all). It is a NetCDF4 file following the CF
conventions (format version 3): ``xarray.open_dataset(path)`` (or netCDF4, ncdump, Panoply) reads it
without spherepde, with named dimensions, coordinates, and ``long_name`` and ``units`` on every
variable; the groups open with ``xarray.open_dataset(path, group="diagnostics")`` and so on::

    /            attrs: Conventions = "CF-1.10", title, source, history, references, format =
                        "spherepde-results", format_version, created, complete, n_steps, wall_time,
                        spherepde_version, config_toml, config_json, versions (JSON: every package,
                        ducc0 included), version_<package>
    /time        (time,)         saved times, appended (the unlimited dimension)
    /cell        (cell,)         cell index (HEALPix: the RING pixel number)
    /component   (component,)    0 .. d-1, the Cartesian axes of R^d
    /density     (time, cell)    cell averages of f at the saved times, appended
    /cell_area   (cell,)         cell measures (sr on S^2); /cell_center (cell, component) unit vectors;
                                 on S^2 also /lon, /lat (degrees) of the centres
    /checksums   (time,)         SHA-256 of each frame (time, density); groups and /config carry a sha256
                                 attribute: load() verifies them all (format version >= 2)
    /config      attrs: toml (the experiment text), json (validated, with defaults), sha256
    /versions    attrs: one per package
    /grid        attrs: type, dim, n_cells, nside | n
    /diagnostics/<name>  (step,)  per-step diagnostics of the solver (time, mass, min, max, ...)
    /concentration/<name> (time,) optional: W2 to Pi#rho_0, alignments (per saved time)
    /particles/{times,positions,weights}   optional overlay run (time, particle, component)

A run whose cells change per saved state (an adaptive grid, ``/grid`` type ``adaptive_healpix``) has
the ragged layout instead of ``density (time, cell)``: the ``cell`` dimension (unlimited) runs over the
cells of all saved states one after the other, ``/cell_count (time)`` (a CF contiguous ragged array
count, ``sample_dimension = "cell"``) says how many belong to each state, and ``/uniq``, ``/density``,
``/cell_area``, ``/lon``, ``/lat`` are ``(cell,)``; each frame's checksum covers its time, NUNIQ and
densities, and ``load`` rebuilds each state's grid from its NUNIQ when it is first asked for (``Result.grid_at``,
:class:`StateGrids`).

Version 2 files (``times`` for ``time``, the grid's centres and areas in /grid) load as before.
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import json
import logging
import os
import platform
import sys
from collections.abc import Sequence
from importlib import metadata as _md
from pathlib import Path

import h5py
import numpy as np

__all__ = ["FORMAT", "FORMAT_VERSION", "DamagedFileError", "ResultsWriter", "WriteError", "check_frames", "checkpoint_config_json",
           "load", "load_config_of",
           "read_checkpoint", "save_result", "versions", "write_checkpoint", "write_fits"]

log = logging.getLogger(__name__)

FORMAT = "spherepde-results"
#: 2: SHA-256 checksums of every frame, group and the configuration (version 1 files load unchecked).
#: 3: NetCDF4 / CF: named dimensions (time, cell, step, ...) as HDF5 dimension scales, units and long_name
#: on every variable, the configuration and versions as root attributes.
FORMAT_VERSION = 3

#: CF attributes (long_name, units) of the variables spherepde writes; "DENSITY" / "MEASURE" stand for the
#: units of a density on S^{d-1} and of its surface measure (see :func:`_units`). Others get their name.
_TIME = ("time t (depth through the transformer; dimensionless)", "1")
_VARIABLES = {
    "time": _TIME,
    "times": _TIME,
    "density": ("cell average of the token density f_t (with respect to the surface measure)", "DENSITY"),
    "cell_area": ("measure of the cell on the sphere", "MEASURE"),
    "cell_center": ("cell centre, a unit vector of R^d", "1"),
    "lon": ("longitude of the cell centre", "degrees_east"),
    "lat": ("latitude of the cell centre", "degrees_north"),
    "checksums": ("SHA-256 of the frame (time, density), hexadecimal", "1"),
    "cell": ("cell index", "1"),
    "uniq": ("HEALPix multi-order cell index NUNIQ = 4 nside^2 + ipix (NESTED ipix at that nside)", "1"),
    "cell_count": ("number of cells of the saved state (its run of the cell dimension)", "1"),
    "component": ("Cartesian axis of R^d (0 = e1)", "1"),
    "step": ("solver step (0 = the initial state)", "1"),
    "particle": ("token index", "1"),
    "mass": ("total mass, the integral of f over the sphere", "1"),
    "min": ("smallest cell average of f", "DENSITY"),
    "max": ("largest cell average of f", "DENSITY"),
    "sup_div": ("sup over cells of the divergence of the velocity field", "1"),
    "dt": ("step size", "1"),
    "error": ("embedded error estimate of the step (relative to the tolerance)", "1"),
    "rejected": ("attempts rejected by the error control before the step", "1"),
    "field_error": ("measured relative error of the linearly extrapolated field where it was recomputed "
                    "(field_interval), else 0", "1"),
    "field_bound": ("largest certified bound on the attention mean's error of the step's evaluations (0: local "
                    "model or direct sums)", "1"),
    "gronwall": ("Gronwall lower bound of min f", "DENSITY"),
    "w2_limit": ("Wasserstein-2 distance to the limit measure Pi#rho_0", "1"),
    "alignment_E": ("alignment of the mass with the eigenspace E of V B^T", "1"),
    "alignment_F": ("alignment of the mass with the eigenspace F", "1"),
    "alignment_F_abs": ("alignment of the mass with the eigenspace F_abs", "1"),
    "V_p": ("Lyapunov functional V_p", "1"),
    "w2_floor": ("least W2 to Pi#rho_0 of any density on the grid (nearest cell centres)", "1"),
    "w2_at_floor": ("1 where W2 to Pi#rho_0 is at the grid floor (a plateau of resolution, not a rate)", "1"),
    "p": ("exponent p of V_p", "1"),
    "positions": ("token positions, unit vectors of R^d", "1"),
    "weights": ("token weights (sum 1)", "1"),
}
_DENSITY_UNITS = {2: ("rad-1", "rad"), 3: ("sr-1", "sr")}  # S^1: per radian of arc; S^2: per steradian
#: What each axis of a group's arrays is called (a group's datasets by name -> dimension names).
_GROUP_DIMS = {"diagnostics": {"*": ("step",)}, "concentration": {"*": ("time",)},
               "particles": {"*": ("time", "particle", "component"), "weights": ("particle",)}}


class DamagedFileError(ValueError):
    """A results file or checkpoint whose content fails its checksum or its layout checks."""


class WriteError(OSError):
    """Writing a results file or checkpoint failed (disk full, a file-size limit, an I/O error)."""


def _reason(exc) -> str:
    """The operating system's reason inside an HDF5 error message ("File too large"), else the message."""
    import re

    m = re.search(r"error message = '([^']+)'", str(exc))
    if m:
        return m.group(1)
    return getattr(exc, "strerror", None) or str(exc).splitlines()[0]


#: What to do after a failed write.
_WRITE_HINT = ("Free space (or raise the file-size limit) and rerun the same command: the run resumes from its "
               "last checkpoint")


@contextlib.contextmanager
def _writing(path):
    """An OSError or RuntimeError (h5py's) while writing ``path`` becomes a WriteError that says what failed
    and what to do."""
    prev = sys.unraisablehook
    _quiet_h5py_teardown()  # the echoes start inside the failing call
    try:
        yield
    except WriteError:
        raise
    except (OSError, RuntimeError) as exc:
        raise WriteError(f"writing {path} failed: {_reason(exc)}. {_WRITE_HINT}") from exc
    sys.unraisablehook = prev  # written: nothing to quieten


def _quiet_h5py_teardown():
    """After a failed write, h5py's objects of that file fail again as they are released ("Exception
    ignored in ... _dealloc: Can't decrement id ref count"), once per object: the WriteError already said
    what happened, so these echoes are dropped (every other unraisable exception is reported as before)."""
    prev = sys.unraisablehook
    if getattr(prev, "_spherepde", False):
        return

    def hook(u):
        if isinstance(u.exc_value, RuntimeError) and "decrement id ref count" in str(u.exc_value):
            return
        prev(u)

    hook._spherepde = True
    sys.unraisablehook = hook


#: Room asked for beyond each write's own size (HDF5 object headers, B-tree nodes, the rewritten groups).
WRITE_MARGIN = 64 * 1024


def _preflight(path, need: int):
    """WriteError, before HDF5 touches ``path``, unless its disk has room for ``need`` more bytes (twice,
    plus WRITE_MARGIN) and the process's file-size limit (``ulimit -f``) allows it. HDF5 cannot recover
    from a write that fails half-way (h5py then crashes closing the file: SIGSEGV, measured), so a full
    disk must be found before the write, not by it."""
    import resource
    import shutil

    path = Path(path)
    need = 2 * int(need) + WRITE_MARGIN
    size = path.stat().st_size if path.exists() else 0
    free = shutil.disk_usage(path.parent).free
    if free < need:
        raise WriteError(f"writing {path} needs about {need} bytes and its disk has {free} free. {_WRITE_HINT}")
    soft = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    if soft != resource.RLIM_INFINITY and size + need > soft:
        raise WriteError(f"writing {path} would take it to about {size + need} bytes, past the file-size limit "
                         f"(ulimit -f) of {soft} bytes. {_WRITE_HINT}")


def _canon(v) -> bytes:
    """Canonical bytes of a value as it is read back from HDF5 (arrays as float64 or their own dtype with
    shape, numbers by kind, strings as UTF-8)."""
    if isinstance(v, (bytes, str)):
        return b"s" + (v.encode() if isinstance(v, str) else v)
    if isinstance(v, (bool, np.bool_, int, np.integer)):
        return b"i%d" % int(v)
    if isinstance(v, (float, np.floating)):
        return b"f" + float(v).hex().encode()
    a = np.ascontiguousarray(np.asarray(v))
    if a.dtype.kind in "US":
        return b"a" + repr(a.tolist()).encode()
    return b"a" + a.dtype.str.encode() + repr(a.shape).encode() + a.tobytes()


def _digest(*values) -> str:
    h = hashlib.sha256()
    for v in values:
        c = _canon(v)
        h.update(len(c).to_bytes(8, "little"))
        h.update(c)
    return h.hexdigest()


def _frame_digest(t, f, uniq=None) -> str:
    """SHA-256 of a frame: its time and densities, and its cells (NUNIQ) in the ragged layout."""
    if uniq is None:
        return _digest(float(t), np.asarray(f, dtype=float))
    return _digest(float(t), np.asarray(uniq, dtype=np.int64), np.asarray(f, dtype=float))


def _ragged(h) -> bool:
    """Whether a results file has the ragged layout (cells per saved state, ``cell_count``)."""
    return "cell_count" in h


def _frame_bounds(h):
    """(start, stop) arrays of each saved state's cells along the ``cell`` dimension (ragged layout)."""
    counts = np.asarray(h["cell_count"][()], np.int64)
    stop = np.cumsum(counts)
    return stop - counts, stop


def _frame(h, i, bounds=None):
    """(time, density, NUNIQ or None) of saved state ``i``."""
    t = _times(h)[i]
    if not _ragged(h):
        return t, h["density"][i], None
    start, stop = _frame_bounds(h) if bounds is None else bounds
    return t, h["density"][start[i]:stop[i]], h["uniq"][start[i]:stop[i]]


def _group_digest(data: dict) -> str:
    return _digest(*[x for k in sorted(data) for x in (k, np.asarray(data[k]))])


def _memory_bytes() -> float:
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not POSIX
        return 2.0 ** 40


def _check_readable(path, h):
    """A crafted or damaged file must not exhaust memory: the datasets ``load`` reads must be of the layout
    it writes (float64 times and densities of the stored grid's size, consistent counts) and all of them
    together below half the machine's memory."""
    try:
        n_cells = int(h["grid"].attrs["n_cells"])
        times, dens = _times(h), h["density"]
        cells = [h[k] for k in ("cell_count",) + _RAGGED if k in h] if _ragged(h) else []
    except (KeyError, TypeError, ValueError) as exc:
        raise DamagedFileError(f"{path}: not the layout of a results file ({exc})") from None
    if _ragged(h):
        counts = h["cell_count"]
        bad = counts.ndim != 1 or counts.shape != times.shape or times.ndim != 1 or counts.dtype.kind not in "iu"
        bad = bad or any(k not in h or h[k].ndim != 1 or h[k].shape != dens.shape for k in _RAGGED)
        if not bad and counts.shape[0]:
            c = counts[()]
            bad = bool(c.min() < 12) or int(c.sum()) != dens.shape[0]
        if bad:
            raise DamagedFileError(f"{path}: the cells per saved state (cell_count, {', '.join(_RAGGED)}) do not fit "
                                   "together: a damaged results file")
    elif times.ndim != 1 or dens.ndim != 2 or dens.shape != (times.shape[0], n_cells):
        raise DamagedFileError(f"{path}: density has shape {dens.shape}, times {times.shape}, the grid "
                               f"{n_cells} cells: a damaged results file")
    total = 0
    for obj in [times, dens] + cells + [g[k] for name in ("diagnostics", "concentration", "particles") if name in h
                                for g in (h[name],) for k in g]:
        if not isinstance(obj, h5py.Dataset):
            raise DamagedFileError(f"{path}: {obj.name} is not a dataset: a damaged results file")
        total += int(np.prod(obj.shape, dtype=np.float64)) * obj.dtype.itemsize
    if total > 0.5 * _memory_bytes():
        raise DamagedFileError(f"{path}: its datasets claim {total / 2**30:.3g} GiB, more than half this machine's "
                               "memory: a damaged or crafted results file, not read")


def _verify_frames(path, h, n: int):
    """DamagedFileError unless the first ``n`` frames (time, density) match their checksums."""
    sums = h["checksums"] if "checksums" in h else None
    if sums is None or sums.shape[0] < n:
        raise DamagedFileError(f"{path}: the frame checksums are missing")
    bounds = _frame_bounds(h) if _ragged(h) else None
    for i in range(n):
        if sums[i].decode() != _frame_digest(*_frame(h, i, bounds)):
            times = _times(h)
            raise DamagedFileError(f"{path}: frame {i} (t = {float(times[i]):g}) fails its checksum: the file is "
                                   "damaged (rerun the experiment: a partial run resumes from its checkpoint)")


def _verify(path, h):
    """DamagedFileError where a frame, a group or the configuration fails its checksum (format 2)."""
    if int(h.attrs.get("format_version", 1)) < 2:
        log.warning("%s: format version 1 (no checksums): its content is not verified", path)
        return
    c = h["config"].attrs
    if c.get("sha256", "") != _digest(c.get("toml", ""), c.get("json", "")):
        raise DamagedFileError(f"{path}: the stored configuration fails its checksum: the file is damaged")
    _verify_frames(path, h, _times(h).shape[0])
    if h["checksums"].shape != _times(h).shape:
        raise DamagedFileError(f"{path}: the frame checksums do not match the frames")
    for name in ("diagnostics", "concentration", "particles"):
        if name in h:
            if h[name].attrs.get("sha256", "") != _group_digest(_group_data(h[name])):
                raise DamagedFileError(f"{path}: the group /{name} fails its checksum: the file is damaged")
_PACKAGES = ("spherepde", "numpy", "scipy", "numba", "healpy", "ducc0", "matplotlib", "h5py", "pot", "xarray",
             "h5netcdf", "dask", "distributed", "tqdm")


def versions() -> dict:
    """Python, platform and package versions (``"not installed"`` where absent)."""
    out = {"python": platform.python_version(), "platform": platform.platform()}
    for p in _PACKAGES:
        try:
            out[p] = _md.version(p)
        except _md.PackageNotFoundError:
            out[p] = "not installed"
    return out


def _adapts(grid) -> bool:
    """Whether ``grid``'s cells may change per saved state (a grid with cells_state, e.g. adaptive HEALPix)."""
    return bool(getattr(grid, "cells_state", dict)())


def _grid_attrs(grid) -> dict:
    a = {"dim": int(grid.dim), "n_cells": int(grid.n_cells), "class": type(grid).__name__}
    if _adapts(grid):  # cells per saved state: the ragged layout (module docstring)
        a.update(type="adaptive_healpix", nside_min=int(grid.nside_min), nside_max=int(grid.nside_max),
                 edge_points=int(grid.edge_points), order="NUNIQ")
        if getattr(grid, "max_cells", None) is not None:
            a["max_cells"] = int(grid.max_cells)
        ref = getattr(grid, "refinement", None)
        if ref is not None:
            from dataclasses import asdict

            a["refinement"] = json.dumps(asdict(ref) if ref else False)
    elif hasattr(grid, "nside"):
        a.update(type="healpix", nside=int(grid.nside), order="RING")
    else:
        a["type"] = "tensor"
        if hasattr(grid, "counts"):
            a["counts"] = np.asarray(grid.counts, dtype=np.int64)
        if hasattr(grid, "reduced"):
            a["reduced"] = bool(grid.reduced)
    return a


#: The per-cell variables of the ragged (adaptive) layout, in the order a frame appends them.
_RAGGED = ("uniq", "density", "cell_area", "lon", "lat")


def _ragged_values(grid, f) -> dict:
    """The per-cell arrays of one frame of the ragged layout: NUNIQ, cell averages, areas, lon, lat."""
    c = np.asarray(grid.centers, float)
    return {"uniq": np.asarray(grid.uniq, np.int64), "density": np.asarray(f, float),
            "cell_area": np.asarray(grid.areas, float),
            "lon": np.degrees(np.arctan2(c[:, 1], c[:, 0])),
            "lat": np.degrees(np.arcsin(np.clip(c[:, 2], -1.0, 1.0)))}


def _config_text_json(config):
    """(toml, json) strings of an ExperimentConfig, or of nothing."""
    if config is None:
        return "", "{}"
    return config.text, config.to_json()


def _dict_bytes(data: dict | None) -> int:
    """Bytes of a group of arrays as written (data and about 1 KB of HDF5 headers per dataset)."""
    return sum(np.asarray(v).nbytes + 1024 for v in (data or {}).values())


def _units(key: str, dim: int) -> tuple:
    """(long_name, units) of a variable (CF attributes), with the density units of S^{dim-1}."""
    long_name, units = _VARIABLES.get(key, (key.replace("_", " "), "1"))
    dens, meas = _DENSITY_UNITS.get(dim, ("1", "1"))
    if units == "DENSITY":
        units = dens
        if dim not in _DENSITY_UNITS:
            long_name += f" (per unit {dim - 1}-volume of S^{dim - 1})"
    elif units == "MEASURE":
        units = meas
        if dim not in _DENSITY_UNITS:
            long_name += f" ({dim - 1}-volume)"
    return long_name, units


def _describe(ds, key: str, dim: int):
    ds.attrs["long_name"], ds.attrs["units"] = _units(key, dim)


def _scale(g, name: str, n: int, values=None, dim: int = 3):
    """The dimension ``name`` of length ``n`` in group ``g``: an HDF5 dimension scale (NetCDF4's dimension;
    an index 0..n-1 unless ``values``). Marked so that :func:`_read_group` leaves it out."""
    if name in g:
        return g[name]
    ds = g.create_dataset(name, data=np.arange(n, dtype=np.int64) if values is None else np.asarray(values))
    ds.make_scale(name)
    ds.attrs["spherepde_role"] = "dimension"
    _describe(ds, name, dim)
    return ds


def _variable(g, name: str, scales, dim: int, **create):
    """Dataset ``name`` of ``g`` (``create``: h5py's create_dataset arguments) along the dimension scales
    ``scales`` (one per axis), with its CF long_name and units."""
    ds = g.create_dataset(name, **create)
    for i, sc in enumerate(scales):
        ds.dims[i].attach_scale(sc)
    _describe(ds, name, dim)
    return ds


def _is_scale(ds) -> bool:
    return ds.attrs.get("spherepde_role", "") == "dimension"


def _group_data(g) -> dict:
    """The arrays of a group as written by :func:`_write_dict_group` (its dimension scales left out)."""
    return {k: g[k][()] for k in g if isinstance(g[k], h5py.Dataset) and not _is_scale(g[k])}


def _write_dict_group(parent, name, data: dict, dim: int = 3):
    """A group of arrays with NetCDF4 dimensions: axis i of every array is ``_GROUP_DIMS[name][i]`` where
    the lengths agree (a group's own dimension scale; ``concentration``'s and ``particles``' time scale
    holds their ``times``), else ``<key>_<i>``. Scalars are variables without dimensions."""
    if name in parent:
        del parent[name]
    g = parent.create_group(name)
    arrays = {k: np.asarray(v) for k, v in data.items()}
    for k, a in arrays.items():
        _describe(g.create_dataset(k, data=a), k, dim)
    sha = _group_digest(_group_data(g))  # of what reads back, before the scales are added
    dims = _GROUP_DIMS.get(name, {})
    times = arrays.get("times")
    lengths = {}
    for k, a in arrays.items():
        names = dims.get(k, dims.get("*", ()))
        for i, n in enumerate(a.shape):
            want = names[i] if i < len(names) else f"{k}_{i}"
            if lengths.setdefault(want, n) != n:  # the group's dimension of that name has another length
                want = f"{k}_{i}"
                lengths[want] = n
            vals = times if want == "time" and times is not None and times.shape == (n,) else None
            g[k].dims[i].attach_scale(_scale(g, want, n, vals, dim))
    g.attrs["sha256"] = sha
    return g


def _write_header(h, config, grid, options=None, model=None):
    h.attrs["format"] = FORMAT
    h.attrs["format_version"] = FORMAT_VERSION
    h.attrs["created"] = _dt.datetime.now(_dt.timezone.utc).isoformat()
    h.attrs["complete"] = False
    h.attrs["n_steps"] = 0
    h.attrs["wall_time"] = 0.0
    v = versions()
    h.attrs["spherepde_version"] = v["spherepde"]
    toml, js = _config_text_json(config)
    c = h.create_group("config")
    c.attrs["toml"] = toml
    c.attrs["json"] = js
    c.attrs["sha256"] = _digest(toml, js)
    if options is not None:
        from dataclasses import asdict

        c.attrs["options_json"] = json.dumps(asdict(options))
    if model is not None:
        c.attrs["model_repr"] = repr(model)
    vg = h.create_group("versions")
    for k, val in v.items():
        vg.attrs[k] = val
    gattrs = _grid_attrs(grid)
    g = h.create_group("grid")
    for k, val in gattrs.items():
        g.attrs[k] = val
    # CF / NetCDF4 description (readers without spherepde: xarray, netCDF4, ncdump)
    h.attrs["Conventions"] = "CF-1.10"
    h.attrs["title"] = (config.name if config is not None else "spherepde run") + ": token density f_t on S^" \
        + str(grid.dim - 1)
    h.attrs["source"] = f"spherepde {v['spherepde']} (finite volumes on the {gattrs['type']} grid, " \
        f"{gattrs['n_cells']} cells)"
    h.attrs["history"] = f"{h.attrs['created']}: created by spherepde {v['spherepde']}"
    h.attrs["references"] = "Alcalde, Bungert, Riedl, Roith, arXiv:2605.10931 (the equation); MODEL.md"
    h.attrs["config_toml"] = toml
    h.attrs["config_json"] = js
    h.attrs["versions"] = json.dumps(v, sort_keys=True)
    for k, val in v.items():
        h.attrs[f"version_{k}"] = val
    d = int(grid.dim)
    centers = np.asarray(grid.centers, dtype=float)
    t = h.create_dataset("time", shape=(0,), maxshape=(None,), dtype="f8", chunks=(1024,))  # appended
    t.make_scale("time")
    t.attrs["axis"] = "T"
    _describe(t, "time", d)
    if gattrs["type"] == "adaptive_healpix":
        _ragged_header(h, t, d)
        return
    cell = _scale(h, "cell", grid.n_cells, dim=d)
    if gattrs["type"] == "healpix":
        cell.attrs["long_name"] = f"HEALPix pixel index (RING order, nside {gattrs['nside']})"
    comp = _scale(h, "component", d, dim=d)
    _variable(h, "cell_area", (cell,), d, data=np.asarray(grid.areas, dtype=float))
    _variable(h, "cell_center", (cell, comp), d, data=centers)
    coords = []
    if d == 3:
        for name, standard, vals in (
                ("lon", "longitude", np.degrees(np.arctan2(centers[:, 1], centers[:, 0]))),
                ("lat", "latitude", np.degrees(np.arcsin(np.clip(centers[:, 2], -1.0, 1.0))))):
            _variable(h, name, (cell,), d, data=vals).attrs["standard_name"] = standard
            coords.append(name)
    dens = _variable(h, "density", (t, cell), d, shape=(0, grid.n_cells), maxshape=(None, grid.n_cells),
                     dtype="f8", chunks=(1, grid.n_cells))
    dens.attrs["cell_measures"] = "area: cell_area"
    if coords:
        dens.attrs["coordinates"] = " ".join(coords)
    _variable(h, "checksums", (t,), d, shape=(0,), maxshape=(None,), dtype="S64", chunks=(1024,))

def _ragged_header(h, t, d: int):
    """The variables of the ragged layout (a grid whose cells change per saved state): the ``cell``
    dimension runs over the cells of all saved states one after the other, and ``cell_count(time)`` (a
    CF contiguous ragged array count, ``sample_dimension = "cell"``) says how many belong to each."""
    cell = h.create_dataset("cell", shape=(0,), maxshape=(None,), dtype="i8", chunks=(16384,))
    cell.make_scale("cell")
    cell.attrs["spherepde_role"] = "dimension"
    _describe(cell, "cell", d)
    cell.attrs["long_name"] = "cell of a saved state (the states' cells one after the other; see cell_count)"
    count = _variable(h, "cell_count", (t,), d, shape=(0,), maxshape=(None,), dtype="i8", chunks=(1024,))
    count.attrs["sample_dimension"] = "cell"
    kinds = {"uniq": "i8"}
    for k in _RAGGED:
        ds = _variable(h, k, (cell,), d, shape=(0,), maxshape=(None,), dtype=kinds.get(k, "f8"), chunks=(16384,))
        if k in ("lon", "lat"):
            ds.attrs["standard_name"] = "longitude" if k == "lon" else "latitude"
    h["density"].attrs["cell_measures"] = "area: cell_area"
    h["density"].attrs["coordinates"] = "lon lat"
    _variable(h, "checksums", (t,), d, shape=(0,), maxshape=(None,), dtype="S64", chunks=(1024,))


def _times(h):
    """The saved times of a results file (``time``; ``times`` before format version 3)."""
    return h["time"] if "time" in h else h["times"]


def check_frames(density, what: str):
    """ValueError unless every saved density in ``density`` is finite and >= 0 (a damaged file).
    ``density``: an (n_saved, N) array, or a list of frames of different lengths (a grid that adapts),
    checked frame by frame (NumPy refuses to make one array of ragged frames)."""
    for d in (density if isinstance(density, list) else [density]):
        d = np.asarray(d, dtype=float)
        if d.size and not (np.all(np.isfinite(d)) and d.min() >= 0.0):
            raise ValueError(f"{what} holds non-finite or negative densities")


class ResultsWriter:
    """Write a results file incrementally (see the module docstring for the layout).

    Parameters
    ----------
    path : str or Path
        The file; created (an existing file is replaced) unless ``resume`` is given.
    config : ExperimentConfig or None
    grid : grid object
    options : spherepde.solver.Options, optional
    resume : int, optional
        Keep the first ``resume`` saved frames of the existing file (a checkpoint's count): they are
        verified against their checksums and copied into a new file; frames written after that
        checkpoint are dropped and recomputed.
    continues : str, optional
        With ``resume``: the configuration JSON of the run this one continues to a later t_end
        (:func:`spherepde.runner.run_experiment`), accepted in the existing file besides ``config``'s own.
    """

    def __init__(self, path, config, grid, options=None, model=None, resume: int | None = None,
                 continues: str | None = None):
        self.path = Path(path)
        self.n_cells = grid.n_cells
        self.dim = int(grid.dim)
        self.ragged = _adapts(grid)  # cells per saved state: append() takes each state's grid
        kept = None
        if resume is not None:
            kept = self._frames_to_keep(config, int(resume), continues)
        # A new file (temporary + os.replace), also on resume: the verified frames are copied into it, so
        # a resumed run never writes into a file whose other parts may be damaged (a torn group header
        # made the next write fail; found by the fault matrix), and an older format is upgraded.
        tmp = self.path.with_name(self.path.name + ".tmp")
        kept_bytes = sum(a.nbytes for a in (kept or {}).values())
        _preflight(tmp, 8 * grid.n_cells * (grid.dim + 1) + kept_bytes + 16384)
        with _writing(tmp), h5py.File(tmp, "w") as h:
            _write_header(h, config, grid, options, model)  # time, density, checksums: empty, appended
            for name, a in (kept or {}).items():
                h[name].resize(a.shape)
                h[name][...] = a
            if self.ragged and kept:
                h["cell"].resize(kept["uniq"].shape)
                h["cell"][:] = np.arange(kept["uniq"].shape[0])
        os.replace(tmp, self.path)
        self.h = h5py.File(self.path, "a")

    def _frames_to_keep(self, config, n: int, continues: str | None = None) -> dict:
        """{dataset: its first ``n`` frames} of the existing file (time, density, checksums; in the ragged
        layout cell_count and the cells of those frames), verified; ValueError (a DamagedFileError where a
        checksum fails) when they cannot be kept."""
        _, js = _config_text_json(config)
        try:
            with h5py.File(self.path, "r") as h:
                if js and h["config"].attrs.get("json", "") not in (js, continues):
                    raise ValueError(f"{self.path} holds the results of another configuration")
                if int(h.attrs.get("format_version", 1)) < 2:
                    raise ValueError(f"{self.path} is of results format version 1 (no checksums)")
                if _times(h).shape[0] < n:
                    raise ValueError(f"{self.path} holds {_times(h).shape[0]} saved frames, the checkpoint "
                                     f"expects {n}")
                if _ragged(h) != self.ragged:
                    raise ValueError(f"{self.path} holds {'' if _ragged(h) else 'no '}cells per saved state, the "
                                     f"grid {'changes' if self.ragged else 'does not change'} during the run")
                if not self.ragged and h["density"].shape[1] != self.n_cells:
                    raise ValueError(f"{self.path} holds densities of {h['density'].shape[1]} cells, the grid has "
                                     f"{self.n_cells}")
                if self.ragged:  # the cells of the frames must be where cell_count says
                    _check_readable(self.path, h)
                _verify_frames(self.path, h, n)
                kept = {"time": _times(h)[:n], "checksums": h["checksums"][:n]}
                if self.ragged:
                    stop = int(_frame_bounds(h)[1][n - 1]) if n else 0
                    kept["cell_count"] = h["cell_count"][:n]
                    kept.update({k: h[k][:stop] for k in _RAGGED})
                else:
                    kept["density"] = h["density"][:n]
                check_frames(kept["density"], f"{self.path} (the frames to keep)")
                return kept
        except (OSError, KeyError, RuntimeError, TypeError) as exc:
            raise DamagedFileError(f"{self.path}: not readable as a results file ({_reason(exc)})") from None

    @property
    def n_saved(self) -> int:
        return int(self.h["time"].shape[0])

    def append(self, t: float, f: np.ndarray, diagnostics: dict | None = None, n_steps: int = 0,
               wall_time: float = 0.0, grid=None):
        """Append the density ``f`` at time ``t`` (and refresh the diagnostics); flushed to disk. ``grid``:
        the grid ``f`` lives on, required where the cells change per saved state (the ragged layout)."""
        if self.ragged:
            if grid is None or not _adapts(grid):
                raise ValueError("ResultsWriter.append: grid (the grid of f, an adaptive grid) is required for a "
                                 "run whose cells change per saved state")
            if np.shape(f) != (grid.n_cells,):
                raise ValueError(f"ResultsWriter.append: f has shape {np.shape(f)}, its grid {grid.n_cells} cells")
        _preflight(self.path, 8 * (5 if self.ragged else 1) * np.size(f) + 128 + _dict_bytes(diagnostics))
        with _writing(self.path):
            self._append(t, f, diagnostics, n_steps, wall_time, grid)

    def _append(self, t, f, diagnostics, n_steps, wall_time, grid=None):
        n = self.n_saved
        self.h["time"].resize((n + 1,))
        self.h["time"][n] = t
        if self.ragged:
            vals = _ragged_values(grid, f)
            m, k = self.h["uniq"].shape[0], vals["uniq"].shape[0]
            for name in ("cell",) + _RAGGED:
                self.h[name].resize((m + k,))
            self.h["cell"][m:] = np.arange(m, m + k)
            for name, a in vals.items():
                self.h[name][m:] = a
            self.h["cell_count"].resize((n + 1,))
            self.h["cell_count"][n] = k
            digest = _frame_digest(self.h["time"][n], self.h["density"][m:], self.h["uniq"][m:])
        else:
            self.h["density"].resize((n + 1, self.n_cells))
            self.h["density"][n] = f
            digest = _frame_digest(self.h["time"][n], self.h["density"][n])
        self.h["checksums"].resize((n + 1,))
        self.h["checksums"][n] = digest.encode()
        if diagnostics is not None:
            _write_dict_group(self.h, "diagnostics", diagnostics, self.dim)
        self.h.attrs["n_steps"] = int(n_steps)
        self.h.attrs["wall_time"] = float(wall_time)
        self.h.flush()

    def write_group(self, name: str, data: dict):
        """Write (replace) a group of arrays, e.g. ``"concentration"`` or ``"particles"``."""
        _preflight(self.path, _dict_bytes(data))
        with _writing(self.path):
            _write_dict_group(self.h, name, data, self.dim)
            self.h.flush()

    def finish(self, diagnostics: dict, n_steps: int, wall_time: float):
        _preflight(self.path, _dict_bytes(diagnostics))
        with _writing(self.path):
            _write_dict_group(self.h, "diagnostics", diagnostics, self.dim)
            self.h.attrs["n_steps"] = int(n_steps)
            self.h.attrs["wall_time"] = float(wall_time)
            self.h.attrs["complete"] = True
            self.h.flush()

    def close(self):
        """Close the file; after a failed write (disk full) closing fails too, and is then only logged: the
        file is damaged, its checksums tell, and the error that matters is the write's."""
        if self.h.id.valid:
            try:
                self.h.close()
            except (OSError, RuntimeError) as exc:
                log.debug("closing %s after a failed write: %s", self.path, exc)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def save_result(result, path, config=None, extra_groups: dict | None = None):
    """Write a complete :class:`~spherepde.solver.Result` to ``path`` (HDF5).

    ``config`` (an :class:`~spherepde.config.ExperimentConfig`) makes the file loadable with the grid and
    model rebuilt; without it, :func:`load` returns ``grid = model = None`` unless the grid is HEALPix.
    """
    with ResultsWriter(path, config, result.grid, result.options, result.model) as w:
        for i, (t, f) in enumerate(zip(result.times, result.density)):
            w.append(float(t), f, grid=result.grid_at(i))
        for name, data in (extra_groups or {}).items():
            w.write_group(name, data)
        w.finish(result.diagnostics, result.n_steps, result.wall_time)
    return Path(path)


def load_config_of(path):
    """The :class:`~spherepde.config.ExperimentConfig` stored in a results file (or None)."""
    from .config import parse_config

    with h5py.File(path, "r") as h:
        text = h["config"].attrs.get("toml", "")
    return parse_config(text) if text else None


def _read_group(h, name) -> dict:
    if name not in h:
        return {}
    return _group_data(h[name])


def load(path, rebuild: bool = True, verify: bool = True):
    """Read a results file into a :class:`spherepde.solver.Result`.

    Parameters
    ----------
    path : str or Path
    rebuild : bool, default True
        Rebuild the grid and model from the stored configuration (a HEALPix grid is rebuilt from its
        nside even without one). With False, ``grid`` and ``model`` are None.
    verify : bool, default True
        Check the SHA-256 checksum of every frame, group and of the configuration: a damaged file is a
        :class:`DamagedFileError` (a ``ValueError``) naming what fails, never data returned as if it were
        right. A file whose datasets are not of the layout written here, or would not fit in memory, is
        refused before anything is read.

    Returns
    -------
    Result
        ``metadata`` holds ``config`` (ExperimentConfig or None), ``versions``, ``grid_attrs``,
        ``complete``, ``path`` and the optional groups ``concentration`` and ``particles``.
    """
    from .config import parse_config
    from .solver import Options, Result

    path = Path(path)
    try:
        with h5py.File(path, "r") as h:
            if h.attrs.get("format") != FORMAT:
                raise ValueError(f"{path} is not a spherepde results file (attribute format = "
                                 f"{h.attrs.get('format')!r}, expected {FORMAT!r})")
            _check_readable(path, h)
            if verify:
                _verify(path, h)
            times = _times(h)[()]
            density = h["density"][()]
            cells = None
            if _ragged(h):  # cells per saved state
                start, stop = _frame_bounds(h)
                uniq = h["uniq"][()]
                density = [density[a:b] for a, b in zip(start, stop)]
                cells = [uniq[a:b] for a, b in zip(start, stop)]
            diagnostics = _read_group(h, "diagnostics")
            text = h["config"].attrs.get("toml", "")
            opt_json = h["config"].attrs.get("options_json", "")
            vers = dict(h["versions"].attrs)
            gattrs = dict(h["grid"].attrs)
            meta = {
                "versions": {k: str(v) for k, v in vers.items()},
                "grid_attrs": {k: (v.item() if getattr(v, "size", 1) == 1 and hasattr(v, "item") else v)
                               for k, v in gattrs.items()},
                "complete": bool(h.attrs.get("complete", False)),
                "path": str(path),
                "concentration": _read_group(h, "concentration"),
                "particles": _read_group(h, "particles"),
                "created": str(h.attrs.get("created", "")),
            }
            if cells is not None:
                meta["uniq"] = cells
            n_steps = int(h.attrs.get("n_steps", 0))
            wall = float(h.attrs.get("wall_time", 0.0))
    except (ValueError, FileNotFoundError):
        raise
    except (OSError, KeyError, RuntimeError, TypeError) as exc:  # truncated, overwritten, not HDF5, ...
        raise DamagedFileError(f"{path}: not readable as a results file ({_reason(exc)}): a damaged file") from None
    config = parse_config(text) if text else None
    meta["config"] = config
    options = Options(**json.loads(opt_json)) if opt_json else (config.options() if config else Options())
    grid = model = None
    ga = meta["grid_attrs"]
    if rebuild:
        if config is not None:
            grid, model = config.build_grid(), config.build_model()
        elif ga.get("type") == "healpix":
            from .grids.healpix import HealpixGrid

            grid = HealpixGrid(int(ga["nside"]))
        elif ga.get("type") == "adaptive_healpix":
            grid = _adaptive_base(ga)
    grids = None
    if cells is not None:
        grids = StateGrids(grid, cells) if grid is not None else None
        if grids is not None:
            grid = grids[0] if len(grids) else grid
        if grids is not None and grids.one_cell_set:  # one cell set: as solve() returns it
            density = np.array(density).reshape(len(times), -1)
            grids = None
    return Result(times=times, density=density, diagnostics=diagnostics, grid=grid, model=model, options=options,
                  n_steps=n_steps, wall_time=wall, metadata=meta, grids=grids)


def _adaptive_base(ga: dict):
    """The adaptive grid of a results file's grid attributes (a file written without a configuration)."""
    from .grids.adaptive import AdaptiveHealpixGrid, Refinement

    ref = json.loads(ga.get("refinement", "null"))
    ref = Refinement(**ref) if isinstance(ref, dict) else (None if ref is None else False)
    mc = ga.get("max_cells")
    return AdaptiveHealpixGrid(int(ga["nside_min"]), int(ga["nside_max"]), edge_points=int(ga.get("edge_points", 6)),
                               refinement=ref, max_cells=None if mc is None else int(mc))


class StateGrids(Sequence):
    """The grid of each saved state of a results file (``Result.grids``), built from its cells (NUNIQ) when it
    is first asked for: reading a file costs no grid but the first state's, and a plot of a few states builds
    those. Consecutive states with the same cells share one grid (``grids[i] is grids[i + 1]``), and each grid
    is built from the nearest one built before it (:meth:`~spherepde.grids.adaptive.AdaptiveHealpixGrid.with_cells`
    copies the geometry of the cells they share: a regrid's work per state when read in order; the same bits
    in any order). Measured on the beta 300 transition-law member at nside_max 1024 (121 states of up to 207k
    cells, beside another job): load() 0.5 s, where building every state's grid from scratch took 1.35 s a
    state (2.7 minutes); the first 20 states in order, each from the one before, 0.65 s a state."""

    def __init__(self, base, cells):
        self._base = base
        self._cells = [np.asarray(u, np.int64) for u in cells]
        first = []  # the first state of each run of equal cell sets
        for i, u in enumerate(self._cells):
            first.append(first[-1] if i and np.array_equal(u, self._cells[i - 1]) else i)
        self._first = first
        self._built = {}

    def __len__(self) -> int:
        return len(self._cells)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        n = len(self)
        i = int(i)
        if not -n <= i < n:
            raise IndexError(f"saved state {i} does not exist: there are {n} (0..{n - 1})")
        k = self._first[i % n]
        g = self._built.get(k)
        if g is None:
            below = [j for j in self._built if j < k]
            src = self._built[max(below)] if below else self._base
            g = self._built[k] = src.with_cells({"uniq": self._cells[k]})
        return g

    def areas_at(self, i) -> np.ndarray:
        """The cell areas of state ``i``: its grid's where built, else from its cells alone where the grid class
        says how (:meth:`~spherepde.grids.adaptive.AdaptiveHealpixGrid.cell_areas`: the same bits)."""
        k = self._first[int(i) % len(self)]
        if k not in self._built and hasattr(self._base, "cell_areas"):
            return self._base.cell_areas(self._cells[k])
        return self[i].areas

    @property
    def one_cell_set(self) -> bool:
        """Whether every state has the same cells (a grid that never changed)."""
        return all(f == 0 for f in self._first)


# ----------------------------------------------------------------------------------------- checkpoints
def _checkpoint_digest(state: dict, extra: dict) -> str:
    """SHA-256 of a checkpoint's content, of the values as :func:`read_checkpoint` returns them."""
    parts = [float(state["t"]), int(state["n_steps"]), float(state["l0"]), np.asarray(state["f"], dtype=float)]
    for k in sorted(state["diag"]):
        parts += [k, np.asarray(state["diag"][k], dtype=float)]
    hist = state.get("history", [])
    parts.append(np.array([t for t, _ in hist], dtype=float))
    parts += [np.asarray(m) for _, m in hist]
    for i, ms in enumerate(state.get("history_means") or []):  # older checkpoints have none (their digests hold)
        if ms is not None:
            parts += [f"means{i}", *[np.asarray(m) for m in ms]]
    ctl = state.get("controller", {})
    for k in sorted(ctl):
        parts += [k, ctl[k]]
    cells = state.get("grid") or {}
    if cells:  # a grid that adapts: its cells (older checkpoints have none, and their digests hold)
        parts += ["n_regrids", int(state.get("n_regrids", 0))]
        for k in sorted(cells):
            parts += [k, np.asarray(cells[k])]
    for k in sorted(extra):
        parts += [k, extra[k]]
    return _digest(*parts)


def write_checkpoint(path, state: dict, extra: dict | None = None):
    """Write a solver state atomically: to ``path.tmp``, fsync, then ``os.replace`` onto ``path``.

    Parameters
    ----------
    state : dict
        ``Solver.get_state()``: t, f, n_steps, l0, diag (dict of lists), history (list of (t, array)): the
        field history of ``field_interval`` (face normal-velocity weights), history_means (per entry, the
        attention heads' means at the cell centres, which a regrid moves; None or absent: not kept), controller (dict of scalars:
        the step-size controller's proposal and the field-extrapolation estimate), grid (the cells of a
        grid that adapts, ``Grid.cells_state()``: {"uniq": NUNIQ}; {} for a fixed grid) and n_regrids.
    extra : dict of scalars
        Runner bookkeeping (number of saved frames, elapsed wall time, config JSON, ...).
    """
    import io as _pyio

    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    # built in memory, then written with one plain write: a full disk is a clean OSError of that write
    # (HDF5 writing to a full disk cannot recover, and h5py then crashes closing the file)
    buf = _pyio.BytesIO()
    _write_checkpoint_to(buf, state, extra)
    data = buf.getvalue()
    with _writing(tmp):
        _preflight(tmp, len(data) // 2)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
    os.replace(tmp, path)
    # persist the rename itself
    try:
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:  # pragma: no cover - some file systems refuse fsync on directories
        pass


def _write_checkpoint_to(target, state, extra):
    with h5py.File(target, "w") as h:
        h.attrs["t"] = float(state["t"])
        h.attrs["n_steps"] = int(state["n_steps"])
        h.attrs["l0"] = float(state["l0"])
        h.create_dataset("f", data=np.asarray(state["f"], dtype=float))
        dg = h.create_group("diag")
        for k, v in state["diag"].items():
            dg.create_dataset(k, data=np.asarray(v, dtype=float))
        hist = state.get("history", [])
        hg = h.create_group("history")
        hg.create_dataset("t", data=np.array([t for t, _ in hist], dtype=float))
        for i, (_, m) in enumerate(hist):
            hg.create_dataset(f"m{i}", data=np.asarray(m))
        for i, ms in enumerate(state.get("history_means") or []):  # the heads' means of entry i
            if ms is not None:
                for j, m in enumerate(ms):
                    hg.create_dataset(f"means{i}_{j}", data=np.asarray(m))
        cg = h.create_group("controller")  # the step-size controller's state (exact resume)
        for k, v in state.get("controller", {}).items():
            cg.attrs[k] = v
        gg = h.create_group("grid")  # the cells of a grid that adapts (Grid.cells_state; empty: a fixed grid)
        for k, v in (state.get("grid") or {}).items():
            gg.create_dataset(k, data=np.asarray(v))
        h.attrs["n_regrids"] = int(state.get("n_regrids", 0))
        for k, v in (extra or {}).items():
            h.attrs[f"extra_{k}"] = v
        h.attrs["sha256"] = _checkpoint_digest(state, extra or {})


def _history_means(group, i: int):
    """The heads' means of history entry i (``means{i}_{j}``), None when the checkpoint has none."""
    ms, j = [], 0
    while f"means{i}_{j}" in group:
        ms.append(group[f"means{i}_{j}"][()])
        j += 1
    return ms or None


def checkpoint_config_json(path):
    """The configuration JSON a checkpoint was written for (its ``extra`` ``config_json``; None if it has none),
    without reading or verifying its state: :func:`read_checkpoint` does that when the run resumes."""
    with h5py.File(path, "r") as h:
        js = h.attrs.get("extra_config_json")
    return None if js is None else str(js)


def read_checkpoint(path):
    """Return ``(state, extra)`` written by :func:`write_checkpoint`; ``state`` feeds ``Solver.set_state``.
    A checkpoint whose content fails its SHA-256 checksum is a :class:`DamagedFileError`."""
    with h5py.File(path, "r") as h:
        hist_t = h["history"]["t"][()]
        state = {
            "t": float(h.attrs["t"]),
            "n_steps": int(h.attrs["n_steps"]),
            "l0": float(h.attrs["l0"]),
            "f": h["f"][()],
            "diag": {k: h["diag"][k][()].tolist() for k in h["diag"]},
            "history": [(float(t), h["history"][f"m{i}"][()]) for i, t in enumerate(hist_t)],
            "history_means": [_history_means(h["history"], i) for i in range(len(hist_t))],
            "controller": {k: v.item() if hasattr(v, "item") else v
                           for k, v in (h["controller"].attrs.items() if "controller" in h else ())},
            "grid": {k: h["grid"][k][()] for k in h["grid"]} if "grid" in h else {},
            "n_regrids": int(h.attrs.get("n_regrids", 0)),
        }
        extra = {k[len("extra_"):]: (v.item() if hasattr(v, "item") else v)
                 for k, v in h.attrs.items() if k.startswith("extra_")}
        stored = h.attrs.get("sha256")
    if stored is None:
        log.warning("%s: a checkpoint without a checksum (an older version): its content is not verified", path)
    elif stored != _checkpoint_digest(state, extra):
        raise DamagedFileError(f"{path}: the checkpoint fails its checksum: it is damaged")
    return state, extra


# ----------------------------------------------------------------------------------------- FITS
def write_fits(result, path, index: int = -1, overwrite: bool = True):
    """Write the density at saved index ``index`` as a HEALPix FITS map (RING order, healpy).

    The map holds the cell averages (density w.r.t. surface measure); the header records the time. A state
    on an adaptive grid is written as a multi-order map (``ORDERING = 'NUNIQ'``: a binary table of the
    columns UNIQ and DENSITY, the format of ligo.skymap and mhealpy, ``mhealpy.HealpixMap.read_map``
    reads it); ``result.to_healpix(index, nside)`` gives a uniform map for healpy instead.
    """
    import healpy as hp

    grid = result.grid_at(index)
    if hasattr(grid, "uniq"):
        return _write_multiorder_fits(grid, result.density[index], float(result.times[index]), path, overwrite)
    nside = getattr(grid, "nside", None)
    if nside is None:
        nside = result.metadata.get("grid_attrs", {}).get("nside")
    if nside is None:
        raise ValueError("write_fits needs a HEALPix grid (this result's grid has no nside)")
    m = np.asarray(result.density[index], dtype=float)
    if m.shape != (12 * int(nside) ** 2,):
        raise ValueError(f"density has shape {m.shape}, not a HEALPix map of nside {nside}")
    t = float(result.times[index])
    hp.write_map(str(path), m, nest=False, coord="C", column_names=["DENSITY"], overwrite=overwrite,
                 dtype=np.float64, extra_header=[("TIME", t, "simulated time"),
                                                 ("CREATOR", "spherepde", "")])
    return Path(path)


def _write_multiorder_fits(grid, f, t: float, path, overwrite: bool):
    """A multi-order HEALPix map (NUNIQ): one row per cell, UNIQ (int64) and DENSITY (float64)."""
    from astropy.io import fits

    cols = [fits.Column(name="UNIQ", format="K", array=np.asarray(grid.uniq, np.int64)),
            fits.Column(name="DENSITY", format="D", unit="sr-1", array=np.asarray(f, float))]
    hdu = fits.BinTableHDU.from_columns(cols)
    for key, value, comment in (("PIXTYPE", "HEALPIX", "HEALPIX pixelisation"),
                                ("ORDERING", "NUNIQ", "multi-order: UNIQ = 4 nside^2 + ipix (NESTED)"),
                                ("INDXSCHM", "EXPLICIT", "indexing: explicit pixel indices"),
                                ("COORDSYS", "C", "coordinates: the sphere's own frame"),
                                ("MOCORDER", int(grid.order.max()), "finest order present"),
                                ("TIME", float(t), "simulated time"), ("CREATOR", "spherepde", "")):
        hdu.header[key] = (value, comment)
    hdu.writeto(str(path), overwrite=overwrite)
    return Path(path)
