"""The clusters study's member with the log-quadratic reconstruction of ``log_reconstruction.py`` in place of the
solver's stage kernel: a prototype experiment, outside the package and the study's criteria.

Superseded on 2026-12-05 by the package's ``Options(scheme="log-quadratic")`` (a Numba kernel with a step-independent
outflow bound; README.md); kept as the record of the prototype's numbers.

The solver runs as in ``run.py`` (``run_experiment``, adaptive grid, attention field, regrids, error control); two
of its methods are replaced for this process only: ``Solver._compute_moments`` also keeps the normal-velocity
weights each moment set was made from (the extrapolated ones, a + c (a - a_prev), as the moments take them), and
``Solver._rhs_stage`` takes the stage from :class:`LogReconstruction` with those weights (Shu-Osher form, values
clipped at 0 like the kernel's rounding clip). The grid's precomputation is redone after every regrid.

Usage: python validation/adaptive_clusters/log_clusters.py NSIDE_MAX T   (e.g. 256 1: ~2 min; 1024 3: ~30 min)
At nside_max 64, where the clusters (0.003 rad) are far inside one cell (0.016 rad), the run stops at t = 0.003
with a step size underflow: the error control cannot meet its tolerance there; 256 and 1024 run.
Prints the centroid errors against the weighted particles at every saved time; writes
runs/log_<NSIDE_MAX>_<T>.json (not committed).
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parents[2]))

import spherepde.solver as S  # noqa: E402
from validation.adaptive_clusters import run as CR  # noqa: E402
from validation.adaptive_clusters.log_reconstruction import LogReconstruction  # noqa: E402

_weights, _rec = {}, {}
_compute_moments = S.Solver._compute_moments


def _moments_keeping_weights(self, a, a_prev=None, c=0.0):
    out = _compute_moments(self, a, a_prev, c)
    w = np.array(a if a_prev is None else a + c * (a - a_prev))
    for key in [k for k, v in _weights.items() if v.shape != w.shape]:  # sets of grids before a regrid
        del _weights[key]
    _weights[id(out[0])] = w
    return out


def _log_stage(self, fa, fb, mom, dt, alpha, out):
    if len(mom) != 2:
        raise NotImplementedError("scaled moment sets (separable prescribed fields) are not supported here")
    g = self.grid
    if _rec.get("grid") is not g:
        _rec["grid"], _rec["rec"] = g, LogReconstruction(g, 5, None, False)
    v = fb + dt * _rec["rec"].rhs(fb, _weights[id(mom[0])], dt)
    if alpha != 0.0:
        v = alpha * fa + (1.0 - alpha) * v
    np.maximum(v, 0.0, out=out)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    nside_max, t_end = int(argv[0]), float(argv[1])
    S.Solver._compute_moments = _moments_keeping_weights
    S.Solver._rhs_stage = _log_stage
    save = np.arange(0.0, t_end + 1e-9, CR.SAVE_EVERY)
    pos = CR.particles(t_end, save)
    runs = CR.HERE / "runs"
    runs.mkdir(exist_ok=True)
    label = f"log_{nside_max}_{t_end:g}"
    t0 = time.perf_counter()
    row = CR.one_run(label, f'type = "adaptive"\nnside_min = {CR.NSIDE_MIN}\nnside_max = {nside_max}', t_end, runs,
                     pos)
    for t, e, w, c in zip(row["times"], row["error"], row["width"], row["cells"]):
        print(f"t {t:.2f} errors {np.round(e, 6)} widths {np.round(w, 5)} cells {c}")
    print("steps", row["steps"], "rejected", row["rejected"], "solver wall", round(row["solver_wall_s"]), "min",
          row["min"], "mass drift", row["mass_drift"], "wall", round(time.perf_counter() - t0))
    (runs / f"{label}.json").write_text(json.dumps(row))


if __name__ == "__main__":
    main()
