"""The transition law at density level: t_exit and t_EF against the perturbation amplitude (issue #17 item 3).

The perturbed f0 of the Figure 4 study, (1 + eps (x1 x2 + x2 + x3 x1 / 2)) / (4 pi), with eps = 1e-1 ... 1e-5
(four decades), beta = 30, the paper matrices, to T = 35, on HEALPix nside 16 and 32 (``sweep.toml``: the
members run with ``spherepde.sweep`` on a local Dask cluster, resumable; their run directories in
``sweep_runs/``, not committed). Each run's t_exit (the E-alignment falls back below 0.9) and t_EF (the
F-alignment overtakes the E-alignment) are fitted per grid as t = a + b log(1 / eps).

What the fit is held against: the reduced cluster dynamics (``validation/cluster_dynamics``). Two antipodal
clusters at +-e1 leave E along e3 at the rate tanh(beta) of their antipodal mode, so a perturbation of
size eps takes log(1 / eps) / tanh(beta) to grow: b = 1 / tanh(30) = 1.000 if the density's symmetry-breaking
part at collapse is proportional to eps. The stall on the cone is left at rate 1 (b = 1 again for t_EF
if its perturbation is proportional to eps too).

Usage: python validation/transition_law/run.py [--quick] [--no-n64] [--beta B]  (quick: nside 8, eps 1e-1 and
1e-3, T = 20; --no-n64: without the two nside 64 members of ``sweep_n64.toml``, ~1 h; --beta: the same
members at another beta, written as *_beta<B>.*)
Writes results.json, results.md and transition_law.png beside this file (quick: *_quick.*).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
from spherepde.diagnostics import exit_time, transition_time  # noqa: E402
from validation import criteria as C  # noqa: E402
from validation.fig3_density.common import PAPER_B, PAPER_V, grid_measures  # noqa: E402

BETA = 30.0
B_PREDICTED = 1.0 / np.tanh(BETA)  # the antipodal mode's inverse rate at (e1, -e1) (validation/cluster_dynamics)
QUICK = {"grid.nside": [8], "initial.eps": [1e-1, 1e-3], "time.t_end": 20.0}


def specs(quick: bool, n64: bool = True, beta: float = BETA):
    """The sweeps: sweep.toml (nside 16 and 32, five eps) and sweep_n64.toml (nside 64, eps 1e-3 and 1e-4);
    quick: nside 8, two eps, T = 20; another ``beta``: the same members at that beta (sweeps of their own
    names)."""
    import tomllib

    from spherepde.sweeps import parse_sweep

    def at_beta(raw):
        if beta != BETA:
            raw["sweep"]["name"] += f"_beta{beta:g}"
            raw["set"]["model.beta"] = float(beta)
        return raw

    raw = at_beta(tomllib.loads((HERE / "sweep.toml").read_text()))
    if quick:
        raw["sweep"]["name"] = "transition_law_quick"
        raw["axes"] = {k: QUICK[k] for k in ("grid.nside", "initial.eps")}
        raw["set"]["time.t_end"] = QUICK["time.t_end"]
        return [parse_sweep(raw, base_dir=HERE)]
    out = [parse_sweep(raw, base_dir=HERE)]
    if n64:
        out.append(parse_sweep(at_beta(tomllib.loads((HERE / "sweep_n64.toml").read_text())), base_dir=HERE))
    return out


def fit(eps, t):
    """Least-squares t = a + b log(1 / eps) over the finite t (None with fewer than 3)."""
    eps, t = np.asarray(eps, float), np.asarray(t, float)
    ok = np.isfinite(t)
    if ok.sum() < 3:
        return None
    X = np.log(1.0 / eps[ok])
    b, a = np.polyfit(X, t[ok], 1)
    resid = t[ok] - (a + b * X)
    return {"a": float(a), "b": float(b), "points": int(ok.sum()), "max_residual": float(np.abs(resid).max())}


def main(argv=None):
    from spherepde import load, sweep

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--workers", type=int, default=None, help="Dask workers (default: one per core)")
    ap.add_argument("--no-n64", action="store_true", help="leave out the nside 64 members (sweep_n64.toml)")
    ap.add_argument("--beta", type=float, default=BETA,
                    help=f"inverse temperature (default {BETA:g}; another writes results_beta<B>.*)")
    a = ap.parse_args(argv)
    if a.quick and a.beta != BETA:
        ap.error("--quick runs beta 30 only")
    if not (np.isfinite(a.beta) and a.beta > 0):
        ap.error(f"--beta must be a finite number > 0, got {a.beta}")
    t0 = time.perf_counter()
    members = []
    for sp_ in specs(a.quick, not a.no_n64, a.beta):
        out = HERE / "sweep_runs" / sp_.name
        ds = sweep(sp_, out, workers=a.workers, quiet=True, progress=False)
        bad = [str(e) for e in ds.error.values.ravel() if e]
        if bad:
            raise RuntimeError(f"sweep {sp_.name}: {len(bad)} members failed: {bad[0]}")
        members += [(m, out) for m in sp_.members()]
    rows = []
    for m, out in members:
        r = load(out / "members" / m.dirname / "results.h5")
        meas = grid_measures(r.grid, r.density, PAPER_B, PAPER_V, w2=False)
        d = r.diagnostics
        rows.append({"nside": int(m.config.grid.nside), "eps": float(m.config.initial.eps),
                     "t_exit": exit_time(r.times, meas["align_E"]),
                     "t_EF": transition_time(r.times, meas["align_E"], meas["align_F"]),
                     "final_align": [float(meas[k][-1]) for k in ("align_E", "align_F", "align_Fabs")],
                     "steps": int(r.n_steps), "wall_s": float(r.wall_time),
                     "mass_drift": float(abs(d["mass"][-1] / d["mass"][0] - 1)), "min": float(np.min(d["min"])),
                     "times": [float(x) for x in r.times], "align_E": meas["align_E"].tolist(),
                     "align_F": meas["align_F"].tolist()})
    fits = {}
    for n in sorted({r["nside"] for r in rows}):
        sel = sorted((r for r in rows if r["nside"] == n), key=lambda r: -r["eps"])
        for key in ("t_exit", "t_EF"):
            fits[f"nside {n} {key}"] = fit([r["eps"] for r in sel], [r[key] for r in sel])
    res = {"beta": a.beta, "T": float(members[0][0].config.time.t_end), "b_predicted": 1.0 / np.tanh(a.beta),
           "rows": rows, "fits": fits, "wall_s": time.perf_counter() - t0, "quick": a.quick}
    C.save_outputs(HERE, "transition_law", res, a.quick, write_md, plot, suffix=_tag(a.beta))
    return 0


def _tag(beta: float) -> str:
    return "" if beta == BETA else f"_beta{beta:g}"


def _f(x, spec=".2f"):
    return "none" if x is None or not np.isfinite(x) else format(x, spec)


def write_md(res, path):
    rows = res["rows"]
    L = ["# The transition law at density level (validation/transition_law)", "",
         f"beta {res['beta']:g}, paper matrices, perturbed f0 (1 + eps (x1 x2 + x2 + x3 x1 / 2)) / 4 pi, T = "
         f"{res['T']:g}, uniform HEALPix grids, the Figure 4 study's settings. t_exit: the E-alignment falls "
         "back below 0.9; t_EF: the F-alignment overtakes the E-alignment ('none': not by T).", "",
         "| nside | eps | t_exit | t_EF | final align E / F / F_abs | steps | wall s | mass drift | min f |",
         "|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (r["nside"], -r["eps"])):
        fa = " / ".join(f"{x:.3f}" for x in r["final_align"])
        L.append(f"| {r['nside']} | {r['eps']:.0e} | {_f(r['t_exit'])} | {_f(r['t_EF'])} | {fa} | {r['steps']} | "
                 f"{r['wall_s']:.0f} | {r['mass_drift']:.1e} | {r['min']:.2e} |")
    L += ["", f"Fits t = a + b log(1 / eps) (the two-cluster prediction for the exit from E: b = 1 / tanh(beta) = "
          f"{res['b_predicted']:.4f}):", "", "| grid, time | a | b | points | largest residual |", "|---|---|---|---|---|"]
    for k, v in res["fits"].items():
        L.append(f"| {k} | {v['a']:.2f} | {v['b']:.3f} | {v['points']} | {v['max_residual']:.2f} |" if v else
                 f"| {k} | | | fewer than 3 | |")
    ns = sorted({r["nside"] for r in rows})
    if len(ns) >= 2:
        L += ["", "t_exit on the resolution ladder (the issue's bar for converged: the last two levels within 2 %; "
              "'-': not run):", "", "| eps | " + " | ".join(f"nside {n}" for n in ns) + " | last two, relative difference |",
              "|---" * (len(ns) + 2) + "|"]
        for e in sorted({r["eps"] for r in rows}, reverse=True):
            ts = [next((r["t_exit"] for r in rows if r["nside"] == n and r["eps"] == e), None) for n in ns]
            have = [t for t in ts if t is not None]
            rel = (abs(have[-1] - have[-2]) / have[-1] if len(have) >= 2 and np.isfinite(have[-1])
                   and np.isfinite(have[-2]) else float("nan"))
            L.append(f"| {e:.0e} | " + " | ".join("-" if t is None else _f(t) for t in ts) + f" | {_f(rel, '.3f')} |")
    L += ["", f"Wall time of this invocation: {res['wall_s']:.0f} s."]
    Path(path).write_text("\n".join(L) + "\n")


def plot(res, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 2, figsize=(11, 4.2))
    ns = sorted({r["nside"] for r in res["rows"]})
    for c, (n, mk) in enumerate(zip(ns, "os^D")):
        sel = sorted((r for r in res["rows"] if r["nside"] == n), key=lambda r: -r["eps"])
        X = np.log(1.0 / np.array([r["eps"] for r in sel]))
        for key, ls in (("t_exit", "-"), ("t_EF", "--")):
            ax[0].plot(X, np.array([r[key] for r in sel], float), mk + ls, color=f"C{c}", label=f"nside {n}: {key}")
        for k, r in enumerate(sel):
            ax[1].plot(r["times"], r["align_E"], lw=1, color=f"C{c}", alpha=0.35 + 0.13 * k,
                       label=f"nside {n}" if k == 0 else None)
    fits = [(n, res["fits"].get(f"nside {n} t_exit")) for n in ns]
    fits = [(n, f) for n, f in fits if f]
    if fits:
        n, fe = fits[-1]
        X = np.array([np.log(10.0), np.log(1e5)])
        ax[0].plot(X, fe["a"] + fe["b"] * X[0] + res["b_predicted"] * (X - X[0]), "k:", lw=1,
                   label="slope 1 / tanh(beta) (two clusters)")
    ax[0].set_xlabel("log(1 / eps)")
    ax[0].set_ylabel("time")
    ax[0].legend(fontsize=7)
    ax[0].set_title(f"beta {res['beta']:g}: exit from E (t_exit) and E -> F (t_EF)", fontsize=9)
    ax[1].set_xlabel("t")
    ax[1].set_ylabel("align E")
    ax[1].legend(fontsize=7)
    ax[1].set_title("align E, every eps (darker: smaller eps)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def criteria(res) -> list[dict]:
    rows = res["rows"]
    out = [C.mass_conserved("all runs", max(r["mass_drift"] for r in rows)),
           # the scheme guarantees f >= 0; where the clusters have emptied a region the density decays
           # through the subnormal range (9e-314 at nside 32) and underflows to exactly 0 (nside 64)
           C.at_least("all runs: min f (non-negative; the emptied regions underflow to 0)",
                      float(min(r["min"] for r in rows)), 0.0)]
    if res.get("quick"):
        return out
    # the finest grid that has every eps: every run leaves E by T (the law needs the exit at all four decades)
    counts = {n: sum(r["nside"] == n for r in rows) for n in {r["nside"] for r in rows}}
    full = max(counts.values())
    n = max(k for k, v in counts.items() if v == full)
    out.append(C.at_least(f"nside {n}: runs leaving E by T (of {full})",
                          int(sum(np.isfinite(r["t_exit"]) for r in rows if r["nside"] == n)), full))
    fe = res["fits"].get(f"nside {n} t_exit")
    rel = float(abs(fe["b"] - res["b_predicted"]) / res["b_predicted"]) if fe else float("nan")
    out.append(C.at_most(f"exploratory: nside {n}: slope b of t_exit against log(1/eps), relative to the two-cluster "
                         f"1 / tanh(beta) (b = {fe['b']:.3f})" if fe else f"exploratory: nside {n}: slope b (no fit)",
                         rel, 0.2))
    return out


def results_for(argv) -> Path:
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--beta", type=float, default=BETA)
    beta = pre.parse_known_args(argv)[0].beta
    if beta != BETA:
        return HERE / f"results{_tag(beta)}.json"
    return C.quick_results(HERE)(argv)


if __name__ == "__main__":
    sys.exit(C.cli("transition_law", criteria, main, results_for))
