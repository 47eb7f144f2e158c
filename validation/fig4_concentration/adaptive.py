"""Figure 4's perturbed runs on a ladder of adaptive grids (issue #17 item 1 with issue #16's grids).

The study's perturbed f0 (eps = 0.05, ``EPS`` of run.py) and its base configuration (sweeps/base.toml: paper
matrices, cfl 0.8, error control, field every <= 10 steps with bound 1e-10), on
``AdaptiveHealpixGrid(16, nside_max)`` with the default ``Refinement()`` (refine where h beta ||B|| > 0.5 and
the cell holds significant mass, or where f varies by more than 25 % over a cell's stencil; coarsen where the
density is negligible or smooth), f0 as cell averages (what an adaptive
grid takes; the uniform runs sample it at the centres, an O(h^2) difference in the perturbation), to
T = ``T_END`` (past the study's T = 20, so that t_EF can occur). One sweep per (beta, nside_max), so that a
level can be added later and a killed study resumes (run directories in sweep_runs/fig4_adaptive_*, not
committed).

Per run: t_exit and t_EF (run.py's definitions, from the saved states every 0.25), the plateau
min_t W2(rho_t, Pi#rho_0) over t <= 20 (Pi#rho_0 of the run's own initial cell masses), the cells (at most,
at T), steps, wall time and the largest relative mass drift over the steps (these from the sweep's dataset); the first time after the exit at which
the alignment with F exceeds 0.1 (the stall cone is left), and at T the share of the attention weight at the
heaviest cell that comes from the tails (cells below 1e-6 of its mass); and between consecutive levels of
each ladder (in nside_max at one nside_min, and in nside_min at one nside_max) the relative changes that
the issue's bar judges (t_exit and t_EF within 2 %, plateau W2 within 5 %), with those of the terminal
phase's better-conditioned readings (``terminal``: the departure from the stall cone and the drift that
follows; README, "What t_EF rests on"). ``--nside-min`` runs a level with finer coarsest cells (where the
tails live), beside the ladder; ``--attended`` runs the levels with ``Refinement(attended=True)`` (the tails
that carry attention weight refined like mass), a ladder of its own, and ``--attended-floor`` gives the
attention density its own floor there.

Usage: python validation/fig4_concentration/adaptive.py [--beta 30] [--nside-max 64 128 256] [--attended]
[--attended-floor 1e-8] [--nside-min 32] [--attention-variation 0.25] [--t-end 12] [--rtol 1e-4] (``--rtol``: the
level at another error-control tolerance, a step-size ladder reported beside the same level at the default; writes adaptive.md, adaptive.json, adaptive.png and terminal.png
beside this file; ``--report-only`` rebuilds them from the sweeps' directories without running anything
new).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import tomllib
from collections import Counter
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
from validation.records import locked, write_atomic  # noqa: E402
#: Where the sweeps' run directories go (not committed) and where adaptive.md / adaptive.json are written.
RUNS = HERE / "sweep_runs"
OUT = HERE

NSIDE_MIN = 16
NSIDE_MAX = [64, 128, 256]
BETAS = [30.0]
T_END = 30.0
#: The window of the study's own runs: the plateau W2 and ladder.csv's times are taken over t <= T_FIG4.
T_FIG4 = 20.0
#: The issue's bar between the two finest levels.
BAR = {"t_exit": 0.02, "t_EF": 0.02, "plateau_w2": 0.05}
#: The terminal phase's better-conditioned readings (README, "What t_EF rests on"): the departure from the
#: stall cone, the time at which F's alignment reaches F_DEPART after the exit, and the slow drift that
#: follows, the slope of align F - align E over DRIFT_WINDOW (least squares over the saved states).
F_DEPART = 0.2
#: A level record's alignment series and the sweep dataset's variables they come from.
ALIGNMENTS = (("align_E", "alignment_E"), ("align_F", "alignment_F"), ("align_Fabs", "alignment_F_abs"))
DRIFT_WINDOW = (20.0, 28.0)
#: The tails: cells below this fraction of the heaviest cell's mass (their share of the attention weight).
TAIL_FRACTION = 1e-6
#: The alignment with E below which the density has left E's plateau (``leave_plateau``).
E_PLATEAU = 0.99
#: The ladders taken for a beta that has no ladder of the default refinement on the default coarsest cells
#: (ladder.csv, adaptive.png): the attended refinement on nside 32 cells, with the attention criterion where f
#: varies (the beta 100 ladder to nside_max 512) or everywhere (beta 100's first two levels); of these, the one
#: with the most levels at that beta (the first of them on a tie): :func:`fallback_ladder`.
FALLBACK_LADDERS = ({"attended": True, "nside_min": 32, "attention_variation": 0.25},
                    {"attended": True, "nside_min": 32})


def fallback_ladder(recs: list[dict], beta: float) -> list[dict]:
    """The ladder of FALLBACK_LADDERS with the most levels at ``beta`` ([] if none has one)."""
    cands = [[r for r in ladder(recs, **kw) if r["beta"] == beta] for kw in FALLBACK_LADDERS]
    return max(cands, key=len)


def terminal(rec: dict) -> dict:
    """t_depart (align F reaches F_DEPART after t_exit, linear between saved states; None if it does not
    by T), drift (the slope of align F - align E over DRIFT_WINDOW) and the gap E - F one time unit after
    t_depart, which the drift has to close: t_EF ~ t_depart + 1 + gap / drift, so an error in the gap moves
    t_EF by 1 / drift (~40) times as much."""
    t, E, F = (np.asarray(rec[k], float) for k in ("times", "align_E", "align_F"))
    out = {"t_depart": None, "drift": None, "gap": None}
    if rec.get("t_exit") is None:
        return out
    i = np.nonzero((F >= F_DEPART) & (t > rec["t_exit"]))[0]
    if i.size and i[0] > 0:
        j = int(i[0])
        td = float(t[j - 1] + (F_DEPART - F[j - 1]) * (t[j] - t[j - 1]) / (F[j] - F[j - 1]))
        out["t_depart"] = td
        out["gap"] = float(np.interp(td + 1.0, t, E - F))
    m = (t >= DRIFT_WINDOW[0] - 1e-9) & (t <= DRIFT_WINDOW[1] + 1e-9)
    if m.sum() >= 2 and out["t_depart"] is not None and out["t_depart"] + 1.0 < DRIFT_WINDOW[0]:
        out["drift"] = float(np.polyfit(t[m], (F - E)[m], 1)[0])
    return out


def refinement_name(attended: bool, attended_floor: float | None = None, attention_variation: float = 0.0) -> str:
    """How the report and the figure name a ladder's refinement."""
    name = ("default" if not attended else
            "attended" if attended_floor is None else f"attended, sigma floor {attended_floor:g}")
    return name if not attention_variation else f"{name}, attention where f varies > {attention_variation:g}"


def spec(beta: float, nside_max: int, nside_min: int | None = None, attended: bool = False,
         attended_floor: float | None = None, f0: str = "perturbed", attention_variation: float = 0.0,
         t_end: float | None = None, rtol: float | None = None, scheme: str | None = None):
    """The sweep of one level (one member); ``nside_min`` other than NSIDE_MIN (the tails' resolution,
    see the README), the attended refinement (``Refinement(attended=True)``) and its own floor for the
    attention density (``attended_floor``, below the mass floor 1e-4) get sweep names of their own, and so
    does the uniform f0 (``f0="uniform"``, adaptive_uniform.py) instead of the study's perturbed one, and
    the attention criterion confined to where f varies (``attention_variation``, ``Refinement``), and a run
    to another end time than T_END (``t_end``: a level run for t_exit and the plateau, which lie before it),
    and the error control's tolerance ``rtol`` other than its default (``[scheme] rtol``: the step-size
    ladder of a level, never a level of the resolution ladders: :func:`ladder`), and a reconstruction other
    than the default linear one (``scheme``: log_tails.py's probe)."""
    if f0 not in ("perturbed", "uniform"):
        raise ValueError(f"f0 must be 'perturbed' or 'uniform', got {f0!r}")
    from spherepde.sweeps import parse_sweep

    nmin = NSIDE_MIN if nside_min is None else int(nside_min)
    base = tomllib.loads((HERE / "sweeps" / "base.toml").read_text())
    base["grid"] = {"type": "adaptive", "nside_min": nmin, "nside_max": int(nside_max)}
    if attended:
        base["grid"]["attended"] = True
        if attended_floor is not None:
            base["grid"]["attended_floor"] = float(attended_floor)
    if attention_variation:
        base["grid"]["attention_variation"] = float(attention_variation)
    base["initial"]["sample"] = "average"
    if f0 == "uniform":
        base["initial"] = {"type": "uniform"}
    base["model"]["beta"] = float(beta)
    base["time"]["t_end"] = T_END if t_end is None else float(t_end)
    if rtol is not None:
        base["scheme"]["rtol"] = float(rtol)
    if scheme is not None:
        base["scheme"]["scheme"] = scheme
    tag = (("" if nmin == NSIDE_MIN else f"_min{nmin}") + ("_att" if attended else "")
           + (f"_af{attended_floor:g}" if attended and attended_floor is not None else "")
           + (f"_av{attention_variation:g}" if attention_variation else "")
           + ("_uniform" if f0 == "uniform" else "") + ("" if t_end is None else f"_T{t_end:g}")
           + ("" if rtol is None else f"_rtol{rtol:.0e}") + ("" if scheme is None else f"_{scheme}"))
    return parse_sweep({"sweep": {"name": f"fig4_adaptive_b{beta:g}_{nside_max}{tag}"}, "base": base}, base_dir=HERE)


def member(beta: float, nside_max: int, run: bool = True, nside_min: int | None = None,
           attended: bool = False, attended_floor: float | None = None, f0: str = "perturbed",
           attention_variation: float = 0.0, t_end: float | None = None, rtol: float | None = None) -> dict | None:
    """The record of one level (None if it has not been run and ``run`` is false). The per-frame series
    (alignments, W2 to Pi#rho_0 of the initial measure, cells) and the run's scalars come from the sweep's
    dataset (``spherepde.sweeps.member_record``); the results file is read for the last state only."""
    import xarray as xr

    from spherepde import load, sweep
    from spherepde.diagnostics import exit_time, transition_time
    from validation.fig3_density.common import PAPER_B

    attended_floor = attended_floor if attended else None
    sp_ = spec(beta, nside_max, nside_min, attended, attended_floor, f0, attention_variation, t_end, rtol)
    cfg = sp_.members()[0].config
    T = cfg.time.t_end
    out = RUNS / sp_.name
    if run:
        ds = sweep(sp_, out, workers=1, quiet=True, progress=False)
        err = [str(e) for e in ds.error.values.ravel() if e]
        if err:
            raise RuntimeError(f"{sp_.name}: {err[0]}")
    elif (out / "sweep.nc").exists():
        ds = xr.load_dataset(out / "sweep.nc")
    else:
        return None
    t = np.asarray(ds["time"].values, float)
    if str(ds["status"].values) != "done" or t[-1] < T - 1e-9:
        return None
    rows = {k: np.asarray(ds[src].values, float).tolist() for k, src in
            ALIGNMENTS + (("W2", "w2_limit"),)}
    cells = [int(c) for c in ds["n_cells"].values]
    W2 = np.asarray(rows["W2"])
    in20 = t <= T_FIG4 + 1e-9
    t20 = t[in20]
    aE, aF = np.asarray(rows["align_E"]), np.asarray(rows["align_F"])
    rec = {"beta": beta, "f0": f0, "nside_max": int(nside_max), "nside_min": cfg.grid.nside_min,
           "attended": bool(attended), "attended_floor": attended_floor,
           "attention_variation": float(attention_variation), "t_end": T,
           "rtol": None if rtol is None else float(rtol),
           "times": t.tolist(), **rows, "cells": cells,
           "t_exit": float(ds["t_exit"]), "t_EF": float(ds["t_EF"]),
           "t_exit_20": exit_time(t20, aE[in20]), "t_EF_20": transition_time(t20, aE[in20], aF[in20]),
           "plateau_w2": float(W2[in20].min()), "argmin_w2": float(t20[int(np.argmin(W2[in20]))]),
           "max_cells": int(max(cells)), "cells_T": cells[-1], "steps": int(ds["n_steps"]),
           "wall_s": float(ds["wall_time"]), "mass_drift": float(ds["mass_drift"]),
           "min_f": float(ds["min_density_steps"])}
    # the third stage: the first time after t_exit that F's alignment exceeds 0.1 (the stall cone has
    # align F = 0; f0 has 1/3), and what holds the final state: the share of the attention weight at the
    # heaviest cell that comes from cells below 1e-6 of the heaviest cell's mass (the tails), their mass
    above = np.nonzero((aF > 0.1) & (t > rec["t_exit"]))[0] if math.isfinite(rec["t_exit"]) else np.array([], int)
    rec["t_F_01"] = float(t[above[0]]) if above.size else None
    r = load(out / str(ds["results_file"].values))
    g = r.grid_at(len(r.times) - 1)
    w = np.asarray(r.density[-1]) * g.areas
    tail = w < TAIL_FRACTION * w.max()
    rec["tail_mass_T"] = float(w[tail].sum())
    rec["top_cell_share_T"] = float(w.max() / w.sum())
    rec["tail_share_T"] = None  # beta = inf: the field does not depend on f (MODEL.md (3)), no attention weights
    if math.isfinite(beta):
        x = g.centers[int(np.argmax(w))]
        e = float(beta) * (g.centers @ (PAPER_B @ x))
        wk = w * np.exp(e - e.max())
        rec["tail_share_T"] = float(wk[tail].sum() / wk.sum())
    for k in ("t_exit", "t_EF", "t_exit_20", "t_EF_20"):
        rec[k] = None if not math.isfinite(rec[k]) else float(rec[k])
    return rec


def leave_plateau(rec: dict) -> float | None:
    """t(E < E_PLATEAU): when the alignment with E falls back below E_PLATEAU after having exceeded it (linear
    between saved states; None if not by T): the departure from E's plateau. Where the density leaves E
    decisively it comes shortly before t_exit (beta 100, nside_max 512: 6.65 against 7.86); at beta 300 align E
    falls from 1 to ~0.93 and then drifts, so t_exit (the 0.9 crossing) lies on that drift, long after it
    (README, "beta 300")."""
    from spherepde.diagnostics import exit_time

    t = exit_time(rec["times"], rec["align_E"], E_PLATEAU)
    return float(t) if math.isfinite(t) else None


def _rel(x: float | None, y: float | None) -> float | None:
    """|y - x| / |y|, the relative change from x to y (None where either is None)."""
    return None if x is None or y is None else abs(y - x) / abs(y)


def changes(recs: list[dict], by: str = "nside_max") -> list[dict]:
    """Relative change of t_exit, t_EF and the plateau W2 between consecutive levels of one beta (levels of
    ``by``: nside_max, or nside_min for the tails' resolution at a fixed nside_max)."""
    out = []
    for a, b in zip(recs, recs[1:]):
        row = {"beta": b["beta"], "levels": [a.get(by, NSIDE_MIN), b.get(by, NSIDE_MIN)]}
        for q in BAR:
            row[q] = _rel(a[q], b[q])
        row["t_EF_none_both"] = a["t_EF"] is None and b["t_EF"] is None
        row["t_exit_none_both"] = a["t_exit"] is None and b["t_exit"] is None
        row["t_end"] = min(a.get("t_end", T_END), b.get("t_end", T_END))  # t_EF is known "none" up to this T
        ta, tb = terminal(a), terminal(b)
        for q in ("t_depart", "drift"):
            row[q] = _rel(ta[q], tb[q])
        row["t_leave"] = _rel(leave_plateau(a), leave_plateau(b))
        out.append(row)
    return out


def verdict(c: dict) -> str:
    """Whether a pair of levels meets the bar: t_exit and the plateau within it, and t_EF within it (or,
    said as such, reached by T at neither level, or at one only). Where neither level leaves E by T (beta 1000),
    the plateau alone is measured and the verdict says so."""
    T = f"{c.get('t_end', T_END):g}"
    if c.get("t_exit_none_both"):
        ok = c["plateau_w2"] is not None and c["plateau_w2"] <= BAR["plateau_w2"]
        return f"the plateau: {'yes' if ok else 'no'}; t_exit and t_EF: reached by T = {T} at neither level"
    within = [q for q in ("t_exit", "plateau_w2") if c[q] is not None and c[q] <= BAR[q]]
    if len(within) < 2:
        return "no"
    if c["t_EF"] is not None:
        return "yes" if c["t_EF"] <= BAR["t_EF"] else "t_exit and the plateau: yes; t_EF: no"
    if c["t_EF_none_both"]:
        return f"t_exit and the plateau: yes; t_EF: reached by T = {T} at neither level"
    return "t_exit and the plateau: yes; t_EF: no (reached by T at one level only)"


def _t_end_note(r: dict) -> str:
    t = r.get("t_end", T_END)
    return ("" if t == T_END else f" (T = {t:g})") + ("" if not r.get("rtol") else f" (rtol {r['rtol']:g})")


def step_pairs(recs: list[dict]) -> list[dict]:
    """The step-size ladder: each level run at another error-control tolerance (``rtol``) beside the same
    level at the default one (same beta, refinement, nside_min, nside_max and T), with the relative changes of
    t_exit, t_EF and the plateau W2 (measured against the tighter tolerance's value) and the ratio of steps."""
    base = {key(r): r for r in recs if not r.get("rtol")}
    out = []
    for r in sorted((r for r in recs if r.get("rtol")), key=key):
        b = base.get(key({**r, "rtol": None}))
        if b is None or b.get("t_end", T_END) != r.get("t_end", T_END):
            continue
        row = {"beta": r["beta"], "refinement": refinement_of(r), "nside_min": r.get("nside_min", NSIDE_MIN),
               "nside_max": r["nside_max"], "t_end": r.get("t_end", T_END), "rtol": r["rtol"],
               "steps": (b["steps"], r["steps"]), "wall_s": (b["wall_s"], r["wall_s"])}
        for q in BAR:
            row[q], row[q + "_pair"] = _rel(b[q], r[q]), (b[q], r[q])
        out.append(row)
    return out


def _pair(c: dict, q: str, p: int = 4) -> str:
    """A step pair's reading ``q``: both values and their relative change (step_pairs)."""
    x, y = c[q + "_pair"]
    if x is None and y is None:
        return "none by T at both"
    return "-" if c[q] is None else f"{x:.{p}f} -> {y:.{p}f} ({c[q]:.1e})"


def report(recs: list[dict]) -> str:
    def f(x, p=2):
        return "none" if x is None else f"{x:.{p}f}"

    L = ["# Figure 4's perturbed runs on adaptive grids (validation/fig4_concentration/adaptive.py)", "",
         f"The study's perturbed f0 (eps = 0.05), its base configuration, on AdaptiveHealpixGrid(nside_min, "
         f"nside_max) with the default refinement or the attended one (Refinement(attended=True): cells that "
         f"carry attention weight count as mass), to T = {T_END:g} (a level run to another T says so beside its "
         f"nside_max; its t_EF and readings at T are those by that T). The plateau is min W2(rho_t, Pi#rho_0) over "
         f"t <= {T_FIG4:g}; t_exit and t_EF over the whole run (\"none\": not by T); t(E < {E_PLATEAU:g}) the departure "
         "from E's plateau (align E falls back below it); t(F > 0.1) the first saved "
         "time at which the alignment with F exceeds 0.1 (the stall cone has none); at T, the share of the "
         "attention weight at the heaviest cell that comes from the tails (cells below 1e-6 of its mass), the "
         "tails' mass and the heaviest cell's share of the mass.", "",
         f"| beta | refinement | nside_min | nside_max | t(E < {E_PLATEAU:g}) | t_exit | t_EF | t(F > 0.1) | plateau W2 (at t) | "
         "final align E / F / F_abs | tails' attention share / mass at T | heaviest cell at T | cells at most / at T | "
         "steps | wall s | mass drift | min f |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(recs, key=key):
        L.append(f"| {r['beta']:g} | {refinement_name(*refinement_of(r))} | "
                 f"{r.get('nside_min', NSIDE_MIN)} | {r['nside_max']}{_t_end_note(r)} | {f(leave_plateau(r))} | "
                 f"{f(r['t_exit'])} | "
                 f"{f(r['t_EF'])} | {f(r.get('t_F_01'))} | {r['plateau_w2']:.4f} ({r['argmin_w2']:.2f}) | "
                 f"{r['align_E'][-1]:.3f} / {r['align_F'][-1]:.3f} / {r['align_Fabs'][-1]:.3f} | "
                 f"{r.get('tail_share_T', float('nan')):.3f} / {r.get('tail_mass_T', float('nan')):.1e} | "
                 f"{r.get('top_cell_share_T', float('nan')):.3f} | "
                 f"{r['max_cells']} / {r['cells_T']} | {r['steps']} | {r['wall_s']:.0f} | {r['mass_drift']:.1e} | "
                 f"{r['min_f']:.1e} |")
    L += ["", "Relative change between consecutive levels (the issue's bar: t_exit and t_EF <= 2 %, plateau W2 "
          "<= 5 % between the two finest), per ladder in nside_max (one per refinement and nside_min), then per "
          "ladder in nside_min (the tails' resolution) at a fixed nside_max:", "",
          f"| beta | refinement | levels | t_exit | t_EF | plateau W2 | within the bar | t(E < {E_PLATEAU:g}) | t_depart | "
          "drift |", "|---|---|---|---|---|---|---|---|---|---|"]
    for by, fixed in (("nside_max", "nside_min"), ("nside_min", "nside_max")):
        for (beta, ref, level), sel in ladders(recs, by).items():
            for c in changes(sel, by):
                L.append(f"| {beta:g} | {refinement_name(*ref)} | {fixed} {level}: {by} {c['levels'][0]} -> "
                         f"{c['levels'][1]} | "
                         + " | ".join("-" if c[q] is None else f"{100 * c[q]:.1f} %" for q in BAR)
                         + f" | {verdict(c)} | "
                         + " | ".join("-" if c[q] is None else f"{100 * c[q]:.1f} %"
                                      for q in ("t_leave", "t_depart", "drift"))
                         + " |")
    pairs = step_pairs(recs)
    if pairs:
        from spherepde import Options

        r0 = Options().rtol
        L += ["", f"The step-size ladder: a level rerun with the error control's tolerance rtol below its default "
              f"{r0:g} (every other run), against the same level at the default; relative changes (the bar "
              "between resolution levels: 2 % in t_exit and t_EF, 5 % in the plateau):", "",
              "| beta | refinement | nside_min | nside_max | T | rtol | t_exit | t_EF | plateau W2 | steps | wall s |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
        for c in pairs:
            L.append(f"| {c['beta']:g} | {refinement_name(*c['refinement'])} | {c['nside_min']} | {c['nside_max']} | "
                     f"{c['t_end']:g} | {r0:g} -> {c['rtol']:g} | {_pair(c, 't_exit')} | {_pair(c, 't_EF')} | "
                     f"{_pair(c, 'plateau_w2', 5)} | {c['steps'][0]} -> {c['steps'][1]} | "
                     f"{c['wall_s'][0]:.0f} -> {c['wall_s'][1]:.0f} |")
    L += ["", f"The terminal phase's readings (README, \"What t_EF rests on\"): t_depart, the time at which the "
          f"alignment with F reaches {F_DEPART:g} after the exit (the stall cone left; linear between saved states); "
          f"the gap align E - align F one time unit later (the third state); the drift, the slope of "
          f"align F - align E over t in [{DRIFT_WINDOW[0]:g}, {DRIFT_WINDOW[1]:g}]; t_EF - t_depart - 1 against "
          "gap / drift, and 1 / drift, the time by which an error of 1 in the gap moves t_EF:", "",
          "| beta | refinement | nside_min | nside_max | t_depart | gap | drift | t_EF - t_depart - 1 | gap / drift | "
          "1 / drift |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(recs, key=key):
        m = terminal(r)
        if m["t_depart"] is None:
            continue
        span = "none" if r["t_EF"] is None else f"{r['t_EF'] - m['t_depart'] - 1.0:.2f}"
        ratio = "-" if not m["drift"] else f"{m['gap'] / m['drift']:.2f}"
        L.append(f"| {r['beta']:g} | {refinement_name(*refinement_of(r))} | {r.get('nside_min', NSIDE_MIN)} | "
                 f"{r['nside_max']}{_t_end_note(r)} | {m['t_depart']:.2f} | {m['gap']:.3f} | "
                 + ("-" if m["drift"] is None else f"{m['drift']:.4f}") + f" | {span} | {ratio} | "
                 + ("-" if not m["drift"] else f"{1.0 / m['drift']:.0f}") + " |")
    return "\n".join(L) + "\n"


def figure(recs: list[dict], path: Path) -> None:
    """adaptive.png: per beta and refinement (one row each), the alignments with E, F and F_abs, W2 to Pi#rho_0 and the cell count
    against t, one line style per level (the finest level darkest)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = sorted({(r["beta"], refinement_of(r)) for r in recs}, key=lambda x: (x[0], _order(x[1])))
    fig, ax = plt.subplots(len(panels), 3, figsize=(15, 4.2 * len(panels)), squeeze=False)
    for row, (beta, ref) in zip(ax, panels):
        sel = [r for r in recs if r["beta"] == beta and refinement_of(r) == ref]
        shades = np.linspace(0.75, 0.0, len(sel))
        for r, sh in zip(sel, shades):
            t = np.asarray(r["times"])
            lab = f"nside_max {r['nside_max']}"
            row[0].plot(t, r["align_E"], color=(sh, sh, 1.0), label=f"E, {lab}")
            row[0].plot(t, r["align_F"], color=(1.0, sh, sh), label=f"F, {lab}")
            row[0].plot(t, r["align_Fabs"], "--", color=(sh, 0.6 + 0.4 * sh, sh), label=f"F_abs, {lab}")
            row[1].semilogy(t, r["W2"], color=(sh, sh, sh), label=lab)
            row[2].semilogy(t, r["cells"], color=(sh, sh, sh), label=lab)
            if r["t_exit"] is not None:
                row[0].axvline(r["t_exit"], color=(sh, sh, 1.0), lw=0.6, ls=":")
        row[0].axhline(0.9, color="0.5", lw=0.5)
        row[0].set(xlabel="t", ylabel="alignment",
                   title=f"beta = {beta:g}, {refinement_name(*ref)}, nside_min {sel[0].get('nside_min', NSIDE_MIN)}: "
                         "\nalignments (dotted: t_exit)")
        row[0].title.set_fontsize(10)
        row[0].legend(fontsize=6, ncol=2)
        row[1].axvline(T_FIG4, color="0.5", lw=0.5)
        row[1].set(xlabel="t", ylabel="W2(rho_t, Pi#rho_0)", title="W2 to the limit measure")
        row[1].legend(fontsize=7)
        row[2].set(xlabel="t", ylabel="cells", title="cells of the adaptive grid")
        row[2].legend(fontsize=7)
    fig.suptitle("Figure 4, perturbed f0 (eps 0.05), on AdaptiveHealpixGrid(nside_min, nside_max)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def terminal_figure(recs: list[dict], path: Path) -> None:
    """terminal.png: the terminal phase of every attended level at beta 30, nside_max >= 128 (README, "What t_EF rests
    on"): left, the alignments with E and F against t; right, align E - align F from the stall cone on, with
    t_depart (dots) and t_EF (where the curve crosses 0): the gap one unit after the departure, and the slow
    drift that has to close it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sel = sorted((r for r in recs if refinement_of(r) == (True, None, 0.0) and not r.get("rtol")
                  and r["nside_max"] >= 128 and r["beta"] == 30.0),
                 key=lambda r: (r.get("nside_min", NSIDE_MIN), r["nside_max"]))
    if not sel:
        return
    fig, ax = plt.subplots(1, 2, figsize=(13, 4.6))
    cmap = plt.get_cmap("tab10")
    for c, r in enumerate(sel):
        t = np.asarray(r["times"])
        E, F = np.asarray(r["align_E"]), np.asarray(r["align_F"])
        lab = f"{r.get('nside_min', NSIDE_MIN)} / {r['nside_max']}"
        ax[0].plot(t, E, color=cmap(c), label=f"E, {lab}")
        ax[0].plot(t, F, "--", color=cmap(c), label=f"F, {lab}")
        m = terminal(r)
        w = t >= 10.0
        ax[1].plot(t[w], (E - F)[w], color=cmap(c), label=f"nside_min / max {lab}: t_EF "
                   + ("none" if r["t_EF"] is None else f"{r['t_EF']:.2f}"))
        if m["t_depart"] is not None:
            ax[1].plot([m["t_depart"]], [np.interp(m["t_depart"], t, E - F)], "o", color=cmap(c), ms=4)
    ax[0].set(xlabel="t", ylabel="alignment", title="attended refinement: align E (solid), F (dashed)")
    ax[0].legend(fontsize=6, ncol=2)
    ax[1].axhline(0.0, color="0.4", lw=0.6)
    ax[1].set(xlabel="t", ylabel="align E - align F", ylim=(-0.3, 0.55),
              title="E - F: departure (dots), gap, drift; t_EF where it crosses 0")
    ax[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def refinement_of(rec: dict) -> tuple:
    """(attended, attended_floor, attention_variation) of a record (records before the attended floor have
    neither or one; records before attention_variation have none: 0)."""
    att = bool(rec.get("attended", False))
    return att, (rec.get("attended_floor") if att else None), float(rec.get("attention_variation") or 0.0)


def _order(ref: tuple) -> tuple:
    return ref[0], -(ref[1] if ref[1] is not None else math.inf), ref[2]


def key(rec: dict) -> tuple:
    return (rec["beta"], rec.get("nside_min", NSIDE_MIN), *_order(refinement_of(rec)), rec["nside_max"],
            rec.get("rtol") or 0.0)


def ladder(recs: list[dict], attended: bool = False, attended_floor: float | None = None,
           attention_variation: float = 0.0, nside_min: int = NSIDE_MIN) -> list[dict]:
    """The ladder proper: the levels on the default coarsest cells (or ``nside_min``), by beta and nside_max;
    ``attended``: the ladder of the attended refinement (``Refinement(attended=True)``) instead of the default
    one, with the attention density's own floor ``attended_floor`` (None: the mass floor), and the attention
    criterion where f varies by more than ``attention_variation`` (0: wherever f is significant)."""
    return sorted((r for r in recs if r.get("nside_min", NSIDE_MIN) == nside_min and not r.get("rtol")
                   and refinement_of(r) == (attended, attended_floor if attended else None,
                                            float(attention_variation))), key=key)


def ladders(recs: list[dict], by: str) -> dict:
    """Every ladder in ``by`` (nside_max, or nside_min: the tails' resolution) with the other kept fixed:
    {(beta, refinement_of, the fixed level): its records by ``by``}, by beta, refinement and fixed level."""
    fixed = "nside_min" if by == "nside_max" else "nside_max"
    out = {}
    for r in recs:
        if r.get("rtol"):  # a step-size ladder's level (step_pairs), not a level of these
            continue
        out.setdefault((r["beta"], refinement_of(r), r.get(fixed, NSIDE_MIN)), []).append(r)
    return {g: sorted(out[g], key=lambda r: r.get(by, NSIDE_MIN))
            for g in sorted(out, key=lambda g: (g[0], _order(g[1]), g[2]))}


def merge_rows(new: list[dict], out: Path | None = None) -> list[dict]:
    """Add the records ``new`` to ``adaptive.json`` (a record of the same key replaced) and rewrite it and
    ``adaptive.md``; returns all rows. The read, merge and write hold an exclusive lock on
    ``adaptive.json.lock``, so that several runs of this script at once (one per beta or level, as the
    ladders are run on this machine) each add their rows to what the others wrote, instead of writing back
    the file as they read it when they started (which lost the rows another run had written meanwhile)."""
    out = OUT if out is None else Path(out)
    path = out / "adaptive.json"
    with locked(path):
        rows = {key(r): r for r in (json.loads(path.read_text())["rows"] if path.exists() else [])}
        if new:
            rows.update({key(r): r for r in new})
            recs = [rows[k] for k in sorted(rows)]
            write_atomic(path, json.dumps({"nside_min": NSIDE_MIN, "t_end": T_END, "rows": recs}))
            write_atomic(out / "adaptive.md", report(recs))
        return [rows[k] for k in sorted(rows)]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--beta", type=float, nargs="+", default=BETAS)
    ap.add_argument("--nside-max", type=int, nargs="+", default=NSIDE_MAX)
    ap.add_argument("--nside-min", type=int, default=NSIDE_MIN,
                    help="the coarsest cells (the tails' resolution; the ladder is the one at the default)")
    ap.add_argument("--attended", action="store_true",
                    help="refine with Refinement(attended=True): the tails that carry attention weight count as mass")
    ap.add_argument("--attended-floor", type=float, default=None,
                    help="with --attended: the attention density (relative to max f) from which a cell counts "
                         "as significant (default: the mass floor 1e-4)")
    ap.add_argument("--attention-variation", type=float, default=0.0,
                    help="the attention criterion only where f varies over a cell's stencil by more than this "
                         "(Refinement.attention_variation; default 0: wherever f is significant)")
    ap.add_argument("--t-end", type=float, default=None,
                    help=f"run the levels to this T instead of {T_END:g} (for t_exit and the plateau; t_EF and the "
                         "terminal readings are then those by this T)")
    ap.add_argument("--rtol", type=float, default=None,
                    help="the error control's tolerance (default: Options().rtol): a step-size ladder's level, "
                         "reported beside the same level at the default")
    ap.add_argument("--report-only", action="store_true", help="only the levels already run")
    a = ap.parse_args(argv)
    recs = merge_rows([])  # the rows of every earlier run (another process may be adding its own)
    for beta in a.beta:
        for nmax in a.nside_max:
            rec = member(beta, nmax, run=not a.report_only, nside_min=a.nside_min, attended=a.attended,
                         attended_floor=a.attended_floor, attention_variation=a.attention_variation,
                         t_end=a.t_end, rtol=a.rtol)
            if rec is not None:
                print(f"beta {beta:g} nside_max {nmax}: t_exit {rec['t_exit']}, t_EF {rec['t_EF']}, "
                      f"plateau {rec['plateau_w2']:.4f}, cells {rec['max_cells']}, {rec['wall_s']:.0f} s", flush=True)
                recs = merge_rows([rec])
    if recs:
        refs = sorted({refinement_of(r) for r in recs}, key=_order)
        rows = [r for ref in refs for r in ladder(recs, *ref)]
        # a beta without a ladder on the default coarsest cells (beta 100) gets its fallback ladders; one level
        # there (beta 1000's nside_min 16 run) is no ladder and does not hide a fallback ladder of two or more
        panel = lambda r: (r["beta"], refinement_of(r))  # noqa: E731
        fallback = [r for kw in FALLBACK_LADDERS for r in ladder(recs, **kw)]
        n_own, n_fb = Counter(map(panel, rows)), Counter(map(panel, fallback))
        rows = [r for r in rows if n_own[panel(r)] >= 2 or n_fb[panel(r)] < 2]
        have = set(map(panel, rows))
        rows += [r for r in fallback if panel(r) not in have]
        figure(rows, OUT / "adaptive.png")
        terminal_figure(recs, OUT / "terminal.png")
    print(report(recs))


if __name__ == "__main__":
    main()
