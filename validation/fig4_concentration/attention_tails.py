"""Who moves the clusters after the exit at beta 100: the attention at a cluster's centre split between the
antipodal cluster and the density's tails, and the clusters' own weighted particle system against the PDE.

Reads the saved states of the beta-100 adaptive levels of adaptive.py (``sweep_runs/fig4_adaptive_b100_<nside_max>
_min32_att``: the attended refinement on nside 32 cells; not committed, so this runs where they are) and writes
attention_tails.md. Per level and time: the heaviest cluster (cells within 0.15 rad of the heaviest cell), its
mass and mass centroid c; at c, the share of the attention weight m_j exp(beta <c, B y_j>) that comes from the
antipodal cluster (cells within 0.15 rad of -c) and from the tails (cells below 1e-6 of the heaviest cell's
mass), the tails' mass, and the speed |P_c V m(c)| of the grid's field at c against that of the antipodal
cluster alone. Then, from the state at t = 12 of the finest level, the clusters' weighted particle system
(``simulate_particles`` with their masses as ``weights``, the point-cluster picture of validation/cluster_dynamics)
against the PDE's alignments.

Usage: python validation/fig4_concentration/attention_tails.py [--levels 64 128]
"""
from __future__ import annotations

import argparse
import glob
from pathlib import Path

import sys

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from validation.fig3_density.common import PAPER_B as B, PAPER_V as V  # noqa: E402
from validation.fig4_concentration.adaptive import TAIL_FRACTION as TAIL  # noqa: E402

BETA = 100.0
RADIUS = 0.15


def results(level: int):
    import spherepde as sp

    hits = glob.glob(str(HERE / "sweep_runs" / f"fig4_adaptive_b100_{level}_min32_att" / "members" / "*" / "results.h5"))
    return sp.load(hits[0]) if hits else None


def split(r, t0: float) -> dict:
    """The attention at the heaviest cluster's centroid at the saved time nearest t0, split by source."""
    from scipy.special import logsumexp

    i = int(np.argmin(abs(np.asarray(r.times) - t0)))
    g = r.grid_at(i)
    m, x = r.density[i] * g.areas, g.centers
    near = np.arccos(np.clip(x @ x[np.argmax(m)], -1, 1)) < RADIUS
    c = (m[near, None] * x[near]).sum(0)
    c /= np.linalg.norm(c)
    other = np.arccos(np.clip(x @ -c, -1, 1)) < RADIUS
    tail = m < TAIL * m.max()
    with np.errstate(divide="ignore"):
        lw = np.log(m) + BETA * (x @ B @ c)
    tot = logsumexp(lw)

    def speed(sel):
        w = np.exp(lw[sel] - logsumexp(lw[sel]))
        v = V @ (w @ x[sel])
        return float(np.linalg.norm(v - (v @ c) * c))

    return {"t": float(r.times[i]), "mass": float(m[near].sum()), "centre": c,
            "antipode": float(np.exp(logsumexp(lw[other]) - tot)),
            "tails": float(np.exp(logsumexp(lw[tail]) - tot)) if tail.any() else 0.0,
            "tail_mass": float(m[tail].sum()), "speed": speed(np.ones(len(m), bool)), "speed_antipode": speed(other)}


def particles_from(r, t0: float):
    """The clusters of the state nearest t0 (cells grouped greedily around the heaviest ones within RADIUS,
    the rest to the nearest group) as weighted particles, run to the end of r; the alignments of both."""
    import spherepde as sp
    from spherepde.diagnostics import alignment

    i0 = int(np.argmin(abs(np.asarray(r.times) - t0)))
    g = r.grid_at(i0)
    m, x = r.density[i0] * g.areas, g.centers
    cents, lab = [], -np.ones(len(m), int)
    for j in np.argsort(-m):
        if m[j] < TAIL * m.max():
            break
        for k, c in enumerate(cents):
            if np.arccos(np.clip(x[j] @ c, -1, 1)) < RADIUS:
                lab[j] = k
                break
        else:
            cents.append(x[j])
            lab[j] = len(cents) - 1
    C = np.array(cents)
    lab[lab < 0] = np.argmax(x[lab < 0] @ C.T, axis=1)
    W = np.bincount(lab, weights=m, minlength=len(C))
    P = np.array([(m[lab == k, None] * x[lab == k]).sum(0) for k in range(len(C))])
    P /= np.linalg.norm(P, axis=1)[:, None]
    T = float(r.times[-1] - r.times[i0])
    res = sp.simulate_particles(sp.Attention(B, V, BETA), P, T, 0.01, weights=W / W.sum(),
                                save_at=np.arange(0.0, T + 1e-9, 2.0))
    def aligned(pts, w):  # E = e1, F = e2 (V's top eigenvector), F_abs = e3 (its largest |eigenvalue|)
        return tuple(alignment(pts, w, e) for e in np.eye(3))

    rows = []
    for k, tt in enumerate(res.times):
        i = int(np.argmin(abs(np.asarray(r.times) - (r.times[i0] + tt))))
        gi = r.grid_at(i)
        rows.append((float(r.times[i]), aligned(gi.centers, r.density[i] * gi.areas),
                     aligned(res.positions[k], W / W.sum())))
    return W, P, rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--levels", type=int, nargs="+", default=[64, 128])
    a = ap.parse_args(argv)
    L = ["# Who moves the clusters after the exit at beta 100 (validation/fig4_concentration/attention_tails.py)", "",
         "The beta-100 adaptive levels of adaptive.py (attended refinement, nside 32 cells, perturbed f0). At the "
         "heaviest cluster's centroid c: the share of the attention weight m_j exp(beta <c, B y_j>) from the "
         f"antipodal cluster (cells within {RADIUS} rad of -c) and from the tails (cells below {TAIL:g} of the "
         "heaviest cell's mass), the tails' mass, and the speed |P_c V m(c)| of the field at c against that of "
         "the antipodal cluster alone (the two-cluster picture).", "",
         "| nside_max | t | cluster mass | centre | antipode's share | tails' share | tails' mass | speed | speed, antipode alone |",
         "|---|---|---|---|---|---|---|---|---|"]
    finest = None
    for lev in a.levels:
        r = results(lev)
        if r is None:
            L.append(f"| {lev} | (no run directory) | | | | | | | |")
            continue
        finest = r
        for t0 in (9.0, 12.0, 16.0, 20.0, 24.0):
            s = split(r, t0)
            L.append(f"| {lev} | {s['t']:.2f} | {s['mass']:.3f} | ({', '.join(f'{v:.3f}' for v in s['centre'])}) | "
                     f"{s['antipode']:.3f} | {s['tails']:.3f} | {s['tail_mass']:.1e} | {s['speed']:.3f} | "
                     f"{s['speed_antipode']:.3f} |")
    if finest is not None:
        W, P, rows = particles_from(finest, 12.0)
        L += ["", f"From the finest level's state at t = 12: {len(W)} clusters, masses "
              f"{', '.join(f'{w:.4f}' for w in W)}, centres {'; '.join('(' + ', '.join(f'{v:.3f}' for v in p) + ')' for p in P)}; "
              "their weighted particle system (simulate_particles, dt 0.01) against the PDE:", "",
              "| t | PDE align E / F / F_abs | particles align E / F / F_abs |", "|---|---|---|"]
        L += [f"| {t:.2f} | {' / '.join(f'{v:.3f}' for v in a)} | {' / '.join(f'{v:.3f}' for v in b)} |"
              for t, a, b in rows]
    (HERE / "attention_tails.md").write_text("\n".join(L) + "\n")
    print("\n".join(L))


if __name__ == "__main__":
    main()
