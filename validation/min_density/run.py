"""Minimal density against the Gronwall bound (issue 4).

Paper matrices B = diag(-1,-1,1), V = diag(-1,1,-2); f0 = (1 + 0.3 x1 x2) / (4 pi) (smooth, not constant,
min f0 = 0.85 / (4 pi)); beta in {10, 100, 1000, inf}; HEALPix nside 32 (quick: 8) to t = 5 (quick: 0.5).
For every step the solver records min_i f_i and the bound

    gronwall(t) = min f_0 * exp(- int_0^t sup_x div_S v_s(x) ds)

(sup over cells of the discrete divergence, trapezoidal in time).  The lemma says min f_t >= gronwall(t)
for the continuum; this script reports min over t of (min f_t / gronwall(t)) and every violation.

Finite beta uses the solver option ``field_interval`` (field recomputed every k steps, extrapolated
linearly in between) -- default k = 5 for beta >= 100, exact method of lines (None) for beta = 10.

    python validation/min_density/run.py --quick
    python validation/min_density/run.py [--betas 10 100 1000 inf] [--nside 32]
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
B = np.diag([-1.0, -1.0, 1.0])
V = np.diag([-1.0, 1.0, -2.0])
EPS = 0.3


def f0(x):
    return (1.0 + EPS * x[:, 0] * x[:, 1]) / (4 * np.pi)


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--part", default="all", choices=["all", "solve", "analyze"])
    ap.add_argument("--betas", nargs="+", default=["10", "100", "1000", "inf"])
    ap.add_argument("--nside", type=int, default=None)
    ap.add_argument("--t-end", type=float, default=None)
    ap.add_argument("--field-interval", type=int, default=5, help="k for beta >= 100 (0: exact)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    if a.quick:
        a.nside = a.nside or 8
        a.t_end = a.t_end or 0.5
    a.nside = a.nside or 32
    a.t_end = a.t_end or 5.0
    a.out = Path(a.out) if a.out else (HERE / "quick" if a.quick else HERE)
    return a


def model_for(beta_s):
    import spherepde as sp

    if beta_s == "inf":
        return sp.ZeroTemperature(B, V), None
    return sp.Attention(B, V, float(beta_s)), float(beta_s)


def solve_one(a, beta_s):
    import spherepde as sp

    grid = sp.HealpixGrid(a.nside)
    model, beta = model_for(beta_s)
    fi = None
    if beta is not None and beta >= 100 and a.field_interval > 0:
        fi = a.field_interval
    c0, w0 = time.process_time(), time.perf_counter()
    res = sp.solve(grid, model, f0, a.t_end, save_at=[0.0, a.t_end], field_interval=fi)
    cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    d = res.diagnostics
    np.savez(a.out / f"raw_beta{beta_s}.npz", time=d["time"], min=d["min"], gronwall=d["gronwall"],
             sup_div=d["sup_div"], mass=d["mass"], max=d["max"], cpu=cpu, wall=wall, n_steps=res.n_steps,
             field_interval=fi or 0, nside=a.nside, f_end=res.density[-1])
    r = d["min"] / d["gronwall"]
    print(f"beta {beta_s}: {res.n_steps} steps, wall {wall:.1f} s, min(min f / bound) = {r.min():.4f}", flush=True)


def analyze(a):
    out = {"setting": {"B": B.tolist(), "V": V.tolist(), "f0": "(1 + 0.3 x1 x2) / (4 pi)", "nside": a.nside,
                       "t_end": a.t_end}, "runs": {}}
    for b in a.betas:
        f = a.out / f"raw_beta{b}.npz"
        if not f.exists():
            print(f"missing {f.name}")
            continue
        r = np.load(f)
        t, mn, gw = r["time"], r["min"], r["gronwall"]
        ratio = mn / gw
        viol = ratio < 1.0
        i = 1 + int(np.argmin(ratio[1:]))  # t = 0 has ratio 1 by construction
        first = int(np.argmax(viol)) if viol.any() else None
        out["runs"][b] = {
            "n_steps": int(r["n_steps"]), "wall_s": float(r["wall"]), "cpu_s": float(r["cpu"]),
            "field_interval": int(r["field_interval"]), "min_f0": float(mn[0]), "min_f_end": float(mn[-1]),
            "bound_end": float(gw[-1]), "min_ratio": float(ratio[i]), "t_min_ratio": float(t[i]),
            "n_violations": int(viol.sum()), "first_violation_t": None if first is None else float(t[first]),
            "max_relative_violation": float(max(0.0, 1.0 - ratio.min())),
            "mass_drift": float(np.max(np.abs(r["mass"] - r["mass"][0]))),
            "max_sup_div": float(r["sup_div"].max()),
        }
    (a.out / "results.json").write_text(json.dumps(out, indent=1))
    L = [f"# Minimal density vs Gronwall bound (nside {a.nside}, t <= {a.t_end:g}, f0 = (1 + 0.3 x1 x2)/(4 pi))", "",
         "| beta | field_interval | steps | wall s | min f_0 | min f_T | bound at T | min over t > 0 of (min f / bound) | at t | "
         "violating steps | worst relative violation |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for b, r in out["runs"].items():
        L.append(f"| {b} | {r['field_interval'] or '-'} | {r['n_steps']} | {r['wall_s']:.1f} | {r['min_f0']:.5f} | "
                 f"{r['min_f_end']:.3e} | {r['bound_end']:.3e} | {r['min_ratio']:.4f} | {r['t_min_ratio']:.3f} | "
                 f"{r['n_violations']} | {r['max_relative_violation']:.2e} |")
    L.append("")
    (a.out / "results.md").write_text("\n".join(L))
    plot(a, out)
    return out


def plot(a, out):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 2, figsize=(11, 4.2))
    for k, b in enumerate(out["runs"]):
        r = np.load(a.out / f"raw_beta{b}.npz")
        c = f"C{k}"
        ax[0].semilogy(r["time"], r["min"], c, label=f"beta = {b}: min f")
        ax[0].semilogy(r["time"], r["gronwall"], c + "--", label=f"beta = {b}: bound")
        ax[1].plot(r["time"], r["min"] / r["gronwall"], c, label=f"beta = {b}")
    ax[1].axhline(1.0, color="k", lw=0.8)
    ax[0].set_xlabel("t"); ax[0].set_ylabel("min f_t  /  Gronwall bound (dashed)"); ax[0].legend(fontsize=7)
    ax[1].set_xlabel("t"); ax[1].set_ylabel("min f_t / bound (>= 1 expected)"); ax[1].set_yscale("log")
    ax[1].legend(fontsize=7)
    fig.suptitle(f"paper matrices, nside {a.nside}")
    fig.tight_layout()
    fig.savefig(a.out / "min_density.png", dpi=110)
    plt.close(fig)


def main(argv=None):
    a = parse(argv)
    os.makedirs(a.out, exist_ok=True)
    if a.part in ("all", "solve"):
        for b in a.betas:
            solve_one(a, b)
    if a.part in ("all", "analyze"):
        return analyze(a)
    return None


if __name__ == "__main__":
    main()
