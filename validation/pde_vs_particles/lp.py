"""The W2 linear programme of one (n, t) cell of the study's table, as a task for worker processes (a
module of its own so that spawned workers can import it however run.py itself was loaded)."""
from __future__ import annotations

import time

import numpy as np


def lp_row(n, t, pts, wts, pos, disp):
    """W2 (chordal, exact LP through POT) between the grid measure (pts, wts) and n equal-mass tokens at
    ``pos``: the table row, with the LP's wall time."""
    import spherepde as sp

    c0 = time.perf_counter()
    w2 = sp.wasserstein2(pts, wts, pos, np.full(n, 1.0 / n))
    return {"n": n, "t": t, "W2": w2, "coarsen_atoms": int(len(wts)), "coarsen_displacement": disp,
            "lp_seconds": time.perf_counter() - c0}
