"""The noisy transformer's phase transition on the circle: stationary states against sigma at fixed beta.

S^1, B = V = I, softmax attention at beta = 5, plus noise sigma (``Attention + Noise``). The uniform state's
mode k changes at the rate lambda_k - D k^2, D = sigma^2 / 2, lambda_k = (k^2 / beta) I_k(beta) / I_0(beta)
(derived and checked in tests/test_usa.py). lambda_k / k^2 = I_k / (beta I_0) falls with k, so mode 1 is the
last to be stabilised: the uniform state is stable exactly for

    sigma > sigma_c = sqrt(2 I_1(beta) / (beta I_0(beta)))     (0.5978 at beta = 5).

Below sigma_c a one-cluster stationary state appears (order parameter r = |int e^{i theta} f|). The study
runs the PDE (256 cells) from f0 = (1 + 1e-3 cos theta) / (2 pi) to T for sigma / sigma_c in a scan, and
tokens (Euler-Maruyama, seeded, drawn from f0) for three of them, and measures

- the rate of mode 1 in the linear phase against lambda_1 - D (above and below sigma_c),
- the critical noise from the PDE's own rates: the measured rate of mode 1 is linear in sigma^2
  (lambda_1 - sigma^2 / 2), and the zero of the least-squares line through all runs estimates sigma_c,
- the stationary r (r(T) with |r(T) - r(0.8 T)| small), zero above sigma_c and positive below (near
  sigma_c the approach is slower than T: those runs are reported, not counted as stationary),
- the tokens' time-averaged r over the last fifth of the run against the PDE's.

    python validation/noisy_phase_transition/run.py [--quick]
    python validation/noisy_phase_transition/run.py --only 0.7 0.9 --t-end 400   # rerun some, merge into results.json
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
from scipy.special import ive

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
from validation import criteria as C  # noqa: E402

BETA = 5.0
RATIOS = (0.5, 0.7, 0.8, 0.9, 0.95, 1.05, 1.2)
QUICK_RATIOS = (0.8, 1.2)
TOKEN_RATIOS = (0.7, 0.9, 1.2)
CELLS = 256
T_END = 250.0
QUICK_T = 200.0
N_TOKENS = 1000
EPS = 1e-3
#: Linear-phase rate of mode 1 within this relative error of lambda_1 - D (or this absolute error where it
#: is near 0); the rates' spatial error at 256 cells is ~1e-3 (tests/test_usa.py).
RATE_TOL = 0.02
#: r below this counts as the uniform state (the initial r is 5e-4 and decays above sigma_c).
R_UNIFORM = 1e-4
#: The critical noise estimated from the PDE's measured rates within this fraction of sigma_c (the rates'
#: error is ~1e-3 relative; near sigma_c a rate error delta moves the zero by delta / (2 lambda_1) relative).
SIGMA_C_TOL = 0.01


def sigma_c(beta=BETA) -> float:
    return float(np.sqrt(2 * ive(1, beta) / (beta * ive(0, beta))))


def lambda1(beta=BETA) -> float:
    return float(ive(1, beta) / (beta * ive(0, beta)))


def _r(grid, f, th):
    return float(abs(np.sum(f * np.exp(1j * th) * grid.areas)))


def pde_run(q: float, T: float) -> dict:
    import spherepde as sp

    s = q * sigma_c()
    grid = sp.TensorGrid(2, CELLS // 2)
    th = np.arctan2(grid.centers[:, 1], grid.centers[:, 0])
    save = np.linspace(0.0, T, 51)
    t0 = time.perf_counter()
    model = sp.Attention(np.eye(2), np.eye(2), BETA) + sp.Noise(s)
    solver_log = {}
    r = sp.solve(grid, model, lambda x: (1 + EPS * np.cos(np.arctan2(x[:, 1], x[:, 0]))) / (2 * np.pi), T,
                 save_at=save, callback=lambda sv: solver_log.__setitem__("clipped", sv.noise_clipped))
    wall = time.perf_counter() - t0
    R = np.array([_r(grid, f, th) for f in r.density])
    lin = (save > 0) & (R < 20 * R[0]) & (R > R[0] / 20)  # the linear phase
    rate = float(np.polyfit(save[lin], np.log(R[lin]), 1)[0]) if lin.sum() >= 3 else float("nan")
    i8 = int(np.argmin(abs(save - 0.8 * T)))
    return {"ratio": q, "sigma": s, "T": T, "times": save.tolist(), "r": R.tolist(), "r_end": float(R[-1]),
            "r_drift": float(abs(R[-1] - R[i8])), "rate_fit": rate, "rate_theory": lambda1() - 0.5 * s * s,
            "steps": r.n_steps, "wall_s": wall, "mass_drift": float(abs(r.diagnostics["mass"][-1] - r.diagnostics["mass"][0])),
            "min_density": float(r.diagnostics["min"].min()), "noise_clipped": list(solver_log.get("clipped", (0, 0.0))),
            "density_end": r.density[-1].tolist(), "theta": th.tolist()}


def token_run(q: float, T: float, n: int) -> dict:
    import spherepde as sp

    s = q * sigma_c()
    rng = np.random.default_rng(1)
    # tokens from f0 = (1 + eps cos theta) / (2 pi): uniform angles (the eps-mode is below the n^-1/2 noise)
    th0 = 2 * np.pi * rng.random(n)
    x0 = np.stack([np.cos(th0), np.sin(th0)], axis=1)
    save = np.linspace(0.0, T, 51)
    t0 = time.perf_counter()
    p = sp.simulate_particles(sp.Attention(np.eye(2), np.eye(2), BETA) + sp.Noise(s), x0, T, 0.02, save_at=save,
                              seed=2)
    wall = time.perf_counter() - t0
    R = np.array([abs(np.mean(x[:, 0] + 1j * x[:, 1])) for x in p.positions])
    tail = save >= 0.8 * T
    return {"ratio": q, "sigma": s, "n": n, "times": save.tolist(), "r": R.tolist(), "r_tail_mean": float(R[tail].mean()),
            "r_tail_sd": float(R[tail].std()), "steps": p.n_steps, "wall_s": wall}


def sigma_c_from_rates(runs) -> tuple[float, float]:
    """(sigma_c, slope): the zero of the least-squares line rate = a + b sigma^2 through the measured linear
    rates of mode 1 (the theory: a = lambda_1, b = -1/2)."""
    ok = [r for r in runs if np.isfinite(r["rate_fit"])]
    if len(ok) < 2:
        return float("nan"), float("nan")
    b, a = np.polyfit([r["sigma"] ** 2 for r in ok], [r["rate_fit"] for r in ok], 1)
    return (float(np.sqrt(-a / b)) if a > 0 > b else float("nan")), float(b)


def criteria(res) -> list[dict]:
    out = []
    sc = res["sigma_c"]
    for r in res["pde"]:
        lab = f"PDE, sigma = {r['ratio']:g} sigma_c"
        err = abs(r["rate_fit"] - r["rate_theory"])
        out.append(C.criterion(f"{lab}: linear rate of mode 1 against lambda_1 - D = {r['rate_theory']:.4f}",
                               r["rate_fit"], f"within {RATE_TOL:.0%} (or 1e-3)",
                               np.isfinite(r["rate_fit"]) and err <= max(RATE_TOL * abs(r["rate_theory"]), 1e-3), ".4f"))
        if r["ratio"] > 1:
            out.append(C.at_most(f"{lab}: stationary state is uniform (r at T)", r["r_end"], R_UNIFORM, ".2e"))
        elif r["ratio"] <= 0.9:  # nearer sigma_c the approach takes longer than T: only the rate is checked
            out.append(C.at_least(f"{lab}: a clustered stationary state (r at T)", r["r_end"], 0.05, ".3f"))
            out.append(C.at_most(f"{lab}: stationary (|r(T) - r(0.8 T)| / r(T))", r["r_drift"] / r["r_end"], 0.01, ".2e"))
        out.append(C.mass_conserved(lab, r["mass_drift"] / 1.0))
        out.append(C.criterion(f"{lab}: density >= 0 (min f)", r["min_density"], ">= 0", r["min_density"] >= 0, ".2e"))
    est, slope = sigma_c_from_rates(res["pde"])
    out.append(C.criterion("critical noise from the PDE's linear rates (zero of rate = a + b sigma^2) against "
                           f"sigma_c = {sc:.4f}", est, f"within {SIGMA_C_TOL:.0%}",
                           np.isfinite(est) and abs(est / sc - 1) <= SIGMA_C_TOL, ".4f"))
    out.append(C.criterion("slope d rate / d sigma^2 against the theory's -1/2", slope, "within 2%",
                           np.isfinite(slope) and abs(slope / -0.5 - 1) <= 0.02, ".4f"))
    for t in res.get("tokens", []):
        pde = next(r for r in res["pde"] if r["ratio"] == t["ratio"])
        lab = f"{t['n']} tokens, sigma = {t['ratio']:g} sigma_c"
        # r of n tokens fluctuates by ~1/sqrt(n) (uniform tokens: mean sqrt(pi / (4 n)) = 0.028 at n = 1000);
        # twice that plus the PDE's grid error (~1e-3)
        tol = 2.0 / np.sqrt(t["n"]) + 0.005
        out.append(C.at_most(f"{lab}: time-averaged r against the PDE's {pde['r_end']:.3f} (|difference|)",
                             abs(t["r_tail_mean"] - pde["r_end"]), tol, ".3f"))
    return out


results_for = C.quick_results(HERE)


def write_md(res, path):
    L = ["# The noisy transformer's phase transition on the circle (beta = 5, B = V = I, softmax)", "",
         f"sigma_c = sqrt(2 I_1(beta) / (beta I_0(beta))) = {res['sigma_c']:.4f}; lambda_1 = {lambda1():.4f}. "
         f"PDE: {CELLS} cells, f0 = (1 + {EPS:g} cos theta) / (2 pi).", "",
         "| sigma / sigma_c | T | rate of mode 1 (fit) | lambda_1 - D | r(T) | drift of r over the last 20 % | steps | wall s |",
         "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in res["pde"]:
        L.append(f"| {r['ratio']:g} | {r['T']:g} | {r['rate_fit']:.4f} | {r['rate_theory']:.4f} | {r['r_end']:.4g} | "
                 f"{r['r_drift']:.2e} | {r['steps']} | {r['wall_s']:.0f} |")
    est, slope = sigma_c_from_rates(res["pde"])
    L += ["", f"Critical noise from the PDE's linear rates (least-squares rate = a + b sigma^2): sigma_c = {est:.4f}, "
          f"b = {slope:.4f} (theory {res['sigma_c']:.4f}, -0.5).", ""]
    if res.get("tokens"):
        L += ["| tokens | sigma / sigma_c | r, mean over the last 20 % | sd | PDE r(T) | steps | wall s |",
              "|---:|---:|---:|---:|---:|---:|---:|"]
        for t in res["tokens"]:
            pde = next(r for r in res["pde"] if r["ratio"] == t["ratio"])
            L.append(f"| {t['n']} | {t['ratio']:g} | {t['r_tail_mean']:.4f} | {t['r_tail_sd']:.4f} | {pde['r_end']:.4f} | "
                     f"{t['steps']} | {t['wall_s']:.0f} |")
    L += ["", f"Total wall time {res['wall_total_s']:.0f} s.", ""]
    Path(path).write_text("\n".join(L))


def plot(res, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 3, figsize=(14, 4))
    for i, r in enumerate(res["pde"]):
        ax[0].semilogy(r["times"], np.maximum(r["r"], 1e-12), color=f"C{i}", label=f"{r['ratio']:g} sigma_c")
    for i, t in enumerate(res.get("tokens", [])):
        ax[0].semilogy(t["times"], t["r"], ":", color="k", lw=0.7)
    ax[0].set_xlabel("t")
    ax[0].set_ylabel("r = |int e^{i theta} f|")
    ax[0].set_title("order parameter (dotted: tokens)", fontsize=9)
    ax[0].legend(fontsize=7)
    q = [r["ratio"] for r in res["pde"]]
    ax[1].plot(q, [r["r_end"] for r in res["pde"]], "o-", label="PDE r(T)")
    if res.get("tokens"):
        ax[1].errorbar([t["ratio"] for t in res["tokens"]], [t["r_tail_mean"] for t in res["tokens"]],
                       [t["r_tail_sd"] for t in res["tokens"]], fmt="s", label=f"{res['tokens'][0]['n']} tokens")
    ax[1].axvline(1.0, color="gray", ls=":")
    ax[1].set_xlabel("sigma / sigma_c")
    ax[1].set_ylabel("r at T (README: which are stationary)")
    ax[1].legend(fontsize=7)
    for i, r in enumerate(res["pde"]):
        th = np.array(r["theta"])
        o = np.argsort(th)
        ax[2].plot(th[o], np.array(r["density_end"])[o], color=f"C{i}", lw=0.9)
    ax[2].set_xlabel("theta")
    ax[2].set_ylabel("f at T (per radian)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", type=float, nargs="+", default=None,
                    help="rerun the PDE at these sigma / sigma_c only and merge them into results.json")
    ap.add_argument("--t-end", type=float, default=None, help="final time of the runs (default 250; quick 150)")
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    T = a.t_end or (QUICK_T if a.quick else T_END)
    if a.only:
        res = json.loads((HERE / "results.json").read_text())
        for q in a.only:
            r = pde_run(q, T)
            print(f"PDE sigma = {q:g} sigma_c: r(T = {T:g}) {r['r_end']:.4g}, {r['wall_s']:.0f} s", flush=True)
            res["pde"] = sorted([x for x in res["pde"] if x["ratio"] != q] + [r], key=lambda x: x["ratio"])
        res["wall_total_s"] = sum(x["wall_s"] for x in res["pde"]) + sum(x["wall_s"] for x in res["tokens"])
        (HERE / "results.json").write_text(json.dumps(res, indent=1))
        write_md(res, HERE / "results.md")
        plot(res, HERE / "noisy_phase_transition.png")
        return 0
    res = {"beta": BETA, "sigma_c": sigma_c(), "T": T, "pde": [], "tokens": []}
    for q in (QUICK_RATIOS if a.quick else RATIOS):
        r = pde_run(q, T)
        print(f"PDE sigma = {q:g} sigma_c: rate {r['rate_fit']:.4f} (theory {r['rate_theory']:.4f}), r(T) "
              f"{r['r_end']:.4g}, {r['steps']} steps, {r['wall_s']:.0f} s", flush=True)
        res["pde"].append(r)
    if not a.quick:
        for q in TOKEN_RATIOS:
            t = token_run(q, T, N_TOKENS)
            print(f"tokens sigma = {q:g} sigma_c: r {t['r_tail_mean']:.4f} +- {t['r_tail_sd']:.4f}, {t['wall_s']:.0f} s",
                  flush=True)
            res["tokens"].append(t)
    res["wall_total_s"] = time.perf_counter() - t0
    C.save_outputs(HERE, "noisy_phase_transition", res, a.quick, write_md, plot)
    return 0


if __name__ == "__main__":
    sys.exit(C.cli("noisy_phase_transition", criteria, main, results_for))
