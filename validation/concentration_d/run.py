"""Density-level concentration towards Pi#rho_0 on S^1, S^2, S^3 (tensor grids, second-order FV).

One run per dimension d = 2, 3, 4 from the uniform density, at zero temperature (beta = inf) and at one
finite beta (``Attention``), recording W2(rho_t, Pi#rho_0) (chordal cost; rho_t is the grid measure
(centres, f |C|), Pi#rho_0 from ``spectral.limit_measure`` of the initial grid measure), the alignment
int |P_E x|^2 drho_t, int |P_F x|^2 drho_t, and the bound of Corollary 2,
sqrt(2 V_p(rho_0)) exp(-p gamma t / sigma_max(B)).

Pairs (Assumption 1: A = V B^T symmetric, B invertible):
- d = 2: the paper's matrices restricted to the (e1, e2) plane, B = diag(-1, -1), V = diag(-1, 1):
  A = diag(1, -1), E = span(e1), gamma = 2, F = span(e2); Pi#rho_0 = (delta_e1 + delta_-e1)/2.
- d = 3: the paper's B = diag(-1, -1, 1), V = diag(-1, 1, -2): A = diag(1, -1, -2), E = span(e1).
- d = 4: B = diag(-1, -1, 1, 1), V = diag(-1, -1, 1, -1): A = diag(1, 1, 1, -1), dim E = 3, gamma = 2,
  so V_1(rho_0) is finite (2p < k with p = 1) and Pi#rho_0 is the uniform measure on the great 2-sphere
  E cap S^3 (x4 = 0).

Usage: ``python validation/concentration_d/run.py [--quick]``; writes concentration_d.md, .json, .png.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from spherepde import ZeroTemperature
from spherepde.grids.tensor import TensorGrid
from spherepde.models.attention import Attention
from spherepde.solver import solve
from spherepde.spectral import limit_measure, lyapunov_vp_uniform, spectral_data
from spherepde.wasserstein import wasserstein2

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
from validation import criteria as C  # noqa: E402

PAIRS = {
    2: (np.diag([-1.0, -1.0]), np.diag([-1.0, 1.0])),
    3: (np.diag([-1.0, -1.0, 1.0]), np.diag([-1.0, 1.0, -2.0])),
    4: (np.diag([-1.0, -1.0, 1.0, 1.0]), np.diag([-1.0, -1.0, 1.0, -1.0])),
}
GRID_N = {2: 256, 3: 32, 4: 12}
QUICK_N = {2: 32, 3: 8, 4: 4}
P_EXP = {2: 0.45, 3: 0.45, 4: 1.0}  # V_p finite needs 2p < k = dim E
BETA = 20.0
T_END = 4.0


def one_run(d: int, beta: float, n: int, times):
    B, V = PAIRS[d]
    sp = spectral_data(B, V)
    g = TensorGrid(d, n)
    f0 = np.full(g.n_cells, 1.0 / g.total_area)
    model = ZeroTemperature(B, V) if beta == np.inf else Attention(B, V, beta)
    t0 = time.perf_counter()
    r = solve(g, model, f0, times[-1], save_at=times)
    wall = time.perf_counter() - t0
    w0 = f0 * g.areas
    lp, lw = limit_measure(g.centers, w0, B, V, spectral=sp)
    # f0 is uniform: V_p(rho_0) exactly (a sum over cell centres misses the integrable singularity on
    # E^perp: 3.42 instead of 9.73 for d = 3, p = 0.45)
    vp = lyapunov_vp_uniform(d, sp.k, P_EXP[d])
    rows = []
    for t, f in zip(r.times, r.density):
        w = f * g.areas
        W2 = wasserstein2(g.centers, w, lp, lw)
        PE = np.einsum("ij,kj->ik", g.centers, sp.E)
        PF = np.einsum("ij,kj->ik", g.centers, sp.F)
        rows.append({
            "t": float(t), "W2": float(W2),
            "bound": float(np.sqrt(2 * vp) * np.exp(-P_EXP[d] * sp.gamma * t / sp.sigma_max)),
            "align_E": float(w @ np.sum(PE**2, axis=1) / w.sum()),
            "align_F": float(w @ np.sum(PF**2, axis=1) / w.sum()),
            "max_f": float(f.max()), "min_f": float(f.min()),
        })
    dg = r.diagnostics
    meta = {"d": d, "beta": "inf" if beta == np.inf else beta, "n": n, "cells": g.n_cells, "k": sp.k,
            "gamma": sp.gamma, "p": P_EXP[d], "V_p0": vp, "steps": r.n_steps, "wall_s": wall,
            "mass_drift": float(abs(dg["mass"][-1] / dg["mass"][0] - 1)), "min_density": float(dg["min"].min()),
            "h": float(np.pi / n)}
    print(meta, flush=True)
    return {"meta": meta, "rows": rows}


def criteria(runs) -> list[dict]:
    """Criteria of concentration_d.json (a list of runs, each {"meta", "rows"}).

    - beta = inf, per d: Corollary 2 (MODEL.md) up to the grid floor: W2(rho_t, Pi#rho_0) <=
      max(bound(t), h) at every saved time, h = pi / n the cell width (README: "W2 stays below the
      Corollary 2 bound until it reaches the grid's floor"; a finite-volume density cannot concentrate
      below one cell). Measured: max over t of W2 / max(bound, h).
    - every run: mass conserved to rounding and min f > 0 (README: "mass drift <= 9e-16 in every run,
      min f > 0 throughout").
    The finite-beta runs have no bound with known constants (Theorem 1's C0, C1): no W2 criterion.
    """
    out = []
    for run in runs:
        m = run["meta"]
        label = f"d = {m['d']}, beta = {m['beta']}"
        if m["beta"] == "inf":
            ratio = max(r["W2"] / max(r["bound"], m["h"]) for r in run["rows"])
            out.append(C.at_most(f"{label}: Corollary 2 up to the grid floor, max_t W2 / max(bound, h)", ratio,
                                 1.0, ".3f"))
        out.append(C.mass_conserved(label, m["mass_drift"]))
        out.append(C.positive(label, m["min_density"]))
    return out


def results_for(argv) -> Path:
    """The results JSON a run with these arguments writes."""
    return HERE / ("concentration_d_quick.json" if "--quick" in argv else "concentration_d.json")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--check-only", action="store_true",
                    help="evaluate the criteria of the results JSON on disk (no run); exit 1 if one fails")
    ap.add_argument("--results", default=None, help="with --check-only: this results JSON")
    ap.add_argument("--no-beta", action="store_true", help="zero temperature only")
    args = ap.parse_args(argv)
    ns = QUICK_N if args.quick else GRID_N
    times = np.linspace(0.0, 1.0 if args.quick else T_END, 9)
    runs = []
    for d in (2, 3, 4):
        for beta in ((np.inf,) if args.no_beta else (np.inf, BETA)):
            runs.append(one_run(d, beta, ns[d], times))
    suffix = "_quick" if args.quick else ""
    (HERE / f"concentration_d{suffix}.json").write_text(json.dumps(runs, indent=1))
    lines = ["# Concentration towards Pi#rho_0 on S^1, S^2, S^3 (tensor grids, uniform rho_0)", "",
             "W2 = W2(rho_t, Pi#rho_0), chordal cost; bound = sqrt(2 V_p(rho_0)) exp(-p gamma t / sigma_max(B))",
             "(Corollary 2, beta = inf); align_E = int |P_E x|^2 drho_t, align_F = int |P_F x|^2 drho_t.", ""]
    for run in runs:
        m = run["meta"]
        lines += [f"## d = {m['d']}, beta = {m['beta']}: n = {m['n']} ({m['cells']} cells, h = {m['h']:.3f}), "
                  f"dim E = {m['k']}, gamma = {m['gamma']:g}, p = {m['p']}, V_p(rho_0) = {m['V_p0']:.4f}, "
                  f"{m['steps']} steps, {m['wall_s']:.1f} s, mass drift {m['mass_drift']:.1e}, min f {m['min_density']:.2e}", "",
                  "| t | W2 | bound | align_E | align_F | max f |", "|---|---|---|---|---|---|"]
        for r in run["rows"]:
            lines.append(f"| {r['t']:.2f} | {r['W2']:.4f} | {r['bound']:.4f} | {r['align_E']:.4f} | {r['align_F']:.4f} | {r['max_f']:.3g} |")
        lines.append("")
    (HERE / f"concentration_d{suffix}.md").write_text("\n".join(lines) + "\n")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, 3, figsize=(13, 4))
        for ax, d in zip(axes, (2, 3, 4)):
            for run in runs:
                m = run["meta"]
                if m["d"] != d:
                    continue
                t = [r["t"] for r in run["rows"]]
                ax.semilogy(t, [r["W2"] for r in run["rows"]], "o-", label=f"W2, beta = {m['beta']}")
                if m["beta"] == "inf":
                    ax.semilogy(t, [r["bound"] for r in run["rows"]], "k--", lw=0.8, label="Cor. 2 bound")
                    ax.axhline(m["h"], color="gray", lw=0.6, ls=":", label="cell width h")
            ax.set_title(f"S^{d - 1} (d = {d})")
            ax.set_xlabel("t")
            ax.legend(fontsize=8)
        axes[0].set_ylabel("W2(rho_t, Pi#rho_0)")
        fig.tight_layout()
        fig.savefig(HERE / f"concentration_d{suffix}.png", dpi=110)
    except Exception as exc:  # pragma: no cover
        print("plot skipped:", exc)


if __name__ == "__main__":
    sys.exit(C.cli("concentration_d", criteria, main, results_for))
