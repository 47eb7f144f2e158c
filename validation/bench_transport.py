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


def read_bandwidth(n: int = 50_000_000, repeat: int = 5) -> float:
    """Streaming read bandwidth (bytes/s) of a parallel Numba sum over n doubles (best of ``repeat``)."""
    @numba.njit(parallel=True, fastmath=True, cache=False)
    def total(a):
        s = 0.0
        for i in numba.prange(a.shape[0]):
            s += a[i]
        return s

    a = np.ones(n)
    total(a)
    best = min(_timed(total, a) for _ in range(repeat))
    return a.nbytes / best


def _timed(fn, *args):
    t = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t


def bytes_per_cell_stage(grid) -> int:
    """Bytes the stage kernel moves to and from memory per cell and stage (float64 state, SSP-RK2: the
    first stage does not read fa)."""
    N = grid.n_cells
    K = grid.cell_faces.shape[1]
    cls, table = grid.stencil_classes
    per_cell = (grid.stencil_offsets.nbytes + cls.nbytes + table.nbytes + grid.inflow_offsets.nbytes
                + grid.kernel_areas.nbytes) / N
    per_cell += K * grid.dim * 8  # cell-major face moments (q, Q in the tangent frame)
    per_cell += 8 + 4 + 8 + 8  # f (read in both passes: once from memory), fa (every other stage), out (+ write-allocate)
    per_cell += 3 * K * 8  # outflows: written (+ write-allocate), read back
    return int(round(per_cell))


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
    bw = read_bandwidth()
    nbytes = bytes_per_cell_stage(grid)
    bound = bw / nbytes
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
        "",
        "Memory-traffic bound: the stage kernel (`fv.stage_update`) streams per cell and stage the int16",
        "stencil and inflow offsets, the class index of the stencil coefficients (the class table itself is",
        "small and read from cache), the cell-major face moments in the tangent frame, f, the outflows",
        f"(written, then read back in the update pass) and the stage inputs: {nbytes} bytes (array sizes of",
        "this grid; neighbour values are cache hits). Streaming read bandwidth measured now: "
        f"{bw / 1e9:.1f} GB/s (2 threads). Bound: {bound:.2e} cell-stage updates per second, {rate_best / bound:.0%}",
        "of which the best step reaches. (Before the tangent frame, the class table, the int16 offsets and the",
        "scalar area: 504 bytes, 2.2e7 per second.)",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    Path(args.output).write_text(text)


if __name__ == "__main__":
    main()
