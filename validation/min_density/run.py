"""Minimal density against the Gronwall bound (issue 4).

Paper matrices B = diag(-1,-1,1), V = diag(-1,1,-2); f0 = (1 + 0.3 x1 x2) / (4 pi) (smooth, not constant,
min f0 = 0.85 / (4 pi)); beta in {10, 100, 1000, inf}; HEALPix nside 32 (quick: 8) to t = 5 (quick: 6);
two limiters of the linear reconstruction (``Options.limiter``): "maximum" (positivity + Barth-Jespersen
local maximum principle; the study's main runs) and "positivity" (the default; the comparison).
For every step the solver records min_i f_i and the bound

    gronwall(t) = min f_0 * exp(- int_0^t sup_x div_S v_s(x) ds)

(sup over cells of the discrete divergence, trapezoidal in time).  The lemma says min f_t >= gronwall(t)
for the continuum; this script reports min over t of (min f_t / gronwall(t)) and every violation.
With limiter="maximum" the discrete minimum follows the discrete bound (the minimising cell gets a zero
gradient, so it loses mass only through its net outflow, at most sup div times its mass; SSPRK2 then
damps by 1 - r dt + (r dt)^2 / 2 >= exp(-r dt)), up to the O(dt^2) changes of the field within a step;
with "positivity" alone a cell next to a cluster narrower than two cells drains within a few steps.

Finite beta uses the solver option ``field_interval`` (field recomputed every k steps, extrapolated
linearly in between) -- default k = 5 for beta >= 100, exact method of lines (None) for beta = 10.

    python validation/min_density/run.py --quick
    python validation/min_density/run.py [--betas 10 100 1000 inf] [--nside 32] [--limiters maximum positivity]
        [--workers N | --scheduler ADDRESS]

The runs are the members of one sweep (limiter x beta) on Dask (spherepde.sweeps): a LocalCluster by
default; their results files are in <out>/sweep_runs/ (not committed).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
from validation import criteria as C  # noqa: E402
from validation import datafile  # noqa: E402

B = np.diag([-1.0, -1.0, 1.0])
V = np.diag([-1.0, 1.0, -2.0])
EPS = 0.3
LIMITERS = ("maximum", "positivity")
#: Tolerance on min f_t / bound for limiter="maximum": the bound is exact for the discrete scheme up to
#: the time integrator (SSPRK2: the minimising cell's damping differs from exp(-int sup div) only through
#: the change of the field and of the minimising cell within a step, O(dt^2) relative per step). The
#: measured worst ratio over all betas is stated in README.md; 1e-3 is far above it and far below the
#: positivity limiter's violations (ratios down to 1e-10 at nside 32, 0.67 at nside 8).
MAX_RATIO_TOL = 1e-3

#: raw_<limiter>_beta<b>.nc (validation.datafile): dims, long_name, units of each variable; one entry per
#: solver step along ``step`` (the results file's diagnostics)
RAW_SCHEMA = {
    "time": (("step",), "time t after each step (depth through the transformer; dimensionless)", "1"),
    "min": (("step",), "minimum over cells of the density", "sr-1"),
    "gronwall": (("step",), "Gronwall bound min f_0 exp(-int_0^t sup_x div v_s ds)", "sr-1"),
    "sup_div": (("step",), "sup over cells of the discrete divergence of the velocity", "1"),
    "mass": (("step",), "total mass", "1"),
    "max": (("step",), "maximum over cells of the density", "sr-1"),
    "cpu": ((), "CPU time of the solve", "s"),
    "wall": ((), "wall time of the solve", "s"),
    "n_steps": ((), "number of time steps", "1"),
    "field_interval": ((), "steps between field evaluations (0: every stage)", "1"),
    "nside": ((), "HEALPix nside", "1"),
    "f_end": (("cell",), "density at the final time (HEALPix RING order)", "sr-1"),
}


def f0(x):  # the study's density in closed form (the sweep builds it as initial.type = "quadratic")
    return (1.0 + EPS * x[:, 0] * x[:, 1]) / (4 * np.pi)


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--part", default="all", choices=["all", "solve", "analyze"])
    ap.add_argument("--betas", nargs="+", default=["10", "100", "1000", "inf"])
    ap.add_argument("--limiters", nargs="+", default=list(LIMITERS), choices=LIMITERS)
    ap.add_argument("--nside", type=int, default=None)
    ap.add_argument("--t-end", type=float, default=None)
    ap.add_argument("--field-interval", type=int, default=5, help="k for beta >= 100 (0: exact)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--check-only", action="store_true",
                    help="evaluate the criteria of the results JSON on disk (no run); exit 1 if one fails")
    ap.add_argument("--results", default=None, help="with --check-only: this results JSON")
    eng = ap.add_mutually_exclusive_group()
    eng.add_argument("--workers", type=int, default=None, help="LocalCluster workers (default: one per core)")
    eng.add_argument("--scheduler", default=None, help="a running Dask scheduler (or DASK_SCHEDULER_ADDRESS)")
    a = ap.parse_args(argv)
    if a.quick:
        a.nside = a.nside or 8
        a.t_end = a.t_end or 6.0
    a.nside = a.nside or 32
    a.t_end = a.t_end or 5.0
    a.out = Path(a.out) if a.out else (HERE / "quick" if a.quick else HERE)
    return a


def model_for(beta_s):
    import spherepde as sp

    if beta_s == "inf":
        return sp.ZeroTemperature(B, V), None
    return sp.Attention(B, V, float(beta_s)), float(beta_s)


def raw_path(a, limiter, beta_s):
    return a.out / f"raw_{limiter}_beta{beta_s}.nc"


def sweep_spec(a):
    """The study's runs as one sweep (spherepde.sweeps): limiter x beta, with the field recomputed at
    most every k steps for beta >= 100 and at every stage otherwise (a zip with beta)."""
    from spherepde.sweeps import parse_sweep

    betas = [np.inf if b == "inf" else float(b) for b in a.betas]
    fis = [a.field_interval if (b != np.inf and b >= 100) else 0 for b in betas]
    base = {"name": "min_density",
            "grid": {"type": "healpix", "nside": a.nside},
            "model": {"type": "attention", "B": B.tolist(), "V": V.tolist(), "beta": 10.0},
            # f0 = (1 + EPS x1 x2) / (4 pi): x^T Q x with Q_12 = Q_21 = EPS / 2 (tr Q = 0)
            "initial": {"type": "quadratic", "Q": [[0.0, EPS / 2, 0.0], [EPS / 2, 0.0, 0.0], [0.0, 0.0, 0.0]]},
            "time": {"t_end": a.t_end, "save_at": [0.0, a.t_end]},
            "output": {"plots": []}}
    return parse_sweep({"sweep": {"name": "min_density"}, "base": base,
                        "axes": {"scheme.limiter": list(a.limiters)},
                        "zip": {"beta": {"model.beta": betas, "scheme.field_interval": fis}}})


def solve_all(a, workers=None, scheduler=None):
    """Run the sweep on Dask (a LocalCluster, or DASK_SCHEDULER_ADDRESS) into ``a.out/sweep_runs`` (always
    from the start: a member is keyed by its configuration, not the code), then write every member's
    per-step diagnostics to raw_<limiter>_beta<b>.nc (NetCDF4/CF, validation.datafile)."""
    import spherepde as sp

    spec = sweep_spec(a)
    out = a.out / "sweep_runs"
    ds = sp.sweep(spec, out, workers=workers, scheduler=scheduler, restart=True)
    bad = [e for e in ds.error.values.ravel() if e]
    if bad:
        raise SystemExit(f"min_density: {len(bad)} sweep members failed: {bad[0]}")
    for m in spec.members():
        lim = m.config.scheme.limiter
        beta = m.config.model.beta
        beta_s = "inf" if beta == np.inf else f"{beta:g}"
        res = sp.load(out / "members" / m.dirname / "results.h5")
        d = res.diagnostics
        fi = m.config.scheme.field_interval
        datafile.save(raw_path(a, lim, beta_s),
                      dict(limiter=lim, time=d["time"], min=d["min"], gronwall=d["gronwall"], sup_div=d["sup_div"],
                           mass=d["mass"], max=d["max"], wall=res.wall_time, n_steps=res.n_steps,
                           field_interval=fi or 0, nside=a.nside, f_end=res.density[-1]),
                      RAW_SCHEMA, f"Minimal density against the Gronwall bound: {lim} limiter, beta {beta_s}")
        r = d["min"] / d["gronwall"]
        print(f"{lim}, beta {beta_s}: {res.n_steps} steps, wall {res.wall_time:.1f} s, min(min f / bound) = "
              f"{r.min():.4f}", flush=True)


def run_stats(r):
    t, mn, gw = r["time"], r["min"], r["gronwall"]
    ratio = mn / gw
    viol = ratio < 1.0
    i = 1 + int(np.argmin(ratio[1:]))  # t = 0 has ratio 1 by construction
    first = int(np.argmax(viol)) if viol.any() else None
    return {
        "n_steps": int(r["n_steps"]), "wall_s": float(r["wall"]),
        "field_interval": int(r["field_interval"]), "min_f0": float(mn[0]), "min_f_end": float(mn[-1]),
        "bound_end": float(gw[-1]), "ratio_end": float(ratio[-1]), "min_ratio": float(ratio[i]),
        "t_min_ratio": float(t[i]), "n_violations": int(viol.sum()),
        "n_violations_beyond_tol": int((ratio < 1.0 - MAX_RATIO_TOL).sum()),
        "first_violation_t": None if first is None else float(t[first]),
        "max_relative_violation": float(max(0.0, 1.0 - ratio.min())),
        "mass_drift": float(np.max(np.abs(r["mass"] - r["mass"][0]))),
        "min_f_ever": float(mn.min()), "max_sup_div": float(r["sup_div"].max()),
    }


def analyze(a):
    out = {"setting": {"B": B.tolist(), "V": V.tolist(), "f0": "(1 + 0.3 x1 x2) / (4 pi)", "nside": a.nside,
                       "t_end": a.t_end, "max_ratio_tol": MAX_RATIO_TOL}, "runs": {}}
    for lim in a.limiters:
        for b in a.betas:
            f = raw_path(a, lim, b)
            if not f.exists():
                print(f"missing {f.name}")
                continue
            out["runs"].setdefault(lim, {})[b] = run_stats(datafile.load(f))
    (a.out / "results.json").write_text(json.dumps(out, indent=1))
    L = [f"# Minimal density vs Gronwall bound (nside {a.nside}, t <= {a.t_end:g}, f0 = (1 + 0.3 x1 x2)/(4 pi))", "",
         "| limiter | beta | field_interval | steps | wall s | min f_0 | min f_T | bound at T | (min f / bound) at T | "
         "min over t > 0 of (min f / bound) | at t | steps with ratio < 1 | steps with ratio < 1 - %g |" % MAX_RATIO_TOL,
         "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for lim, runs in out["runs"].items():
        for b, r in runs.items():
            L.append(f"| {lim} | {b} | {r['field_interval'] or '-'} | {r['n_steps']} | {r['wall_s']:.1f} | "
                     f"{r['min_f0']:.5f} | {r['min_f_end']:.3e} | {r['bound_end']:.3e} | {r['ratio_end']:.4g} | "
                     f"{r['min_ratio']:.8f} | {r['t_min_ratio']:.3f} | {r['n_violations']} | "
                     f"{r['n_violations_beyond_tol']} |")
    L.append("")
    (a.out / "results.md").write_text("\n".join(L))
    plot(a, out)
    return out


def plot(a, out):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 2, figsize=(11, 4.2))
    style = {"maximum": "-", "positivity": ":"}
    for lim, runs in out["runs"].items():
        for k, b in enumerate(runs):
            r = datafile.load(raw_path(a, lim, b))
            c = f"C{k}"
            ls = style.get(lim, "-")
            ax[0].semilogy(r["time"], r["min"], c + ls, label=f"{lim}, beta = {b}")
            if lim == next(iter(out["runs"])):
                ax[0].semilogy(r["time"], r["gronwall"], c + "--", lw=0.8)
            ax[1].plot(r["time"], r["min"] / r["gronwall"], c + ls, label=f"{lim}, beta = {b}")
    ax[1].axhline(1.0, color="k", lw=0.8)
    ax[0].set_xlabel("t"); ax[0].set_ylabel("min f_t  (dashed: Gronwall bound)"); ax[0].legend(fontsize=6)
    ax[0].set_ylim(bottom=1e-21)
    ax[1].set_xlabel("t"); ax[1].set_ylabel("min f_t / bound (>= 1 expected)"); ax[1].set_yscale("log")
    ax[1].set_ylim(1e-3, 10.0)
    ax[1].legend(fontsize=6)
    fig.suptitle(f"paper matrices, nside {a.nside}; solid: limiter maximum, dotted: positivity")
    fig.tight_layout()
    fig.savefig(a.out / "min_density.png", dpi=110)
    plt.close(fig)


def criteria(out) -> list[dict]:
    """Criteria of results.json: the minimal-density lemma (MODEL.md, Assumption 3) for limiter "maximum".

    - per beta: min over t > 0 of min f_t / (Gronwall bound) >= 1 - MAX_RATIO_TOL (the discrete minimum
      follows the discrete Gronwall bound up to the time integrator; see MAX_RATIO_TOL);
    - per beta: min f > 0 throughout and mass conserved to rounding.
    The "positivity" limiter runs are the comparison (README: they violate the bound late at beta = 10
    and 1000) and carry no criterion. A missing "maximum" run fails.
    """
    runs = out["runs"].get("maximum", {})
    if not runs:
        return [C.criterion("limiter 'maximum': runs present", 0, ">= 1", False)]
    res = []
    for b, r in runs.items():
        label = f"maximum, beta {b}"
        res.append(C.at_least(f"{label}: min over t > 0 of min f_t / Gronwall bound", r["min_ratio"],
                              1.0 - MAX_RATIO_TOL, ".6f"))
        res.append(C.positive(label, r["min_f_ever"]))
        res.append(C.mass_conserved(label, r["mass_drift"]))
    return res


def results_for(argv) -> Path:
    """The results JSON a run with these arguments writes."""
    return parse(argv).out / "results.json"


def main(argv=None):
    a = parse(argv)
    os.makedirs(a.out, exist_ok=True)
    if a.part in ("all", "solve"):
        solve_all(a, workers=a.workers, scheduler=a.scheduler)
    if a.part in ("all", "analyze"):
        # the criteria (the bound for limiter "maximum") are checked by C.cli (__main__) from results.json
        return analyze(a)
    return None


if __name__ == "__main__":
    sys.exit(C.cli("min_density", criteria, main, results_for))
