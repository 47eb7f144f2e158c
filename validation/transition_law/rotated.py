"""The transition-law sweep with the paper's matrices turned by a fixed generic rotation (a control for the
one-cell capture of ``capture.py``; issue #17 item 3).

B' = R B R^T, V' = R V R^T with R = Rz(0.3) Ry(0.7) Rz(1.1): the same dynamics in a frame where E' = R e1 is
no HEALPix vertex and no symmetry axis of the grid. The f0 is the study's perturbed uniform density in
the grid's frame (its symmetry-breaking part is then generic for the turned matrices too). beta 30,
nside 16 and 32, eps 1e-1 ... 1e-5, T = 35, as ``sweep.toml``. Per run: t_exit (E-alignment with E'), the
share of the mass in the two heaviest cells at T and the capture diagnosis of ``capture.py`` with B', V'.

Usage: python validation/transition_law/rotated.py   (~6 minutes on 2 cores; writes rotated.md and
rotated.json beside this file; run directories in sweep_runs/transition_law_rotated, not committed).
"""
from __future__ import annotations

import json
import sys
import tomllib
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
from spherepde.diagnostics import exit_time  # noqa: E402
from validation.fig3_density.common import PAPER_B, PAPER_V, grid_measures  # noqa: E402
from validation.transition_law.capture import capture_columns, capture_state  # noqa: E402


def rotation(a=0.3, b=0.7, c=1.1):
    """Rz(a) Ry(b) Rz(c)."""
    def rz(t):
        return np.array([[np.cos(t), -np.sin(t), 0], [np.sin(t), np.cos(t), 0], [0, 0, 1.0]])

    ry = np.array([[np.cos(b), 0, np.sin(b)], [0, 1.0, 0], [-np.sin(b), 0, np.cos(b)]])
    return rz(a) @ ry @ rz(c)


def spec():
    from spherepde.sweeps import parse_sweep

    R = rotation()
    raw = tomllib.loads((HERE / "sweep.toml").read_text())
    raw["sweep"]["name"] = "transition_law_rotated"
    raw["set"]["model.B"] = (R @ PAPER_B @ R.T).tolist()
    raw["set"]["model.V"] = (R @ PAPER_V @ R.T).tolist()
    return parse_sweep(raw, base_dir=HERE), R


def main():
    from spherepde import load, sweep

    sp_, R = spec()
    Bp, Vp = R @ PAPER_B @ R.T, R @ PAPER_V @ R.T
    out = HERE / "sweep_runs" / sp_.name
    sweep(sp_, out, quiet=True, progress=False)
    rows = []
    for m in sp_.members():
        r = load(out / "members" / m.dirname / "results.h5")
        meas = grid_measures(r.grid, r.density, Bp, Vp, w2=False)
        t = np.asarray(r.times)
        d = capture_state(r.grid, r.density[-1], float(m.config.model.beta), B=Bp, V=Vp, axis=R[:, 0])
        rows.append({"nside": int(m.config.grid.nside), "eps": float(m.config.initial.eps),
                     "t_exit": exit_time(t, meas["align_E"]), "align_E_T": float(meas["align_E"][-1]),
                     "steps": int(r.n_steps), "wall_s": float(r.wall_time), **d})
    rows.sort(key=lambda r: (r["nside"], -r["eps"]))
    (HERE / "rotated.json").write_text(json.dumps({"R": R.tolist(), "rows": rows}, indent=1))
    L = ["# The transition law with the paper's matrices turned (validation/transition_law/rotated.py)", "",
         "B' = R B R^T, V' = R V R^T, R = Rz(0.3) Ry(0.7) Rz(1.1); beta 30, T = 35, the study's perturbed f0.", "",
         "| nside | eps | t_exit | align E' at T | top two cells' share | their angle from +-E' (cells) | outward fraction | "
         "attractor to nearest vertex (cells) | attractor to centre (cells) | steps | wall s |",
         "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        te = "none" if not np.isfinite(r["t_exit"]) else f"{r['t_exit']:.2f}"
        L.append(f"| {r['nside']} | {r['eps']:.0e} | {te} | {r['align_E_T']:.4f} | " + capture_columns(r)
                 + f" {r['steps']} | {r['wall_s']:.0f} |")
    (HERE / "rotated.md").write_text("\n".join(L) + "\n")
    print("\n".join(L))


if __name__ == "__main__":
    main()
