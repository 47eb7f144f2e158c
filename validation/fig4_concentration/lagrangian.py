"""The terminal phase without transport error: an adaptive level's saved state continued as weighted particles
(issue #17, a check of the density-level t_depart and t_EF).

A weighted empirical measure sum_i m_i delta_{x_i} whose points move with the attention field of the measure
itself (``simulate_particles`` with ``weights``) is an exact measure-valued solution of the mean-field
equation. Started from a PDE level's saved state at t0 (each cell's mass m = f A placed at the centres of its
4^s NESTED descendants at s orders below it, m / 4^s each: the cell's mass as the piecewise-constant density
on 4^s points), it continues that state with no transport error after t0: no diffusion of the tails (cells
down to ~1e-27 of the mass keep their mass exactly) and no numerical width of the clusters. Its only errors
are the placement of the mass inside each cell at t0 (the ladder in s) and the time step (RK4, the ladder in
dt), and the field's certified bound (tol 1e-10, the study's).

Read beside the PDE's own continuation: where the two agree, the level's terminal phase after t0 is the
equation's evolution of its state at t0; where they differ, the scheme's error after t0 moves it.

Usage: python validation/fig4_concentration/lagrangian.py --run NAME --t0 10 --t-end 20 [--split 0 1] [--dt 0.02]
NAME is a sweep directory under sweep_runs/ (an adaptive level's). Writes lagrangian.json beside this file
(one row per run, keyed by NAME, t0, split and dt), lagrangian.md, lagrangian.png and lagrangian_t0.png (the
departure against t0); ``--figure`` rewrites the last three from the JSON only. ``--restart-max-dt 0.001 inf``
restarts the PDE level itself from t0 instead (the step-size check of its evolution after t0;
lagrangian_restarts.json); ``--drop-below 1e-12 1e-6`` continues the state without the cells below that
fraction of the mass (lagrangian_clusters.json).
"""
from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import re
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from validation.fig4_concentration import adaptive as A  # noqa: E402
from validation.records import upsert  # noqa: E402

OUT = HERE / "lagrangian.json"
#: The field's certified bound, the study's (FIELD_TOL of fig3_density; sweeps/base.toml).
TOL = 1e-10
SAVE_EVERY = 0.25


def member(name: str):
    """The saved result of sweep ``name`` (its single member)."""
    import spherepde as sp

    paths = glob.glob(str(A.RUNS / name / "members" / "*" / "results.h5"))
    if len(paths) != 1:
        raise FileNotFoundError(f"sweep {name!r}: expected one member's results.h5 under {A.RUNS / name}, found {len(paths)}")
    return sp.load(paths[0])


def particles_of(grid, f, split: int):
    """Points and masses: every cell of positive mass as 4^split points at its NESTED descendants' centres,
    each with a 4^-split share of the cell's mass f A (the piecewise-constant density)."""
    import healpy as hp

    m = f * grid.areas
    keep = m > 0
    if split == 0:
        return grid.centers[keep], m[keep]
    o, ip = grid.order[keep], grid.ipix[keep]
    q = 4 ** split
    kids = (ip[:, None] << (2 * split)) + np.arange(q)
    x = np.empty((len(o), q, 3))
    for k in np.unique(o):
        sel = o == k
        x[sel] = np.stack(hp.pix2vec(1 << int(k + split), kids[sel].ravel(), nest=True), axis=-1).reshape(-1, q, 3)
    return x.reshape(-1, 3), np.repeat(m[keep] / q, q)


def alignments(points, weights, s) -> list[float]:
    from spherepde.diagnostics import alignment

    return [alignment(points, weights, getattr(s, k)) for k in ("E", "F", "F_abs")]


def readings(times, E, F, t_exit) -> dict:
    """t_EF (spherepde.diagnostics.transition_time) and the terminal phase's readings (adaptive.terminal)."""
    from spherepde.diagnostics import transition_time

    t_ef = transition_time(times, E, F)
    rec = {"times": list(times), "align_E": list(E), "align_F": list(F), "t_exit": t_exit}
    return {"t_EF": None if np.isnan(t_ef) else float(t_ef), **A.terminal(rec)}


def series(r: dict):
    """A continuation's alignment series (times, E, F): the PDE level's up to t0, the particles' after it."""
    tp = np.asarray(r["pde_times"])
    up = tp <= r["t0"] + 1e-9
    return (np.concatenate([tp[up], r["times"][1:]]), np.concatenate([np.asarray(r["pde_align_E"])[up], r["align_E"][1:]]),
            np.concatenate([np.asarray(r["pde_align_F"])[up], r["align_F"][1:]]))


def level_state(name: str, t0: float):
    """(result, i, pde, t_exit) of level ``name`` at its saved time t0: the loaded result, the index of t0 among
    its saved times, its stored alignments (E, F, F_abs) at every saved time and its t_exit (None if none)."""
    from spherepde.diagnostics import exit_time

    res = member(name)
    if list(res.times[:2]) != [0.0, SAVE_EVERY]:
        raise ValueError(f"{name}: saved every {res.times[1] - res.times[0]}, not {SAVE_EVERY}")
    i = int(np.argmin(np.abs(res.times - t0)))
    if abs(res.times[i] - t0) > 1e-9:
        raise ValueError(f"t0 = {t0} is not a saved time of {name} (saved every {SAVE_EVERY})")
    conc = res.metadata["concentration"]
    pde = np.stack([np.asarray(conc[k], float) for k in ("alignment_E", "alignment_F", "alignment_F_abs")], axis=1)
    t_exit = exit_time(res.times, pde[:, 0])
    return res, i, pde, None if np.isnan(t_exit) else float(t_exit)


def paper_model(beta: float):
    """The study's attention model (paper matrices, field bound TOL) and the spectral data of its alignments."""
    import spherepde as sp
    from spherepde.config import MATRIX_PRESETS
    from spherepde.spectral import spectral_data

    P = MATRIX_PRESETS["paper"]
    return sp.Attention(P["B"], P["V"], beta, tol=TOL), spectral_data(P["B"], P["V"])


def continue_run(name: str, t0: float, t_end: float, split: int, dt: float, beta: float = 30.0,
                 drop_below: float = 0.0) -> dict:
    """The level's state at t0 continued as particles (``split``: 4^split points a cell); ``drop_below`` > 0
    leaves out the cells holding less than that fraction of the mass (which part of the state sets what
    follows: the tails or the clusters)."""
    from spherepde.particles import simulate_particles

    res, i, pde, t_exit = level_state(name, t0)
    if t_end <= t0:
        raise ValueError(f"t_end = {t_end} must be after t0 = {t0}")
    g = res.grid_at(i)
    x0, w = particles_of(g, res.density[i], split)
    dropped = 0.0
    if drop_below > 0:
        keep = w >= drop_below * 4.0 ** -split * w.sum()
        dropped = float(w[~keep].sum() / w.sum())
        x0, w = x0[keep], w[keep]
    model, s = paper_model(beta)
    save = np.arange(0.0, t_end - t0 + 1e-9, SAVE_EVERY)
    wall = time.perf_counter()
    pr = simulate_particles(model, x0, t_end - t0, dt, save_at=save, method="rk4", weights=w)
    wall = time.perf_counter() - wall
    times = (t0 + pr.times).tolist()
    part = np.array([alignments(x, pr.weights, s) for x in pr.positions])
    # the PDE's own alignments at its saved times (the run's concentration diagnostics: the same sums over
    # cell centres and masses as :func:`alignments`)
    if not np.allclose(pde[i], alignments(g.centers, res.density[i] * g.areas, s), rtol=0, atol=1e-12):
        raise RuntimeError(f"{name}: the stored alignments at t0 are not the state's")
    within = res.times <= t_end + 1e-9
    row = {"run": name, "t0": float(res.times[i]), "t_end": float(t_end), "split": split, "dt": dt,
           "particles": int(len(w)), "cells": int(g.n_cells), "min_mass": float(w.min()), "wall_s": wall,
           "drop_below": drop_below, "mass_dropped": dropped,
           "t_exit": t_exit,
           "pde_readings": readings(res.times[within], pde[within, 0], pde[within, 1], t_exit),
           "times": times, "align_E": part[:, 0].tolist(), "align_F": part[:, 1].tolist(),
           "align_Fabs": part[:, 2].tolist(),
           "pde_times": res.times.tolist(), "pde_align_E": pde[:, 0].tolist(), "pde_align_F": pde[:, 1].tolist(),
           "pde_align_Fabs": pde[:, 2].tolist()}
    # read on :func:`series` (the PDE's up to t0: readings need the lead of E); t_depart is searched after the
    # level's exit (where t0 precedes it the continuation's own exit differs by ~0.1, where align F is ~2e-5,
    # far below the departure's 0.2: continuation_exit reports it)
    t, E, F = series(row)
    row["particles_readings"] = readings(t, E, F, t_exit)
    return row


RESTARTS = HERE / "lagrangian_restarts.json"
CLUSTERS = HERE / "lagrangian_clusters.json"


def restart_pde(name: str, t0: float, t_end: float, max_dt: float) -> dict:
    """The level itself restarted from its saved state at t0 (its grid with its refinement, its options:
    log-quadratic, cfl 0.8, field_interval 10, rtol 1e-3; the model is autonomous, so the run starts at 0 and is
    read shifted by t0), with the step bounded by ``max_dt`` (inf: the level's own steps): the step-size check of
    the PDE's evolution after t0, beside the exact continuation of the same state. Readings on the level's
    series up to t0 and the restart's after it, as :func:`series` does for the particles."""
    import spherepde as sp

    res, i, pde, t_exit = level_state(name, t0)
    model, s = paper_model(30.0)
    opts = dataclasses.replace(res.options, max_dt=max_dt)  # the level's own options (log-quadratic, cfl 0.8, ...)
    wall = time.perf_counter()
    out = sp.solve(res.grid_at(i), model, res.density[i].copy(), t_end - t0,
                   save_at=np.arange(0.0, t_end - t0 + 1e-9, SAVE_EVERY), options=opts)
    wall = time.perf_counter() - wall
    al = np.array([alignments(out.grid_at(k).centers, out.density[k] * out.grid_at(k).areas, s)
                   for k in range(len(out.times))])
    row = {"run": name, "t0": float(res.times[i]), "t_end": float(t_end),
           "max_dt": None if np.isinf(max_dt) else max_dt, "steps": int(out.n_steps), "wall_s": wall,
           "options": str(opts), "times": (t0 + out.times).tolist(), "align_E": al[:, 0].tolist(),
           "align_F": al[:, 1].tolist()}
    t, E, F = series({**row, "pde_times": res.times, "pde_align_E": pde[:, 0], "pde_align_F": pde[:, 1]})
    row["readings"] = readings(t, E, F, t_exit)
    return row


def figure(rows: list[dict], path: Path) -> None:
    """lagrangian.png: per PDE level, align E and align F of the level (solid) and of its continuations as
    particles (dashed: 1 point a cell, dotted: more), from t0 on."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = sorted({r["run"] for r in rows}, key=level_key)
    ncol = min(len(runs), 3 if len(runs) > 4 else 4)
    nrow = -(-len(runs) // ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(5.2 * ncol, 4.2 * nrow), squeeze=False, sharey=True)
    for ax in axes.ravel()[len(runs):]:
        ax.set_visible(False)
    for ax, run in zip(axes.ravel(), runs):
        mine = sorted((r for r in rows if r["run"] == run), key=lambda r: (r["t0"], r["split"], -r["dt"]))
        r0 = mine[0]
        t = np.asarray(r0["pde_times"])
        sel = (t >= min(r["t0"] for r in mine) - 2.0) & (t <= max(r["t_end"] for r in mine))
        ax.plot(t[sel], np.asarray(r0["pde_align_E"])[sel], "C3-", lw=1.6, label="PDE: align E")
        ax.plot(t[sel], np.asarray(r0["pde_align_F"])[sel], "C1-", lw=1.6, label="PDE: align F")
        for r in mine:
            ls = "--" if r["split"] == 0 else ":"
            tag = f"particles from t0 = {r['t0']:g} ({r['particles']}, dt {r['dt']:g})"
            ax.plot(r["times"], r["align_E"], "C3" + ls, lw=1.1)
            ax.plot(r["times"], r["align_F"], "C1" + ls, lw=1.1, label=tag)
        ax.set_title(level_name(run).replace(", attended, log-quadratic", ""), fontsize=9)
        ax.set_xlabel("t")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="center left")
    for row in axes:
        row[0].set_ylabel("alignment")
    fig.suptitle("beta 30, eps 0.05: PDE levels against their states continued as weighted particles",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def own_departure(rows: list[dict], restarts: list[dict], run: str) -> float | None:
    """The level's own t_depart: from its run, or, for a level run to T = 10 only, from its restart at t0 = 10
    with its own steps (``restarts``; the 256 level's restart reproduces its own departure to 1e-4)."""
    own = next(r["pde_readings"]["t_depart"] for r in rows if r["run"] == run)
    if own is None:
        own = next((r["readings"]["t_depart"] for r in restarts
                    if (r["run"], r["t0"], r["max_dt"]) == (run, 10.0, None)), None)
    return own


def departure_figure(rows: list[dict], restarts: list[dict], path: Path) -> None:
    """lagrangian_t0.png: t_depart of each level's state continued exactly against t0 (1 point a cell: line
    and dots; 4 points a cell: open circles), the level's own departure as a dashed line of its colour (of a
    level run to T = 10 only, its restart's from t = 10 with its own steps, ``restarts``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    base = [r for r in rows if r["dt"] == 0.02]
    runs = sorted({r["run"] for r in base}, key=level_key)
    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    for c, run in enumerate(runs):
        k = level_key(run)
        one = sorted((r["t0"], r["particles_readings"]["t_depart"]) for r in base
                     if r["run"] == run and r["split"] == 0 and r["t0"] >= 6 and r["particles_readings"]["t_depart"])
        if not one:
            continue
        col = f"C{c}"
        ax.plot(*zip(*one), "o-", color=col, ms=4, lw=1.2, label=f"nside_max {k[0]}, nside_min {k[1]}")
        four = [(r["t0"], r["particles_readings"]["t_depart"]) for r in base
                if r["run"] == run and r["split"] == 1 and r["t0"] >= 6 and r["particles_readings"]["t_depart"]]
        if four:
            ax.plot(*zip(*four), "o", mfc="none", color=col, ms=8)
        own = own_departure(rows, restarts, run)
        if own is not None:
            ax.axhline(own, color=col, ls="--", lw=0.9)
    ax.set_xlabel("t0 (the level's state continued exactly as weighted particles from t0)")
    ax.set_ylabel("t_depart (align F past 0.2)")
    ax.set_title("beta 30, eps 0.05: the departure of each level's state at t0\n(dashed: the level's own; open "
                 "circles: 4 points a cell)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def continuation_exit(r: dict) -> float | None:
    """The continuation's own t_exit (None where the exit lies before t0: it is then the PDE's)."""
    from spherepde.diagnostics import exit_time

    t, E, _ = series(r)
    te = exit_time(t, E)
    return None if np.isnan(te) or te <= r["t0"] else float(te)


_LEVEL = re.compile(r"fig4_adaptive_b30_(\d+)(?:_min(\d+))?_att(?:_T([\d.]+))?_log-quadratic")


def level_key(run: str) -> tuple:
    """(nside_max, nside_min, T) of a level's sweep name, for ordering (unknown names last)."""
    m = _LEVEL.fullmatch(run)
    return (1 << 30, 0, 0.0) if m is None else (int(m[1]), int(m[2] or A.NSIDE_MIN), float(m[3] or A.T_END))


def level_name(run: str) -> str:
    """How the report names a level: 'fig4_adaptive_b30_512_min32_att_T10_log-quadratic' -> 'nside_max 512,
    nside_min 32, attended, log-quadratic, T = 10' (a level run to a shorter T than the study's for its state at
    t0 only: its own readings after T are blank)."""
    m = _LEVEL.fullmatch(run)
    if m is None:
        return run
    return (f"nside_max {m[1]}, nside_min {m[2] or A.NSIDE_MIN}, attended, log-quadratic"
            + (f", T = {m[3]}" if m[3] else ""))


def report(rows: list[dict]) -> str:
    """lagrangian.md: one line per continuation."""
    def f(x, fmt="{:.3f}"):
        return "" if x is None else fmt.format(x)

    lines = ["# The PDE levels continued as weighted particles (lagrangian.py)", "",
             "beta 30, eps 0.05, paper matrices; RK4, field bound 1e-10; particles: each cell of positive mass as "
             "4^split points (its NESTED descendants' centres). Readings: t_exit (align E below 0.9), t_depart (align F "
             "past 0.2 after the exit), t_EF (F overtakes E); particles / PDE level. Exits before t0 are the PDE's.", "",
             "| PDE level | t0 | split | dt | particles | t_exit | t_depart | t_EF | wall s |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        p, q = r["particles_readings"], r["pde_readings"]
        lvl = level_name(r["run"])
        lines.append(f"| {lvl} | {r['t0']:g} | {r['split']} | {r['dt']:g} | {r['particles']} | "
                     f"{f(continuation_exit(r)) or '(' + f(r['t_exit']) + ')'} / {f(r['t_exit'])} | "
                     f"{f(p['t_depart'])} / {f(q['t_depart'])} | {f(p['t_EF'])} / {f(q['t_EF'])} | {r['wall_s']:.0f} |")
    return "\n".join(lines) + "\n"


def departure_matrix(rows: list[dict], restarts: list[dict]) -> str:
    """The continued departures as a matrix: one row per t0, one column per level (1 point a cell, dt 0.02),
    with the level's own departure last (:func:`own_departure`); in parentheses the same state placed with 4
    (16) points a cell, where run (the placement's check)."""
    base = [r for r in rows if r["split"] == 0 and r["dt"] == 0.02]
    runs = sorted({r["run"] for r in base}, key=level_key)
    t0s = sorted({r["t0"] for r in base})

    def cell(run, t0):
        [r] = [r for r in base if (r["run"], r["t0"]) == (run, t0)] or [None]
        if r is None or r["particles_readings"]["t_depart"] is None:
            return ""
        v = r["particles_readings"]["t_depart"]
        more = sorted((x["split"], x["particles_readings"]["t_depart"]) for x in rows
                      if (x["run"], x["t0"], x["dt"]) == (run, t0, 0.02) and x["split"] > 0)
        return f"{v:.3f}" + "".join(f" ({4 ** k}: {'-' if m is None else format(m, '.3f')})" for k, m in more)

    def short(run):
        k = level_key(run)
        return f"{k[1]} / {k[0]}" + ("" if k[2] == A.T_END else f" (T {k[2]:g})")

    own = {run: own_departure(rows, restarts, run) for run in runs}
    lines = ["## The departure of each level's state at t0, continued exactly", "",
             "t_depart of the continuation (1 point a cell, dt 0.02) by t0 (rows) and level (nside_min / nside_max); "
             "in parentheses, with 4 (16) points a cell. Last row: the level's own departure (of a level run to T = 10, "
             "its restart's from t = 10 with its own steps).", "",
             "| t0 | " + " | ".join(short(r) for r in runs) + " |", "|---|" + "---|" * len(runs)]
    for t0 in t0s:
        lines.append(f"| {t0:g} | " + " | ".join(cell(r, t0) for r in runs) + " |")
    lines.append("| PDE level | " + " | ".join("" if own[r] is None else f"{own[r]:.3f}" for r in runs) + " |")
    return "\n".join(lines) + "\n"


def restarts_table(rows: list[dict]) -> str:
    """The PDE levels restarted from their state at t0 with a bounded step (``--restart-max-dt``)."""
    if not rows:
        return ""
    lines = ["## The levels restarted from t0 with smaller steps (`--restart-max-dt`)", "",
             "The level's own grid, refinement and options from its saved state at t0; max_dt blank: its own steps.", "",
             "| PDE level | t0 | max_dt | steps | t_depart | t_EF | wall s |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        q = r["readings"]
        lines.append(f"| {level_name(r['run'])} | {r['t0']:g} | {'' if r['max_dt'] is None else format(r['max_dt'], 'g')} | "
                     f"{r['steps']} | {'' if q['t_depart'] is None else format(q['t_depart'], '.4f')} | "
                     f"{'' if q['t_EF'] is None else format(q['t_EF'], '.3f')} | {r['wall_s']:.0f} |")
    return "\n" + "\n".join(lines) + "\n"


def clusters_table(rows: list[dict]) -> str:
    """The continuations without the cells below a mass fraction (``--drop-below``)."""
    if not rows:
        return ""
    lines = ["## Continued without the light cells (`--drop-below`)", "",
             "The state at t0 without the cells holding less than the fraction of the mass; beside it the full "
             "state's continuation (fraction 0, lagrangian.json).", "",
             "| PDE level | t0 | fraction | mass left out | particles | t_depart |", "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {level_name(r['run'])} | {r['t0']:g} | {r['drop_below']:g} | {r['mass_dropped']:.2e} | "
                     f"{r['particles']} | {r['particles_readings']['t_depart']:.4f} |")
    return "\n" + "\n".join(lines) + "\n"


def write_outputs(rows: list[dict]) -> None:
    restarts = json.loads(RESTARTS.read_text()) if RESTARTS.exists() else []
    clusters = json.loads(CLUSTERS.read_text()) if CLUSTERS.exists() else []
    (HERE / "lagrangian.md").write_text(report(rows) + "\n" + departure_matrix(rows, restarts) + restarts_table(restarts)
                                        + clusters_table(clusters))
    figure(rows, HERE / "lagrangian.png")
    departure_figure(rows, restarts, HERE / "lagrangian_t0.png")



def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", help="a sweep directory under sweep_runs/")
    ap.add_argument("--figure", action="store_true", help="only rewrite lagrangian.md and lagrangian.png from lagrangian.json")
    ap.add_argument("--t0", type=float)
    ap.add_argument("--t-end", type=float, default=20.0)
    ap.add_argument("--split", type=int, nargs="+", default=[0])
    ap.add_argument("--dt", type=float, nargs="+", default=[0.02])
    ap.add_argument("--drop-below", type=float, nargs="+", default=None, metavar="FRACTION",
                    help="continue without the cells holding less than FRACTION of the mass; rows in "
                         "lagrangian_clusters.json")
    ap.add_argument("--restart-max-dt", type=float, nargs="+", default=None, metavar="MAX_DT",
                    help="instead of particles, restart the PDE level itself from t0 with these step bounds "
                         "(inf: its own steps); rows in lagrangian_restarts.json")
    a = ap.parse_args(argv)
    if a.figure:
        write_outputs(json.loads(OUT.read_text()))
        return
    if a.run is None or a.t0 is None:
        ap.error("--run and --t0 are required (or --figure)")
    if a.drop_below:
        for cut in a.drop_below:
            r = continue_run(a.run, a.t0, a.t_end, a.split[0], a.dt[0], drop_below=cut)
            upsert(CLUSTERS, r, lambda x: (x["run"], x["t0"], x["drop_below"], x["split"], x["dt"]))
            print({k: r[k] for k in ("run", "t0", "drop_below", "mass_dropped", "particles", "wall_s",
                                     "particles_readings")}, flush=True)
        write_outputs(json.loads(OUT.read_text()))
        return
    if a.restart_max_dt:
        for mdt in a.restart_max_dt:
            r = restart_pde(a.run, a.t0, a.t_end, mdt)
            upsert(RESTARTS, r, lambda x: (x["run"], x["t0"], x["max_dt"] or 1e9))
            print({k: r[k] for k in ("run", "t0", "max_dt", "steps", "wall_s", "readings")}, flush=True)
        write_outputs(json.loads(OUT.read_text()))
        return
    for split in a.split:
        for dt in a.dt:
            r = continue_run(a.run, a.t0, a.t_end, split, dt)
            upsert(OUT, r, lambda x: (x["run"], x["t0"], x["split"], -x["dt"]))
            print({k: r[k] for k in ("run", "t0", "split", "dt", "particles", "wall_s", "t_exit",
                                     "particles_readings", "pde_readings")}, flush=True)
    write_outputs(json.loads(OUT.read_text()))


if __name__ == "__main__":
    main()
