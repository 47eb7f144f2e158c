"""Does the log-quadratic scheme take the tails' resolution out of t_EF? A probe for issue #17 (outside the
study's criteria).

``adaptive.py --attended`` found t_EF at beta 30 (eps 0.05, nside_max 128) 18.51 with the coarsest cells at
nside 16 and 15.36 at nside 32 (README, "The attended refinement"): the tails, ~1e-11 of the mass carried on
the coarsest cells since the collapse, set it. The linear scheme carries them with an absolute error of the
limited reconstruction; a reconstruction of log f (``Options(scheme="log-quadratic")``) carries them with a
relative one. This runs the same two levels (``adaptive.spec`` with the attended refinement) with that scheme
and prints t_exit, t_EF and the terminal phase's better-conditioned readings (``adaptive.terminal``: the
departure from the stall cone, the drift after it) beside the linear records of ``adaptive.json``.

Usage: python validation/fig4_concentration/log_tails.py [--nside-min 16 32] [--nside-max 128] [--t-end 10]
Sweeps in sweep_runs/<the level's name>_log-quadratic (not committed); writes log_tails.json beside this file.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from validation.fig4_concentration import adaptive as A  # noqa: E402
from validation.records import upsert  # noqa: E402


def run_level(nside_min: int, nside_max: int, beta: float = 30.0, t_end: float | None = None) -> dict:
    from spherepde import sweep

    sp_ = A.spec(beta, nside_max, nside_min, attended=True, t_end=t_end, scheme="log-quadratic")
    name = sp_.name
    ds = sweep(sp_, A.RUNS / name, workers=1, quiet=True, progress=False)
    err = [str(e) for e in ds.error.values.ravel() if e]
    if err:
        raise RuntimeError(f"{name}: {err[0]}")
    rec = {"times": ds["time"].values.tolist(), "t_exit": float(ds["t_exit"])}
    for key, src in A.ALIGNMENTS:
        rec[key] = ds[src].values.ravel().tolist()
    return {"nside_min": nside_min, "nside_max": nside_max, "beta": beta, "t_exit": rec["t_exit"],
            "t_EF": float(ds["t_EF"]), **A.terminal(rec), "steps": int(ds["n_steps"]),
            "wall_s": float(ds["wall_time"]), "mass_drift": float(ds["mass_drift"]),
            "min_f": float(ds["min_density_steps"]), "t_end": A.T_END if t_end is None else float(t_end)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nside-min", type=int, nargs="+", default=[16, 32])
    ap.add_argument("--nside-max", type=int, default=128)
    ap.add_argument("--t-end", type=float, default=None,
                    help="end time (default the study's T = 30); a shorter run is kept as a record of its own, "
                         "for its state at t0 <= T that lagrangian.py continues")
    a = ap.parse_args(argv)
    out = HERE / "log_tails.json"
    for n in a.nside_min:
        r = run_level(n, a.nside_max, t_end=a.t_end)
        upsert(out, r, lambda x: (x["nside_max"], x["nside_min"], x.get("t_end", A.T_END)))  # levels may run in parallel calls
        print(r, flush=True)


if __name__ == "__main__":
    main()
