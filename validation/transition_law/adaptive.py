"""The transition-law members on an adaptive grid (issue #17 item 3 with issue #16's grids; a first rung).

The study's setting (beta 30, the perturbed f0, T = 35) on ``AdaptiveHealpixGrid(16, nside_max)``, nside_max 64
and 128, with the default
refinement (refine where h beta ||B|| > 0.5 and the density is significant, coarsen where it is
negligible) and f0 as cell averages (the uniform runs sample it at the centres: an O(h^2) difference in
the perturbation), for eps = 1e-3 and 1e-4: the two amplitudes that the uniform nside 16 and 32 grids capture
(``capture.py``) and the uniform nside 64 grid lets leave E (t_exit 17.65 and 28.02). Per run: t_exit,
t_EF, the final alignments, the cells (at most and at T), the share of the mass in the two heaviest cells
at T and the wall time, beside the uniform rows of ``results.json``.

Usage: python validation/transition_law/adaptive.py [--nside-max 64 128] [--eps 1e-3 1e-4] [--beta 10] [--report-only]
[--t-end 35 --continue-from-t-end 12]
(writes adaptive.md and adaptive.json beside this file, keeping the rows of the (level, eps) pairs not run;
run directories in sweep_runs/transition_law_adaptive*, not committed). ``--beta``: the same setting at another
beta, in sweeps and files of its own (adaptive_beta10.md, .json, adaptive_law_beta10.png); its law is anchored at
its own converged exit of eps = 0.05 where Figure 4's ladder has none at that beta.
"""
from __future__ import annotations

import json
import sys
import tomllib
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

NSIDE_MIN = 16
NSIDE_MAX = [64, 128]
EPS = [1e-3, 1e-4]
#: From this beta on, the members take the refinement of Figure 4's ladder at that beta (fig4_concentration/adaptive.py,
#: its ``FALLBACK_LADDERS[0]``: the attended refinement on nside 32 base cells, the attention criterion where f varies by
#: more than 0.25), so that the law is anchored at eps 0.05's converged exit of the same setting. The default refinement
#: refines every cell of the near-uniform early density there (at beta 100 the nside_max 128 level started on all 196608
#: cells), which makes the fine levels unaffordable.
ATTENDED_FROM_BETA = 100.0


def study_beta() -> float:
    """The study's beta (sweep.toml: 30); other beta run beside it with ``--beta``."""
    return float(tomllib.loads((HERE / "sweep.toml").read_text())["set"]["model.beta"])


def refinement(beta: float) -> dict:
    """The grid keys of a beta's setting besides nside_max: {"nside_min": 16} (the default refinement) below
    ATTENDED_FROM_BETA, Figure 4's ladder's refinement from it on."""
    if beta < ATTENDED_FROM_BETA:
        return {"nside_min": NSIDE_MIN}
    from validation.fig4_concentration.adaptive import FALLBACK_LADDERS

    return dict(FALLBACK_LADDERS[0])


def base_min(beta: float) -> int:
    """The base level of a beta's setting (:func:`refinement`)."""
    return int(refinement(beta)["nside_min"])


def setting_name(beta: float, nside_min: int | None = None) -> str:
    """How the reports name a beta's grid setting."""
    r = refinement(beta)
    nmin = r["nside_min"] if nside_min is None else nside_min
    how = ("the default refinement" if not r.get("attended") else
           f"the attended refinement, the attention criterion where f varies > {r['attention_variation']:g} "
           "(Figure 4's ladder at this beta)")
    return f"AdaptiveHealpixGrid({nmin}, nside_max) with {how}"


def suffix(beta: float, nside_min: int | None = None, rtol: float | None = None) -> str:
    """The file-name suffix of a beta's outputs: "" for the study's beta, "_beta10" for beta 10; "_min32" added for
    a base level other than the beta's own (:func:`base_min`: a ladder of its own, the tails' resolution);
    "_rtol1e-04" for an error control tolerance other than the default (a ladder of its own: the step size)."""
    nmin = base_min(beta) if nside_min is None else nside_min
    return (("" if beta == study_beta() else f"_beta{beta:g}") + ("" if nmin == base_min(beta) else f"_min{nmin}")
            + ("" if rtol is None else f"_rtol{rtol:.0e}"))


def spec(nside_max=NSIDE_MAX[0], eps=None, beta=None, nside_min=None, rtol=None, t_end=None):
    """The sweep of one finest level (each level its own sweep, so that a level can be added later); ``eps``:
    amplitudes other than EPS, in a sweep of their own beside the level's; ``beta``: other than the study's,
    in sweeps of their own (the rest of the setting unchanged); ``nside_min``: the base level (the coarsest cells,
    on which the tails are carried), other than NSIDE_MIN in sweeps of their own; ``rtol``: the error control's
    tolerance (``[scheme] rtol``), other than its default in sweeps of their own (a step-size ladder); ``t_end``:
    the members' T other than the study's 35 (for t_exit, which lies before it), in sweeps of their own. From
    ATTENDED_FROM_BETA on, the refinement is Figure 4's at that beta (:func:`refinement`)."""
    from spherepde.sweeps import parse_sweep

    raw = tomllib.loads((HERE / "sweep.toml").read_text())
    base = tomllib.loads((HERE.parent / "fig4_concentration" / "sweeps" / "base.toml").read_text())
    beta = study_beta() if beta is None else float(beta)
    grid = refinement(beta)
    nside_min = grid["nside_min"] if nside_min is None else int(nside_min)
    base["grid"] = dict(grid, type="adaptive", nside_min=int(nside_min), nside_max=int(nside_max))
    base["initial"]["sample"] = "average"  # what an adaptive grid takes (it refines on f0, then averages)
    name = ("transition_law_adaptive" + suffix(beta, nside_min, rtol) + ("" if nside_max == 64 else f"_{nside_max}")
            + ("" if t_end is None else f"_T{t_end:g}"))
    eps = EPS if eps is None else [float(e) for e in eps]
    if eps != EPS:
        name += "_eps" + "_".join(f"{e:.0e}" for e in eps)
    sets = dict(raw["set"], **{"model.beta": beta})
    if t_end is not None:
        sets["time.t_end"] = float(t_end)
    if rtol is not None:
        sets["scheme.rtol"] = float(rtol)
    return parse_sweep({"sweep": {"name": name}, "base": base, "set": sets,
                        "axes": {"initial.eps": eps}}, base_dir=HERE)


def _t_end(sp_) -> float:
    """The members' T of a sweep of :func:`spec`."""
    return float(sp_.overrides.get("time.t_end", sp_.base["time"]["t_end"]))


def main(argv=None):
    import argparse

    from spherepde import load, sweep
    from spherepde.diagnostics import exit_time
    from validation.fig4_concentration.adaptive import E_PLATEAU

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nside-max", type=int, nargs="+", default=NSIDE_MAX, help="the finest levels (powers of 2)")
    ap.add_argument("--eps", type=float, nargs="+", default=None, help=f"the amplitudes (default {EPS})")
    ap.add_argument("--beta", type=float, default=None,
                    help="beta other than the study's 30, its outputs beside the study's (adaptive_beta10.md, ...)")
    ap.add_argument("--report-only", action="store_true", help="rewrite adaptive.md from adaptive.json (no runs)")
    ap.add_argument("--nside-min", type=int, default=None,
                    help=f"the base level (default {NSIDE_MIN}, from beta {ATTENDED_FROM_BETA:g} on Figure 4's "
                         f"{base_min(ATTENDED_FROM_BETA)}); another "
                         "is a ladder of its own (adaptive_beta10_min32.md)")
    ap.add_argument("--t-end", type=float, default=None,
                    help="the members' T other than the study's 35 (for t_exit; t_EF then only where it occurs by T)")
    ap.add_argument("--rtol", type=float, default=None,
                    help="the error control's tolerance other than its default 1e-3: a step-size ladder of its own "
                         "(adaptive_beta10_rtol1e-04.md)")
    ap.add_argument("--continue-from-t-end", type=float, default=None, metavar="T0",
                    help="continue the members of the same levels and amplitudes run to T0 (their sweeps' runs "
                         "copied and run on to --t-end: the result of a straight run, without its early collapse)")
    a = ap.parse_args(argv)
    beta = study_beta() if a.beta is None else float(a.beta)
    if a.nside_min is None:
        a.nside_min = base_min(beta)
    sfx = suffix(beta, a.nside_min, a.rtol)
    # the uniform rows of this beta (results.json: the study's beta; results_beta100.json: beta 100)
    upath = HERE / f"results{suffix(beta)}.json"
    uniform = json.loads(upath.read_text())["rows"] if upath.exists() else []
    rows = []
    if a.report_only:
        a.nside_max = []
    for nmax in a.nside_max:
        sp_ = spec(nmax, a.eps, beta, a.nside_min, a.rtol, a.t_end)
        out = HERE / "sweep_runs" / sp_.name
        # the sweep's dataset has each member's alignment series, t_exit, t_EF and cell counts already
        # (spherepde.sweeps.member_record); the results file is read for the last state and the mass
        earlier = None
        if a.continue_from_t_end is not None:
            # the sweep run to T0 (named _T<T0>); where T0 is the study's own T and no such sweep exists, the
            # study's own sweep (named without a _T suffix)
            own = spec(nmax, a.eps, beta, a.nside_min, a.rtol)
            earlier = HERE / "sweep_runs" / spec(nmax, a.eps, beta, a.nside_min, a.rtol, a.continue_from_t_end).name
            if not earlier.exists() and a.continue_from_t_end == _t_end(own):
                earlier = HERE / "sweep_runs" / own.name
        ds = sweep(sp_, out, quiet=True, progress=False, continue_from=earlier)
        for eps in ds["eps"].values:
            m = ds.sel(eps=eps)
            if str(m["status"].values) != "done":
                # a failed member: said, and skipped (its earlier row, if any, is kept below); rerunning the
                # command resumes it from its checkpoint
                print(f"nside_max {nmax}, eps {float(eps):g}: not done ({m['error'].values})", file=sys.stderr)
                continue
            r = load(out / str(m["results_file"].values))
            g = r.grid_at(len(r.times) - 1)
            mass = r.density[-1] * g.areas
            d = r.diagnostics
            rows.append({"nside_max": int(nmax), "eps": float(eps), "t_exit": float(m["t_exit"]),
                         "t_EF": float(m["t_EF"]),
                         # the departure from E's plateau (align E back below 0.99): at beta >= 300 the exit (the
                         # 0.9 crossing) lies on a slow drift long after it (terminal_phase.md, "beta 300")
                         "t_depart": exit_time(ds["time"].values, m["alignment_E"].values, E_PLATEAU),
                         "final_align": [float(m[k]) for k in ("final_alignment_E", "final_alignment_F",
                                                               "final_alignment_F_abs")],
                         "cells_max": int(m["n_cells"].max()), "cells_T": int(m["n_cells"][-1]),
                         "top_two_share": float(np.sort(mass)[-2:].sum() / mass.sum()),
                         "steps": int(m["n_steps"]), "wall_s": float(m["wall_time"]),
                         "t_end": _t_end(sp_),
                         "mass_drift": float(abs(d["mass"][-1] / d["mass"][0] - 1)), "min": float(np.min(d["min"]))})
    # the levels not run now keep their rows (each level is a sweep of its own; a level's run directories
    # need not be on this machine)
    jpath = HERE / f"adaptive{sfx}.json"
    if jpath.exists():
        done = {(r["nside_max"], r["eps"]) for r in rows}
        rows += [r for r in json.loads(jpath.read_text())["rows"]
                 if (r["nside_max"], r["eps"]) not in done]
    rows.sort(key=lambda r: (-r["eps"], r["nside_max"]))
    jpath.write_text(json.dumps({"nside_min": a.nside_min, "rows": rows}, indent=1))

    flags = (("" if beta == study_beta() else f" --beta {beta:g}") + ("" if a.nside_min == base_min(beta) else
                                                                      f" --nside-min {a.nside_min}")
             + ("" if a.rtol is None else f" --rtol {a.rtol:g}"))
    L = [f"# The transition law on an adaptive grid (validation/transition_law/adaptive.py{flags})", "",
         f"beta {beta:g}, the study's perturbed f0, T = {t_ends(rows)}, {setting_name(beta, a.nside_min)}"
         + ("" if a.rtol is None else f", error control tolerance rtol = {a.rtol:g}")
         + "; beside it the uniform grids of " + (f"{upath.name}." if uniform else "(none at this beta)."), "",
         "| eps | nside_max | t_exit adaptive | t_EF | t(E < 0.99) | final align E / F / F_abs | cells at most / at T | top two cells' share at T | "
         "steps | wall s | mass drift | min f | t_exit uniform 16 / 32 / 64 |",
         "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        u = {row["nside"]: row["t_exit"] for row in uniform if row["eps"] == r["eps"]}
        L.append(f"| {_e(r['eps'])} | {r['nside_max']} | {_fmt(r['t_exit'])} | {_fmt(r['t_EF'])} | "
                 f"{_fmt(r['t_depart']) if 't_depart' in r else '-'} | "
                 f"{' / '.join(f'{a:.3f}' for a in r['final_align'])} | {r['cells_max']} / {r['cells_T']} | "
                 f"{r['top_two_share']:.4f} | {r['steps']} | {r['wall_s']:.0f} | {r['mass_drift']:.1e} | {r['min']:.1e} | "
                 + " / ".join(_fmt(u.get(n)) if n in u else "-" for n in (16, 32, 64)) + " |")
    # the rows of this beta at the base level 16 and the default tolerance, which the other ladders are set beside
    base = HERE / f"adaptive{suffix(beta)}.json"
    base_rows = json.loads(base.read_text())["rows"] if base.exists() else None
    if a.rtol is None:
        L += ladder_section(rows, beta, a.nside_min)
        if a.nside_min != base_min(beta) and base_rows is not None:
            L += tails_section(rows, base_rows, a.nside_min, base_min(beta))
        L += ["", f"![t_exit and t_EF against log(1 / eps) per finest level](adaptive_law{sfx}.png)"]
        plot(rows, HERE / f"adaptive_law{sfx}.png", beta, a.nside_min)
    elif base_rows is not None:  # a step-size ladder has one level: its verdict is this table, not a ladder or figure
        L += steps_section(rows, base_rows, a.rtol)
    (HERE / f"adaptive{sfx}.md").write_text("\n".join(L) + "\n")
    print("\n".join(L))
    write_betas()


def tails_section(rows, base_rows, nside_min, base=NSIDE_MIN) -> list[str]:
    """The same (nside_max, eps) on base level ``nside_min`` against the beta's own ``base``: how the times depend
    on the resolution of the tails (the cells the refinement leaves on the base level)."""
    head = ["", f"## The tails' resolution: base level {nside_min} against {base}", ""]
    return head + _pairs(rows, base_rows, f"nside_min {base} / {nside_min}", f"{base} / {nside_min}",
                         "cells_T", "cells at T")


def steps_section(rows, base_rows, rtol) -> list[str]:
    """The same (nside_max, eps) at the error control's tolerance ``rtol`` against its default 1e-3: the time
    error of the default tolerance (the step-size ladder of the times), which the bar of 2 % must dwarf."""
    from spherepde import Options

    r0 = Options().rtol
    head = ["", f"## The step size: rtol {rtol:g} against the default {r0:g}", "",
            f"The same members with the error control's tolerance {r0 / rtol:g} times smaller; its relative "
            f"difference is the time error of the default tolerance in each time (the ladder's own bar is "
            f"2 % between levels).", ""]
    return head + _pairs(rows, base_rows, f"rtol {r0:g} / {rtol:g}", f"{r0:g} / {rtol:g}", "steps", "steps")


def _pairs(rows, base_rows, label, short, key, key_label) -> list[str]:
    """The table of :func:`tails_section` and :func:`steps_section`: t_exit and t_EF of each row beside the
    base's row of the same (nside_max, eps), their relative differences, and ``key`` of both."""
    base = {(r["nside_max"], r["eps"]): r for r in base_rows}
    L = [f"| eps | nside_max | t_exit ({label}) | relative difference | t_EF ({short}) | relative difference | "
         f"{key_label} ({short}) |", "|---|---|---|---|---|---|---|"]
    fs = lambda s: "-" if s is None else f"{s:.1e}"  # noqa: E731
    for r in rows:
        b = base.get((r["nside_max"], r["eps"]))
        if b is None:
            continue
        L.append(f"| {_e(r['eps'])} | {r['nside_max']} | {b['t_exit']:.6f} / {r['t_exit']:.6f} | "
                 f"{fs(_step(b['t_exit'], r['t_exit']))} | {_fmt6(b['t_EF'])} / {_fmt6(r['t_EF'])} | "
                 f"{fs(_step(b['t_EF'], r['t_EF']))} | {b[key]} / {r[key]} |")
    return L


def t_ends(rows) -> str:
    """The members' T as the reports state it: "35", or "12 (nside_max 128, 256), 35 (64)" where rows differ
    (rows written before T was recorded ran to the study's 35)."""
    by = {}
    for r in rows:
        by.setdefault(float(r.get("t_end") or 35.0), set()).add(r["nside_max"])
    if len(by) <= 1:
        return f"{next(iter(by), 35.0):g}"
    return ", ".join(f"{t:g} (nside_max {', '.join(map(str, sorted(n)))})" for t, n in sorted(by.items()))


def _fmt6(x) -> str:
    return f"{x:.6f}" if _finite(x) else "none"


def converged(rows, key="t_exit") -> dict:
    """{eps: (finest level's value, its nside_max)} where the last two levels of eps are within the bar."""
    from validation.fig4_concentration.adaptive import BAR

    out = {}
    for eps in {r["eps"] for r in rows}:
        rs = sorted((r for r in rows if r["eps"] == eps), key=lambda r: r["nside_max"])
        if len(rs) >= 2:
            s = _step(rs[-2][key], rs[-1][key])
            if s is not None and s <= BAR[key]:
                out[eps] = (rs[-1][key], rs[-1]["nside_max"])
    return out


#: A beta whose slope over its converged exits is further than this from 1 / tanh(beta), relative, is not on the
#: two-cluster law (beta 300: its exit lies on the stall's drift) and is left out of a(beta) against log(beta).
B_OFF_LAW = 0.2


def write_betas(path=None, here=None):
    """adaptive_betas.md: the law across beta from every beta's adaptive*.json (the study's and --beta runs):
    per beta the converged exits, the law's intercept a(beta) at eps = 0.05 (t_exit - log(1 / 0.05) / tanh(beta)),
    the least-squares slope over the converged exits at eps <= 0.05, the converged t_EF; then a(beta) against
    log(beta)."""
    import math

    here = HERE if here is None else Path(here)
    path = here / "adaptive_betas.md" if path is None else path
    per = []
    for f in sorted(here.glob("adaptive*.json")):
        if f.name == "adaptive_betas.json" or "_min" in f.stem or "_rtol" in f.stem:  # ladders of their own
            continue
        beta = study_beta() if f.stem == "adaptive" else float(f.stem.split("_beta")[1])
        rows = json.loads(f.read_text())["rows"]
        conv = converged(rows)
        law = _law(beta, rows)
        if law is not None and law[5]["source"] == "fig4":
            conv.setdefault(law[2], (law[3], f"fig4 {law[5]['nside_max']}"))
        per.append((beta, rows, conv, converged(rows, "t_EF"), law))
    per.sort(key=lambda p: p[0])
    L = ["# The transition law across beta (validation/transition_law/adaptive.py, every beta's adaptive*.json)", "",
         "Per beta: the setting of the study (the perturbed f0, T = 35, AdaptiveHealpixGrid(16, nside_max), the default "
         f"refinement; from beta {ATTENDED_FROM_BETA:g} on Figure 4's refinement at that beta, on nside "
         f"{base_min(ATTENDED_FROM_BETA)} base cells, "
         "and T as the beta's rows say: `adaptive_beta100.md`) and the issue's bar (the last two levels within 2 %). a(beta) = t_exit(0.05) - log(1 / 0.05) / "
         "tanh(beta), the two-cluster law's intercept at its anchor; the slope b from least squares over the converged "
         "exits at eps <= 0.05 (two-cluster: 1 / tanh(beta)).", "",
         "| beta | levels | converged t_exit (eps: value, finest level) | a(beta) | b fitted (amplitudes) | "
         "b over every converged exit | converged t_EF | t_EF fitted (eps <= 0.05) | t_EF / t_exit where both converged |",
         "|---|---|---|---|---|---|---|---|---|"]
    avals, off_law = [], []
    for beta, rows, conv, conv_ef, law in per:
        lv = sorted({r["nside_max"] for r in rows})
        ce = ", ".join(f"{_e(e)}: {v:.2f} ({n})" for e, (v, n) in sorted(conv.items(), reverse=True)) or "none"
        a = "-" if law is None else f"{law[0]:.3f}"
        # the slope over every converged exit, the large amplitudes included (on the law within ~1 % where it
        # holds): where it is far from the two-cluster 1 / tanh(beta), a(beta) is not that law's intercept
        every = [(e, v, n) for e, (v, n) in conv.items()]
        b_all = _fit(every)[1] if len(every) >= 2 else None
        ba = "-" if b_all is None else f"{b_all:.3f} ({_e(max(conv))} to {_e(min(conv))})"
        if b_all is not None and abs(b_all * math.tanh(beta) - 1) > B_OFF_LAW:
            off_law.append((beta, b_all))
        elif law is not None:
            avals.append((beta, law[0]))
        small = [(e, v, n) for e, (v, n) in conv.items() if e <= 0.05]
        bf = "-"
        if len(small) >= 2:
            _, b, _ = _fit(small)
            bf = f"{b:.3f} ({len(small)}: {_e(max(e for e, _, _ in small))} to {_e(min(e for e, _, _ in small))})"
        cf = ", ".join(f"{_e(e)}: {v:.2f} ({n})" for e, (v, n) in sorted(conv_ef.items(), reverse=True)) or "none"
        ratio = ", ".join(f"{_e(e)}: {v / conv[e][0]:.3f}" for e, (v, n) in sorted(conv_ef.items(), reverse=True)
                          if e in conv) or "-"
        small_ef = [(e, v, n) for e, (v, n) in conv_ef.items() if e <= 0.05]
        ff = "-"
        if len(small_ef) >= 2:
            a_ef, b_ef, _ = _fit(small_ef)
            ff = f"{a_ef:.2f} + {b_ef:.2f} log(1 / eps)"
        L.append(f"| {beta:g} (T {t_ends(rows)}) | {', '.join(map(str, lv))} | {ce} | {a} | {bf} | {ba} | {cf} | {ff} | "
                 f"{ratio} |")
    if len(avals) >= 2:
        L += ["", "a(beta) against log(beta): " + ", ".join(
            f"from beta {b0:g} to {b1:g}: {(a1 - a0) / math.log(b1 / b0):.3f} per e-fold of beta"
            for (b0, a0), (b1, a1) in zip(avals[:-1], avals[1:])) + "."]
    for beta, b_all in off_law:
        L += ["", f"beta {beta:g} is left out of a(beta): its converged exits do not follow the two-cluster slope (b = "
              f"{b_all:.3f} over them against 1 / tanh(beta) = {1 / math.tanh(beta):.3f}; the bar: within "
              f"{B_OFF_LAW:.0%}), so its a(beta) is not that law's intercept (README, \"At beta {beta:g}\")."]
    ratios = [(beta, e, v / conv[e][0]) for beta, _, conv, conv_ef, _ in per for e, (v, _) in conv_ef.items()
              if e in conv and e <= 0.05]
    if ratios:
        lo, hi = min(r for *_, r in ratios), max(r for *_, r in ratios)
        L += ["", f"t_EF / t_exit at the small amplitudes (eps <= 0.05) where both times converged: {lo:.3f} to {hi:.3f} "
              f"({', '.join(f'beta {b:g}, eps {_e(e)}' for b, e, _ in ratios)}). Every t_EF rests on "
              f"tails carried on nside {NSIDE_MIN} cells (`terminal_phase.md`)."]
    path.write_text("\n".join(L) + "\n")
    return L


def plot(rows, path, beta=None, nside_min=NSIDE_MIN):
    """t_exit (filled) and t_EF (open) against log(1 / eps), one colour per finest level, the finest level of
    each eps ringed where its step from the level below meets the bar; the two-cluster law through the anchor
    (fig4's converged eps 0.05 exit, drawn as a star)."""
    import math

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from validation.fig4_concentration.adaptive import BAR

    law = _law(beta, rows)
    beta = study_beta() if beta is None else float(beta)
    levels = sorted({r["nside_max"] for r in rows})
    fig, ax = plt.subplots(figsize=(10.0, 4.8))
    for c, n in enumerate(levels):
        sel = sorted((r for r in rows if r["nside_max"] == n), key=lambda r: -r["eps"])
        X = [math.log(1 / r["eps"]) for r in sel]
        ax.plot(X, [r["t_exit"] if _finite(r["t_exit"]) else np.nan for r in sel], "o-", color=f"C{c % 10}",
                ms=4, lw=1, label=f"nside_max {n}")
        ax.plot(X, [r["t_EF"] if _finite(r["t_EF"]) else np.nan for r in sel], "o--", color=f"C{c % 10}",
                mfc="none", ms=4, lw=0.7)
    for eps in sorted({r["eps"] for r in rows}):
        rs = sorted((r for r in rows if r["eps"] == eps), key=lambda r: r["nside_max"])
        if len(rs) < 2:
            continue
        for key in ("t_exit", "t_EF"):
            s = _step(rs[-2][key], rs[-1][key])
            if s is not None and s <= BAR[key]:
                ax.plot(math.log(1 / eps), rs[-1][key], "o", ms=11, mfc="none", mec="k", mew=1.2)
    if law is not None and law[5]["source"] == "fig4":  # the anchor's own ladder, level by level, in the levels' colours
        f4 = [r for r in fig4_rows(beta) if r["nside_max"] in levels]
        for r in f4:
            ax.plot(math.log(1 / r["eps"]), r["t_exit"], "s", color=f"C{levels.index(r['nside_max']) % 10}", ms=5)
        if f4:
            ax.plot([], [], "ks", ms=5, label=f"eps {f4[0]['eps']:g}: fig4's levels (t_exit)")
    if law is not None:
        a_law, b_law, eps0, t0, _, anchor = law
        X = np.linspace(0.0, math.log(1e5), 2)
        ax.plot(X, a_law + b_law * X, "k:", lw=1, label=f"two-cluster law a + log(1/eps) / tanh(beta), a = {a_law:.2f}")
        ax.plot(math.log(1 / eps0), t0, "k*", ms=10,
                label=f"eps {eps0:g}: " + ("fig4's converged exit" if anchor["source"] == "fig4" else "the anchor"))
    ax.plot([], [], "ko", ms=11, mfc="none", label=f"converged (last two levels within {BAR['t_exit']:.0%})")
    ax.plot([], [], "ko--", mfc="none", ms=4, lw=0.7, label="t_EF (filled: t_exit)")
    ax.set_xlabel("log(1 / eps)")
    ax.set_ylabel("time")
    ax.set_title(f"beta {beta:g}, AdaptiveHealpixGrid({nside_min}, nside_max): exit from E and E -> F against "
                 "the amplitude", fontsize=9)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _law(beta=None, rows=None):
    """(a, b, eps0, t0, beta, anchor row), or None: the two-cluster law t = a + b log(1 / eps), b = 1 / tanh(beta),
    anchored at the converged exit t0 of eps0 = 0.05: fig4's finest level (ladder.csv) where its last two levels
    at this beta meet the bar (beta 30), else this study's own converged exit at 0.05 among ``rows`` (the anchor
    row then has ``source`` "ladder"); None where neither has one."""
    import math

    beta = study_beta() if beta is None else float(beta)
    b = 1 / math.tanh(beta)
    eps0 = 0.05
    fig4 = fig4_rows(beta)
    for source, rs in (("fig4", fig4), ("ladder", rows or [])):
        hit = converged(rs).get(eps0)
        if hit is not None:
            t0, n = hit
            return t0 - b * math.log(1 / eps0), b, eps0, t0, beta, {"nside_max": n, "source": source}
    return None


def fig4_rows(beta: float) -> list[dict]:
    """Figure 4's ladder at ``beta`` (fig4_concentration/ladder.csv, the perturbed f0, eps 0.05): its levels' exits."""
    import csv

    with open(HERE.parent / "fig4_concentration" / "ladder.csv") as fh:
        return [{"eps": float(r["eps"]), "nside_max": int(r["nside_max"]), "t_exit": float(r["t_exit"])}
                for r in csv.DictReader(fh) if r["beta"] == f"{beta:g}" and r["f0"] == "perturbed" and r["t_exit"]]


def _finite(x) -> bool:
    return x is not None and bool(np.isfinite(x))


def _step(x, y):
    """The relative step |y - x| / |y| from one level's time x to the next's y (None where either is missing)."""
    return abs(y - x) / abs(y) if _finite(x) and _finite(y) else None


def _fit(points):
    """Least squares t = a + b log(1 / eps) over (eps, t, source) points: (a, b, largest residual)."""
    import math

    x = np.array([math.log(1 / e) for e, _, _ in points])
    y = np.array([v for _, v, _ in points])
    b, a = np.polyfit(x, y, 1)
    return a, b, np.abs(y - (a + b * x)).max()


def _e(eps) -> str:
    """An amplitude in the tables: 1e-03, 6.5e-05 (the digits it has, no more)."""
    return np.format_float_scientific(eps, trim="-", exp_digits=2)


def _fmt(x) -> str:
    """A time to two decimals, "none" where it does not occur."""
    return f"{x:.2f}" if _finite(x) else "none"


def ladder_section(rows, beta=None, nside_min=NSIDE_MIN) -> list[str]:
    """The ladder read off the rows: per eps, the step between the last two levels in t_exit and t_EF against
    the issue's bar (fig4_concentration's BAR), the two-cluster law t = a + log(1 / eps) / tanh(beta) anchored
    at the converged exit of eps = 0.05 (fig4_concentration/ladder.csv, its finest level at this beta), a
    least-squares fit over the converged exits, and the slope b between the amplitudes at each level."""
    import math

    from validation.fig4_concentration.adaptive import BAR

    law = _law(beta, rows)
    beta = study_beta() if beta is None else float(beta)
    if law is None:  # no converged exit at eps 0.05 yet: the ladder, the fit and the slopes without the anchor
        a_law, b_law, eps0, t0, anchor = math.nan, 1 / math.tanh(beta), 0.05, math.nan, None
        said = (f"two-cluster law: none drawn (it is anchored at the converged exit of eps = {eps0:g}, which this "
                "ladder does not have yet)")
    else:
        a_law, b_law, eps0, t0, _, anchor = law
        said = (f"two-cluster law t = a + log(1 / eps) / tanh(beta) with a = {a_law:.2f}, anchored at eps = {eps0:g}'s "
                f"exit {t0:.2f} (" + (f"fig4_concentration/ladder.csv, beta {beta:g}, nside_max {anchor['nside_max']}"
                                      if anchor["source"] == "fig4" else
                                      f"this ladder's nside_max {anchor['nside_max']}") + ", converged there)")
    L = ["", "## The ladder", "",
         f"The step between the last two levels (converged: <= {BAR['t_exit']:.0%}, the issue's bar), and the {said}:",
         "", "| eps | levels | t_exit: last two | step | t_EF: last two | step | converged (t_exit / t_EF) | law | "
         "finest / law |", "|---|---|---|---|---|---|---|---|---|"]

    def verdict(x, y, bar):
        if not _finite(x) and not _finite(y):
            return "none by T at both"
        s = _step(x, y)
        return "yes" if s is not None and s <= bar else "NO"

    fs = lambda s: "-" if s is None else f"{s:.1%}"  # noqa: E731
    eps_all = sorted({r["eps"] for r in rows}, reverse=True)
    # the converged exits, fig4's anchor first (an anchor from this ladder is among its rows already)
    conv = [(eps0, t0, f"fig4 nside_max {anchor['nside_max']}")] if anchor and anchor["source"] == "fig4" else []
    conv_ef = []  # the converged t_EF (fig4's anchor has none by its T = 20)
    for eps in eps_all:
        rs = sorted((r for r in rows if r["eps"] == eps), key=lambda r: r["nside_max"])
        if len(rs) < 2:
            continue
        p, q = rs[-2], rs[-1]
        t_law = a_law + b_law * math.log(1 / eps)
        ve, vf = verdict(p["t_exit"], q["t_exit"], BAR["t_exit"]), verdict(p["t_EF"], q["t_EF"], BAR["t_EF"])
        L.append(f"| {_e(eps)} | {p['nside_max']} -> {q['nside_max']} | {_fmt(p['t_exit'])} -> {_fmt(q['t_exit'])} | "
                 f"{fs(_step(p['t_exit'], q['t_exit']))} | {_fmt(p['t_EF'])} -> {_fmt(q['t_EF'])} | "
                 f"{fs(_step(p['t_EF'], q['t_EF']))} | {ve} / {vf} | " + ("- | - |" if anchor is None else
                 f"{t_law:.2f} | {q['t_exit'] / t_law:.3f} |"))
        if ve == "yes":
            conv.append((eps, q["t_exit"], f"nside_max {q['nside_max']}"))
        if vf == "yes":
            conv_ef.append((eps, q["t_EF"], f"nside_max {q['nside_max']}"))
    conv.sort(key=lambda c: -c[0])
    # the law is the small-amplitude one (the perturbation's growth linearised about E): it is fitted over the
    # converged exits at and below the anchor's eps; larger amplitudes are set beside it, not fitted
    small = [c for c in conv if c[0] <= eps0]
    if len(small) >= 2:
        a_fit, b_fit, res = _fit(small)
        L += ["", "The converged exits: " + ", ".join(f"eps {e:g}: {v:.2f} ({src})" for e, v, src in conv)
              + f", over {math.log10(conv[0][0] / conv[-1][0]):.1f} decades of eps. Least squares over those at "
              f"eps <= {eps0:g}: t_exit = {a_fit:.3f} + {b_fit:.3f} log(1 / eps) (largest residual {res:.3f}), over "
              f"{math.log10(small[0][0] / small[-1][0]):.1f} decades; the two-cluster reduction's slope is "
              f"1 / tanh({beta:g}) = {b_law:.3f}."]
        big = [c for c in conv if c[0] > eps0]
        if big:
            L += ["", "Above the anchor's amplitude (outside the linearised law's range; not fitted): " + ", ".join(
                f"eps {e:g}: {v:.2f}, " + ("" if anchor is None else f"the law {a_law + b_law * math.log(1 / e):.2f}, ")
                + f"the fit {a_fit + b_fit * math.log(1 / e):.2f}" for e, v, _ in big) + "."]
    if conv_ef:
        txt = ("The converged t_EF: " + ", ".join(f"eps {e:g}: {v:.2f} ({src})" for e, v, src in conv_ef) + "; where a "
               f"level reaches F by T = {t_ends(rows)} at all (the rows above; 'none': not by T), t_EF is measured on tails "
               f"carried on nside {nside_min} cells (the refinement's floor coarsens them), which the converged value "
               "depends on (`terminal_phase.md`).")
        small_ef = [c for c in conv_ef if c[0] <= eps0]  # as for t_exit: the small amplitudes only
        if len(small_ef) >= 2:
            a_ef, b_ef, _ = _fit(small_ef)
            txt += (f" Through those at eps <= {eps0:g} (least squares; {len(small_ef)} amplitudes): t_EF = {a_ef:.2f} + "
                    f"{b_ef:.2f} log(1 / eps), so the time from the exit to F grows with log(1 / eps) at "
                    f"{b_ef - b_law:.2f} per e-fold as well.")
        L += ["", txt]
    amps = sorted(set(eps_all) | {eps0}, reverse=True)
    pairs = list(zip(amps[:-1], amps[1:]))
    L += ["", f"Slope b of t_exit against log(1 / eps) (two-cluster: 1 / tanh({beta:g}) = {b_law:.3f}); from "
          + (f"eps = {eps0:g} uses its converged exit {t0:.2f}:" if anchor and anchor["source"] == "fig4" else
             "each level's own exits:"), "",
          "| nside_max | " + " | ".join(f"b({_e(e0)} -> {_e(e1)})" for e0, e1 in pairs) + " |",
          "|---|" + "---|" * len(pairs)]
    for n in sorted({r["nside_max"] for r in rows}):
        t = {r["eps"]: r["t_exit"] for r in rows if r["nside_max"] == n}
        if anchor and anchor["source"] == "fig4":
            t[eps0] = t0
        cells = [f"{(t[e1] - t[e0]) / math.log(e0 / e1):.2f}" if _finite(t.get(e0)) and _finite(t.get(e1)) else "-"
                 for e0, e1 in pairs]
        L.append(f"| {n} | " + " | ".join(cells) + " |")
    return L


if __name__ == "__main__":
    main()
