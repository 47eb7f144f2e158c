"""Adaptive against uniform HEALPix grids at zero temperature, against the exact solution (issue #16).

The paper matrices (B = diag(-1, -1, 1), V = diag(-1, 1, -2)) at t = 3, where the density has collapsed
towards +-e1 and uniform grids are under-resolved; the smooth positive f0 of the zero-temperature
convergence study. Uniform grids nside 16 ... 128; adaptive grids nside_min 8 with nside_max 64 ... 256
and the default refinement (``Refinement()``: refine where the density varies by more than 25 % across a
cell's stencil, regrid every 4 steps, the refined region following the concentration). Errors: relative
L1 of cell averages against the exact cell averages on each run's final grid (backward characteristics,
spherepde.exact). The comparison at equal cell count interpolates the uniform ladder's error, log-log in
the number of cells, at the adaptive run's mean cell count over the run (its cost) and at its final one.

Usage: python validation/adaptive/run.py [--quick]
Writes results.json, results.md and adaptive.png beside this file (quick mode: *_quick.*).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from spherepde import AdaptiveHealpixGrid, HealpixGrid, Solver, ZeroTemperature
from spherepde.config import MATRIX_PRESETS
from spherepde.exact import _default_steps

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parents[1]))
from validation import criteria as C  # noqa: E402

T = 3.0
UNIFORM = (16, 32, 64, 128)
ADAPTIVE = (64, 128, 256)
NSIDE_MIN = 8
QUICK_UNIFORM = (8, 16, 32)
QUICK_ADAPTIVE = (32,)
#: Tolerance of the reference's pixel refinement: mass 1 to 1.5e-7, and its cell averages on nside 64 differ from
#: those at rtol 1e-3 by 2.9e-5 in L1 (measured), four orders below the scheme's errors.
REF_RTOL = 1e-4
#: The issue's bar: at equal cell count the adaptive L1 error is at most this fraction of the uniform one.
RATIO_TARGET = 0.25


def f0(x):
    """The smooth positive f0 of validation/convergence_zero_temperature (mass 1)."""
    return (1 + 0.5 * x[:, 0] + 0.3 * x[:, 1] * x[:, 2] + 0.2 * x[:, 2] ** 2) / (4 * np.pi * (1 + 0.2 / 3))


def model():
    p = MATRIX_PRESETS["paper"]
    return ZeroTemperature(p["B"], p["V"])


class Reference:
    """Exact integrals of the t = T solution over NESTED pixels, refined where the solution is concentrated.

    At t = 3 the exact density is so peaked that a fixed quadrature of the pointwise exact solution (backward
    characteristics) misses most of the mass (its cell averages on nside 32 hold 0.16 of it). Here each
    NESTED pixel from nside 8 down is integrated with the 32-point sub-pixel rule and compared with the sum
    over its four children; a pixel is accepted when they agree to ``rtol`` of its share of the total
    (area or content), else its children are examined, down to nside 2^MAX_ORDER. A grid cell's exact
    integral is the sum of the accepted pixels inside it, or, for a cell inside an accepted (smooth) pixel,
    its own fixed-rule integral. The estimate of the total error is kept (``error``)."""

    MAX_ORDER = 14

    def __init__(self, rtol: float = 1e-4):
        from spherepde.exact import exact_zero_temperature

        m = model()
        n_steps = max(20, _default_steps(m, T) // 2)
        self.func = lambda x: exact_zero_temperature(m, f0, x, T, n_steps)  # noqa: E731
        k = 3
        pix = np.arange(12 << (2 * k))
        acc_uniq, acc_val = [], []
        I = self._integrals(k, pix)
        err_total = 0.0
        levels = 0
        while pix.size:
            kids = ((pix[:, None] << 2) + np.arange(4)).ravel()
            Ik = self._integrals(k + 1, kids)
            sums = Ik.reshape(-1, 4).sum(axis=1)
            area = 4 * np.pi / (12 << (2 * k))
            share = np.maximum(area / (4 * np.pi), np.abs(sums))
            ok = (np.abs(sums - I) <= rtol * share) | (k + 1 >= self.MAX_ORDER)
            # accepted: the children's integrals are kept (they are the better ones)
            acc_uniq.append(4 * (1 << (2 * (k + 1))) + kids.reshape(-1, 4)[ok].ravel())
            acc_val.append(Ik.reshape(-1, 4)[ok].ravel())
            err_total += float(np.abs(sums - I)[ok].sum())
            pix, I, k = kids.reshape(-1, 4)[~ok].ravel(), Ik.reshape(-1, 4)[~ok].ravel(), k + 1
            levels += 1
        self.uniq = np.concatenate(acc_uniq)
        self.val = np.concatenate(acc_val)
        self.mass = float(self.val.sum())
        self.error = err_total / self.mass
        self.levels = levels

    def _integrals(self, k, pix):
        g = _PixelRule(k, pix)
        v = np.asarray(self.func(g.points.reshape(-1, 3)), float).reshape(g.points.shape[:2])
        return (v @ g.weights) * (4 * np.pi / (12 << (2 * k)))

    def averages(self, grid) -> np.ndarray:
        """Exact cell averages on ``grid`` (HealpixGrid with nside a power of 2, or AdaptiveHealpixGrid)."""
        import healpy as hp

        from spherepde.grids.adaptive import uniq_to_nest

        if hasattr(grid, "order"):
            order, ipix = grid.order, grid.ipix
        else:
            k = int(np.log2(grid.nside))
            order, ipix = np.full(grid.n_cells, k), hp.ring2nest(grid.nside, np.arange(grid.n_cells))
        ro, rp = uniq_to_nest(self.uniq)
        kref = max(int(ro.max()), int(order.max()))
        r0, r1 = rp << (2 * (kref - ro)), (rp + 1) << (2 * (kref - ro))
        c0, c1 = ipix << (2 * (kref - order)), (ipix + 1) << (2 * (kref - order))
        srt = np.argsort(c0)
        cell_of_ref = srt[np.searchsorted(c0[srt], r0, side="right") - 1]
        inside = r1 <= c1[cell_of_ref]  # reference pixel within the cell
        out = np.bincount(cell_of_ref[inside], self.val[inside], minlength=grid.n_cells).astype(float)  # (int if empty)
        covered = np.bincount(cell_of_ref[inside], minlength=grid.n_cells) > 0
        rest = ~covered  # cells inside a (smooth) accepted reference pixel: their own rule
        if rest.any():
            for k in np.unique(order[rest]):
                sel = np.nonzero(rest & (order == k))[0]
                out[sel] = self._integrals(int(k), ipix[sel])
        return out / grid.areas


class _PixelRule:
    """The 32-point sub-pixel rule of HealpixGrid on NESTED pixels (k, pix)."""

    def __init__(self, k, pix):
        import healpy as hp

        from spherepde.grids.healpix import _square_rule

        ix, iy, face = hp.pix2xyf(1 << int(k), np.asarray(pix, np.int64), nest=True)
        h = 1.0 / (1 << int(k))
        self.points, self.weights = _square_rule(4, face, ix * h, iy * h, np.full(len(ix), h))


def one_run(grid, label: str, nside_max: int, ref: Reference) -> dict:
    m = model()
    t0 = time.perf_counter()
    s = Solver(grid, m, f0)
    cells = [s.grid.n_cells]
    s.advance(T, lambda sv: cells.append(sv.grid.n_cells))
    wall = time.perf_counter() - t0
    g = s.grid
    ex = ref.averages(g)
    err = s.f - ex
    l1 = float(np.sum(np.abs(err) * g.areas) / np.sum(np.abs(ex) * g.areas))
    mass = np.array(s.diag["mass"])
    row = dict(grid=label, nside_max=nside_max, cells_final=int(g.n_cells), cells_mean=float(np.mean(cells)),
               cells_max=int(max(cells)), steps=int(s.n_steps), regrids=int(getattr(s, "n_regrids", 0)),
               L1=l1, min=float(min(s.diag["min"])), mass_drift=float(np.abs(mass / mass[0] - 1).max()),
               seconds=wall)
    if hasattr(g, "order"):
        row["cells_per_nside"] = {str(1 << int(k)): int(c) for k, c in zip(*np.unique(g.order, return_counts=True))}
    print(f"{label:9s} nside_max {nside_max:4d}: {row['cells_final']:7d} cells (mean {row['cells_mean']:.0f}), "
          f"L1 {l1:.3e}, {row['steps']} steps, {row['regrids']} regrids, {wall:.1f} s", flush=True)
    return row


def uniform_error_at(rows, cells: float) -> float:
    """The uniform ladder's L1 at ``cells``, interpolated (or extrapolated from the last two) log-log."""
    u = sorted((r for r in rows if r["grid"] == "uniform"), key=lambda r: r["cells_final"])
    n = np.log([r["cells_final"] for r in u])
    e = np.log([r["L1"] for r in u])
    x = np.log(cells)
    i = int(np.clip(np.searchsorted(n, x) - 1, 0, len(n) - 2))
    return float(np.exp(e[i] + (e[i + 1] - e[i]) * (x - n[i]) / (n[i + 1] - n[i])))


def compare(rows) -> list[dict]:
    out = []
    for r in rows:
        if r["grid"] != "adaptive":
            continue
        em, ef = uniform_error_at(rows, r["cells_mean"]), uniform_error_at(rows, r["cells_final"])
        row = dict(nside_max=r["nside_max"], L1=r["L1"], cells_mean=r["cells_mean"], uniform_L1_at_mean=em,
                   ratio_mean=r["L1"] / em, cells_final=r["cells_final"], uniform_L1_at_final=ef,
                   ratio_final=r["L1"] / ef)
        same = [u for u in rows if u["grid"] == "uniform" and u["nside_max"] == r["nside_max"]]
        if same:  # the uniform grid of the adaptive grid's finest cells: the same resolution where it matters
            u = same[0]
            row.update(uniform_L1_same_nside=u["L1"], L1_ratio_same_nside=r["L1"] / u["L1"],
                       cells_ratio_same_nside=r["cells_mean"] / u["cells_final"],
                       wall_ratio_same_nside=r["seconds"] / u["seconds"])
        out.append(row)
    return out


def criteria(res) -> list[dict]:
    """Per adaptive run: L1 <= 1/4 of the uniform ladder's at the run's mean cell count; mass to rounding and
    min f > 0 on every run."""
    rows = res["rows"]
    out = []
    for c in res["compare"]:
        out.append(C.at_most(f"adaptive nside_max {c['nside_max']}: L1 / uniform L1 at equal (mean) cell count "
                             f"{c['cells_mean']:.0f}", c["ratio_mean"], RATIO_TARGET, ".3f"))
    out.append(C.mass_conserved("all runs", max(r["mass_drift"] for r in rows)))
    out.append(C.positive("all runs", min(r["min"] for r in rows)))
    return out


def write_md(res, path):
    lines = ["# Adaptive against uniform grids at zero temperature (validation/adaptive)", "",
             f"Paper matrices, t = {res['T']}, the smooth f0 of the convergence study; relative L1 error of cell",
             "averages against the exact solution on each run's final grid. Adaptive: nside_min "
             f"{res['nside_min']}, default `Refinement()`. The exact cell averages come from a reference of "
             f"{res['reference']['pixels']} NESTED pixels over {res['reference']['levels']} levels (mass "
             f"{res['reference']['mass']:.9f}, estimated error {res['reference']['error']:.1e}): see `Reference`.", "",
             "| grid | nside_max | cells (final) | cells (mean) | steps | regrids | L1 | min f | mass drift | s |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in res["rows"]:
        lines.append(f"| {r['grid']} | {r['nside_max']} | {r['cells_final']} | {r['cells_mean']:.0f} | {r['steps']} | "
                     f"{r['regrids']} | {r['L1']:.3e} | {r['min']:.2e} | {r['mass_drift']:.1e} | {r['seconds']:.1f} |")
    lines += ["", "At equal cell count (the uniform ladder's L1 interpolated log-log in the number of cells):", "",
              "| nside_max | adaptive L1 | cells (mean) | uniform L1 there | ratio | cells (final) | uniform L1 there "
              "| ratio |", "|---|---|---|---|---|---|---|---|"]
    for c in res["compare"]:
        lines.append(f"| {c['nside_max']} | {c['L1']:.3e} | {c['cells_mean']:.0f} | {c['uniform_L1_at_mean']:.3e} | "
                     f"{c['ratio_mean']:.3f} | {c['cells_final']} | {c['uniform_L1_at_final']:.3e} | "
                     f"{c['ratio_final']:.3f} |")
    same = [c for c in res["compare"] if "L1_ratio_same_nside" in c]
    if same:
        lines += ["", "Against the uniform grid of the adaptive grid's finest cells (the same resolution at the peak):",
                  "", "| nside_max | adaptive L1 | uniform L1 | L1 ratio | mean cells ratio | wall time ratio |",
                  "|---|---|---|---|---|---|"]
        for c in same:
            lines.append(f"| {c['nside_max']} | {c['L1']:.3e} | {c['uniform_L1_same_nside']:.3e} | "
                         f"{c['L1_ratio_same_nside']:.3f} | {c['cells_ratio_same_nside']:.3f} | "
                         f"{c['wall_ratio_same_nside']:.2f} |")
    u = sorted((r for r in res["rows"] if r["grid"] == "uniform"), key=lambda r: r["nside_max"])
    if len(u) >= 2 and u[-1]["L1"] > u[0]["L1"]:
        lines += ["", f"**Not converged.** The uniform ladder's error grows with resolution, nside {u[0]['nside_max']} "
                  f"-> {u[-1]['nside_max']}: {u[0]['L1']:.3g} -> {u[-1]['L1']:.3g}. At t = {res['T']:g} the exact peak is "
                  "narrower than every cell here, and finer cells split its mass among more cells that the "
                  "scheme's smearing misplaces: the pre-asymptotic regime, where a coarse grid's L1 is smaller "
                  "and the equal-cell-count comparison measures that, not resolution. The adaptive grids carry "
                  "the error of the uniform grid of their finest cells (last table) at a fraction of its cells; "
                  "the asymptotic regime needs cells below the peak width (nside_max well beyond 256)."]
    for r in res["rows"]:
        if "cells_per_nside" in r:
            lines.append(f"\nCells per nside at t = {res['T']}, nside_max {r['nside_max']}: {r['cells_per_nside']}")
    lines += ["", f"Wall time of this study: {res['wall_total_s']:.0f} s.", ""]
    Path(path).write_text("\n".join(lines))


def plot(res, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4.2))
    for kind, mk in (("uniform", "o-"), ("adaptive", "s-")):
        rs = sorted((r for r in res["rows"] if r["grid"] == kind), key=lambda r: r["cells_mean"])
        ax.loglog([r["cells_mean"] for r in rs], [r["L1"] for r in rs], mk,
                  label=f"{kind} (labels: {'nside' if kind == 'uniform' else 'nside_max'})")
        for r in rs:
            ax.annotate(str(r["nside_max"]), (r["cells_mean"], r["L1"]), fontsize=7, xytext=(3, 3),
                        textcoords="offset points")
    ax.set_xlabel("cells (mean over the run)")
    ax.set_ylabel(f"relative L1 error at t = {res['T']:g}")
    ax.set_title("zero temperature, paper matrices: adaptive vs uniform")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


results_for = C.quick_results(HERE)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="uniform nside 8, 16, 32 and adaptive 8..32 (seconds)")
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    ref = Reference(REF_RTOL)
    print(f"reference: {len(ref.uniq)} pixels over {ref.levels} levels, mass {ref.mass:.9f}, estimated relative "
          f"error {ref.error:.1e} ({time.perf_counter() - t0:.0f} s)", flush=True)
    rows = []
    for ns in (QUICK_UNIFORM if a.quick else UNIFORM):
        rows.append(one_run(HealpixGrid(ns), "uniform", ns, ref))
    for ns in (QUICK_ADAPTIVE if a.quick else ADAPTIVE):
        rows.append(one_run(AdaptiveHealpixGrid(NSIDE_MIN, ns), "adaptive", ns, ref))
    res = {"T": T, "nside_min": NSIDE_MIN, "rows": rows, "compare": compare(rows),
           "reference": {"rtol": REF_RTOL, "pixels": int(len(ref.uniq)), "levels": ref.levels, "mass": ref.mass,
                         "error": ref.error},
           "wall_total_s": time.perf_counter() - t0}
    C.save_outputs(HERE, "adaptive", res, a.quick, write_md, plot)
    return 0


if __name__ == "__main__":
    sys.exit(C.cli("adaptive", criteria, main, results_for))
