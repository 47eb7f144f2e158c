"""What sets the second stage's "order log beta": the stall's seed shrinks in the collapse (issue #17 items 2-4).

``law.py`` finds that each token run's second stage t_EF - t_exit follows c(beta) + log(1 / |eps_stall|), with
eps_stall = 3 mean(x2) of the initial tokens (the first moment along e2, which the translation out of the stall
grows at rate 1), and that the intercept c(beta) grows by ~0.5 per e-fold of beta (2.35 at beta 3 to 4.75 at
300). The two-cluster reduction has no such growth (its stall exit has a beta-independent intercept:
``validation/cluster_dynamics``). The hypothesis checked here: the seed the stall receives is not the initial
moment but what is left of it when the pair reaches the stall, and the collapse into clusters shrinks it by a
factor r(beta) that falls with beta. Then c(beta) - log(1 / r(beta)) is one constant c0 for every beta, and the
second stage measured from the seed at the exit, 3 mean(x2) at t_exit, is c0 + log(1 / |3 mean(x2)(t_exit)|).

This reruns law.py's token runs at n = 1000 (the same draws, Algorithm 1 with Euler dt 0.01, the same certified
field: t_exit and t_EF agree with law.json's to rounding, which the criteria check) and records the tokens' mean
vector every 0.25 time units: r = mean(x2)(t_exit) / mean(x2)(0) per run. Writes stall_seed.json, stall_seed.md
and stall_seed.png. Seconds a run (beta <= 100), ~20 s at beta 300; ~10 minutes in all on one core.

Usage: python validation/token_ensembles/stall_seed.py [--betas 3 10 30 100 300] [--seeds 20] [--n 1000]
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from spherepde import alignment, simulate_particles  # noqa: E402
from spherepde.diagnostics import exit_time, transition_time  # noqa: E402

BETAS = (3.0, 10.0, 30.0, 100.0, 300.0)
SEEDS = 20
N = 1000
#: the bar on the spread over beta of c(beta) - mean log(1 / |r|): c itself spans 2.4 from beta 3 to 300, and
#: each beta's c is a mean over 20 runs with a standard error of 0.1-0.17 (law.md), so 0.4 is about two
#: standard errors of a difference, and a fifth of the range the hypothesis has to explain
SPREAD_BAR = 0.4


def t_end(beta: float) -> float:
    """law.py's T at this beta: the study's 30 at beta >= 100 (t_EF comes later), 20 below."""
    return 30.0 if beta >= 100.0 else 20.0


def one(beta: float, seed: int, n: int = N) -> dict:
    """One run of law.py's ensemble (``run.one_run``'s draw and algorithm), with the tokens' mean vector."""
    from validation.token_ensembles.run import DT, draw

    T = t_end(beta)
    save, x0, model, sd, w = draw(n, seed, T, beta=beta)
    pr = simulate_particles(model, x0, T, DT, save_at=save)
    m = np.array([X.mean(axis=0) for X in pr.positions])
    aE = [alignment(X, w, sd.E) for X in pr.positions]
    aF = [alignment(X, w, sd.F) for X in pr.positions]
    te, tf = exit_time(save, aE), transition_time(save, aE, aF)
    m2x = float(np.interp(te, save, m[:, 1])) if np.isfinite(te) else float("nan")
    return {"beta": beta, "seed": seed, "n": n, "t_exit": te, "t_EF": tf, "m2_0": float(m[0, 1]), "m2_exit": m2x,
            "r": m2x / float(m[0, 1]), "times": save.tolist(), "mean": m.tolist()}


def analyse(runs: list, law: dict | None) -> list:
    """Per beta: the geometric-mean shrink factor, the tokens' second-stage intercept at slope 1 from the same
    runs (a mean: nothing fitted), c - mean log(1 / |r|), and the second stage against the seed at the exit."""
    out = []
    for beta in sorted({r["beta"] for r in runs}):
        rs = [r for r in runs if r["beta"] == beta and np.isfinite(r["t_EF"]) and np.isfinite(r["t_exit"])]
        if len(rs) < 2:
            continue
        G = np.array([r["t_EF"] - r["t_exit"] for r in rs])
        L0 = np.array([math.log(1.0 / abs(3.0 * r["m2_0"])) for r in rs])
        Lx = np.array([math.log(1.0 / abs(3.0 * r["m2_exit"])) for r in rs])
        lr = L0 - Lx  # log |r|
        c = float(np.mean(G - L0))
        c0 = G - Lx
        slope_x = float(np.polyfit(Lx, G, 1)[0])
        q = {"beta": beta, "runs": len(rs), "of": sum(r["beta"] == beta for r in runs),
             "r_geomean": float(np.exp(np.mean(lr))), "log_r_std": float(np.std(lr)),
             "sign_kept": int(sum(r["r"] > 0 for r in rs)),
             "c": c, "c_sem": float(np.std(G - L0) / math.sqrt(len(rs))),
             "c0": float(np.mean(c0)), "c0_sem": float(np.std(c0) / math.sqrt(len(rs))),
             "corr_initial": float(np.corrcoef(L0, G)[0, 1]), "corr_exit": float(np.corrcoef(Lx, G)[0, 1]),
             "slope_exit": slope_x, "rms_c0": float(np.std(c0)), "rms_c": float(np.std(G - L0))}
        if law is not None:  # the same runs in law.json (law.py's cache): their times, to rounding
            by = {(r["n"], r["seed"]): r for b in law["betas"] if b["beta"] == beta for r in b["runs"]}
            d = [max(abs(r["t_exit"] - by[(r["n"], r["seed"])]["t_exit"]),
                     abs(r["t_EF"] - by[(r["n"], r["seed"])]["t_EF"])) for r in rs if (r["n"], r["seed"]) in by]
            q["matched"] = len(d)
            q["max_time_difference"] = float(max(d)) if d else None
        out.append(q)
    return out


def criteria(res: dict) -> list:
    from validation import criteria as C

    per = res["per_beta"]
    out = []
    if len(per) >= 2:
        c0 = [q["c0"] for q in per]
        cc = [q["c"] for q in per]
        out.append(C.criterion("stall_seed.py: the second-stage intercept c(beta) grows with beta (" + ", ".join(
            f"{q['beta']:g}: {q['c']:.2f}" for q in per) + ")", all(a < b for a, b in zip(cc, cc[1:])), "increasing",
            all(a < b for a, b in zip(cc, cc[1:]))))
        out.append(C.at_most("stall_seed.py: spread over beta of c(beta) - mean log(1 / |r(beta)|), the intercept "
                             "from the seed left at the exit (" + ", ".join(f"{q['beta']:g}: {q['c0']:.2f}" for q in per)
                             + f"; c itself spans {max(cc) - min(cc):.2f})", max(c0) - min(c0), SPREAD_BAR, ".2f"))
    for q in per:
        if q.get("max_time_difference") is not None:
            out.append(C.at_most(f"stall_seed.py, beta {q['beta']:g}: |t - law.json's t| of the same runs "
                                 f"({q['matched']} runs)", q["max_time_difference"], 1e-9, ".1e"))
    return out


def write_md(res: dict):
    per = res["per_beta"]
    L = ["# The stall's seed shrinks in the collapse (validation/token_ensembles/stall_seed.py)", "",
         f"Algorithm 1 (Euler, dt 0.01), the paper matrices, n = {res['n']} uniform tokens, seeds 0-{res['seeds'] - 1} "
         "(law.py's runs), the tokens' mean vector every 0.25. r = mean(x2)(t_exit) / mean(x2)(0): what is left of the "
         "stall's seed when the pair leaves E. c: the tokens' second-stage intercept at slope 1, mean(t_EF - t_exit "
         "- log(1 / |3 mean(x2)(0)|)); c0: the same from the seed at the exit, mean(t_EF - t_exit - log(1 / |3 "
         "mean(x2)(t_exit)|)) = c - mean log(1 / |r|). Means over the runs that reach F by T; nothing fitted.", "",
         "| beta | runs (reached F) | r: geometric mean (std of log r) | sign kept | c (+- se) | c0 (+- se) | "
         "corr(stage, log 1/|seed|): initial / at the exit | slope against the seed at the exit | rms about c / c0 |",
         "|---|---|---|---|---|---|---|---|---|"]
    for q in per:
        L.append(f"| {q['beta']:g} | {q['of']} ({q['runs']}) | {q['r_geomean']:.3f} ({q['log_r_std']:.2f}) | "
                 f"{q['sign_kept']} of {q['runs']} | {q['c']:.2f} +- {q['c_sem']:.2f} | {q['c0']:.2f} +- {q['c0_sem']:.2f} | "
                 f"{q['corr_initial']:.2f} / {q['corr_exit']:.2f} | {q['slope_exit']:.2f} | "
                 f"{q['rms_c']:.2f} / {q['rms_c0']:.2f} |")
    if len(per) >= 2:
        lb = np.log([q["beta"] for q in per])
        lr = -np.log([q["r_geomean"] for q in per])
        s = float(np.polyfit(lb, lr, 1)[0])
        res["shrink_slope"] = s
        L += ["", f"log(1 / r) against log(beta): slope {s:.3f} (least squares over the betas), i.e. r ~ beta^(-{s:.2f}); "
              f"c0 ranges {min(q['c0'] for q in per):.2f}-{max(q['c0'] for q in per):.2f} where c ranges "
              f"{min(q['c'] for q in per):.2f}-{max(q['c'] for q in per):.2f}."]
    (HERE / "stall_seed.md").write_text("\n".join(L) + "\n")


def figure(res: dict, runs: list):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 2, figsize=(11.5, 4.3))
    for i, beta in enumerate(sorted({r["beta"] for r in runs})):
        rs = [r for r in runs if r["beta"] == beta]
        t = np.array(rs[0]["times"])
        ratio = np.array([np.array(r["mean"])[:, 1] / r["m2_0"] for r in rs])
        ax[0].plot(t, np.median(np.abs(ratio), axis=0), color=f"C{i}", label=f"beta {beta:g}")
        ax[0].plot(t, np.percentile(np.abs(ratio), 25, axis=0), color=f"C{i}", lw=0.5, ls=":")
        ax[0].plot(t, np.percentile(np.abs(ratio), 75, axis=0), color=f"C{i}", lw=0.5, ls=":")
        te = np.median([r["t_exit"] for r in rs])
        ax[0].axvline(te, color=f"C{i}", lw=0.6, ls="--")
    ax[0].set_yscale("log")
    ax[0].set_xlim(0, 16)
    ax[0].set_xlabel("t")
    ax[0].set_ylabel("|mean(x2)(t) / mean(x2)(0)|: median (quartiles dotted)")
    ax[0].set_title("the stall's seed through the collapse (dashed: median t_exit)", fontsize=9)
    ax[0].legend(fontsize=7)
    per = res["per_beta"]
    b = [q["beta"] for q in per]
    ax[1].plot(b, [q["c"] for q in per], "o-", label="c: intercept from the initial seed 3 mean(x2)(0)")
    ax[1].plot(b, [q["c0"] for q in per], "s-", label="c0 = c - log(1 / r): from the seed left at t_exit")
    ax[1].plot(b, [-math.log(q["r_geomean"]) for q in per], "^--", label="log(1 / r)")
    ax[1].set_xscale("log")
    ax[1].set_xlabel("beta")
    ax[1].set_ylabel("time")
    ax[1].set_title(f"n = {res['n']}, {res['seeds']} seeds a beta", fontsize=9)
    ax[1].legend(fontsize=7)
    fig.suptitle("The second stage's log(beta): the collapse shrinks the stall's seed by r(beta)", fontsize=10)
    fig.tight_layout()
    fig.savefig(HERE / "stall_seed.png", dpi=110)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--betas", type=float, nargs="+", default=list(BETAS))
    ap.add_argument("--seeds", type=int, default=SEEDS)
    ap.add_argument("--n", type=int, default=N)
    a = ap.parse_args(argv)
    runs = []
    for beta in a.betas:
        for s in range(a.seeds):
            r = one(beta, s, a.n)
            runs.append(r)
            print(f"beta {beta:g} seed {s}: t_exit {r['t_exit']:.2f}, t_EF {r['t_EF']:.2f}, r {r['r']:+.3f}", flush=True)
    lawp = HERE / "law.json"
    law = json.loads(lawp.read_text()) if lawp.exists() else None
    res = {"n": a.n, "seeds": a.seeds, "per_beta": analyse(runs, law),
           "runs": [{k: v for k, v in r.items() if k not in ("times", "mean")} for r in runs]}
    write_md(res)
    figure(res, runs)
    (HERE / "stall_seed.json").write_text(json.dumps(res, indent=1))
    print((HERE / "stall_seed.md").read_text())
    for c in criteria(res):
        print(c)
    return 0


if __name__ == "__main__":
    sys.exit(main())
