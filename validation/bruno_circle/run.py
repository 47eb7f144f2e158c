"""Metastable clusters on the circle (Bruno et al., ICLR 2025, arXiv 2410.23228) at density level.

S^1 (tensor grid), B = V = I, unnormalised attention (USA, ``normalization="usa"``, time rescaled by
e^{beta}: see ``spherepde.Attention``) and the normalised softmax attention, beta scanned. The uniform
state is unstable: the mode e^{ik theta} grows at

    USA:     lambda_k = (k^2 / beta) e^{-beta} I_k(beta),      softmax: lambda_k = (k^2 / beta) I_k(beta) / I_0(beta)

(derived in tests/test_usa.py, which checks the PDE's rates against it). From f0 = (1 + eps sum_{k<=K}
cos(k theta - phi_k)) / (2 pi) (equal amplitudes eps = 1e-3, K = 16 modes, seeded phases) the fastest mode
k* = argmax lambda_k wins the linear phase, so the prediction is k* metastable clusters, centred at the
maxima of cos(k* theta - phi_k*): theta_j = (phi_k* + 2 pi j) / k*. The run goes to T = 12 / lambda_k*
(the clusters have formed by ~ 8 / lambda_k*); a cluster is a local maximum of the density above 3 / (2 pi).

Measured per (normalisation, beta): the early growth rate of mode k* against lambda_k*; the cluster count
against k*; the largest distance of a cluster from its predicted centre, in units of the spacing 2 pi / k*
(the other modes, whose rates are close to lambda_k*, shift them); and, for two betas, the same on a grid of
twice the resolution (the counts and positions are converged).

    python validation/bruno_circle/run.py [--quick]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
from scipy.special import ive

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
from validation import criteria as C  # noqa: E402

EPS = 1e-3
K_MODES = 16
SEED = 0
BETAS = (3.0, 5.0, 7.0, 9.0, 12.0, 16.0, 20.0)
QUICK_BETAS = (5.0, 12.0)
CELLS = 512
QUICK_CELLS = 256
#: A cluster is a local maximum of the density above this multiple of the uniform density.
PEAK = 3.0
#: Each cluster within this fraction of the spacing 2 pi / k* of its own predicted centre (one cluster per
#: prediction, so the assignment is one to one; half the spacing would be ambiguous).
POSITION_TOL = 0.25
#: The measured early growth rate of mode k* within this relative error of lambda_k* (the spatial error of
#: the rates at 512 cells is ~1e-3, tests/test_usa.py; the fit over the linear phase adds the other modes'
#: leakage).
RATE_TOL = 0.02


def rates(beta: float, norm: str, K: int = K_MODES):
    k = np.arange(1, K + 1)
    lam = (k * k / beta) * ive(k, beta) / (1.0 if norm == "usa" else ive(0, beta))
    return k, lam


def phases():
    return 2 * np.pi * np.random.default_rng(SEED).random(K_MODES)


def f0_of(phi):
    def f0(x):
        th = np.arctan2(x[:, 1], x[:, 0])
        return (1 + EPS * sum(np.cos((k + 1) * th - phi[k]) for k in range(K_MODES))) / (2 * np.pi)
    return f0


def clusters(grid, f):
    th = np.arctan2(grid.centers[:, 1], grid.centers[:, 0])
    order = np.argsort(th)
    fo, to = f[order], th[order]
    peak = (fo > np.roll(fo, 1)) & (fo >= np.roll(fo, -1)) & (fo > PEAK / (2 * np.pi))
    return np.sort(to[peak])


def one_run(norm: str, beta: float, cells: int, phi) -> dict:
    import spherepde as sp

    k, lam = rates(beta, norm)
    ks = int(k[np.argmax(lam)])
    lam_s = float(lam.max())
    T = 12.0 / lam_s
    grid = sp.TensorGrid(2, cells // 2)
    th = np.arctan2(grid.centers[:, 1], grid.centers[:, 0])
    save = np.linspace(0.0, T, 25)
    t0 = time.perf_counter()
    r = sp.solve(grid, sp.Attention(np.eye(2), np.eye(2), beta, normalization=norm), f0_of(phi), T, save_at=save)
    wall = time.perf_counter() - t0
    amp = np.array([abs(np.sum(f * np.exp(-1j * ks * th) * grid.areas)) for f in r.density])
    lin = (save > 0) & (amp < 30 * amp[0])  # the linear phase: amplitude within a factor 30 of the start
    fit = float(np.polyfit(save[lin], np.log(amp[lin]), 1)[0]) if lin.sum() >= 3 else float("nan")
    counts = [int(len(clusters(grid, f))) for f in r.density]
    pos = clusters(grid, r.density[-1])
    pred = np.angle(np.exp(1j * (phi[ks - 1] + 2 * np.pi * np.arange(ks)) / ks))
    dev = [float(np.min(np.abs(np.angle(np.exp(1j * (p - pred)))))) for p in pos]
    nearest = [int(np.argmin(np.abs(np.angle(np.exp(1j * (p - pred)))))) for p in pos]
    return {"normalization": norm, "beta": beta, "cells": cells, "k_star": ks, "lambda_star": lam_s,
            "lambda": lam.tolist(), "T": T, "times": save.tolist(), "counts": counts,
            "count_final": counts[-1], "positions": pos.tolist(), "predicted": np.sort(pred).tolist(),
            "max_deviation_over_spacing": (max(dev) / (2 * np.pi / ks)) if dev else None,
            "one_to_one": len(set(nearest)) == len(nearest) == ks,
            "rate_fit": fit, "rate_rel_err": abs(fit / lam_s - 1) if np.isfinite(fit) else None,
            "mass_drift": float(abs(r.diagnostics["mass"][-1] / r.diagnostics["mass"][0] - 1)),
            "min_density": float(r.diagnostics["min"].min()), "steps": r.n_steps, "wall_s": wall,
            "density_final": r.density[-1].tolist(), "theta": th.tolist()}


def criteria(res) -> list[dict]:
    out = []
    for run in res["runs"]:
        lab = f"{run['normalization']}, beta {run['beta']:g}, {run['cells']} cells"
        out.append(C.criterion(f"{lab}: metastable clusters = k* (fastest linear mode)", run["count_final"],
                               f"= {run['k_star']}", run["count_final"] == run["k_star"], "d"))
        out.append(C.criterion(f"{lab}: clusters at the maxima of mode k*'s initial phase, one each "
                               "(max distance / spacing)", run["max_deviation_over_spacing"],
                               f"<= {POSITION_TOL} and one to one",
                               run["one_to_one"] and run["max_deviation_over_spacing"] is not None
                               and run["max_deviation_over_spacing"] <= POSITION_TOL, ".3f"))
        out.append(C.at_most(f"{lab}: early growth rate of mode k* against lambda_k* (relative error)",
                             run["rate_rel_err"], RATE_TOL, ".2e"))
        out.append(C.mass_conserved(lab, run["mass_drift"]))
        out.append(C.positive(lab, run["min_density"]))
    for fine in res.get("resolution", []):
        coarse = next(r for r in res["runs"] if r["normalization"] == fine["normalization"]
                      and r["beta"] == fine["beta"])
        lab = f"{fine['normalization']}, beta {fine['beta']:g}: {coarse['cells']} -> {fine['cells']} cells"
        same = fine["count_final"] == coarse["count_final"]
        shift = max(abs(float(np.angle(np.exp(1j * (a - b))))) for a, b in zip(fine["positions"], coarse["positions"])) \
            if same else float("inf")
        out.append(C.criterion(f"{lab}: the same clusters (count; largest position shift / spacing)",
                               f"{fine['count_final']} vs {coarse['count_final']}; "
                               f"{shift / (2 * np.pi / coarse['k_star']):.3f}",
                               "same count, shift <= 0.05", same and shift <= 0.05 * 2 * np.pi / coarse["k_star"]))
    return out


results_for = C.quick_results(HERE)


def write_md(res, path):
    L = ["# Metastable clusters on the circle (Bruno et al. 2025), density level", "",
         f"S^1, B = V = I, f0 = (1 + eps sum_k cos(k theta - phi_k)) / (2 pi), eps = {EPS:g}, {K_MODES} modes, "
         f"seeded phases; T = 12 / lambda_k*. A cluster: a local maximum above {PEAK:g} / (2 pi).", "",
         "| attention | beta | cells | k* | lambda_k* | fitted rate | clusters at T (over time) | max deviation / "
         "spacing | steps | wall s |", "|---|---:|---:|---:|---:|---:|---|---:|---:|---:|"]
    for r in res["runs"] + res.get("resolution", []):
        counts = "".join(str(c) if c < 10 else "+" for c in r["counts"])
        L.append(f"| {r['normalization']} | {r['beta']:g} | {r['cells']} | {r['k_star']} | {r['lambda_star']:.4f} | "
                 f"{r['rate_fit']:.4f} | {r['count_final']} ({counts}) | {r['max_deviation_over_spacing']:.3f} | "
                 f"{r['steps']} | {r['wall_s']:.1f} |")
    L += ["", "USA time is the rescaled time t = e^{beta} t' of the raw USA dynamics (spherepde.Attention).",
          f"Total wall time {res['wall_total_s']:.0f} s.", ""]
    Path(path).write_text("\n".join(L))


def plot(res, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [r for r in res["runs"] if r["normalization"] == "usa"]
    fig, axes = plt.subplots(2, 1, figsize=(9, 6.5))
    for i, r in enumerate(runs):
        th = np.array(r["theta"])
        o = np.argsort(th)
        f = np.array(r["density_final"])
        axes[0].semilogy(th[o], f[o] + 1e-12, color=f"C{i}", lw=0.9, label=f"beta {r['beta']:g}: k* = {r['k_star']}")
        for p in r["predicted"]:
            axes[0].axvline(p, color=f"C{i}", ls=":", lw=0.6)
    axes[0].set_xlabel("theta")
    axes[0].set_ylabel("f at T (per radian)")
    axes[0].set_title("USA: density at T; dotted: predicted centres (maxima of the initial mode k*)", fontsize=9)
    axes[0].legend(fontsize=7, ncol=2)
    for norm, ls in (("usa", "-"), ("softmax", "--")):
        for i, r in enumerate(x for x in res["runs"] if x["normalization"] == norm):
            lam = np.array(r["lambda"])
            axes[1].plot(np.arange(1, len(lam) + 1), lam / lam.max(), ls, color=f"C{i}", lw=0.9,
                         label=f"{norm}, beta {r['beta']:g}" if norm == "usa" else None)
    axes[1].set_xlabel("mode k")
    axes[1].set_ylabel("lambda_k / max")
    axes[1].set_title("linear growth rates of the uniform state (solid USA, dashed softmax)", fontsize=9)
    axes[1].legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    phi = phases()
    betas = QUICK_BETAS if a.quick else BETAS
    cells = QUICK_CELLS if a.quick else CELLS
    res = {"setting": {"eps": EPS, "modes": K_MODES, "seed": SEED, "peak": PEAK}, "runs": [], "resolution": []}
    for norm in ("usa", "softmax"):
        for beta in betas:
            r = one_run(norm, beta, cells, phi)
            print(f"{norm} beta {beta:g}: k* {r['k_star']}, clusters {r['count_final']}, deviation "
                  f"{r['max_deviation_over_spacing']}, rate {r['rate_fit']:.4f} vs {r['lambda_star']:.4f}", flush=True)
            res["runs"].append(r)
    if not a.quick:
        for norm, beta in (("usa", 5.0), ("usa", 20.0), ("softmax", 12.0)):
            res["resolution"].append(one_run(norm, beta, 2 * cells, phi))
    res["wall_total_s"] = time.perf_counter() - t0
    C.save_outputs(HERE, "bruno_circle", res, a.quick, write_md, plot)
    return 0


if __name__ == "__main__":
    sys.exit(C.cli("bruno_circle", criteria, main, results_for))
