"""Cost of adaptive HEALPix grids against uniform ones at the same cell count (issue #16).

Three figures, each the median and spread of ``--repeat`` timed runs of ``--steps`` steps of the steady
zero-temperature field (paper matrices), linear reconstruction with the positivity limiter, SSP-RK2, the
default error control:

1. the uniform HealpixGrid(nside): cell-stage updates per second;
2. a static adaptive grid (``refinement=False``) of about the same cell count, three orders mixed (a polar
   cap refined twice), the same field: cell-stage updates per second, and its ratio to 1 (target: within 2x);
3. the same adaptive grid regridding every 4 steps (the default ``Refinement()``) on a moving bump: the
   time per regrid (grid rebuild with reused geometry plus transfer) against the time per step.

Usage: python validation/bench_adaptive.py [--nside 64] [--steps 40] [--repeat 5]
Writes validation/bench_adaptive.md. The paper-scale benchmark of the issue (beta 100, T = 20, nside_min 32,
nside_max 1024) is not run here yet: see the closing note of issue #16.
"""
from __future__ import annotations

import argparse
import os
import platform
import time
from pathlib import Path

import numba
import numpy as np

from spherepde import AdaptiveHealpixGrid, HealpixGrid, Options, Prescribed, Solver, ZeroTemperature
from spherepde.config import MATRIX_PRESETS
from spherepde.grids.adaptive import Refinement

HERE = Path(__file__).parent


def f0(x):
    return 1.0 + 0.5 * x[:, 0] + 0.3 * x[:, 1] * x[:, 2]


def throughput(grid, steps: int, repeat: int):
    """(median, min, max) cell-stage updates per second of ``steps`` steps on ``grid``, and the stages."""
    p = MATRIX_PRESETS["paper"]
    model = ZeroTemperature(p["B"], p["V"])
    rates = []
    for _ in range(repeat + 1):  # the first run compiles and warms the caches
        s = Solver(grid, model, f0, Options())
        s.step()
        t0 = time.perf_counter()
        for _ in range(steps):
            s.step()
        wall = time.perf_counter() - t0
        stages = steps * (2 + 1)  # SSP-RK2 and the embedded stage of the error control
        rates.append(grid.n_cells * stages / wall)
    r = np.array(rates[1:])
    return float(np.median(r)), float(r.min()), float(r.max())


def regrid_cost(nside: int, steps: int, repeat: int):
    """(median s per regrid, median s per step without the regrids, cells) of a bump in rigid rotation."""
    c = np.array([0.0, 0.6, 0.8])
    per_regrid, per_step, cells = [], [], []
    for _ in range(repeat + 1):
        g = AdaptiveHealpixGrid(nside // 4, nside, refinement=Refinement())
        s = Solver(g, Prescribed.rigid_rotation([1.0, 0.0, 0.0]), lambda x: np.exp(30 * (x @ c - 1)), Options())
        t_regrid = 0.0
        orig = s.grid.__class__.regrid

        def timed(self, f, scale=0.0):
            nonlocal t_regrid
            t0 = time.perf_counter()
            out = orig(self, f, scale)
            t_regrid += time.perf_counter() - t0
            return out

        s.grid.__class__.regrid = timed
        try:
            n0 = s.n_regrids
            t0 = time.perf_counter()
            for _ in range(steps):
                s.step()
            wall = time.perf_counter() - t0
        finally:
            s.grid.__class__.regrid = orig
        n = max(1, s.n_regrids - n0)
        per_regrid.append(t_regrid / n)
        per_step.append((wall - t_regrid) / steps)
        cells.append(s.grid.n_cells)
    return float(np.median(per_regrid[1:])), float(np.median(per_step[1:])), int(np.median(cells[1:])), \
        (float(min(per_regrid[1:])), float(max(per_regrid[1:])))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nside", type=int, default=64)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args(argv)
    load = os.getloadavg()
    uni = HealpixGrid(a.nside)
    # a static grid of about the same count, three orders: nside/2 everywhere and a polar cap refined to
    # 2 nside (z > 0.6: 49728 cells against 49152 at nside 64)
    base = AdaptiveHealpixGrid(a.nside // 2, 2 * a.nside, refinement=False)
    ada = base.refined_where(lambda g: g.centers[:, 2] > 0.6)
    ru = throughput(uni, a.steps, a.repeat)
    ra = throughput(ada, a.steps, a.repeat)
    per_regrid, per_step, cells, spread = regrid_cost(a.nside, a.steps * 2, a.repeat)
    lines = [
        "# Adaptive grid cost (validation/bench_adaptive.py)", "",
        f"Machine: {platform.processor() or platform.machine()}, {numba.get_num_threads()} Numba thread(s), load "
        f"average before the run {load[0]:.1f}; {a.steps} steps x {a.repeat} repeats "
        "(median [min, max]); steady zero-temperature field, linear + positivity limiter, SSP-RK2, error control.", "",
        "| grid | cells | cell-stage updates / s |", "|---|---|---|",
        f"| HealpixGrid({a.nside}) | {uni.n_cells} | {ru[0]:.3g} [{ru[1]:.3g}, {ru[2]:.3g}] |",
        f"| {ada!r} | {ada.n_cells} | {ra[0]:.3g} [{ra[1]:.3g}, {ra[2]:.3g}] |", "",
        f"Adaptive / uniform cost per cell-stage: {ru[0] / ra[0]:.2f}x (target: within 2x).", "",
        f"Regridding (bump in rigid rotation, nside {a.nside // 4} .. {a.nside}, ~{cells} cells, default "
        f"Refinement, every 4 steps): {per_regrid * 1e3:.1f} ms per regrid [{spread[0] * 1e3:.1f}, "
        f"{spread[1] * 1e3:.1f}], {per_step * 1e3:.1f} ms per step without it: a regrid costs "
        f"{per_regrid / per_step:.1f} steps.", "",
    ]
    text = "\n".join(lines)
    (HERE / "bench_adaptive.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
