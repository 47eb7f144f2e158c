"""Figure 4 at beta = inf on a ladder of adaptive grids, against the exact solution (issue #17 item 1).

At beta = inf the equation is linear (MODEL.md (3)): v_inf(x) = P_x(V B^T x) / |B^T x| does not depend on f.
For the paper's matrices B^T is orthogonal and A = V B^T = diag(1, -1, -2), so v_inf(x) = A x - <x, A x> x,
whose characteristics are X_t(x) = e^{tA} x / |e^{tA} x|. The sign of x_1 is kept along them, so
Pi#rho_0 = (delta_e1 + delta_-e1) / 2 for both of the study's f0 (the perturbation is odd in x_2 or x_3),
and the plan that sends each hemisphere x_1 > 0, x_1 < 0 to its pole is optimal (the atoms' masses are the
hemispheres'; ``wasserstein2_two_atoms`` fills e1 with the points of largest <x, e1>). So

    W2(rho_t, Pi#rho_0)^2 = int 2 (1 - |<X_t(x), e1>|) rho_0(x) dx,   align_i(t) = int <X_t(x), e_i>^2 rho_0(x) dx,

and every integrand is even in each coordinate, so the perturbation (odd in x_2 or x_3) drops out: both f0
have the same exact curves. In coordinates x_1 = u, (x_2, x_3) = sqrt(1 - u^2) (cos phi, sin phi) the u
integrals are elementary (:func:`_phi_integrands`, with q(phi) = e^{-4t} cos^2 phi + e^{-6t} sin^2 phi):

    int_0^1 (1 - u / sqrt(q + (1 - q) u^2)) du = s / (1 + s),   s = sqrt(q),
    int_0^1 u^2 / (q + (1 - q) u^2) du = (1 - s / r atan(r / s)) / r^2,   r = sqrt(1 - q),
    int_0^1 (1 - u^2) / (q + (1 - q) u^2) du = (atan(r / s) / (s r) - 1) / r^2,

and the phi integrals are done by adaptive quadrature (:func:`exact_curves`; the integrands peak at
phi = pi/2 with width ~e^{-t}). W2 ~ (2 / sqrt(pi)) e^{-t} for large t: 2.3e-9 at t = 20, the exact plateau.
Align E rises monotonically to 1 (each <X_t, e1>^2 does): the exact solution has no t_exit and no t_EF.

The ladder: ``AdaptiveHealpixGrid(16, nside_max)`` with the default refinement, the study's base
configuration to T = 20 (adaptive.py's ``member`` with beta = inf, one sweep per level and f0 in
sweep_runs/, not committed), both f0; beside it, levels on other coarsest cells (``--nside-min``: the nside_min
ladder at nside_max 128 and the joint ladder nside_min = nside_max / 4) and at another error-control tolerance
(``--rtol``), the perturbed f0 only, found on disk for every (nside_min, rtol) of NSIDE_MINS x RTOLS. Per level: t_exit and t_EF (none expected), the largest deviation of
align E and align F from the exact curves over the saved times, W2 against the exact W2 at t = 1, 2, 3,
t(W2 <= w) against the exact times, the plateau (min W2 over t <= 20) and plateau / h (h the finest cell's
angular size: the density ends as point masses seen through cells of size h, so the plateau is the grid's,
10^6-10^7 times the exact 2.3e-9), cells, steps, wall time. Between levels: the times' and W2's errors against the
exact solution, and the observed order along each ladder (LADDERS).

Usage: python validation/fig4_concentration/zero_temperature.py [--nside-max 64 128 256 512] [--f0 perturbed
uniform] [--nside-min 16] [--rtol 1e-4] [--report-only] (writes zero_temperature.md, zero_temperature.json and zero_temperature.png beside
this file; ladder.csv takes its records through run.py --ladder-only).
"""
from __future__ import annotations

import argparse
import functools
import json
import math
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
from validation.fig4_concentration.adaptive_uniform import cell_size, first_below  # noqa: E402

NSIDE_MAX = [64, 128, 256, 512]
NSIDE_MIN = 16
#: The coarsest cells and the error control's tolerances of the levels looked for on disk (run with
#: --nside-min / --rtol; rtol None: the solver's default, 1e-3). ladder.csv takes the nside_min 16 ladder.
NSIDE_MINS = (16, 32, 64, 128)
RTOLS = (None, 1e-4)
#: The ladders whose errors against the exact solution are compared level to level: (name, the records'
#: grouping key, the ordering key). "joint": nside_min = nside_max / 4, both refined together.
LADDERS = (("nside_max", lambda r: ("nside_min", r["nside_min"]), lambda r: r["nside_max"]),
           ("nside_min", lambda r: ("nside_max", r["nside_max"]), lambda r: r["nside_min"]),
           ("joint", lambda r: ("nside_max / nside_min", r["nside_max"] // r["nside_min"]), lambda r: r["nside_max"]))
F0S = ["perturbed", "uniform"]
T_END = 20.0
#: Concentration levels: the first time W2(rho_t, Pi#rho_0) falls to each (above every level's floor).
W2_LEVELS = (0.2, 0.1, 0.05)
#: Times at which W2 is compared with the exact W2 (before the coarsest level's floor).
W2_TIMES = (1.0, 2.0, 3.0)


def _phi_integrands(phi, t: float):
    """The u-integrals over [0, 1] at angle phi (module docstring): (W2 part, align E, align F, align F_abs)."""
    c2, s2 = np.cos(phi) ** 2, np.sin(phi) ** 2
    q2, q3 = math.exp(-4.0 * t) * c2, math.exp(-6.0 * t) * s2
    q = q2 + q3
    s, r = np.sqrt(q), np.sqrt(1.0 - q)
    at = np.arctan2(r, s)
    g = (at / (s * r) - 1.0) / (r * r)
    return s / (1.0 + s), (1.0 - s / r * at) / (r * r), q2 * g, q3 * g


def exact_curves(times) -> dict:
    """The exact W2(rho_t, Pi#rho_0) and alignments with E (e1), F (e2) and F_abs (e3) at ``times`` (module
    docstring): by symmetry 4 times the phi integral over [0, pi/2]; W2^2 = (1/pi) int s / (1 + s) dphi and
    align = (1 / (2 pi)) int (...) dphi over [0, 2 pi]."""
    from scipy import integrate

    out = {k: [] for k in ("W2", "align_E", "align_F", "align_Fabs")}
    for t in np.asarray(times, float):
        if t <= 0.0:
            vals = (1.0, 1.0 / 3.0, 1.0 / 3.0, 1.0 / 3.0)
        else:
            # the integrands change on the scale e^{-t} next to pi/2: break points there
            brk = [math.pi / 2 * (1.0 - 10.0 ** -k) for k in range(1, 12) if 10.0 ** -k > 1e-3 * math.exp(-t)]
            parts = [4.0 * integrate.quad(lambda p, k=k: _phi_integrands(p, t)[k], 0.0, math.pi / 2, points=brk,
                                          limit=500, epsabs=0.0, epsrel=1e-11)[0] for k in range(4)]
            vals = (math.sqrt(parts[0] / math.pi), *(x / (2.0 * math.pi) for x in parts[1:]))
        for k, v in zip(out, vals):
            out[k].append(float(v))
    return out


def readings(rec: dict, exact: dict) -> dict:
    """One level's readings against the exact curves at its saved times (module docstring)."""
    t = np.asarray(rec["times"], float)
    W = np.asarray(rec["W2"], float)
    if not np.array_equal(t, exact["times"]):  # every level saves every 0.25 to T: the same times
        exact = {"times": t.tolist(), **exact_curves(t)}
    h = cell_size(rec["nside_max"])
    We = np.asarray(exact["W2"])
    out = {"f0": rec["f0"], "nside_min": rec.get("nside_min", NSIDE_MIN), "rtol": rec.get("rtol"),
           "nside_max": rec["nside_max"], "h": h, "t_exit": rec["t_exit"], "t_EF": rec["t_EF"],
           "d_align_E": float(np.max(np.abs(np.asarray(rec["align_E"]) - exact["align_E"]))),
           "d_align_F": float(np.max(np.abs(np.asarray(rec["align_F"]) - exact["align_F"]))),
           "w2_at": {f"{s:g}": float(np.interp(s, t, W)) for s in W2_TIMES},
           "w2_exact_at": {f"{s:g}": float(np.interp(s, t, We)) for s in W2_TIMES},
           "t_w2": {f"{w:g}": first_below(t, W, w) for w in W2_LEVELS},
           "t_w2_exact": {f"{w:g}": exact_time(w) for w in W2_LEVELS},
           "plateau_w2": rec["plateau_w2"], "plateau_over_h": rec["plateau_w2"] / h,
           "exact_plateau": float(We[t <= T_END + 1e-9].min())}
    out["w2_err"] = {k: abs(out["w2_at"][k] - out["w2_exact_at"][k]) / out["w2_exact_at"][k] for k in out["w2_at"]}
    out["t_err"] = {k: None if out["t_w2"][k] is None else abs(out["t_w2"][k] - out["t_w2_exact"][k])
                    / out["t_w2_exact"][k] for k in out["t_w2"]}
    for k in ("max_cells", "cells_T", "steps", "wall_s", "mass_drift", "min_f"):
        out[k] = rec[k]
    return out


def _fine_exact(times) -> dict:
    """The exact curves on the saved times refined 8 times (for the figure)."""
    t = np.linspace(0.0, float(np.max(times)), 8 * (len(times) - 1) + 1)
    return {"times": t.tolist(), **exact_curves(t)}


def _variant(rec: dict) -> tuple:
    return (rec.get("nside_min", NSIDE_MIN), rec.get("rtol"))


def _rtol(r: dict) -> str:
    return "default" if r.get("rtol") is None else f"{r['rtol']:g}"


def _rule(header: str) -> str:
    """The separator row of a markdown table with ``header``'s columns."""
    return "|" + "---|" * (header.count("|") - 1)


@functools.lru_cache(maxsize=None)
def exact_time(level: float) -> float:
    """The exact first time W2 falls to ``level`` (root of the closed form; W2 decreases monotonically). Cached:
    every level's readings and the report ask for the same W2_LEVELS."""
    from scipy.optimize import brentq

    return float(brentq(lambda s: exact_curves([s])["W2"][0] - level, 0.01, 40.0, xtol=1e-12))


def report(rows: list[dict], exact: dict) -> str:
    def f(x, p=3):
        return "none" if x is None else f"{x:.{p}f}"

    def pc(x):
        return "-" if x is None else f"{100 * x:.2f} %"

    t = np.asarray(exact["times"])
    L = ["# Figure 4 at beta = inf on adaptive grids, against the exact solution "
         "(validation/fig4_concentration/zero_temperature.py)", "",
         f"AdaptiveHealpixGrid(nside_min, nside_max), the default Refinement(), the study's base configuration (the "
         f"error control's default rtol 1e-3 unless a row says), T = {T_END:g}, "
         "both f0 (the perturbed one, eps = 0.05, and the uniform one); the exact curves are the closed form of the "
         "module docstring (the perturbation drops out of them). h: the finest cell's angular size. t(W2 <= w): the "
         "first time W2 falls to w (log-linear between saved states, every 0.25; the exact one a root of the closed form).",
         "", "Exact: W2 " + ", ".join(f"{w:.4g} at t = {s:g}" for s, w in zip(t, exact["W2"]) if s in (1, 2, 3, 5, 10, 20))
         + "; align E " + ", ".join(f"{w:.6f} at t = {s:g}" for s, w in zip(t, exact["align_E"]) if s in (1, 2, 3, 5))
         + "; " + ", ".join(f"t(W2 <= {w:g}) = {exact_time(w):.4f}" for w in W2_LEVELS)
         + f"; no t_exit, no t_EF (align E rises monotonically to 1); the plateau min_(t <= 20) W2 = "
           f"{min(exact['W2']):.3g} (at t = 20).", ""]
    L += ["| f0 | nside_min | rtol | nside_max | h | t_exit | t_EF | max |align E - exact| | max |align F - exact| | "
          + " | ".join(f"W2 error at t = {s:g}" for s in W2_TIMES) + " | "
          + " | ".join(f"t(W2 <= {w:g}) (error)" for w in W2_LEVELS)
          + " | plateau W2 | plateau / h | cells at most / at T | steps | wall s | mass drift | min f |"]
    L.append(_rule(L[-1]))
    for r in rows:
        L.append(f"| {r['f0']} | {r['nside_min']} | {_rtol(r)} | {r['nside_max']} | {r['h']:.4f} | {f(r['t_exit'])} | {f(r['t_EF'])} | "
                 f"{r['d_align_E']:.1e} | {r['d_align_F']:.1e} | "
                 + " | ".join(pc(r["w2_err"][f"{s:g}"]) for s in W2_TIMES) + " | "
                 + " | ".join(f"{f(r['t_w2'][f'{w:g}'], 4)} ({pc(r['t_err'][f'{w:g}'])})" for w in W2_LEVELS)
                 + f" | {r['plateau_w2']:.5f} | {r['plateau_over_h']:.3f} | {r['max_cells']} / {r['cells_T']} | "
                 f"{r['steps']} | {r['wall_s']:.0f} | {r['mass_drift']:.1e} | {r['min_f']:.1e} |")
    L += ["", "Observed orders of the errors against the exact solution along each ladder (log2 of the errors' ratio "
          "between consecutive levels over log2 of their cells' ratio: in nside_max at a fixed nside_min, in nside_min at a fixed "
          "nside_max, and jointly at nside_max = 4 nside_min):", "",
          "| f0 | rtol | ladder | levels (nside_min / nside_max) | " + " | ".join(f"W2 at t = {s:g}" for s in W2_TIMES)
          + " | " + " | ".join(f"t(W2 <= {w:g})" for w in W2_LEVELS) + " | align E | plateau ratio |"]
    L.append(_rule(L[-1]))

    for name, group, by in LADDERS:
        keys = sorted({(r["f0"], r["rtol"] or 1.0, group(r)) for r in rows})
        for f0, rt, g in keys:
            rs = sorted((r for r in rows if (r["f0"], r["rtol"] or 1.0, group(r)) == (f0, rt, g)), key=by)
            if name == "joint" and g[1] != 4:
                continue
            for a, b in zip(rs, rs[1:]):
                def order(x, y, a=a, b=b):  # per halving of the cells: the levels may be more than one apart
                    return "-" if not x or not y else f"{math.log2(x / y) / math.log2(by(b) / by(a)):.2f}"
                L.append(f"| {f0} | {_rtol(a)} | {name} ({g[0]} {g[1]}) | {a['nside_min']} / {a['nside_max']} -> "
                         f"{b['nside_min']} / {b['nside_max']} | "
                         + " | ".join(order(a["w2_err"][f"{s:g}"], b["w2_err"][f"{s:g}"]) for s in W2_TIMES) + " | "
                         + " | ".join(order(a["t_err"][f"{w:g}"], b["t_err"][f"{w:g}"]) for w in W2_LEVELS)
                         + f" | {order(a['d_align_E'], b['d_align_E'])} | {a['plateau_w2'] / b['plateau_w2']:.3f} |")
    return "\n".join(L) + "\n"


def figure(recs: list[dict], fine: dict, path: Path) -> None:
    """zero_temperature.png: W2 against t with the exact curve, W2's relative error and |align E - exact| against
    t, for the nside_max ladder on nside 16 coarsest cells (blue: perturbed f0; red, dashed: uniform f0) and the
    joint ladder nside_min = nside_max / 4 (green, perturbed f0)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 3, figsize=(17, 4.8))
    sel = [r for r in recs if not r.get("rtol") and (r["nside_min"] == NSIDE_MIN or r["nside_max"] == 4 * r["nside_min"])]
    levels = sorted({r["nside_max"] for r in sel})
    shades = dict(zip(levels, np.linspace(0.75, 0.0, len(levels))))
    for r in sel:
        sh = shades[r["nside_max"]]
        joint = r["nside_min"] != NSIDE_MIN
        if joint:
            c, ls = (sh, 1.0 - 0.5 * sh, sh), "-"
        elif r["f0"] == "perturbed":
            c, ls = (sh, sh, 1.0 - 0.5 * sh), "-"
        else:
            c, ls = (1.0 - 0.4 * sh, sh, sh), "--"
        t = np.asarray(r["times"])
        lab = f"{r['f0']}, {r['nside_min']} / {r['nside_max']}"
        ax[0].semilogy(t, r["W2"], color=c, ls=ls, label=lab)
        ax[1].semilogy(t, np.abs(np.asarray(r["W2"]) / np.interp(t, fine["times"], fine["W2"]) - 1.0), color=c, ls=ls,
                       label=lab)
        ax[2].semilogy(t, np.abs(np.asarray(r["align_E"]) - np.interp(t, fine["times"], fine["align_E"])) + 1e-12,
                       color=c, ls=ls, label=lab)
    ax[0].semilogy(fine["times"], fine["W2"], "k:", lw=1.5, label="exact")
    ax[0].set(xlabel="t", ylabel="W2(rho_t, Pi#rho_0)", ylim=(1e-9, 1.5),
              title="beta = inf: W2 (each level stops at ~0.77 h of its finest cell)")
    ax[0].legend(fontsize=6, ncol=2, title="f0, nside_min / nside_max", title_fontsize=6)
    ax[1].set(xlabel="t", ylabel="|W2 / W2_exact - 1|", xlim=(0, 6), ylim=(1e-5, 10),
              title="relative error of W2 (before the floor)")
    ax[2].set(xlabel="t", ylabel="|align E - exact|", xlim=(0, 8), ylim=(1e-7, 1e-2),
              title="error of the alignment with E")
    ax[2].legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    from validation.fig4_concentration import adaptive as A

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nside-max", type=int, nargs="+", default=NSIDE_MAX)
    ap.add_argument("--f0", nargs="+", default=F0S, choices=F0S)
    ap.add_argument("--nside-min", type=int, default=NSIDE_MIN,
                    help=f"the coarsest cells of the levels run (default {NSIDE_MIN}; one of {NSIDE_MINS})")
    ap.add_argument("--rtol", type=float, default=None, help="the error control's tolerance (default: the solver's)")
    ap.add_argument("--report-only", action="store_true", help="only the levels already run")
    a = ap.parse_args(argv)
    recs = []
    for nmin in NSIDE_MINS:
        for rtol in RTOLS:
            for f0 in F0S:
                for nmax in sorted(set(NSIDE_MAX) | set(a.nside_max)):
                    if nmax < nmin:
                        continue
                    run = (not a.report_only and (nmin, rtol) == (a.nside_min, a.rtol) and f0 in a.f0
                           and nmax in a.nside_max)
                    rec = A.member(math.inf, nmax, run=run, f0=f0, t_end=T_END,
                                   nside_min=None if nmin == NSIDE_MIN else nmin, rtol=rtol)
                    if rec is not None:
                        recs.append(rec)
                        print(f"{f0}, nside_min {nmin}, nside_max {nmax}, rtol {rtol}: plateau "
                              f"{rec['plateau_w2']:.5f}, t_exit {rec['t_exit']}, {rec['steps']} steps, "
                              f"{rec['wall_s']:.0f} s", flush=True)
    if not recs:
        return 1
    exact = {"times": recs[0]["times"], **exact_curves(recs[0]["times"])}
    rows = [readings(r, exact) for r in recs]
    main_recs = [r for r in recs if _variant(r) == (NSIDE_MIN, None)]  # ladder.csv's: nside_min 16, default step
    (HERE / "zero_temperature.json").write_text(json.dumps({"exact": exact, "rows": rows, "records": main_recs,
                                                            "variants": [r for r in recs if r not in main_recs]}))
    (HERE / "zero_temperature.md").write_text(report(rows, exact))
    figure(recs, _fine_exact(recs[0]["times"]), HERE / "zero_temperature.png")
    print(report(rows, exact))
    return 0


if __name__ == "__main__":
    sys.exit(main())
