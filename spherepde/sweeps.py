"""Sweeps: ensembles and parameter scans of experiments, run on Dask, collected as one xarray dataset.

A sweep is a base experiment (an ordinary experiment configuration) and axes: config keys with lists
of values. Every combination of the axes is a *member*, an ordinary run of
:func:`spherepde.runner.run_experiment` in its own directory (results file and checkpoint). The members
run on Dask: by default on a :class:`distributed.LocalCluster` that the sweep starts and closes (one
worker process per core), or on any running Dask cluster given by its scheduler address
(``dask scheduler``, dask-jobqueue on SLURM/PBS, dask-kubernetes).

Functions
---------
sweep(spec, output=None, workers=None, scheduler=None, ...) -> xarray.Dataset
    Run a sweep (a SWEEP.toml path, TOML text, a dict or a :class:`SweepSpec`); rerun with the same
    arguments to resume it. Also ``spherepde sweep SWEEP.toml`` on the command line, and
    ``spherepde.sweep(...)`` (exported at the top level with ``open_sweep`` and ``load_sweep``).
open_sweep(path) -> xarray.Dataset
    The dataset of a sweep directory (or of its ``sweep.nc``).
load_sweep(path) / parse_sweep(source) -> SweepSpec
    Read and validate a sweep specification without running it.

A sweep file::

    [sweep]
    name = "beta_scan"                          # default: the file's stem
    base = "paper_attention.toml"               # the base experiment, relative to this file ...
    figures = false                             # per-member figures (default false)

    [base]                                      # ... or the base experiment inline (its sections)
    grid = {type = "healpix", nside = 16}
    ...

    [set]                                       # overrides applied to every member
    "time.t_end" = 10.0

    [axes]                                      # one dimension each, their product is the sweep
    "model.beta" = [30.0, 100.0, 300.0, inf]    # a list
    "grid.nside" = {values = [8, 16]}           # the same
    "particles.seed" = {range = [0, 5]}         # range(start, stop[, step]): seeds 0..4
    "initial.eps" = {linspace = [0.0, 0.1, 5]}  # also geomspace = [start, stop, num]

    [zip.case]                                  # keys that vary together: one dimension "case"
    "model.beta" = [30.0, 100.0]
    "time.t_end" = [40.0, 50.0]

Keys are ``section.key`` of the experiment configuration (or ``name``); written unquoted
(``model.beta = [...]``) TOML nests them, which is read the same way. The dimensions are the [axes]
in their order, then the [zip] tables; members are numbered in row-major order of that product.

A sweep directory holds::

    sweep.toml          the specification as given
    members.json        every member: index, coordinates, key, directory
    sweep.nc            the dataset (NetCDF4 / HDF5, CF conventions; written atomically)
    members/<key>/      one run directory per member (experiment.toml, results.h5, checkpoint.h5,
                        record.json: the member's outcome, written atomically when it is finished)

Resume and faults. A member is identified by ``key``, the SHA-256 of its full validated configuration
(defaults filled in: a version whose default changed gets new keys, so a cached member never stands for a
run this version would do differently; the price is that a version adding an option recomputes each
member once). A rerun skips members whose ``record.json`` carries their key, and
``run_experiment`` resumes a partial member from its checkpoint bit for bit, so a sweep killed at any
moment and rerun gives the dataset of an uninterrupted sweep. A member that raises is recorded with
``status = "failed"`` and its error and the others go on; its next rerun tries it again. When a worker
process dies, Dask's scheduler gives its member to another worker, which resumes from the checkpoint.
Every member directory is locked (``flock``) while a process runs it, so a member is never run twice at
once, e.g. by an orphan worker of a killed driver.

The dataset: dimensions = the sweep axes (plus ``time`` for the per-frame variables); each config key
of an axis is a coordinate (``config_key`` attribute); variables (all with ``long_name`` and ``units``)

* per saved time: ``mass``, ``min_density``, ``max_density``, ``n_cells`` of the density frames, and, where the
  model has (B, V), ``w2_limit`` (W2(rho_t, Pi#rho_0)), ``alignment_E``, ``alignment_F``,
  ``alignment_F_abs`` (the runner's concentration diagnostics);
* per member: ``t_EF``, ``t_exit``, ``min_w2``, ``argmin_w2``, ``final_alignment_{E,F,F_abs}``,
  ``n_steps``, ``n_rejected``, ``mass_drift`` (max over the steps of |mass / mass_0 - 1|),
  ``min_density_steps`` (min over the steps), ``wall_time``, ``status``, ``error``, ``member_key`` and
  ``results_file`` (the member's results.h5, relative to the sweep directory).

Members save at their own times; ``time`` is the union, and a member's value is NaN at a time it did
not save.
"""
from __future__ import annotations

import contextlib
import copy
import hashlib
import itertools
import json
import logging
import math
import os
import sys
import time
import tomllib
import weakref
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .config import ConfigError, ExperimentConfig, parse_config, read_source

__all__ = ["sweep", "open_sweep", "load_sweep", "parse_sweep", "SweepSpec", "Axis", "Member", "run_member",
           "member_record", "DATASET_NAME"]

log = logging.getLogger(__name__)

DATASET_NAME = "sweep.nc"
RECORD_NAME = "record.json"
SPEC_NAME = "sweep.toml"
MEMBERS_NAME = "members.json"
_GENERATORS = ("values", "range", "linspace", "geomspace")
#: Seconds between a sweep's checks that its Dask cluster still has workers: a LocalCluster the sweep started
#: that has lost every worker (a restart that failed, e.g. after the machine was suspended past the
#: scheduler's worker-ttl while loaded) is scaled back up, instead of waiting for one forever; with a
#: cluster of the caller's, the sweep says that it waits.
WORKER_WATCH_S = 60.0
#: The LocalClusters that :func:`_client` started, with their worker counts.
_OWNED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()

#: Variables per saved time and per member: name -> (long_name, units).
FRAME_VARS = {
    "mass": ("total mass int f of the density frame", "1"),
    "min_density": ("minimum cell average of the density frame", "1"),
    "max_density": ("maximum cell average of the density frame", "1"),
    "n_cells": ("cells of the frame's grid (an adaptive grid's change from frame to frame)", "1"),
    "w2_limit": ("W2 distance (chordal cost) of rho_t to the limit measure Pi#rho_0", "1"),
    "alignment_E": ("alignment int |P_E x|^2 drho_t with the eigenspace E", "1"),
    "alignment_F": ("alignment int |P_F x|^2 drho_t with the eigenspace F", "1"),
    "alignment_F_abs": ("alignment int |P_F_abs x|^2 drho_t with the eigenspace F_abs", "1"),
}
SCALAR_VARS = {
    "t_EF": ("E-to-F transition time (spherepde.diagnostics.transition_time; NaN: not in the window)", "1"),
    "t_exit": ("end of the E-phase, alignment_E back below 0.9 (spherepde.diagnostics.exit_time)", "1"),
    "min_w2": ("minimum over the saved times of w2_limit", "1"),
    "argmin_w2": ("saved time of min_w2", "1"),
    "final_alignment_E": ("alignment_E at the last saved time", "1"),
    "final_alignment_F": ("alignment_F at the last saved time", "1"),
    "final_alignment_F_abs": ("alignment_F_abs at the last saved time", "1"),
    "n_steps": ("accepted time steps of the run", "1"),
    "n_rejected": ("time steps rejected by the error control", "1"),
    "mass_drift": ("max over the steps of |mass / mass_0 - 1|", "1"),
    "min_density_steps": ("minimum cell average over all steps", "1"),
    "wall_time": ("solver wall-clock time of the member", "s"),
}
STRING_VARS = {
    "status": "member outcome: done or failed",
    "error": "the error of a failed member (empty when done)",
    "member_key": "SHA-256 of the member's validated configuration (its directory is members/<key[:16]>)",
    "results_file": "the member's results file, relative to the sweep directory",
}


# ----------------------------------------------------------------------------------------- the spec
@dataclass(frozen=True)
class Axis:
    """One dimension of a sweep: ``dim`` (its name), the config ``keys`` it sets, and for each key the
    list of values (all of one length: the keys of a zip vary together)."""

    dim: str
    keys: tuple
    values: tuple  # one tuple of values per key

    def __len__(self):
        return len(self.values[0])


@dataclass(frozen=True)
class Member:
    """One run of a sweep: its position ``index`` (one integer per axis), ``coords`` (config key ->
    value), validated ``config`` and ``key`` (SHA-256 of the configuration)."""

    index: tuple
    coords: dict
    config: ExperimentConfig
    key: str

    @property
    def dirname(self) -> str:
        return self.key[:16]

    def label(self) -> str:
        return ", ".join(f"{k} = {_fmt_value(v)}" for k, v in self.coords.items())


@dataclass(frozen=True)
class SweepSpec:
    """A validated sweep: the base experiment (a raw config dict), fixed overrides, axes."""

    name: str
    base: dict
    axes: tuple
    overrides: dict = field(default_factory=dict)
    description: str = ""
    figures: bool = False
    text: str = field(default="", repr=False, compare=False)

    @property
    def shape(self) -> tuple:
        return tuple(len(a) for a in self.axes)

    def members(self) -> list:
        """Every member, validated (a :class:`ConfigError` names the member and the key)."""
        out = []
        for index in itertools.product(*(range(len(a)) for a in self.axes)):
            raw = copy.deepcopy(self.base)
            for k, v in self.overrides.items():
                _set_key(raw, k, v)
            coords = {}
            for a, i in zip(self.axes, index):
                for k, vals in zip(a.keys, a.values):
                    _set_key(raw, k, vals[i])
                    coords[k] = vals[i]
            try:
                cfg = parse_config(raw)
            except ConfigError as exc:
                where = ", ".join(f"{k} = {_fmt_value(v)}" for k, v in coords.items())
                raise ConfigError(exc.key, exc.value, f"{exc.allowed} (in the sweep member {where})") from None
            out.append(Member(index=tuple(index), coords=coords, config=cfg, key=config_key(cfg)))
        keys = [m.key for m in out]
        if len(set(keys)) != len(keys):
            dup = next(m for m in out if keys.count(m.key) > 1)
            raise ConfigError("axes", dup.label(), "axes whose combinations give different configurations "
                              "(two members have the same configuration)")
        return out


def config_key(cfg: ExperimentConfig) -> str:
    """SHA-256 of the validated configuration (its JSON with the defaults filled in)."""
    return hashlib.sha256(cfg.to_json().encode()).hexdigest()


def _fmt_value(v) -> str:
    if isinstance(v, float):
        return "inf" if v == math.inf else f"{v:g}"
    return json.dumps(v) if not isinstance(v, str) else v


def _set_key(raw: dict, key: str, value):
    parts = key.split(".")
    if len(parts) == 1:
        raw[key] = value
        return
    if len(parts) != 2:
        raise ConfigError(key, value, "a key 'section.key' of the experiment configuration (e.g. model.beta)")
    sec = raw.setdefault(parts[0], {})
    if not isinstance(sec, dict):
        raise ConfigError(key, value, f"a key of the table [{parts[0]}]")
    sec[parts[1]] = value


def _flatten(table: dict, where: str, prefix: str = "") -> dict:
    """Dotted keys -> values; nested tables (TOML's unquoted dotted keys) are flattened, generator tables
    ({range = ...}) are values."""
    out = {}
    for k, v in table.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and not (v and set(v) <= set(_GENERATORS)):
            out.update(_flatten(v, where, key + "."))
        else:
            out[key] = v
    return out


def _axis_values(v, where: str, unique: bool = True) -> list:
    allowed = ("a non-empty list of values, or a table {values = [...]}, {range = [start, stop(, step)]} "
               "(integers), {linspace = [start, stop, num]} or {geomspace = [start, stop, num]}")
    if isinstance(v, list):
        vals = v
    elif isinstance(v, dict) and len(v) == 1:
        (kind, arg), = v.items()
        if kind == "values" and isinstance(arg, list):
            vals = arg
        elif kind == "range" and isinstance(arg, list) and 1 <= len(arg) <= 3 \
                and all(isinstance(a, int) and not isinstance(a, bool) for a in arg) and (len(arg) < 3 or arg[2]):
            vals = list(range(*arg))
        elif kind in ("linspace", "geomspace") and isinstance(arg, list) and len(arg) == 3 \
                and all(isinstance(a, (int, float)) and not isinstance(a, bool) and math.isfinite(a) for a in arg) \
                and isinstance(arg[2], int) and arg[2] >= 1 and (kind == "linspace" or arg[0] * arg[1] > 0):
            fn = np.linspace if kind == "linspace" else np.geomspace
            vals = [float(x) for x in fn(arg[0], arg[1], int(arg[2]))]
        else:
            raise ConfigError(where, v, allowed)
    else:
        raise ConfigError(where, v, allowed)
    if not vals:
        raise ConfigError(where, v, allowed)
    keyed = [json.dumps(x, sort_keys=True) for x in vals]
    if unique and len(set(keyed)) != len(keyed):
        raise ConfigError(where, v, "values without repetitions")
    return vals


_SPEC_TABLES = ("sweep", "base", "set", "axes", "zip")


def parse_sweep(source, base_dir=None, default_name: str = "sweep") -> SweepSpec:
    """Validate a sweep given as TOML text or a dict (see the module docstring for the format).

    ``base_dir`` resolves a relative ``sweep.base`` path (default: the working directory). Every member's
    configuration is validated here; a :class:`ConfigError` names the key and the member.
    """
    raw, text = read_source(source, dump_sweep)
    for k in raw:
        if k not in _SPEC_TABLES:
            raise ConfigError(k, raw[k] if not isinstance(raw[k], dict) else f"[{k}]",
                              f"the tables {', '.join(f'[{t}]' for t in _SPEC_TABLES)} of a sweep file (unknown key)")
    sw = raw.get("sweep", {})
    if not isinstance(sw, dict):
        raise ConfigError("sweep", sw, "a table [sweep]")
    for k in sw:
        if k not in ("name", "description", "base", "figures"):
            raise ConfigError(f"sweep.{k}", sw[k], "known keys of [sweep] are name, description, base, figures "
                              "(unknown key)")
    name = sw.get("name", default_name)
    if not isinstance(name, str) or not name or "/" in name:
        raise ConfigError("sweep.name", name, "a non-empty string without '/'")
    figures = sw.get("figures", False)
    if not isinstance(figures, bool):
        raise ConfigError("sweep.figures", figures, "true or false")
    if ("base" in sw) == ("base" in raw):
        raise ConfigError("sweep.base", sw.get("base"), "exactly one of sweep.base (a path to an experiment "
                          "TOML file) and an inline [base] table")
    if "base" in sw:
        if not isinstance(sw["base"], str):
            raise ConfigError("sweep.base", sw["base"], "a path to an experiment TOML file")
        p = Path(sw["base"])
        if not p.is_absolute():
            p = Path(base_dir or ".") / p
        if not p.is_file():
            raise ConfigError("sweep.base", sw["base"], f"an existing experiment file (not found: {p})")
        try:
            base = tomllib.loads(p.read_text())
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError("sweep.base", str(p), f"valid TOML ({exc})") from None
    else:
        base = raw["base"]
        if not isinstance(base, dict):
            raise ConfigError("base", base, "a table [base] holding an experiment's sections")
    overrides = raw.get("set", {})
    if not isinstance(overrides, dict):
        raise ConfigError("set", overrides, "a table [set] of config keys and values")
    overrides = _flatten(overrides, "set")
    axes, dims = [], set()
    ax = raw.get("axes", {})
    if not isinstance(ax, dict):
        raise ConfigError("axes", ax, "a table [axes] of config keys and lists of values")
    used = set(overrides)
    for k, v in _flatten(ax, "axes").items():
        axes.append(Axis(dim=k, keys=(k,), values=(tuple(_axis_values(v, f"axes.{k}")),)))
    zp = raw.get("zip", {})
    if not isinstance(zp, dict) or not all(isinstance(t, dict) for t in zp.values()):
        raise ConfigError("zip", zp, "tables [zip.<dimension name>] of config keys and lists of equal length")
    for zname, table in zp.items():
        flat = _flatten(table, f"zip.{zname}")
        if not flat:
            raise ConfigError(f"zip.{zname}", table, "at least one config key with a list of values")
        vals = tuple(tuple(_axis_values(v, f"zip.{zname}.{k}", unique=False)) for k, v in flat.items())
        if len({len(v) for v in vals}) != 1:
            raise ConfigError(f"zip.{zname}", {k: len(v) for k, v in zip(flat, vals)},
                              "lists of one length (the keys of a zip vary together)")
        rows = [json.dumps(r, sort_keys=True) for r in zip(*vals)]
        if len(set(rows)) != len(rows):
            raise ConfigError(f"zip.{zname}", table, "combinations without repetitions")
        axes.append(Axis(dim=zname, keys=tuple(flat), values=vals))
    for a in axes:
        for k in a.keys:
            if k in used:
                raise ConfigError(k, "set twice", "each config key in at most one of [set], [axes], [zip.*]")
            used.add(k)
    # dimension names: a key's last component, unless two would clash
    short = [k.split(".")[-1] for a in axes for k in a.keys]
    reserved = set(FRAME_VARS) | set(SCALAR_VARS) | set(STRING_VARS) | {"time"}
    named = []
    for a in axes:
        if len(a.keys) == 1:
            k = a.keys[0]
            s = k.split(".")[-1]
            dim = s if short.count(s) == 1 and s not in reserved and s not in zp else k.replace(".", "_")
        else:
            dim = a.dim
            if dim in reserved:
                raise ConfigError(f"zip.{dim}", dim, f"a dimension name other than {', '.join(sorted(reserved))}")
        if dim in dims:
            raise ConfigError(f"zip.{a.dim}", dim, "dimension names that differ from each other and the axes'")
        dims.add(dim)
        named.append(Axis(dim=dim, keys=a.keys, values=a.values))
    spec = SweepSpec(name=name, base=base, axes=tuple(named), overrides=overrides,
                     description=str(sw.get("description", "")), figures=figures,
                     text=text)
    spec.members()  # validate every member now, before anything runs
    return spec


def _toml_key(k: str) -> str:
    return k if k.replace("_", "").replace("-", "").isalnum() else json.dumps(k)


def _toml_val(v) -> str:
    from .config import _toml_value

    if isinstance(v, dict):
        return "{" + ", ".join(f"{_toml_key(k)} = {_toml_val(x)}" for k, x in v.items()) + "}"
    return _toml_value(v)


def dump_sweep(raw: dict, path: tuple = ()) -> str:
    """TOML text of a sweep given as a dict (recorded as sweep.toml for sweeps built in Python)."""
    def is_table(v):
        return isinstance(v, dict) and not (v and set(v) <= set(_GENERATORS))

    lines = []
    leaves = [(k, v) for k, v in raw.items() if not is_table(v)]
    if path and (leaves or not any(is_table(v) for v in raw.values())):
        lines.append("[" + ".".join(_toml_key(p) for p in path) + "]")
    lines += [f"{_toml_key(k)} = {_toml_val(v)}" for k, v in leaves]
    for k, v in raw.items():
        if is_table(v):
            lines.append(dump_sweep(v, path + (k,)).rstrip("\n"))
    return "\n".join(lines) + "\n"


def load_sweep(path) -> SweepSpec:
    """Read and validate a sweep file (``sweep.base`` is relative to the file's folder)."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"sweep file not found: {p}")
    return parse_sweep(p.read_text(), base_dir=p.parent, default_name=p.stem)


def _as_spec(spec) -> SweepSpec:
    if isinstance(spec, SweepSpec):
        return spec
    if isinstance(spec, dict):
        return parse_sweep(spec)
    if isinstance(spec, (str, os.PathLike)) and Path(spec).suffix == ".toml" and "\n" not in str(spec):
        return load_sweep(spec)
    if isinstance(spec, str):
        return parse_sweep(spec)
    raise TypeError(f"spec must be a SweepSpec, a sweep file path, TOML text or a dict, got {type(spec).__name__}")


# ----------------------------------------------------------------------------------------- a member
def member_record(result, cfg: ExperimentConfig) -> dict:
    """The outcome of a finished run as plain data: per-frame series and scalars (see the module
    docstring); ``result`` is the run's :class:`spherepde.solver.Result` read back from its file."""
    from .diagnostics import exit_time, transition_time

    times = np.asarray(result.times, float)
    dens = [np.asarray(f, float) for f in result.density]  # each frame on its own grid (an adaptive one)
    nan = np.full(len(times), np.nan)
    conc = result.metadata.get("concentration") or {}
    mass = np.asarray(result.density, float) @ result.grid.areas if result.grids is None else \
        np.array([f @ result.areas_at(i) for i, f in enumerate(dens)])  # (one product: as solve's users)
    frames = {
        "mass": mass,
        "min_density": np.array([f.min() for f in dens]),
        "max_density": np.array([f.max() for f in dens]),
        "n_cells": np.array([f.size for f in dens], float),
        "w2_limit": np.asarray(conc.get("w2_limit", nan), float),
        "alignment_E": np.asarray(conc.get("alignment_E", nan), float),
        "alignment_F": np.asarray(conc.get("alignment_F", nan), float),
        "alignment_F_abs": np.asarray(conc.get("alignment_F_abs", nan), float),
    }
    dg = result.diagnostics
    mass = np.asarray(dg["mass"], float)
    w2 = frames["w2_limit"]
    has_w2 = bool(np.isfinite(w2).any())
    i_min = int(np.nanargmin(w2)) if has_w2 else 0
    scalars = {
        "t_EF": transition_time(times, frames["alignment_E"], frames["alignment_F"]),
        "t_exit": exit_time(times, frames["alignment_E"]),
        "min_w2": float(w2[i_min]) if has_w2 else math.nan,
        "argmin_w2": float(times[i_min]) if has_w2 else math.nan,
        "final_alignment_E": float(frames["alignment_E"][-1]),
        "final_alignment_F": float(frames["alignment_F"][-1]),
        "final_alignment_F_abs": float(frames["alignment_F_abs"][-1]),
        "n_steps": float(result.n_steps),
        "n_rejected": float(np.sum(dg.get("rejected", 0.0))),
        "mass_drift": float(np.max(np.abs(mass / mass[0] - 1.0))),
        "min_density_steps": float(np.min(dg["min"])),
        "wall_time": float(result.wall_time),
    }
    return {"times": times.tolist(), "frames": {k: np.asarray(v, float).tolist() for k, v in frames.items()},
            "scalars": scalars}


def _write_json_atomic(path: Path, data):
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as fh:
        json.dump(data, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def run_member(config_text: str, directory: str, key: str, threads: int | None = None,
               figures: bool = False) -> dict:
    """Run one member into ``directory`` (the Dask task of a sweep); returns its record.

    Resumes from the directory's checkpoint; a finished member's record is returned without running.
    A failure is returned as a record with ``status = "failed"`` and the error, not raised, so the
    scheduler does not retry a deterministic failure; a dying worker process is retried by Dask.
    """
    from .runner import directory_lock, postprocess, run_experiment

    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    if threads:
        import numba

        # Dask applies a LocalCluster's env (NUMBA_NUM_THREADS among it) in the worker after spawning it, and
        # spawn first re-imports the driver's main module, which may import numba: numba's config then holds
        # the default thread count and the environment another, and the next JIT compile's config reload
        # raises "Cannot set NUMBA_NUM_THREADS to a different value once the threads have been launched"
        # (seen: the first run of an adaptive sweep from a script, whose kernels were not yet cached). The
        # environment is made to agree with the config numba has; set_num_threads limits the threads used.
        os.environ["NUMBA_NUM_THREADS"] = str(numba.config.NUMBA_NUM_THREADS)
        numba.set_num_threads(max(1, min(int(threads), numba.config.NUMBA_NUM_THREADS)))
    # the sweep's own lock on the member (waiting for an orphan of a killed driver to finish it); the run
    # inside takes the directory's run lock as any run does
    with directory_lock(d, ".lock", wait=600.0):
        done = _read_record(d, key)
        if done is not None:
            return done
        try:
            cfg = parse_config(config_text)
            if config_key(cfg) != key:
                raise RuntimeError("the member's configuration does not match its key (different spherepde "
                                   "version on the worker?)")
            result = run_experiment(cfg, d, figures=False)
            postprocess(result, cfg, d, figures=figures)  # concentration diagnostics into the result and file
            rec = {"key": key, "status": "done", "error": "", **member_record(result, cfg)}
            _write_json_atomic(d / RECORD_NAME, rec)
            return rec
        except Exception as exc:  # recorded, and the sweep goes on
            log.warning("sweep member %s failed: %s: %s", d.name, type(exc).__name__, exc)
            return {"key": key, "status": "failed", "error": f"{type(exc).__name__}: {exc}"}


def _read_record(directory: Path, key: str):
    p = directory / RECORD_NAME
    if not p.is_file():
        return None
    try:
        rec = json.loads(p.read_text())
    except ValueError:
        return None
    return rec if rec.get("key") == key and rec.get("status") == "done" else None


# ----------------------------------------------------------------------------------------- the engine
@contextlib.contextmanager
def _client(workers, scheduler, threads=None, tasks=None):
    """(client, threads per member) for a LocalCluster of ``workers`` processes, or a connection to
    ``scheduler`` (an address, a distributed.Client, or None: Dask's ``scheduler-address`` config /
    ``DASK_SCHEDULER_ADDRESS`` if set, else a LocalCluster). Without ``workers`` the LocalCluster has one
    worker per core but no more than the ``tasks`` (members) to run, so that the cores of a worker that would
    have nothing to do go to the members' threads (one member on 2 cores: one worker, 2 threads)."""
    import dask
    from distributed import Client, LocalCluster

    if scheduler is None and workers is None:
        scheduler = dask.config.get("scheduler-address", None)
    if scheduler is not None:
        if workers is not None:
            raise ValueError("workers and scheduler: give one (workers starts a LocalCluster, scheduler "
                             "connects to a running one)")
        if isinstance(scheduler, Client):
            yield scheduler, threads
            return
        with Client(scheduler) as client:
            yield client, threads
        return
    ncpu = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    n = (ncpu if tasks is None else max(1, min(ncpu, int(tasks)))) if workers is None else int(workers)
    if n < 1:
        raise ValueError(f"workers must be an integer >= 1, got {workers!r}")
    threads = max(1, ncpu // n) if threads is None else int(threads)
    env = {"NUMBA_NUM_THREADS": str(threads), "OMP_NUM_THREADS": str(threads), "OMP_WAIT_POLICY": "PASSIVE"}
    # distributed logs every connection at INFO; a sweep's own progress bar and table say what matters
    for name in ("distributed", "distributed.scheduler", "distributed.nanny", "distributed.core",
                 "distributed.worker", "distributed.http.proxy"):
        logger = logging.getLogger(name)
        if logger.getEffectiveLevel() < logging.WARNING:
            logger.setLevel(logging.WARNING)
    import multiprocessing

    hint = ("the LocalCluster's worker processes are started with multiprocessing's spawn method, which "
            "imports the calling script again: in a script, call spherepde.sweep under "
            "`if __name__ == \"__main__\":`")
    if multiprocessing.parent_process() is not None and multiprocessing.current_process().name.startswith("Dask"):
        raise RuntimeError(f"spherepde.sweep called while a Dask worker process starts: {hint}")
    try:
        with dask.config.set({"distributed.worker.daemon": False}):
            cluster = LocalCluster(n_workers=n, threads_per_worker=1, processes=True, env=env,
                                   dashboard_address=":0", silence_logs=logging.ERROR)
    except RuntimeError as exc:
        raise RuntimeError(f"could not start a LocalCluster of {n} workers ({exc}); if this is a script, {hint}") \
            from exc
    _OWNED[cluster] = n
    try:
        with Client(cluster) as client:
            yield client, threads
    finally:
        cluster.close()


class _WorkerWatch:
    """Every WORKER_WATCH_S seconds (:meth:`check`), the number of workers connected to the sweep's scheduler.
    When none has been for two checks in a row (a worker that a nanny restarts is back within seconds), a
    LocalCluster the sweep started gets its workers anew (all closed, then as many started as it had), and
    with any other cluster the sweep says that it waits (warnings of the ``spherepde.sweeps`` logger)."""

    def __init__(self, client):
        self.client = client
        self.last = time.monotonic()
        self.empty = 0  # consecutive checks without a worker

    def check(self):
        if time.monotonic() - self.last < WORKER_WATCH_S:
            return
        self.last = time.monotonic()
        try:
            n = len(self.client.scheduler_info(n_workers=-1)["workers"])
        except Exception:  # pragma: no cover - the scheduler itself is gone: as_completed will raise
            return
        self.empty = 0 if n else self.empty + 1
        if self.empty < 2:
            return
        self.empty = 0
        cluster = getattr(self.client, "cluster", None)
        want = _OWNED.get(cluster) if cluster is not None else None
        if want:
            log.warning("sweep: the Dask cluster has had no worker for %.0f s; starting its %d again (the members "
                        "resume from their checkpoints)", 2 * WORKER_WATCH_S, want)
            cluster.scale(0)
            cluster.scale(want)
        else:
            log.warning("sweep: no Dask worker has been connected to the scheduler for %.0f s; the members wait "
                        "for one", 2 * WORKER_WATCH_S)


def _member_dir(out: Path, m: Member) -> Path:
    return out / "members" / m.dirname


def _continue_members(todo, out: Path, sources) -> int:
    """Copy into each member of ``todo`` that has no run of its own the run of a member of the sweep
    directories ``sources`` that it continues (the same configuration but for an earlier ``time.t_end``:
    :func:`spherepde.runner.run_experiment`), so that it goes on from there; the number copied. The results
    file goes first and the checkpoint last, by a rename: a copy cut short leaves no checkpoint, and the
    member then starts over."""
    import shutil

    from . import io as _io
    from .runner import CHECKPOINT_NAME, RESULTS_NAME, _extended

    runs = []  # (the directory, its configuration's JSON) of every member with a checkpoint
    for src in ([sources] if isinstance(sources, (str, os.PathLike)) else sources):
        if not (Path(src) / "members").is_dir():
            raise ValueError(f"continue_from: {src} is not a sweep directory (no members/ in it)")
        for d in sorted((Path(src) / "members").iterdir()):
            if (d / CHECKPOINT_NAME).is_file() and (d / RESULTS_NAME).is_file():
                try:  # (its state is read and verified by the run that continues it)
                    runs.append((d, _io.checkpoint_config_json(d / CHECKPOINT_NAME)))
                except Exception as exc:  # an unreadable checkpoint continues nothing
                    log.warning("continue_from: %s skipped (%s)", d, exc)
    n = 0
    for m in todo:
        d = _member_dir(out, m)
        if (d / CHECKPOINT_NAME).exists():
            continue  # its own run resumes
        for src, stored in runs:
            if stored and _extended(stored, m.config) is not None:
                d.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src / RESULTS_NAME, d / RESULTS_NAME)
                shutil.copy2(src / CHECKPOINT_NAME, d / (CHECKPOINT_NAME + ".part"))
                os.replace(d / (CHECKPOINT_NAME + ".part"), d / CHECKPOINT_NAME)
                log.info("sweep member %s continues %s", d.name, src)
                n += 1
                break
    return n


def sweep(spec, output=None, *, workers: int | None = None, scheduler=None, threads: int | None = None,
          progress: bool = True, restart: bool = False, figures: bool | None = None, quiet: bool = False,
          continue_from=None):
    """Run a sweep on Dask and return its dataset; rerun the same call to resume it.

    Parameters
    ----------
    spec : path to a sweep TOML file, TOML text, a dict, or a :class:`SweepSpec`
    output : path, optional
        Sweep directory (default ``output/<sweep name>``).
    workers : int, optional
        Start a LocalCluster of this many worker processes (default: one per core, but no more than the
        members left to run), each member running with cores // workers Numba threads; the cluster is
        closed at the end.
    scheduler : str or distributed.Client, optional
        Run on an existing Dask cluster instead (e.g. ``"tcp://10.0.0.1:8786"``). The workers must have
        spherepde installed and see ``output`` on a shared file system. Without ``workers`` and
        ``scheduler``, Dask's ``scheduler-address`` config (``DASK_SCHEDULER_ADDRESS``) is used when set.
    threads : int, optional
        Numba threads per member (default: cores // workers on a LocalCluster; the workers' own
        setting on a given scheduler).
    progress : bool
        A progress bar over the members with ETA (tqdm; in a notebook its widget).
    restart : bool
        Rerun every member from the start, discarding what the directory holds.
    figures : bool, optional
        Per-member figures (default: the spec's ``sweep.figures``, false).
    quiet : bool
        No dashboard address or summary table on stderr.
    continue_from : path or list of paths, optional
        Sweep directories whose members this sweep's continue: a member without a run of its own whose
        configuration is one of theirs with a later ``time.t_end`` starts from that member's checkpoint and
        saved frames (copied; those directories are left as they are) and runs on from its t_end, as
        :func:`spherepde.runner.run_experiment` continues a run: the result is a straight run's, bit for bit.

    Returns
    -------
    xarray.Dataset
        Also written to ``<output>/sweep.nc``; ``attrs["last_run"]`` tells what this call did.
    """
    import shutil

    from tqdm.auto import tqdm

    spec = _as_spec(spec)
    members = spec.members()
    out = Path(output) if output is not None else Path("output") / spec.name
    out.mkdir(parents=True, exist_ok=True)
    (out / SPEC_NAME).write_text(spec.text)
    _write_json_atomic(out / MEMBERS_NAME, [
        {"index": list(m.index), "coords": m.coords, "key": m.key, "directory": f"members/{m.dirname}"}
        for m in members])
    figures = spec.figures if figures is None else bool(figures)
    records, skipped, todo = {}, 0, []
    for m in members:
        d = _member_dir(out, m)
        if restart and d.exists():
            shutil.rmtree(d)
        rec = _read_record(d, m.key)
        if rec is not None:
            records[m.key] = rec
            skipped += 1
        else:
            todo.append(m)
    n_continued = _continue_members(todo, out, continue_from) if continue_from is not None and todo else 0
    t0 = time.perf_counter()
    def say(text):
        if not quiet:
            print(text, file=sys.stderr, flush=True)

    if todo:
        from distributed import as_completed

        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
            raise ValueError(f"threads must be an integer >= 1, got {threads!r}")
        with _client(workers, scheduler, threads, len(todo)) as (client, threads):
            say(f"sweep {spec.name}: {len(members)} members ({skipped} finished before"
                + (f", {n_continued} continuing runs of {continue_from}" if n_continued else "") + "), "
                f"{len(client.scheduler_info(n_workers=-1)['workers'])} Dask workers; dashboard {client.dashboard_link}")
            futures = {}
            for m in todo:
                fut = client.submit(run_member, m.config.text, str(_member_dir(out, m).resolve()), m.key, threads,
                                    figures, key=f"spherepde-member-{m.key}", pure=False)
                futures[fut] = m
            bar = tqdm(total=len(members), initial=skipped, unit="member", desc=spec.name,
                       disable=not progress or None)
            watch = _WorkerWatch(client)
            try:
                done = as_completed(list(futures))
                while not done.is_empty():
                    batch = done.next_batch(block=False)
                    if not batch:
                        watch.check()
                        time.sleep(0.05)
                        continue
                    for fut in batch:
                        _collect(fut, futures[fut], records, bar)
            finally:
                bar.close()
    wall = time.perf_counter() - t0
    n_done = sum(1 for m in todo if records.get(m.key, {}).get("status") == "done")
    failed = [m for m in members if records.get(m.key, {}).get("status") != "done"]
    last = (f"{n_done} done, {skipped} skipped (finished before), {len(failed)} failed, "
            f"wall time {wall:.1f} s")
    ds = build_dataset(spec, members, records)
    ds.attrs["last_run"] = last
    write_dataset(ds, out / DATASET_NAME)
    say(summary_table(ds, members, records, last))
    return ds


def _collect(fut, m, records, bar):
    """A finished member's record (its result, or the error of a failed task) into ``records``."""
    try:
        rec = fut.result()
    except Exception as exc:  # KilledWorker (its worker died too often), a cancelled task, ...
        rec = {"key": m.key, "status": "failed", "error": f"{type(exc).__name__}: {exc}"}
    records[m.key] = rec
    bar.update(1)
    if rec["status"] != "done":
        bar.write(f"member failed ({m.label()}): {rec['error']}")


def summary_table(ds, members, records, last) -> str:
    """The end-of-sweep table: one line per member (coordinates, status, steps, wall time, error)."""
    lines = [f"sweep {ds.attrs.get('title', '')}: {last}"]
    if len(members) <= 64:
        lines.append(f"  {'member':<40s} {'status':<7s} {'steps':>7s} {'wall s':>8s}")
        for m in members:
            r = records.get(m.key, {"status": "missing"})
            sc = r.get("scalars", {})
            steps = f"{sc['n_steps']:.0f}" if "n_steps" in sc else "-"
            wall = f"{sc['wall_time']:.1f}" if "wall_time" in sc else "-"
            lines.append(f"  {m.label()[:40]:<40s} {r['status']:<7s} {steps:>7s} {wall:>8s}"
                         + (f"  {r.get('error', '')}" if r["status"] != "done" else ""))
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------- the dataset
def _coord_array(values):
    if all(isinstance(v, bool) for v in values):
        return np.array(values, dtype=bool)
    if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        return np.array(values, dtype=np.int64)
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return np.array(values, dtype=float)
    if all(isinstance(v, str) for v in values):
        return np.array(values, dtype=object)
    return np.array([json.dumps(v, sort_keys=True) for v in values], dtype=object)


def _zip_coord_name(spec: SweepSpec, axis: Axis, key: str) -> str:
    """A zip key's coordinate: its last component when that names the zip's dimension (then it is the
    dimension's index, ``ds.sel(beta=100.0)``) or nothing else; else the key with '_' for '.'."""
    short = key.split(".")[-1]
    if short == axis.dim:
        return short
    shorts = [k.split(".")[-1] for a in spec.axes for k in a.keys]
    taken = {a.dim for a in spec.axes} | set(FRAME_VARS) | set(SCALAR_VARS) | set(STRING_VARS) | {"time"}
    return short if shorts.count(short) == 1 and short not in taken else key.replace(".", "_")


def build_dataset(spec: SweepSpec, members: list, records: dict):
    """The sweep's xarray.Dataset from the members' records (see the module docstring)."""
    import xarray as xr

    from . import __version__

    dims = tuple(a.dim for a in spec.axes)
    shape = spec.shape
    done = [records[m.key] for m in members if records.get(m.key, {}).get("status") == "done"]
    times = np.unique(np.concatenate([np.asarray(r["times"], float) for r in done])) if done else np.zeros(0)
    data = {k: np.full(shape + (len(times),), np.nan) for k in FRAME_VARS}
    scal = {k: np.full(shape, np.nan) for k in SCALAR_VARS}
    strs = {k: np.full(shape, "", dtype=object) for k in STRING_VARS}
    for m in members:
        r = records.get(m.key, {"status": "missing", "error": "not run"})
        strs["status"][m.index] = r["status"]
        strs["error"][m.index] = r.get("error", "")
        strs["member_key"][m.index] = m.key
        strs["results_file"][m.index] = f"members/{m.dirname}/results.h5"
        if r["status"] != "done":
            continue
        pos = np.searchsorted(times, np.asarray(r["times"], float))
        for k in FRAME_VARS:
            data[k][m.index + (pos,)] = np.asarray(r["frames"][k], float)
        for k in SCALAR_VARS:
            scal[k][m.index] = r["scalars"][k]
    coords = {"time": ("time", times, {"long_name": "model time t (depth of the transformer)", "units": "1",
                                       "axis": "T"})}
    for a in spec.axes:
        for k, vals in zip(a.keys, a.values):
            name = a.dim if len(a.keys) == 1 else _zip_coord_name(spec, a, k)
            attrs = {"config_key": k, "long_name": f"experiment config key {k}"}
            arr = _coord_array(list(vals))
            if arr.dtype != object:
                attrs["units"] = "s" if k == "output.checkpoint_every" else "1"
            coords[name] = (a.dim, arr, attrs)
    dv = {}
    for k, (ln, u) in FRAME_VARS.items():
        dv[k] = (dims + ("time",), data[k], {"long_name": ln, "units": u})
    for k, (ln, u) in SCALAR_VARS.items():
        dv[k] = (dims, scal[k], {"long_name": ln, "units": u})
    for k, ln in STRING_VARS.items():
        dv[k] = (dims, strs[k], {"long_name": ln})
    import datetime as _dt

    ds = xr.Dataset(dv, coords=coords, attrs={
        "Conventions": "CF-1.10",
        "title": spec.name,
        "description": spec.description,
        "source": f"spherepde {__version__} sweep",
        "history": f"{_dt.datetime.now(_dt.timezone.utc).isoformat(timespec='seconds')}: spherepde sweep",
        "sweep_toml": spec.text,
        "n_members": len(members),
        "dimensions_note": "one dimension per sweep axis (coordinates carry the config keys) and time",
    })
    return ds


def write_dataset(ds, path: Path):
    """Write the dataset as NetCDF4 (h5netcdf engine) atomically: a temporary file, then a rename."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    enc = {k: {"dtype": str} for k in STRING_VARS}
    enc.update({c: {"dtype": str} for c in ds.coords if ds[c].dtype == object})
    ds.to_netcdf(tmp, engine="h5netcdf", encoding=enc)
    os.replace(tmp, path)


def open_sweep(path):
    """The dataset of a sweep (its directory or its ``sweep.nc``), loaded into memory."""
    import xarray as xr

    p = Path(path)
    if p.is_dir():
        p = p / DATASET_NAME
    if not p.is_file():
        raise FileNotFoundError(f"sweep dataset not found: {p}")
    return xr.load_dataset(p, engine="h5netcdf")
