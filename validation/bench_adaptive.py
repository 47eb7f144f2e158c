"""Cost of adaptive HEALPix grids against uniform ones at the same cell count (issue #16).

Four figures, each the median and spread of ``--repeat`` timed runs of ``--steps`` steps of the steady
zero-temperature field (paper matrices), linear reconstruction with the positivity limiter, the solver's
default stepper (SSP-RK(4,3): 4 stages per step; the stages are counted from the stepper) and error control:

1. the uniform HealpixGrid(nside): cell-stage updates per second;
2. a static adaptive grid (``refinement=False``) of about the same cell count, three orders mixed (a polar
   cap refined twice), the same field: cell-stage updates per second, and its ratio to 1 (target: within 2x);
3. the same adaptive grid regridding every 4 CFL steps (the default ``Refinement()``; every 2 steps of SSP-RK(4,3)) on a moving bump: the
   time per regrid (grid rebuild with reused geometry plus transfer) against the time per step;
4. the attention field (beta 10 and 100) on the grids of 1 and 2: seconds per evaluation and the ratio per cell.

Usage: python validation/bench_adaptive.py [--nside 64] [--steps 40] [--repeat 5]
Writes validation/bench_adaptive.md. ``--attended`` times only the attended density of
``Refinement(attended=True)`` (its pruned kernel against the dense twin): bench_attended.md. ``--paper [--limit 900] [--attention 1e9]`` runs only the paper-scale
benchmark of the issue instead (beta 100, T = 20, perturbed f0, nside_min 32, nside_max 1024; wall time,
the time reached within the limit, peak memory, the cell count against t): bench_adaptive_paper.md/.png.
``--parts`` (bench_adaptive_parts.md: ``--steps 20 --repeat 3``): where that run's time goes at its peak cell count, part by part (the
regrid's criteria, new grid, balance, faces, stencils, transfer, field history; the stages; whole fields).
"""
from __future__ import annotations

import argparse
import os
import platform
import time
from pathlib import Path

import numba
import numpy as np

from spherepde import AdaptiveHealpixGrid, HealpixGrid, Options, Prescribed, Solver, ZeroTemperature
from spherepde.config import MATRIX_PRESETS
from spherepde.grids.adaptive import Refinement

HERE = Path(__file__).parent


def f0(x):
    return 1.0 + 0.5 * x[:, 0] + 0.3 * x[:, 1] * x[:, 2]


def throughput(grid, steps: int, repeat: int):
    """(median, min, max) cell-stage updates per second of ``steps`` steps on ``grid``, and the stages."""
    p = MATRIX_PRESETS["paper"]
    model = ZeroTemperature(p["B"], p["V"])
    rates = []
    for _ in range(repeat + 1):  # the first run compiles and warms the caches
        s = Solver(grid, model, f0, Options())
        s.step()
        t0 = time.perf_counter()
        for _ in range(steps):
            s.step()
        wall = time.perf_counter() - t0
        stages = steps * s._stepper.n_stages  # the answer's stages and any extra one of the estimate
        rates.append(grid.n_cells * stages / wall)
    r = np.array(rates[1:])
    return float(np.median(r)), float(r.min()), float(r.max())


def field_cost(grid, beta: float, repeat: int):
    """(median, min, max) seconds of one attention-field evaluation (paper matrices, the solver's own
    evaluator and method choice) on ``grid``'s cells for f0, and the method it used."""
    from spherepde import Attention

    p = MATRIX_PRESETS["paper"]
    s = Solver(grid, Attention(p["B"], p["V"], beta), f0, Options())
    ts = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        s._grid_mean_field(s.f)
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts)), float(min(ts)), float(max(ts)), s.field_info.method


def regrid_cost(nside: int, steps: int, repeat: int):
    """(median s per regrid, median s per step without the regrids, cells) of a bump in rigid rotation."""
    c = np.array([0.0, 0.6, 0.8])
    per_regrid, per_step, cells = [], [], []
    for _ in range(repeat + 1):
        g = AdaptiveHealpixGrid(nside // 4, nside, refinement=Refinement())
        s = Solver(g, Prescribed.rigid_rotation([1.0, 0.0, 0.0]), lambda x: np.exp(30 * (x @ c - 1)), Options())
        t_regrid = 0.0
        orig = s.grid.__class__.regrid

        def timed(self, f, scale=0.0, **kw):
            nonlocal t_regrid
            t0 = time.perf_counter()
            out = orig(self, f, scale, **kw)
            t_regrid += time.perf_counter() - t0
            return out

        s.grid.__class__.regrid = timed
        try:
            n0 = s.n_regrids
            t0 = time.perf_counter()
            for _ in range(steps):
                s.step()
            wall = time.perf_counter() - t0
        finally:
            s.grid.__class__.regrid = orig
        n = max(1, s.n_regrids - n0)
        per_regrid.append(t_regrid / n)
        per_step.append((wall - t_regrid) / steps)
        cells.append(s.grid.n_cells)
    return float(np.median(per_regrid[1:])), float(np.median(per_step[1:])), int(np.median(cells[1:])), \
        (float(min(per_regrid[1:])), float(max(per_regrid[1:])))


def _timed_method(obj, name: str, acc: dict, label: str | None = None):
    """Wrap obj.name to add its calls and seconds to acc[label] = [calls, seconds] (label: name); returns the
    original, for the caller to put back."""
    inner = getattr(obj, name)
    label = name if label is None else label
    acc.setdefault(label, [0, 0.0])

    def wrapped(*a, **k):
        t = time.perf_counter()
        try:
            return inner(*a, **k)
        finally:
            acc[label][0] += 1
            acc[label][1] += time.perf_counter() - t

    setattr(obj, name, wrapped)
    return inner


def paper_solver(refinement: Refinement, field_interval: int | None = 40, cells=None, f=None, t0: float = 0.0):
    """The paper setting's solver (--paper, --parts): beta 100, the paper matrices, AdaptiveHealpixGrid(32, 1024,
    ``cells``) with ``refinement``, Options(field_interval=...); from the perturbed f0 (eps 0.05) at t = 0, or
    from the cell averages ``f`` on ``cells`` at ``t0``."""
    from spherepde import Attention
    from spherepde.config import perturbed_uniform

    p = MATRIX_PRESETS["paper"]
    grid = AdaptiveHealpixGrid(32, 1024, cells, refinement=refinement, max_cells=3_000_000)
    start = (lambda x: perturbed_uniform(x, 0.05)) if f is None else f
    return Solver(grid, Attention(p["B"], p["V"], 100.0), start, Options(field_interval=field_interval), t0=t0)


def paper_scale(limit_s: float, attention: float, field_interval: int | None = 40, attention_variation: float = 0.0,
                attended: bool = False):
    """The issue's paper-scale run: beta 100, paper matrices, the perturbed f0 (eps 0.05), T = 20, nside_min
    32, nside_max 1024, Refinement(attention=..., attention_variation=..., attended=...), stopped after ``limit_s`` seconds of wall time. Returns
    the wall time, the time reached, peak memory (max RSS, bytes) and the cell count against t."""
    import resource

    refinement = Refinement(attention=attention, attention_variation=attention_variation, attended=attended)
    t0 = time.perf_counter()
    s = paper_solver(refinement, field_interval)
    acc = {}
    for name in ("_head_means", "_maybe_regrid", "_try_step"):  # field evaluations, regrids, the stages
        _timed_method(s, name, acc)
    track = [(0.0, s.grid.n_cells, time.perf_counter() - t0)]
    while s.t < 20.0 and time.perf_counter() - t0 < limit_s:
        s.step(dt_max=20.0 - s.t)
        if s.n_steps % 20 == 0:
            track.append((s.t, s.grid.n_cells, time.perf_counter() - t0))
    track.append((s.t, s.grid.n_cells, time.perf_counter() - t0))
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"wall_s": time.perf_counter() - t0, "t": s.t, "steps": s.n_steps, "peak_rss": rss,
            "track": track, "refinement": refinement, "max_cells": max(c for _, c, _ in track),
            "field_interval": field_interval, "parts": acc}


#: The parts --parts times: (label, owner kind, attribute(s), depth), nested as listed (a part includes the parts indented under
#: it in the report); the lazy grid properties are made at the first stage after a regrid.
_PARTS = (
    ("a regrid (Solver._maybe_regrid; per regrid made)", "solver", "_maybe_regrid", 0),
    ("the criteria (Refinement.flags)", "refinement", "flags", 1),
    ("the new grid (AdaptiveHealpixGrid.adapt)", "grid", "adapt", 1),
    ("2:1 balance (_balance)", "module", "_balance", 2),
    ("faces (AdaptiveHealpixGrid._build_faces)", "grid", "_build_faces", 2),
    ("stencils (AdaptiveHealpixGrid._stencil_neighbours)", "grid", "_stencil_neighbours", 2),
    ("the density's transfer (transfer)", "module", "transfer", 1),
    ("the field history's move (Solver._move_history)", "solver", "_move_history", 1),
    ("the field at the new cells (Solver._refresh_new_cells)", "solver", "_refresh_new_cells", 2),
    ("lazy: stencil_coef", "lazy", "stencil_coef", 0),
    ("lazy: stencil_classes", "lazy", "stencil_classes", 0),
    ("lazy: kernel_split + kernel_compact", "lazy", "kernel_split kernel_compact", 0),
    ("a step attempt (Solver._try_step, with the lazy properties)", "solver", "_try_step", 0),
    ("whole attention fields (Solver._head_means)", "solver", "_head_means", 0),
)


def _patched_parts(acc: dict):
    """Wrap the classes' and module's functions of _PARTS (a cached property: its function) to add [calls,
    seconds] to acc[label]; returns the undo list of (owner, name, original)."""
    import spherepde.grids.adaptive as A
    import spherepde.grids.base as GB

    owners = {"solver": Solver, "grid": AdaptiveHealpixGrid, "refinement": Refinement, "module": A}
    undo = []
    for label, kind, names, _ in _PARTS:
        acc[label] = [0, 0.0]
        for name in names.split():
            if kind == "lazy":  # where the class (or its base) defines the cached property
                obj, name = AdaptiveHealpixGrid.__dict__.get(name) or GB.Grid.__dict__[name], "func"
            else:
                obj = owners[kind]
            undo.append((obj, name, _timed_method(obj, name, acc, label)))
    return undo


def parts_breakdown(t_state: float, steps: int, repeat: int):
    """Where the paper-scale run's time goes at its peak cell count: the --paper setting run to ``t_state``
    (its cells near their most), then ``repeat`` times ``steps`` steps from that state (a fresh grid and solver
    each time, two untimed steps first), each part of :data:`_PARTS` timed. Returns the state's cells and t,
    the time to reach it, and per repeat the wall time, the regrids and acc."""
    ref = Refinement(attention=1e9)
    t0 = time.perf_counter()
    s = paper_solver(ref)
    s.advance(t_state)
    reach = time.perf_counter() - t0
    uniq, f = s.grid.uniq.copy(), s.f.copy()
    runs = []
    for _ in range(repeat):
        r = paper_solver(ref, cells=uniq, f=f, t0=t_state)
        for _ in range(2):
            r.step()
        acc = {}
        undo = _patched_parts(acc)
        try:
            n0, w0 = r.n_regrids, time.perf_counter()
            for _ in range(steps):
                r.step()
            runs.append((time.perf_counter() - w0, r.n_regrids - n0, acc))
        finally:
            for obj, name, orig in reversed(undo):
                setattr(obj, name, orig)
    return {"cells": len(uniq), "t": t_state, "reach_s": reach, "steps": steps, "runs": runs}


def write_parts(r: dict):
    walls = np.array([w for w, _, _ in r["runs"]])
    regrids = int(np.median([n for _, n, _ in r["runs"]]))
    lines = ["# Where the paper-scale run's time goes (validation/bench_adaptive.py --parts)", "",
             f"The --paper setting (beta 100, AdaptiveHealpixGrid(32, 1024), Refinement(attention=1e9), "
             f"field_interval 40) run to t = {r['t']:g} ({r['cells']} cells, near the run's most; "
             f"{r['reach_s']:.0f} s to get there), then {len(r['runs'])} times {r['steps']} steps from that state; "
             f"{numba.get_num_threads()} Numba thread(s), load average {os.getloadavg()[0]:.1f}. "
             f"Wall time of the {r['steps']} steps: {np.median(walls):.2f} s [{walls.min():.2f}, {walls.max():.2f}], "
             f"{regrids} regrids (every 2 steps of SSP-RK(4,3)).", "",
             "Each part's seconds per call, median [min, max] over the repeats, and its share of the wall time "
             "(indented parts are inside the part above them):", "",
             "| part | calls | ms per call | share |", "|---|---|---|---|"]
    for label, _, name, depth in _PARTS:
        # _maybe_regrid is called every step and regrids every second one: per regrid made
        n = [n if name == "_maybe_regrid" else acc[label][0] for _, n, acc in r["runs"]]
        per = np.array([acc[label][1] / max(k, 1) * 1e3 for k, (_, _, acc) in zip(n, r["runs"])])
        share = np.median([acc[label][1] / w for w, _, acc in r["runs"]])
        calls = int(np.median(n))
        lines.append(f"| {'&nbsp;&nbsp;' * depth}{label} | {calls} | {np.median(per):.1f} [{per.min():.1f}, "
                     f"{per.max():.1f}] | {share:.0%} |")
    text = "\n".join(lines + [""])
    (HERE / "bench_adaptive_parts.md").write_text(text)
    print(text)
    return 0


def attended_cost(repeat: int):
    """The attended density of ``Refinement(attended=True)`` (one call per regrid) on a collapse-like state:
    two clusters of width ~0.2 rad at +-e1 over a floor of 1e-12, on an adaptive grid refined around them
    (nside 32 .. 256), at beta 100, 300 and 1000 (paper B): the pruned kernel against its dense NumPy twin
    (seconds, median [min, max] of ``repeat`` calls after one warm-up; the twin 3 calls), the pixels and
    targets, and the largest relative difference where sigma >= 1e-6 of its largest value."""
    from spherepde.grids.adaptive import _attended_density_dense, _attended_pixels, attended_density

    g = AdaptiveHealpixGrid(32, 256, refinement=False).refined_where(lambda gr: np.abs(gr.centers[:, 0]) > 0.8,
                                                                      max_passes=3)
    f = np.exp(30.0 * (np.abs(g.xbar[:, 0]) - 1.0)) + 1e-12
    B = np.asarray(MATRIX_PRESETS["paper"]["B"], float)
    rows = []
    for beta in (100.0, 300.0, 1000.0):
        K = [(beta, B)]
        attended_density(g, f, K)
        ts = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            fast = attended_density(g, f, K)
            ts.append(time.perf_counter() - t0)
        td = []
        for _ in range(3):
            t0 = time.perf_counter()
            dense = _attended_density_dense(g, f, K)
            td.append(time.perf_counter() - t0)
        big = dense >= 1e-6 * dense.max()
        px = _attended_pixels(g, np.maximum(f, 0) * g.areas, beta, B, 1e-4)
        rows.append((beta, len(px[1]), len(px[3]), ts, td, float(np.max(np.abs(fast[big] / dense[big] - 1)))))
    return g, rows


def write_attended(g, rows, repeat: int):
    lines = ["# The attended density: pruned kernel against its dense twin (validation/bench_adaptive.py --attended)", "",
             f"Machine: {platform.processor() or platform.machine()}, {numba.get_num_threads()} Numba thread(s), "
             f"load average before the run {os.getloadavg()[0]:.1f}. {g!r}; f = exp(30 (|x_1| - 1)) + 1e-12 (two "
             "clusters at +-e1 over a floor), the paper's B; one call of `attended_density` (a regrid of "
             "`Refinement(attended=True)`) against `_attended_density_dense` (every term), seconds: median [min, "
             f"max] of {repeat} calls after a warm-up (the twin: 3 calls).", "",
             "| beta | pixels | targets | pruned kernel | dense twin | speed-up | largest relative difference (sigma >= 1e-6 max) |",
             "|---|---|---|---|---|---|---|"]
    for beta, P, K, ts, td, rel in rows:
        lines.append(f"| {beta:g} | {P} | {K} | {np.median(ts):.3f} [{min(ts):.3f}, {max(ts):.3f}] | "
                     f"{np.median(td):.3f} [{min(td):.3f}, {max(td):.3f}] | {np.median(td) / np.median(ts):.1f}x | {rel:.1e} |")
    lines.append("")
    text = "\n".join(lines)
    (HERE / "bench_attended.md").write_text(text)
    print(text)
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nside", type=int, default=64)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--paper", action="store_true",
                    help="only the paper-scale run (beta 100, T = 20, nside 32..1024), stopped after --limit s; "
                         "writes bench_adaptive_paper.md and .png")
    ap.add_argument("--limit", type=float, default=900.0, help="wall-time limit of --paper (s; the target is 900)")
    ap.add_argument("--field-interval", type=int, default=40,
                    help="Options.field_interval of --paper (default 40: the field extrapolated in time under "
                         "error control, which recomputes it when the extrapolation needs it, its history moved "
                         "across regrids; 0: exact at every stage). A cap, not the rate: against 4 (the default "
                         "before 2026-12-06) 34 whole fields in 475 steps instead of 94 in 344 in 240 s "
                         "(docs/user_guide.md)")
    ap.add_argument("--attention", type=float, default=1e9,
                    help="Refinement.attention of --paper (default 1e9: refine on the variation of f only; the "
                         "default 0.5 starts on 786432 cells)")
    ap.add_argument("--attention-variation", type=float, default=0.0,
                    help="Refinement.attention_variation of --paper (default 0; Figure 4's ladder runs 0.25 with "
                         "attention 0.5 and --attended-cells: validation/fig4_concentration)")
    ap.add_argument("--attended-cells", action="store_true",
                    help="Refinement(attended=True) in --paper (the cells that receive attention count as mass)")
    ap.add_argument("--parts", action="store_true",
                    help="only the breakdown of the --paper run's time by part at its peak cell count (t = 1.5, "
                         "~180k cells; --steps steps, --repeat times): bench_adaptive_parts.md")
    ap.add_argument("--attended", action="store_true",
                    help="only the attended density's cost (pruned kernel against its dense twin): bench_attended.md")
    a = ap.parse_args(argv)
    if a.attended:
        return write_attended(*attended_cost(a.repeat), a.repeat)
    if a.parts:
        return write_parts(parts_breakdown(1.5, a.steps, a.repeat))
    if a.paper:
        return write_paper(paper_scale(a.limit, a.attention, a.field_interval or None,
                                       a.attention_variation, a.attended_cells), a.limit)
    load = os.getloadavg()
    uni = HealpixGrid(a.nside)
    # a static grid of about the same count, three orders: nside/2 everywhere and a polar cap refined to
    # 2 nside (z > 0.6: 49728 cells against 49152 at nside 64)
    base = AdaptiveHealpixGrid(a.nside // 2, 2 * a.nside, refinement=False)
    ada = base.refined_where(lambda g: g.centers[:, 2] > 0.6)
    ru = throughput(uni, a.steps, a.repeat)
    ra = throughput(ada, a.steps, a.repeat)
    per_regrid, per_step, cells, spread = regrid_cost(a.nside, a.steps * 2, a.repeat)
    fields = [(beta, field_cost(uni, beta, a.repeat), field_cost(ada, beta, a.repeat)) for beta in (10.0, 100.0)]
    lines = [
        "# Adaptive grid cost (validation/bench_adaptive.py)", "",
        f"Machine: {platform.processor() or platform.machine()}, {numba.get_num_threads()} Numba thread(s), load "
        f"average before the run {load[0]:.1f}; {a.steps} steps x {a.repeat} repeats "
        "(median [min, max]); steady zero-temperature field, linear + positivity limiter, the default stepper "
        "(auto: SSP-RK(4,3), 4 stages a step), error control.", "",
        "| grid | cells | cell-stage updates / s |", "|---|---|---|",
        f"| HealpixGrid({a.nside}) | {uni.n_cells} | {ru[0]:.3g} [{ru[1]:.3g}, {ru[2]:.3g}] |",
        f"| {ada!r} | {ada.n_cells} | {ra[0]:.3g} [{ra[1]:.3g}, {ra[2]:.3g}] |", "",
        f"Adaptive / uniform cost per cell-stage: {ru[0] / ra[0]:.2f}x (target: within 2x).", "",
        "The attention field on the same two grids (one evaluation of the mean at the cell centres, f0, the "
        "paper matrices, the default tol; seconds, median [min, max]; per cell: the ratio times the cell "
        "counts' ratio):", "",
        "| beta | uniform | adaptive | method (uniform / adaptive) | adaptive / uniform per cell |", "|---|---|---|---|---|",
        *[f"| {beta:g} | {u[0]:.3f} [{u[1]:.3f}, {u[2]:.3f}] | {ad[0]:.3f} [{ad[1]:.3f}, {ad[2]:.3f}] | {u[3]} / {ad[3]} "
          f"| {ad[0] / u[0] * uni.n_cells / ada.n_cells:.2f}x |" for beta, u, ad in fields], "",
        f"Regridding (bump in rigid rotation, nside {a.nside // 4} .. {a.nside}, ~{cells} cells, default "
        f"Refinement, every 4 CFL steps: every 2 steps of SSP-RK(4,3)): {per_regrid * 1e3:.1f} ms per regrid [{spread[0] * 1e3:.1f}, "
        f"{spread[1] * 1e3:.1f}], {per_step * 1e3:.1f} ms per step without it: a regrid costs "
        f"{per_regrid / per_step:.1f} steps.", "",
    ]
    text = "\n".join(lines)
    (HERE / "bench_adaptive.md").write_text(text)
    print(text)


def write_paper(r: dict, limit: float):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done = r["t"] >= 20.0 - 1e-9
    lines = ["# Paper-scale adaptive run (validation/bench_adaptive.py --paper)", "",
             "beta 100, paper matrices, perturbed f0 (eps 0.05), T = 20, AdaptiveHealpixGrid(32, 1024), "
             f"{r['refinement']}, Options(field_interval={r['field_interval']}); machine {platform.processor() or platform.machine()}, "
             f"{numba.get_num_threads()} Numba thread(s), load average before the run {os.getloadavg()[0]:.1f}.", "",
             f"- wall time: {r['wall_s']:.0f} s (target <= 900 s){'' if done else f', stopped at the limit of {limit:g} s'}",
             f"- reached t = {r['t']:.3g} of 20 in {r['steps']} steps" + ("" if done else ": **not finished**"),
             f"- peak memory (max RSS): {r['peak_rss'] / 2**30:.2f} GiB (target <= 2 GB)",
             f"- cells: {r['track'][0][1]} at t = 0, at most {r['max_cells']}",
             "- where the time went: " + ", ".join(
                 f"{label} {r['parts'][k][1]:.0f} s ({r['parts'][k][0]} calls)" for label, k in (
                     ("attention evaluations", "_head_means"),
                     ("regrids (with the field history's move and its recomputation at the new cells)",
                      "_maybe_regrid"),
                     ("step attempts (stages, extrapolated moments)", "_try_step"))),
             f"- attention evaluations per step: {r['parts']['_head_means'][0] / max(r['steps'], 1):.2f}"]
    t, c, w = np.array(r["track"]).T
    if w[-1] > 900.0:  # a run given a longer limit: where it stood at the target's 900 s (the track: every 20 steps)
        lines.append(f"- at 900 s of wall time (the target) it stood at t = {np.interp(900.0, w, t):.3g}")
    lines.append("- wall time to each t (the track, every 20 steps): " + ", ".join(
        f"t = {x:g}: {np.interp(x, t, w):.0f} s" for x in (1, 2, 3, 5, 10, 15, 20) if x <= t[-1]))
    lines.append("")
    (HERE / "bench_adaptive_paper.md").write_text("\n".join(lines))
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(t, c)
    ax.set_xlabel("t")
    ax.set_ylabel("cells")
    ax.set_title("paper-scale adaptive run: cell count and wall time against t", fontsize=9)
    ax.grid(True, alpha=0.3)
    ax2 = ax.twinx()
    ax2.plot(t, w, color="C1", ls="--")
    ax2.set_ylabel("wall time (s, dashed)")
    ax2.axhline(900.0, color="C1", lw=0.6, ls=":")
    fig.tight_layout()
    fig.savefig(HERE / "bench_adaptive_paper.png", dpi=110)
    plt.close(fig)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    main()
