"""What sets the coarsest cells' error of the beta = inf ladder (zero_temperature.py, README "beta = inf").

The perturbed f0 at beta = inf to t = 2 on uniform HEALPix nside 16 and 32 and on AdaptiveHealpixGrid(16, 64) with
the default Refinement() and with one of its parameters changed: the regrid interval (4 CFL steps by default; 16,
64) and the variation threshold (0.25 by default; 0.1), and the same grid never regridded (refinement=False: it
stays on its nside 16 cells). Per run the error of align E against the exact curve (zero_temperature.exact_curves)
at t = 0.5, 1 and 2, and the cells at t = 2. If the error came from refining and coarsening the same cells
again and again, it would grow with the regrids; if it comes from the cells the criterion leaves coarse, it
follows the variation threshold.

Usage: python validation/fig4_concentration/zero_temperature_criterion.py (about a minute; writes
zero_temperature_criterion.md beside this file).
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

TIMES = (0.5, 1.0, 2.0)


def runs():
    import spherepde as sp
    from spherepde.config import MATRIX_PRESETS, perturbed_uniform
    from spherepde.diagnostics import alignment
    from spherepde.grids.adaptive import Refinement

    p = MATRIX_PRESETS["paper"]
    model = sp.ZeroTemperature(p["B"], p["V"])
    grids = [("HealpixGrid(16)", sp.HealpixGrid(16)), ("HealpixGrid(32)", sp.HealpixGrid(32)),
             ("AdaptiveHealpixGrid(16, 64), default Refinement()", sp.AdaptiveHealpixGrid(16, 64)),
             ("the same, regrid interval 16", sp.AdaptiveHealpixGrid(16, 64, refinement=Refinement(interval=16))),
             ("the same, regrid interval 64", sp.AdaptiveHealpixGrid(16, 64, refinement=Refinement(interval=64))),
             ("the same, variation 0.1", sp.AdaptiveHealpixGrid(16, 64, refinement=Refinement(variation=0.1))),
             ("the same, never regridded", sp.AdaptiveHealpixGrid(16, 64, refinement=False))]
    for label, grid in grids:
        t0 = time.perf_counter()
        r = sp.solve(grid, model, lambda x: perturbed_uniform(x, 0.05), TIMES[-1], save_at=list(TIMES))
        out = []
        for s in TIMES:
            i = int(np.argmin(np.abs(np.asarray(r.times) - s)))
            g = r.grid_at(i)
            w = np.asarray(r.density[i]) * g.areas
            out.append(alignment(g.centers, w / w.sum(), [1.0, 0.0, 0.0]))
        yield label, out, r.grid_at(len(r.times) - 1).n_cells, time.perf_counter() - t0


def main():
    from validation.fig4_concentration.zero_temperature import exact_curves

    ex = exact_curves(TIMES)["align_E"]
    L = ["# The coarsest cells' error at beta = inf (validation/fig4_concentration/zero_temperature_criterion.py)", "",
         "The perturbed f0, beta = inf, the solver's defaults; align E minus the exact align E.", "",
         "| grid | " + " | ".join(f"t = {s:g}" for s in TIMES) + " | cells at t = 2 | wall s |", "|---|---|---|---|---|---|"]
    for label, a, cells, wall in runs():
        L.append(f"| {label} | " + " | ".join(f"{x - e:+.2e}" for x, e in zip(a, ex)) + f" | {cells} | {wall:.0f} |")
        print(L[-1], flush=True)
    (HERE / "zero_temperature_criterion.md").write_text("\n".join(L) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
