"""Why the density stays on E below a grid-set eps: one-cell capture (issue #17 item 3, a diagnosis).

For every finished member of the study's sweeps on disk (``run.py``'s, in ``sweep_runs/``, both betas), the
state at T: whether the run left E, the share of the mass in its two heaviest cells, their distance from +-e1 in
cell sizes, and, where the two cells hold the mass (a captured state), what the attention field of that
state does on the captured cell's faces: the outward part of its normal velocity (sum of max(v . n, 0)
over the Gauss points of the cell's faces, against the sum of |v . n|), and where the flow of the field
at the cluster, x' = P_x(w) with w = V m(c), has its attractor w / |w|, against the cell's own vertices.

Usage: python validation/transition_law/capture.py   (seconds; writes capture.md and capture.json beside
this file). Needs the sweeps' run directories (``run.py`` and ``run.py --beta 100`` make them).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
from spherepde.diagnostics import exit_time  # noqa: E402
from validation.fig3_density.common import PAPER_B, PAPER_V, grid_measures  # noqa: E402

#: A state is captured when its two heaviest cells hold more than this share of the mass.
CAPTURED = 0.999


def field(x, src, w, beta, B=PAPER_B, V=PAPER_V):
    """The attention velocity P_x(V m(x)) at the unit vectors x (n, 3) of point sources at src with masses w."""
    s = beta * (x @ B @ src.T)
    s = s - s.max(axis=1, keepdims=True)
    e = w * np.exp(s)
    m = (e @ src) / e.sum(axis=1, keepdims=True)
    u = m @ V.T
    return u - np.sum(u * x, axis=1, keepdims=True) * x


def capture_state(grid, f, beta, n_src=400, B=PAPER_B, V=PAPER_V, axis=(1.0, 0.0, 0.0)):
    """The capture diagnosis of the density f (cell averages) on a HEALPix grid (RING): the mass share of
    the two heaviest cells, their angle from +-``axis`` (e1: E of the paper's matrices) in cell sizes, the
    outward fraction of the heaviest cell's face flux (field of the n_src heaviest cells as point masses at
    their mean positions, matrices B and V) and the attractor of the field's flow at that cell against the
    cell's vertices (healpy's corners, nearest to it)."""
    import healpy as hp

    B, V, axis = np.asarray(B, float), np.asarray(V, float), np.asarray(axis, float)

    m = f * grid.areas
    order = np.argsort(m)[::-1]
    top = order[:2]
    src = order[:n_src]
    xs = grid.xbar[src] / np.linalg.norm(grid.xbar[src], axis=1, keepdims=True)
    ws = m[src]
    cell = int(order[0])
    pos = neg = 0.0
    for fc, sg in zip(grid.cell_faces[cell], grid.cell_face_sign[cell]):
        if sg == 0:
            continue
        a = sg * np.sum(field(grid.face_points[fc], xs, ws, beta, B, V) * grid.face_normals[fc], axis=1)
        pos += float(np.clip(a, 0.0, None).sum())
        neg += float(np.abs(a).sum())
    c = grid.xbar[cell] / np.linalg.norm(grid.xbar[cell])
    s = beta * (c @ B @ xs.T)
    e = ws * np.exp(s - s.max())
    w = V @ ((e @ xs) / e.sum())
    att = w / np.linalg.norm(w)
    corners = hp.boundaries(int(round(np.sqrt(grid.n_cells / 12))), cell, step=1).T  # (4, 3)
    size = np.sqrt(4 * np.pi / grid.n_cells)
    return {"top_two_share": float(m[top].sum() / m.sum()),
            "top_angles_cells": [float(np.arccos(min(1.0, abs(grid.centers[i] @ axis))) / size) for i in top],
            "outward_fraction": pos / neg if neg > 0 else 0.0,
            "attractor": att.tolist(),
            "attractor_to_nearest_vertex_cells": float(np.arccos(np.clip(corners @ att, -1, 1)).min() / size),
            "attractor_to_centre_cells": float(np.arccos(np.clip(c @ att, -1, 1)) / size)}


def capture_columns(r) -> str:
    """The capture columns of a report row (``capture_state``'s dict): the two heaviest cells' share and
    angles, then the field's columns, which describe a captured cluster's cell only ('-' otherwise)."""
    head = f"{r['top_two_share']:.6f} | {' / '.join(f'{a:.2f}' for a in r['top_angles_cells'])} | "
    if r["top_two_share"] <= CAPTURED:
        return head + "- | - | - |"
    return head + (f"{r['outward_fraction']:.1e} | {r['attractor_to_nearest_vertex_cells']:.3f} | "
                   f"{r['attractor_to_centre_cells']:.2f} |")


def study_members():
    """(config, results file) of every finished member of the study's own sweeps (``run.py``'s, at beta 30
    and 100: uniform grids, the paper's frame), so that the other sweeps beside them (``rotated.py``,
    ``adaptive.py``, quick runs) are never mixed in."""
    from validation import criteria as C

    study = C.load_study("transition_law")
    for beta in (study.BETA, 100.0):
        for sp_ in study.specs(False, True, beta):
            for m in sp_.members():
                res = HERE / "sweep_runs" / sp_.name / "members" / m.dirname / "results.h5"
                if res.exists():
                    yield m.config, res


def main():
    from spherepde import load

    rows = []
    for cfg, res in study_members():
        r = load(res)
        meas = grid_measures(r.grid, r.density, PAPER_B, PAPER_V, w2=False)
        left = bool(np.isfinite(exit_time(np.asarray(r.times), meas["align_E"])))
        d = capture_state(r.grid, r.density[-1], float(cfg.model.beta))
        rows.append({"beta": float(cfg.model.beta), "nside": int(cfg.grid.nside), "eps": float(cfg.initial.eps),
                     "left_E": left, "T": float(r.times[-1]), "align_E_T": float(meas["align_E"][-1]), **d})
    rows.sort(key=lambda r: (r["beta"], r["nside"], -r["eps"]))
    (HERE / "capture.json").write_text(json.dumps(rows, indent=1))
    L = ["# One-cell capture (validation/transition_law/capture.py)", "",
         "Each finished member of the transition-law sweeps at T: did it leave E, the share of the mass in its two",
         "heaviest cells, their angle from +-e1 in cell sizes; for the heaviest cell the outward fraction of its",
         "faces' normal velocity (sum max(v . n, 0) / sum |v . n| over the Gauss points, the field of the state's",
         "own mass) and the distance, in cell sizes, from the attractor w / |w| of the field's flow at that cell",
         "(w = V m(c)) to the cell's nearest vertex and to its centre ('-': not captured).", "",
         "| beta | nside | eps | left E | align E at T | top two cells' share | their angle from +-e1 (cells) | "
         "outward fraction | attractor to nearest vertex (cells) | attractor to centre (cells) |",
         "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        L.append(f"| {r['beta']:g} | {r['nside']} | {r['eps']:.0e} | {'yes' if r['left_E'] else 'no'} | "
                 f"{r['align_E_T']:.4f} | " + capture_columns(r))
    cap = [r for r in rows if r["top_two_share"] > CAPTURED]
    L += ["", f"Captured (top two cells > {CAPTURED} of the mass): {len(cap)} of {len(rows)} runs; of these "
          f"{sum(not r['left_E'] for r in cap)} stayed on E. Runs that left E: {sum(r['left_E'] for r in rows)}, "
          f"none captured: {all(r['top_two_share'] <= CAPTURED for r in rows if r['left_E'])}."]
    (HERE / "capture.md").write_text("\n".join(L) + "\n")
    print("\n".join(L))


if __name__ == "__main__":
    main()
