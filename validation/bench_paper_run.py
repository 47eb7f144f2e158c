"""End-to-end wall time and peak memory of the paper's setting at finite temperature (issue 3).

beta = 100, B = diag(-1,-1,1), V = diag(-1,1,-2), uniform f0, T = 20 (Alcalde et al. 2026, Sec. 5),
HEALPix nside given, second-order scheme, SSP-RK2, CFL 0.4, attention field recomputed every
`field_interval` steps (linear extrapolation in time in between), field error bound `tol` (default 1e-10,
as the default experiment docs/examples/paper_attention.toml). Targets: nside 32 <= 2 minutes,
nside 64 <= 15 minutes on the 2-core machine; peak memory of a run at nside 128 under 2 GB.

Usage: python validation/bench_paper_run.py --nside 32 [--t-end 20] [--field-interval 4] [--tol 1e-10]
Appends a line to validation/bench_paper_run.md (the table's tol column: rows without one used 1e-12).
"""
from __future__ import annotations

import argparse
import os
import resource
import time
from pathlib import Path

import numpy as np

from spherepde import Attention, HealpixGrid, solve


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nside", type=int, default=32)
    ap.add_argument("--t-end", type=float, default=20.0)
    ap.add_argument("--beta", type=float, default=100.0)
    ap.add_argument("--field-interval", type=int, default=4)
    ap.add_argument("--tol", type=float, default=1e-10, help="attention field error bound (Attention tol)")
    ap.add_argument("--output", default=str(Path(__file__).with_suffix(".md")))
    args = ap.parse_args(argv)
    model = Attention(np.diag([-1.0, -1.0, 1.0]), np.diag([-1.0, 1.0, -2.0]), args.beta, tol=args.tol)
    grid = HealpixGrid(args.nside)

    t0 = time.perf_counter()
    r = solve(grid, model, lambda x: np.full(len(x), 1 / (4 * np.pi)), args.t_end,
              save_at=np.linspace(0, args.t_end, 11), field_interval=args.field_interval, progress=True)
    wall = time.perf_counter() - t0
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    d = r.diagnostics
    line = (f"| {args.nside} | {args.beta:g} | {args.t_end:g} | {args.field_interval} | {r.n_steps} | {wall:.1f} | "
            f"{peak_mb:.0f} | {d['min'].min():.3e} | {abs(d['mass'][-1] / d['mass'][0] - 1):.1e} | "
            f"{os.getloadavg()[0]:.1f} | {args.tol:g} |")
    out = Path(args.output)
    if not out.exists():
        out.write_text("# Paper setting end to end (validation/bench_paper_run.py)\n\n"
                       "| nside | beta | T | field_interval | steps | wall s | peak RSS MB | min f | mass drift | load | tol |\n"
                       "|---|---|---|---|---|---|---|---|---|---|---|\n")
    with out.open("a") as fh:
        fh.write(line + "\n")
    print(line)


if __name__ == "__main__":
    main()
