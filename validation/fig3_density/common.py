"""Helpers shared by the paper studies (fig3_density, fig4_concentration, appendix_c).

Measures of a grid density: the grid measure is (cell centres, f |C|). W2 to Pi#rho_0 uses the exact
two-atom solver (``wasserstein2_two_atoms``, chordal cost) with the atoms +-e (E = span(e)) and their
masses from ``limit_measure`` of the *initial* grid measure.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from spherepde import (Attention, HealpixGrid, ZeroTemperature, alignment, limit_measure, solve,
                       spectral_data, wasserstein2_two_atoms)
from spherepde.config import perturbed_uniform  # noqa: F401  (one definition; the studies import it from here)
from spherepde.diagnostics import transition_time  # noqa: F401  (idem)
from spherepde.solver import Options

PAPER_B = np.diag([-1.0, -1.0, 1.0])
PAPER_V = np.diag([-1.0, 1.0, -2.0])


#: Guaranteed bound on the attention field's error at every point. 1e-10 (as the default experiment and
#: the finite-beta convergence study): six orders below anything these studies report, and it lets
#: the fast spectral path run (it cannot certify 1e-12), 5x faster at beta ~ 100 on nside 64.
FIELD_TOL = 1e-10


def model_for(B, V, beta):
    return ZeroTemperature(B, V) if beta == np.inf else Attention(B, V, float(beta), tol=FIELD_TOL)


#: The solver options of the density runs of fig3_density, fig4_concentration and appendix_c (the CFL
#: number is the stability limit of the step; the error control chooses the step within it).
CFL, FIELD_INTERVAL = 0.8, 10


def options_record(cfl=CFL, field_interval=FIELD_INTERVAL) -> dict:
    """The options of :func:`run_density` as a plain dict (for results.json)."""
    from dataclasses import asdict

    d = asdict(Options(cfl=cfl, field_interval=field_interval))
    d["max_dt"] = str(d["max_dt"])  # inf is not JSON
    return d


def options_text(cfl=CFL, field_interval=FIELD_INTERVAL) -> str:
    """One line naming the options of :func:`run_density` (for the reports)."""
    o = Options(cfl=cfl, field_interval=field_interval)
    ec = f"error control rtol {o.rtol:g}, atol {o.atol:g}" if o.error_control else "fixed CFL steps"
    return (f"{o.stepper}, cfl {o.cfl:g} (upper limit), {ec}, field recomputed at most every "
            f"{o.field_interval} steps")


def run_density(nside, B, V, beta, t_end, save_at, f0="uniform", field_interval=FIELD_INTERVAL, cfl=CFL):
    """One Eulerian run on HealpixGrid(nside). Returns (grid, Result, wall seconds)."""
    g = HealpixGrid(nside)
    if isinstance(f0, str):
        f0 = np.full(g.n_cells, 1.0 / (4 * np.pi)) if f0 == "uniform" else perturbed_uniform(g.centers)
    opts = Options(cfl=cfl, field_interval=None if beta == np.inf else field_interval)
    t0 = time.perf_counter()
    r = solve(g, model_for(B, V, beta), f0, t_end, save_at=save_at, options=opts)
    return g, r, time.perf_counter() - t0


def measures(points, weights_rows, B, V, w2=True):
    """Alignment with E, F, F_abs, (W2 to Pi#rho_0 when dim E = 1) for rows of weights on ``points``.

    ``weights_rows[0]`` defines rho_0 (and Pi#rho_0)."""
    sp = spectral_data(B, V)
    out = {"align_E": [], "align_F": [], "align_Fabs": [], "W2": []}
    atoms = aw = None
    if w2 and sp.assumption1 and sp.k == 1:
        atoms, aw = limit_measure(points, weights_rows[0], B, V, spectral=sp)
    for w in weights_rows:
        w = np.asarray(w, float)
        out["align_E"].append(alignment(points, w, sp.E))
        out["align_F"].append(alignment(points, w, sp.F))
        out["align_Fabs"].append(alignment(points, w, sp.F_abs))
        out["W2"].append(wasserstein2_two_atoms(points, w, atoms, aw) if atoms is not None else float("nan"))
    return {k: np.asarray(v, float) for k, v in out.items()}


def grid_measures(grid, density, B, V, w2=True):
    return measures(grid.centers, np.asarray(density) * grid.areas[None, :], B, V, w2=w2)


def sphere_lonlat(x):
    x = np.asarray(x, float)
    return np.arctan2(x[:, 1], x[:, 0]), np.arcsin(np.clip(x[:, 2], -1, 1))


def machine():
    import os
    import platform

    return f"{platform.node()} {platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"


def density_config(nside, B, V, beta, t_end, save_at, f0="uniform", field_interval=FIELD_INTERVAL, cfl=CFL) -> dict:
    """The experiment configuration (a raw dict) of :func:`run_density`'s run: what a sweep member runs."""
    inf = beta == np.inf
    return {"name": "density_run",
            "grid": {"type": "healpix", "nside": int(nside)},
            "model": {"type": "attention", "B": np.asarray(B, float).tolist(), "V": np.asarray(V, float).tolist(),
                      "beta": float(beta), "tol": FIELD_TOL},
            "initial": {"type": "perturbed_uniform" if f0 == "perturbed" else "uniform", "sample": "center"},
            "time": {"t_end": float(t_end), "save_at": [float(s) for s in save_at]},
            "scheme": {"cfl": float(cfl), "field_interval": 0 if inf or field_interval is None else int(field_interval)},
            "output": {"plots": []}}


def run_density_sweep(name, runs, out, workers=None, scheduler=None):
    """:func:`run_density` for many runs at once, as the members of one sweep on Dask (spherepde.sweep: a
    LocalCluster, or ``scheduler`` / DASK_SCHEDULER_ADDRESS), always from the start (members are keyed by
    their configuration, not by the code). ``runs``: dicts of run_density's arguments. Returns
    [(grid, Result, solver wall seconds)] in the order of ``runs``; the results files stay in ``out``."""
    from spherepde import load, sweep
    from spherepde.sweeps import parse_sweep

    raws = [density_config(**r) for r in runs]
    keys = [(sec, k) for sec in ("grid", "model", "initial", "time", "scheme") for k in raws[0][sec]]
    zipped = {f"{sec}.{k}": [r[sec][k] for r in raws] for sec, k in keys
              if any(r[sec][k] != raws[0][sec][k] for r in raws)}
    spec = parse_sweep({"sweep": {"name": name}, "base": raws[0], "zip": {"run": zipped}} if zipped else
                       {"sweep": {"name": name}, "base": raws[0], "axes": {"name": ["density_run"]}})
    ds = sweep(spec, out, workers=workers, scheduler=scheduler, restart=True)
    bad = [e for e in ds.error.values.ravel() if e]
    if bad:
        raise RuntimeError(f"sweep {name}: {len(bad)} members failed: {bad[0]}")
    outs = []
    for m in spec.members():
        r = load(Path(out) / "members" / m.dirname / "results.h5")
        outs.append((r.grid, r, float(r.wall_time)))
    return outs
