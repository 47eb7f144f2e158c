"""Throughput of the second-order transport scheme: cell-stage updates per second.

Steady zero-temperature field (paper matrices), HEALPix nside 256 (786432 cells), linear
reconstruction with the positivity limiter, SSP-RK2. A cell-stage update is one cell advanced through
one Runge-Kutta stage (gradient + limiter, face fluxes, update). Target (issue 2): >= 5e7 per second
on the 2-core development machine.

Usage: python validation/bench_transport.py [--nside 256] [--steps 20]
Writes validation/bench_transport.md.
"""
from __future__ import annotations

import argparse
import os
import platform
import time
from pathlib import Path

import numba
import numpy as np

from spherepde import HealpixGrid, Options, Solver, ZeroTemperature


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nside", type=int, default=256)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--output", default=str(Path(__file__).with_suffix(".md")))
    args = ap.parse_args(argv)

    model = ZeroTemperature(np.diag([-1.0, -1.0, 1.0]), np.diag([-1.0, 1.0, -2.0]))
    t0 = time.perf_counter()
    grid = HealpixGrid(args.nside)
    t_grid = time.perf_counter() - t0
    f0 = lambda x: (1 + 0.5 * x[:, 0] + 0.3 * x[:, 1] * x[:, 2]) / (4 * np.pi)
    solver = Solver(grid, model, f0, Options(stepper="ssprk2"))
    solver.step()  # compile and warm up
    stages = 2
    times = []
    for _ in range(args.steps):
        t = time.perf_counter()
        solver.step()
        times.append(time.perf_counter() - t)
    best, med = min(times), float(np.median(times))
    rate_best = grid.n_cells * stages / best
    rate_med = grid.n_cells * stages / med
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    lines = [
        "# Transport throughput (validation/bench_transport.py)",
        "",
        f"- machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, numba "
        f"{numba.__version__} with {numba.get_num_threads()} threads ({numba.threading_layer()} layer), "
        f"load average at start {load:.2f}",
        f"- grid: HEALPix nside {args.nside}, {grid.n_cells} cells, {grid.n_faces} faces, built in {t_grid:.1f} s",
        "- scheme: linear reconstruction + positivity limiter, SSP-RK2, steady zero-temperature field",
        "",
        "| measure | seconds per step | cell-stage updates per second |",
        "|---|---|---|",
        f"| best of {args.steps} steps | {best:.4f} | {rate_best:.3e} |",
        f"| median | {med:.4f} | {rate_med:.3e} |",
        "",
        f"Target: >= 5e7 cell-stage updates per second: {'met' if rate_best >= 5e7 else 'NOT met'} "
        f"(best), {'met' if rate_med >= 5e7 else 'not met'} (median).",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    Path(args.output).write_text(text)


if __name__ == "__main__":
    main()
