"""Beta 30's second stage with the clusters refined past the ladder: is t_EF the equation's? (issue #17 items 1-4)

The transition-law member at beta 30, eps 1e-3 (``adaptive.py --nside-min 32 --nside-max 2048 4096 --eps 1e-3
--t-end 25``) converges in nside_max (t_EF 21.82 / 21.73). But after the exit the two clusters are only 3-4 of
their finest cells wide on both levels (their width follows the cell), so a ladder in nside_max cannot show an
error that lives at the clusters' own scale. This study measures one: the growth rate of the stall's seed
mean(x2) (the translation of both clusters along e2, rate 1 in the reduced cluster dynamics,
``validation/cluster_dynamics``), read three ways at the same states:

- the *exact* rate: d mean(x2)/dt = int f v2 (v the attention velocity) over mean(x2), with the field summed
  over the cells as point masses (``Attention.velocity_measure``, no tolerance) at the targets holding the mass;
- the *scheme's* rate: mean(x2) of the run itself between saved states (the rate the grid carries out);
- the same from a restart of the state at ``T0`` (before the exit, where the levels agree) on grids whose
  finest cells are 2, 4 and 8 times smaller (``AdaptiveHealpixGrid(32, nside_max, uniq=the state's cells)``,
  the same refinement; the new cells come from the regrids), run to T = 25: t_exit, t_EF, the rates and the
  clusters' width per level. The restart on the state's own nside_max checks the restart (it drops the field
  history, nothing else).

Reads the members' results files in ``sweep_runs/`` (not committed: this runs where the members ran), writes
stall_refined.md and stall_refined.json beside this file (each invocation adds its levels). ``--levels`` the
restart levels, ``--t0`` the restart time, ``--t-end`` where they stop, ``--source`` the member's nside_max;
``--checks`` (~8 min on one core) what the slow stall is not: the step, the regrids, the exact rate's quadrature.

Usage: python validation/transition_law/stall_refined.py [--levels 4096 8192 16384] [--t0 8] [--source 4096]
       [--t-end 25] [--checks] [--report-only]
The committed record: ``--levels 4096 8192 --t0 8``, ``--levels 16384 --t0 12.5 --t-end 23``, ``--checks --levels``.
"""
from __future__ import annotations

import argparse
import functools
import glob
import json
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
from spherepde.diagnostics import exit_time, transition_time  # noqa: E402
from validation.fig3_density.common import PAPER_B, PAPER_V, grid_measures  # noqa: E402

BETA, T_END = 30.0, 25.0
#: The clusters' cells: at least this share of the heaviest cell's mass (the tails' cut of fig4's TAIL_FRACTION).
MASSIVE = 1e-6
#: The cluster's cells for its width: within this angle (rad) of the heaviest cell.
RADIUS = 0.05
#: The stall: the growth of mean(x2) is read from here to RATE_T1 (on the cone, before the nonlinear turn).
RATE_T0, RATE_T1 = 13.0, 17.0


@functools.lru_cache(maxsize=None)  # one load a member per process (checks and restarts share its built grids)
def source(nside_max: int):
    import spherepde as sp

    hits = glob.glob(str(HERE / "sweep_runs" / f"transition_law_adaptive_min32_{nside_max}_T25_eps1e-03" /
                         "members" / "*" / "results.h5"))
    if not hits:
        raise SystemExit(f"no results file of the beta-30 eps-1e-3 member at nside_max {nside_max} in sweep_runs/ "
                         f"(run adaptive.py --nside-min 32 --nside-max {nside_max} --eps 1e-3 --t-end 25 first)")
    return sp.load(hits[0])


def model():
    import spherepde as sp

    return sp.Attention(PAPER_B, PAPER_V, BETA, tol=1e-10)


def moments(grid, f) -> dict:
    """mean(x2), the exact rate int f v2 / mean(x2), and the heaviest cluster's width (rms angle) over its finest
    cell size."""
    m = np.asarray(f) * grid.areas
    x = grid.centers
    x2 = float(np.sum(m * x[:, 1]))
    tgt = np.flatnonzero(m >= MASSIVE * m.max())
    v = model().velocity_measure(x[tgt], x, np.maximum(m, 0.0))
    k = int(np.argmax(m))
    near = x @ x[k] > np.cos(RADIUS)
    c = (m[near, None] * x[near]).sum(0)
    c /= np.linalg.norm(c)
    width = float(np.sqrt((m[near] * ((x[near] - c) ** 2).sum(1)).sum() / m[near].sum()))
    return {"x2": x2, "exact_rate": float(np.sum(m[tgt] * v[:, 1]) / x2), "width": width,
            "h": float(np.sqrt(grid.areas[near].min()))}


def nearest(times, t: float) -> int:
    """The index of the saved time nearest ``t``."""
    return int(np.argmin(abs(np.asarray(times) - t)))


def state_at(r, t: float):
    """(index, grid, density) of the state of ``r`` saved nearest ``t``."""
    i = nearest(r.times, t)
    return i, r.grid_at(i), np.asarray(r.density[i])


def rate_between(times, x2, t0=RATE_T0, t1=RATE_T1) -> float:
    times = np.asarray(times)
    i, j = nearest(times, t0), nearest(times, t1)
    return float(np.log(x2[j] / x2[i]) / (times[j] - times[i]))


def measure(grid, f) -> tuple[float, float, float]:
    """(align E, align F, mean(x2)) of one state."""
    q = grid_measures(grid, np.asarray(f)[None, :], PAPER_B, PAPER_V, w2=False)
    return q["align_E"][0], q["align_F"][0], float(np.sum(np.asarray(f) * grid.areas * grid.centers[:, 1]))


def lag(q: dict, exact: float, t0: float = RATE_T0, t1: float = 20.0) -> float:
    """The time the run took over [t0, t1] beyond what the stall's growth from mean(x2)(t0) to mean(x2)(t1) takes
    at the ``exact`` rate (what t_EF is late by, when the rest of the run is right)."""
    t, x2 = np.asarray(q["times"]), np.asarray(q["x2"])
    i, j = nearest(t, t0), nearest(t, t1)
    return float((t[j] - t[i]) - np.log(x2[j] / x2[i]) / exact)


def series(times, rows) -> dict:
    """t_exit, t_EF and the stall's rate from the rows (align E, align F, mean(x2)) at the saved ``times``."""
    aE, aF, x2 = (np.array(c) for c in zip(*rows))
    return {"times": list(map(float, times)), "align_E": aE.tolist(), "align_F": aF.tolist(), "x2": x2.tolist(),
            "t_exit": exit_time(times, aE), "t_EF": transition_time(times, aE, aF),
            "rate": rate_between(times, x2)}


def on_finest(nside_max: int):
    """grid_of for :func:`solver_at`: a state's own cells and refinement, with finest cells of ``nside_max``."""
    from spherepde.grids.adaptive import AdaptiveHealpixGrid

    def grid_of(g, f):
        return AdaptiveHealpixGrid(32, nside_max, uniq=g.uniq, refinement=g.refinement, max_cells=3_000_000), f
    return grid_of


def solver_at(r, t0: float, grid_of, **options):
    """(a Solver from the state of ``r`` saved nearest t0, on ``grid_of(its grid, its f)`` -> (grid, f), with the
    member's options overridden by ``options``; the state's index)."""
    import spherepde as sp

    i, g, f = state_at(r, t0)
    grid, f = grid_of(g, f)
    opts = dict(cfl=0.8, field_interval=10)
    opts.update(options)
    return sp.Solver(grid, model(), f, sp.Options(**opts), t0=float(r.times[i])), i


def restart(r, t0: float, nside_max: int, t_end: float = T_END) -> dict:
    """The state of ``r`` at t0 on AdaptiveHealpixGrid(32, nside_max) with its cells, run to t_end."""
    times = np.asarray(r.times)
    s, i = solver_at(r, t0, on_finest(nside_max))
    mass0 = float(np.sum(s.f * s.grid.areas))
    # the alignments before t0 are the source's (t_exit and t_EF need the E-phase's lead)
    rows = [measure(r.grid_at(k), r.density[k]) for k in range(i)] + [measure(s.grid, s.f)]
    w0, peak, min_f, at16 = time.perf_counter(), s.grid.n_cells, float(s.f.min()), None
    for t in times[i + 1:]:
        if t > t_end + 1e-9:
            break
        s.advance(float(t))
        rows.append(measure(s.grid, s.f))
        peak, min_f = max(peak, s.grid.n_cells), min(min_f, float(s.f.min()))
        if abs(t - 16.0) < 1e-9:
            at16 = moments(s.grid, s.f)
        print(f"  nside_max {nside_max}: t = {s.t:.2f}, {s.grid.n_cells} cells, {s.n_steps} steps, "
              f"{time.perf_counter() - w0:.0f} s", file=sys.stderr, flush=True)
    out = series(times[:len(rows)], rows)
    out.update({"nside_max": nside_max, "t0": float(times[i]), "steps": s.n_steps, "wall_s": time.perf_counter() - w0,
                "max_cells": int(peak), "at16": at16, "min_f": min_f,
                "mass_drift": abs(float(np.sum(s.f * s.grid.areas)) / mass0 - 1)})
    return out


def short_run(r, t0: float, span: float, grid_of, **options) -> float:
    """The run's growth rate of mean(x2) over [t0, t0 + span] from the state of ``r`` at t0 (:func:`solver_at`)."""
    s, _ = solver_at(r, t0, grid_of, **options)
    t_start, a = s.t, measure(s.grid, s.f)[2]
    s.advance(t_start + span)
    return float(np.log(measure(s.grid, s.f)[2] / a) / span)


def checks(r) -> dict:
    """What the slow stall is not: the step (cfl, rtol), the field's extrapolation (field_interval 1), the regrids
    (a static grid), the quadrature of the exact rate (the states' reconstructions on finer cells); what moves it
    (finer cells, other reconstructions); and the exit's seed on E, carried at its exact rate."""
    from spherepde.grids.adaptive import AdaptiveHealpixGrid, transfer

    same = on_finest(4096)

    def static(g, f):  # the clusters' neighbourhood (0.03 rad) all on the finest cells, no regrids
        m = f * g.areas
        c1 = g.centers[int(np.argmax(m))]
        far = g.centers @ c1 < 0
        c2 = g.centers[far][int(np.argmax(m[far]))]
        g0 = AdaptiveHealpixGrid(32, 4096, uniq=g.uniq, refinement=False, max_cells=3_000_000)
        g2 = g0.refined_where(lambda G: (G.centers @ c1 > np.cos(0.03)) | (G.centers @ c2 > np.cos(0.03)))
        return g2, transfer(f, g0, g2)

    out = {"step": {"cfl 0.8": short_run(r, 16.0, 0.5, same), "cfl 0.2": short_run(r, 16.0, 0.5, same, cfl=0.2),
                    "rtol 1e-6": short_run(r, 16.0, 0.5, same, rtol=1e-6),
                    "field every step": short_run(r, 16.0, 0.5, same, field_interval=1)},
           "static_1.5": short_run(r, 16.0, 1.5, static), "adaptive_1.5": short_run(r, 16.0, 1.5, same),
           "refined16384_1.5": short_run(r, 16.0, 1.5, on_finest(16384)),
           # the other reconstructions from the same state (each starts from the linear scheme's profile)
           "schemes": {name: short_run(r, 16.0, 0.5, same, **kw) for name, kw in
                       (("limiter maximum", {"limiter": "maximum"}), ("quadratic", {"scheme": "quadratic"}),
                        ("upwind", {"scheme": "upwind"}))}}
    times = np.asarray(r.times)
    recon = {}
    for t in (13.0, 16.0):
        _, g, f = state_at(r, t)
        hx = g.centers[f * g.areas >= MASSIVE * (f * g.areas).max()]
        for n in (16384, 65536):  # every cell within 5 source cells of a massive one refined to n
            g0 = AdaptiveHealpixGrid(32, n, uniq=g.uniq, refinement=False, max_cells=3_000_000)
            g2 = g0.refined_where(lambda G: (G.order < G.order_max) &
                                  (np.max(G.centers @ hx.T, axis=1) > np.cos(5 * 2.5e-4)))
            recon[f"t {t:g}, nside {n}"] = moments(g2, transfer(f, g0, g2))["exact_rate"]
    out["exact_on_finer"] = recon
    exit_seed = {}
    for t in (5.0, 6.0, 7.0, 8.0):
        i, g, f = state_at(r, t)
        m, x = f * g.areas, g.centers
        tgt = np.flatnonzero(m >= MASSIVE * m.max())
        v = model().velocity_measure(x[tgt], x, m)
        exact = float(np.sum(m[tgt] * (v[:, 0] * x[tgt, 2] + x[tgt, 0] * v[:, 2])) / np.sum(m * x[:, 0] * x[:, 2]))
        j, gj, fj = state_at(r, t + 0.5)
        mj, xj = fj * gj.areas, gj.centers
        scheme = float(np.log(np.sum(mj * xj[:, 0] * xj[:, 2]) / np.sum(m * x[:, 0] * x[:, 2])) / (times[j] - times[i]))
        exit_seed[f"{t:g}"] = {"exact": exact, "scheme": scheme}
    out["exit_seed"] = exit_seed
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--levels", type=int, nargs="*", default=[4096, 8192, 16384])
    ap.add_argument("--t0", type=float, default=8.0)
    ap.add_argument("--source", type=int, default=4096)
    ap.add_argument("--t-end", type=float, default=T_END, help="run the restarts to this t (<= 25)")
    ap.add_argument("--checks", action="store_true", help="also the checks on the 4096 member's states (~8 min)")
    ap.add_argument("--report-only", action="store_true")
    a = ap.parse_args()
    path = HERE / "stall_refined.json"

    def read() -> dict:
        return json.loads(path.read_text()) if path.exists() else {"levels": {}, "sources": {}}

    def store(section: str, key: str | None, value):
        """Add ``value`` to the record on disk, read afresh (other invocations may have added levels meanwhile)."""
        rec = read()
        if key is None:
            rec[section] = value
        else:
            rec[section][key] = value
        path.write_text(json.dumps(rec, indent=1))

    rec = read()
    if not a.report_only:
        for n in (2048, 4096):
            if str(n) in rec["sources"]:  # a member's readings do not change
                continue
            try:
                r = source(n)
            except SystemExit:
                continue
            times = np.asarray(r.times)
            sr = series(times, [measure(r.grid_at(k), r.density[k]) for k in range(len(times))])
            sr["states"] = {f"{t:g}": moments(*state_at(r, t)[1:]) for t in (13.0, 14.0, 15.0, 16.0, 17.0, 18.0, 19.0)}
            store("sources", str(n), sr)
        if a.checks:
            store("checks", None, checks(source(4096)))
        for n in a.levels:
            store("levels", f"{a.source}_t{a.t0:g}_{n}", restart(source(a.source), a.t0, n, a.t_end))
        rec = read()
    write(rec)


def write(rec: dict):
    L = ["# Beta 30's second stage with the clusters refined past the ladder (validation/transition_law/stall_refined.py)",
         "", "beta 30, eps 1e-3, the perturbed f0, nside_min 32 (the converged transition-law member). The stall's seed "
         "mean(x2) grows at rate 1 in the reduced cluster dynamics; here its rate read on the run's states (scheme) "
         "against the exact int f v2 / mean(x2) at the same states (exact).", "",
         "## The ladder's own members", "",
         "| nside_max | t | mean(x2) | exact rate | cluster width (rad) | finest cell there (rad) | width / cell |",
         "|---|---|---|---|---|---|---|"]
    for n, sr in sorted(rec["sources"].items(), key=lambda kv: int(kv[0])):
        for t, q in sr["states"].items():
            L.append(f"| {n} | {t} | {q['x2']:.4e} | {q['exact_rate']:.4f} | {q['width']:.2e} | {q['h']:.2e} | "
                     f"{q['width'] / q['h']:.1f} |")
    L += ["", "Lag: the time the run took from t = 13 to 20 beyond what the growth of mean(x2) over it takes at the exact "
          "rate of t = 16 (t_EF less the lag is the run's t_EF with the stall's rate exact).", "",
          "| nside_max | t_exit | t_EF | scheme's rate of mean(x2), t = 13 -> 17 | exact rate at t = 16 | lag | t_EF - lag |",
          "|---|---|---|---|---|---|---|"]
    for n, sr in sorted(rec["sources"].items(), key=lambda kv: int(kv[0])):
        ex = sr["states"]["16"]["exact_rate"]
        L.append(f"| {n} | {sr['t_exit']:.3f} | {sr['t_EF']:.3f} | {sr['rate']:.4f} | {ex:.4f} | {lag(sr, ex):.3f} | "
                 f"{sr['t_EF'] - lag(sr, ex):.3f} |")
    if rec["levels"]:
        L += ["", "## Restarts on finer clusters", "",
              "The source member's state at t0 on AdaptiveHealpixGrid(32, nside_max) with its own cells and refinement, "
              "run to T = 25 (saved every 0.25; the alignments before t0 are the source's).", "",
              "| source / t0 / nside_max | t_exit | t_EF | scheme's rate t = 13 -> 17 | exact rate at t = 16 | "
              "width / cell at t = 16 | lag | t_EF - lag | cells at most | steps | wall s | mass drift | min f |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for k, q in rec["levels"].items():
            s16 = q["at16"]
            at16 = "- | - | - | -" if s16 is None else (
                f"{s16['exact_rate']:.4f} | {s16['width'] / s16['h']:.1f} | {lag(q, s16['exact_rate']):.3f} | "
                f"{q['t_EF'] - lag(q, s16['exact_rate']):.3f}")
            L.append(f"| {k.replace('_', ' / ')} | {q['t_exit']:.3f} | {q['t_EF']:.3f} | {q['rate']:.4f} | {at16} | "
                     f"{q['max_cells']} | {q['steps']} | "
                     f"{q['wall_s']:.0f} | {q['mass_drift']:.1e} | {q['min_f']:.1e} |")
    c = rec.get("checks")
    if c:
        L += ["", "## Checks (the nside_max 4096 member's states)", "",
              "The grid's growth rate of mean(x2) from the state at t = 16 (exact rate there: "
              f"{rec['sources']['4096']['states']['16']['exact_rate']:.4f}):", "",
              "| run | rate |", "|---|---|"]
        L += [f"| over 0.5, {k} | {v:.4f} |" for k, v in c["step"].items()]
        L += [f"| over 0.5, {k} | {v:.4f} |" for k, v in c.get("schemes", {}).items()]
        L += [f"| over 1.5, adaptive (the member's refinement) | {c['adaptive_1.5']:.4f} |",
              f"| over 1.5, static grid (the clusters' 0.03 rad all at nside 4096, no regrids) | {c['static_1.5']:.4f} |",
              f"| over 1.5, the state's cells refined to nside_max 16384 | {c['refined16384_1.5']:.4f} |", "",
              "The exact rate on the states' reconstructions on finer cells (every cell within 5 source cells of a "
              "massive one refined):", "", "| state | exact rate |", "|---|---|"]
        L += [f"| {k} | {v:.4f} |" for k, v in c["exact_on_finer"].items()]
        L += ["", "The exit's seed mean(x1 x3) on E: the exact rate at t against the run's growth over [t, t + 0.5]:", "",
              "| t | exact | run |", "|---|---|---|"]
        L += [f"| {k} | {v['exact']:.4f} | {v['scheme']:.4f} |" for k, v in c["exit_seed"].items()]
    L += ["", "![the stall's seed per level against its exact growth](stall_refined.png)"]
    (HERE / "stall_refined.md").write_text("\n".join(L) + "\n")
    plot(rec)


def plot(rec: dict):
    """stall_refined.png: mean(x2) per level against t (left) and its growth rate over each half time unit against
    the exact rate at the members' states (right)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [(f"member, nside_max {n}", q) for n, q in sorted(rec["sources"].items(), key=lambda kv: int(kv[0]))]
    runs += [(f"restart t0 = {q['t0']:g}, nside_max {q['nside_max']}", q) for q in rec["levels"].values()]
    fig, ax = plt.subplots(1, 2, figsize=(11, 4.2))
    for k, (name, q) in enumerate(runs):
        t, x2 = np.asarray(q["times"]), np.asarray(q["x2"])
        ax[0].semilogy(t, x2, color=f"C{k}", lw=1.2, label=name)
        sel = (t >= 12.5) & (t <= 20.0)
        tm, xm = t[sel][::2], x2[sel][::2]
        ax[1].plot(0.5 * (tm[1:] + tm[:-1]), np.diff(np.log(xm)) / np.diff(tm), "o-", ms=3, color=f"C{k}", label=name)
    src = rec["sources"]["4096"]["states"]
    ax[1].plot([float(t) for t in src], [q["exact_rate"] for q in src.values()], "k*", ms=9,
               label="exact int f v2 / mean(x2) at nside_max 4096's states")
    t0 = 13.0
    x0 = np.interp(t0, rec["sources"]["4096"]["times"], rec["sources"]["4096"]["x2"])
    tt = np.linspace(t0, 20.0, 2)
    ax[0].semilogy(tt, x0 * np.exp(tt - t0), "k--", lw=0.8, label="rate 1 from t = 13")
    ax[0].set_xlabel("t")
    ax[0].set_ylabel("mean(x2): the stall's seed")
    ax[0].set_xlim(8, 23)
    ax[0].legend(fontsize=7)
    ax[1].axhline(1.0, color="k", lw=0.6)
    ax[1].set_xlabel("t")
    ax[1].set_ylabel("growth rate of mean(x2) over each 0.5")
    ax[1].set_ylim(0.85, 1.05)
    ax[1].legend(fontsize=7)
    fig.suptitle("beta 30, eps 1e-3: the stall's seed grows 3-4 % slowly on clusters 3-4 finest cells wide", fontsize=9)
    fig.tight_layout()
    fig.savefig(HERE / "stall_refined.png", dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
