"""Figure 4's uniform f0 on a ladder of adaptive grids (issue #17 item 1: "uniform and perturbed f0").

The uniform f0 (the study's other initial density) at beta 30 and 100 on ``AdaptiveHealpixGrid(16, nside_max)``
with the default ``Refinement()``, the study's base configuration, to T = 30: the same levels as
adaptive.py's perturbed ladder (its ``member`` with ``f0="uniform"``: one sweep per level in sweep_runs/,
not committed; a finished level is loaded, not rerun).

What the uniform f0 does (README, "The uniform f0 on adaptive grids"): its symmetries keep the mass on E,
split equally between the clusters at +e1 and -e1 (no t_exit at any level), and W2(rho_t, Pi#rho_0)
keeps falling until it reaches the finest cell's size. So the plateau (min W2 over t <= 20) that a grid
reports is its finest cell's, the same fraction of h on every level (h the finest cell's angular size,
sqrt(4 pi / N) at its nside: a point mass seen through cells of size h), and the ladder has to show that
rather than converge to a number. What does converge is how fast the density concentrates: t(W2 <= w)
for levels w above every grid's floor (W2_LEVELS), and the decay rate of W2 over each octave of W2 that
lies above the level's floor.

Per level: t_exit, the final alignment with E, the plateau W2 and plateau / h, t(W2 <= w), the decay
rate over each W2 octave (-d log W2 / dt between the times W2 halves), cells, steps, wall time; between
consecutive levels the relative changes of t(W2 <= w) against the issue's 2 % bar, and the plateaus'
ratio (2 where the finest cell sets it).

Usage: python validation/fig4_concentration/adaptive_uniform.py [--beta 30 100] [--nside-max 64 128 256 512]
[--report-only] (writes adaptive_uniform.md, adaptive_uniform.json and adaptive_uniform.png beside this file: one
ladder per beta, each over the levels of it that have been run; a level not run at a beta is left out there).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

BETAS = [30.0, 100.0]
#: The levels run by default, per beta (``--nside-max`` sets them for every beta).
NSIDE_MAX = {30.0: [64, 128, 256, 512], 100.0: [64, 128, 256]}
#: Concentration levels: the first time W2(rho_t, Pi#rho_0) falls to each (above every level's floor).
W2_LEVELS = (0.2, 0.1, 0.05)
BAR = 0.02


def cell_size(nside: int) -> float:
    """The angular size of a HEALPix cell at nside: sqrt(4 pi / (12 nside^2))."""
    return math.sqrt(4.0 * math.pi / (12 * nside ** 2))


def first_below(t, w, level: float) -> float | None:
    """The first time w(t) falls to ``level``, linear in log w between saved states (None if it does not)."""
    t, w = np.asarray(t, float), np.asarray(w, float)
    i = np.nonzero(w <= level)[0]
    if not i.size or i[0] == 0:
        return None
    j = int(i[0])
    a, b = math.log(w[j - 1]), math.log(w[j])
    return float(t[j - 1] + (math.log(level) - a) * (t[j] - t[j - 1]) / (b - a))


def readings(rec: dict) -> dict:
    """The uniform f0's readings of one level (see the module docstring)."""
    t, W = np.asarray(rec["times"], float), np.asarray(rec["W2"], float)
    h = cell_size(rec["nside_max"])
    out = {"beta": rec["beta"], "nside_max": rec["nside_max"], "h": h, "t_exit": rec["t_exit"],
           "align_E_T": rec["align_E"][-1],
           "min_align_E_after_2": float(np.min(np.asarray(rec["align_E"])[t >= 2.0])),
           "plateau_w2": rec["plateau_w2"], "plateau_over_h": rec["plateau_w2"] / h, "w2_T": float(W[-1]),
           "t_w2": {f"{w:g}": first_below(t, W, w) for w in W2_LEVELS}}
    # the decay rate over each octave of W2 that lies above twice the plateau: ln 2 / (time to halve)
    rates = []
    w = 0.4
    while w / 2 > 2 * rec["plateau_w2"]:
        a, b = first_below(t, W, w), first_below(t, W, w / 2)
        if a is not None and b is not None:
            rates.append({"from": w, "to": w / 2, "rate": math.log(2.0) / (b - a)})
        w /= 2
    out["rates"] = rates
    for k in ("max_cells", "cells_T", "steps", "wall_s", "mass_drift", "min_f"):
        out[k] = rec[k]
    return out


def changes(rows: list[dict]) -> list[dict]:
    """Between consecutive levels of one beta's ladder (``rows`` of one beta, by nside_max): the relative
    change of each t(W2 <= w) and the plateaus' ratio."""
    out = []
    for a, b in zip(rows, rows[1:]):
        c = {"beta": a["beta"], "levels": [a["nside_max"], b["nside_max"]],
             "plateau_ratio": a["plateau_w2"] / b["plateau_w2"]}
        for k in a["t_w2"]:
            x, y = a["t_w2"][k], b["t_w2"][k]
            c[f"t_w2_{k}"] = None if x is None or y is None else abs(y - x) / abs(y)
        out.append(c)
    return out


def by_beta(items: list[dict]) -> list[tuple[float, list[dict]]]:
    """(beta, its items by nside_max) for each beta of ``items`` (rows or records), betas ascending."""
    return [(b, sorted((x for x in items if x["beta"] == b), key=lambda x: x["nside_max"]))
            for b in sorted({x["beta"] for x in items})]


def report(rows: list[dict], recs: list[dict]) -> str:
    L = ["# Figure 4's uniform f0 on adaptive grids (validation/fig4_concentration/adaptive_uniform.py)", "",
         "The uniform f0, AdaptiveHealpixGrid(16, nside_max) with the default Refinement(), the "
         f"study's base configuration, to T = {recs[0]['times'][-1]:g}. h: the finest cell's angular size. The "
         "plateau is min W2(rho_t, Pi#rho_0) over t <= 20; t(W2 <= w) the first time W2 falls to w (log-linear "
         "between saved states, every 0.25)."]
    for beta, rs in by_beta(rows):
        L += ["", f"## beta {beta:g}", ""] + _ladder_report(rs)
    return "\n".join(L) + "\n"


def _ladder_report(rows: list[dict]) -> list[str]:
    def f(x, p=2):
        return "none" if x is None else f"{x:.{p}f}"

    L = ["| nside_max | h | t_exit | align E at T (least after t = 2) | plateau W2 | plateau / h | W2 at T | "
         + " | ".join(f"t(W2 <= {w:g})" for w in W2_LEVELS)
         + " | cells at most / at T | steps | wall s | mass drift | min f |",
         "|" + "---|" * (12 + len(W2_LEVELS))]
    for r in rows:
        L.append(f"| {r['nside_max']} | {r['h']:.4f} | {f(r['t_exit'])} | {r['align_E_T']:.5f} "
                 f"({r['min_align_E_after_2']:.5f}) | {r['plateau_w2']:.5f} | {r['plateau_over_h']:.3f} | "
                 f"{r['w2_T']:.5f} | " + " | ".join(f(r["t_w2"][f"{w:g}"], 3) for w in W2_LEVELS)
                 + f" | {r['max_cells']} / {r['cells_T']} | {r['steps']} | {r['wall_s']:.0f} | "
                 f"{r['mass_drift']:.1e} | {r['min_f']:.1e} |")
    L += ["", f"Between consecutive levels (the issue's bar for times: <= {100 * BAR:g} %; the plateaus' ratio is 2 "
          "where the finest cell sets the plateau):", "",
          "| levels | " + " | ".join(f"t(W2 <= {w:g})" for w in W2_LEVELS) + " | within the bar | plateau ratio |",
          "|" + "---|" * (3 + len(W2_LEVELS))]
    for c in changes(rows):
        ch = [c[f"t_w2_{w:g}"] for w in W2_LEVELS]
        ok = all(x is not None and x <= BAR for x in ch)
        L.append(f"| nside_max {c['levels'][0]} -> {c['levels'][1]} | "
                 + " | ".join("-" if x is None else f"{100 * x:.2f} %" for x in ch)
                 + f" | {'yes' if ok else 'no'} | {c['plateau_ratio']:.3f} |")
    octaves = sorted({x["from"] for r in rows for x in r["rates"]}, reverse=True)
    L += ["", "The decay rate -d log W2 / dt over each octave of W2 above twice the level's plateau (ln 2 over the "
          "time W2 takes to halve):", "",
          "| nside_max | " + " | ".join(f"{w:g} -> {w / 2:g}" for w in octaves) + " |",
          "|" + "---|" * (1 + len(octaves))]
    for r in rows:
        by = {round(x["from"], 9): x["rate"] for x in r["rates"]}
        L.append(f"| {r['nside_max']} | " + " | ".join(f"{by[round(w, 9)]:.3f}" if round(w, 9) in by else "-"
                                                      for w in octaves) + " |")
    return L


def figure(recs: list[dict], path: Path) -> None:
    """adaptive_uniform.png: W2 to Pi#rho_0 against t per level with each level's finest cell h (dotted), and
    W2 / h against t (the plateau the same on every level)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ladders = by_beta(recs)
    fig, axs = plt.subplots(len(ladders), 2, figsize=(12, 4.4 * len(ladders)), squeeze=False)
    for ax, (beta, rs) in zip(axs, ladders):
        _ladder_panels(ax, beta, rs)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _ladder_panels(ax, beta: float, recs: list[dict]) -> None:
    shades = np.linspace(0.7, 0.0, len(recs))
    for r, sh in zip(recs, shades):
        t, W = np.asarray(r["times"]), np.asarray(r["W2"])
        h = cell_size(r["nside_max"])
        c = (sh, sh, 1.0 - 0.5 * sh)
        ax[0].semilogy(t, W, color=c, label=f"nside_max {r['nside_max']}")
        ax[0].axhline(h, color=c, lw=0.6, ls=":")
        ax[1].plot(t, W / h, color=c, label=f"nside_max {r['nside_max']}")
    ax[0].set(xlabel="t", ylabel="W2(rho_t, Pi#rho_0)", ylim=(1e-3, 1.5),
              title=f"uniform f0, beta {beta:g}: W2 (dotted: the finest cell h)")
    ax[0].legend(fontsize=7)
    ax[1].set(xlabel="t", ylabel="W2 / h", ylim=(0, 3),
              title=f"beta {beta:g}: W2 over the finest cell: the plateau is the grid's")
    ax[1].legend(fontsize=7)


def main(argv=None):
    import adaptive as A  # noqa: E402  (beside this file)

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--beta", type=float, nargs="+", default=BETAS)
    ap.add_argument("--nside-max", type=int, nargs="+", default=None)
    ap.add_argument("--report-only", action="store_true", help="only the levels already run")
    a = ap.parse_args(argv)
    recs = []
    # the betas asked for are run; the others' levels already on disk stay in the outputs (a run of one
    # beta must not drop another's ladder from adaptive_uniform.json, which ladder.csv reads)
    for beta in sorted(set(BETAS) | set(a.beta)):
        default = NSIDE_MAX.get(beta, NSIDE_MAX[30.0])
        to_run = set() if a.report_only or beta not in a.beta else set(a.nside_max or default)
        for nmax in sorted(set(default) | set(a.nside_max or ()) | to_run):
            rec = A.member(beta, nmax, run=nmax in to_run, f0="uniform")
            if rec is not None:
                recs.append(rec)
                print(f"beta {beta:g}, nside_max {nmax}: plateau {rec['plateau_w2']:.5f}, t_exit {rec['t_exit']}, "
                      f"{rec['steps']} steps, {rec['wall_s']:.0f} s", flush=True)
    if not recs:
        return 1
    recs = [r for _, rs in by_beta(recs) for r in rs]
    rows = [readings(r) for r in recs]
    (HERE / "adaptive_uniform.json").write_text(json.dumps({"betas": sorted({r["beta"] for r in recs}),
                                                            "rows": rows, "records": recs}))
    (HERE / "adaptive_uniform.md").write_text(report(rows, recs))
    figure(recs, HERE / "adaptive_uniform.png")
    print(report(rows, recs))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    sys.exit(main())
