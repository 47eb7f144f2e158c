"""Appendix C of the paper at density level: gradient-flow cases B = V and B = -V (energy monotonicity),
a non-symmetric V B^T, and a search for a diagonal pair whose terminal phase goes to F_abs rather than F.

- Energy: E_B(rho) = int int exp(beta <x, B y>) drho drho of the grid measure (cell centres, f |C|),
  via ``interaction_energy(..., log=True)``; increasing along the flow for B = V, decreasing for B = -V.
  Monotonicity is checked at every saved time (dt 0.1); the largest violation is reported.
  B = V = diag(-2, 1, 0.5): A = B^2 = diag(4, 1, 0.25), E = span e1 = F_abs, F = span e2.
  B = -V, V = diag(1, 2, 3): A = -V^2 = diag(-1, -4, -9), E = span e1, F = F_abs = span e3 (Fig. 8 type:
  E first, then F while the energy is minimised).
- Non-symmetric: B = diag(-1, -1, 1), V = paper V + 0.5 (e1 e2^T - e2 e1^T): A = V B^T is not symmetric
  (Assumption 1 fails: no Pi#rho_0); alignment with the axes recorded at beta = 30 and beta = inf.
- F_abs search: diagonal pairs with E, F, F_abs three different axes (like the paper's), beta = 30,
  5 % perturbed f0, T = 20, coarse grid; the terminal alignment with F and F_abs is compared, with a
  200-token run of each pair as a cross-check; the pair with the largest F_abs alignment is rerun finer.

Usage: ``python validation/appendix_c/run.py [--quick] [--workers N | --scheduler ADDRESS]``; writes
results.md, results.json, energy.png, nonsym.png, fabs.png (quick: *_quick.*). The density runs are the
members of sweeps on Dask (spherepde.sweep; results files in sweep_runs/, not committed).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from spherepde import (Attention, alignment, interaction_energy, sample_uniform,  # noqa: E402
                       simulate_particles, spectral_data)
from validation import criteria as C  # noqa: E402
from validation.fig3_density.common import (grid_measures, machine, options_record, options_text,  # noqa: E402
                                            run_density_sweep)

D = np.diag
GRADIENT = {
    "B=V": (D([-2.0, 1.0, 0.5]), D([-2.0, 1.0, 0.5]), +1),
    "B=-V": (-D([1.0, 2.0, 3.0]), D([1.0, 2.0, 3.0]), -1),
}
NONSYM = (D([-1.0, -1.0, 1.0]), np.array([[-1.0, 0.5, 0.0], [-0.5, 1.0, 0.0], [0.0, 0.0, -2.0]]))
FABS_PAIRS = {
    "paper B=(-1,-1,1) V=(-1,1,-2)": (D([-1.0, -1.0, 1.0]), D([-1.0, 1.0, -2.0])),
    "B=(-1,-1,1) V=(-1,1,-4)": (D([-1.0, -1.0, 1.0]), D([-1.0, 1.0, -4.0])),
    "B=(-1,-1,0.25) V=(-1,0.5,-2)": (D([-1.0, -1.0, 0.25]), D([-1.0, 0.5, -2.0])),
    "B=(-1,-1,-0.25) V=(-1,1,-2)": (D([-1.0, -1.0, -0.25]), D([-1.0, 1.0, -2.0])),
    "B=(-2,1,-0.25) V=(-1,1,-2)": (D([-2.0, 1.0, -0.25]), D([-1.0, 1.0, -2.0])),
}


def energy_run(name, nside, beta, t_end):
    B, V, _ = GRADIENT[name]
    return {"nside": nside, "B": B, "V": V, "beta": beta, "t_end": t_end,
            "save_at": np.round(np.arange(0.0, t_end + 1e-9, 0.1), 10)}


def energy_case(name, nside, beta, t_end, run):
    B, V, sign = GRADIENT[name]
    save = np.round(np.arange(0.0, t_end + 1e-9, 0.1), 10)
    g, r, wall = run
    logE = np.array([interaction_energy(g.centers, f * g.areas, B, beta, log=True) for f in r.density])
    inc = np.diff(logE) * sign  # should be >= 0
    m = grid_measures(g, r.density, B, V, w2=True)
    rec = {"case": name, "nside": nside, "beta": beta, "t_end": t_end, "times": save.tolist(),
           "logE": logE.tolist(), "expected": "increasing" if sign > 0 else "decreasing",
           "monotone": bool(np.all(inc >= -1e-12 * np.maximum(1, abs(logE[1:])))),
           "worst_violation": float(max(0.0, -inc.min())), "total_change": float(logE[-1] - logE[0]),
           "wall_s": wall, **{k: v.tolist() for k, v in m.items()}}
    print(f"{name} n{nside} beta {beta}: monotone {rec['monotone']} (worst {rec['worst_violation']:.2e}), "
          f"log E {logE[0]:.4f} -> {logE[-1]:.4f}, {wall:.1f} s", flush=True)
    return rec


def axes_alignment(g, density):
    w = density * g.areas[None, :]
    return {f"e{i + 1}": [alignment(g.centers, wi, np.eye(3)[i]) for wi in w] for i in range(3)}


def nonsym_run(nside, beta, t_end):
    B, V = NONSYM
    return {"nside": nside, "B": B, "V": V, "beta": beta, "t_end": t_end,
            "save_at": np.round(np.arange(0.0, t_end + 1e-9, 0.25), 10)}


def nonsym_case(nside, beta, t_end, run):
    B, V = NONSYM
    save = np.round(np.arange(0.0, t_end + 1e-9, 0.25), 10)
    g, r, wall = run
    A = V @ B.T
    ev, evec = np.linalg.eig(A)
    top = np.real(evec[:, np.argmax(np.real(ev))])
    top /= np.linalg.norm(top)
    w = r.density * g.areas[None, :]
    rec = {"nside": nside, "beta": "inf" if beta == np.inf else beta, "times": save.tolist(), "wall_s": wall,
           "A": A.tolist(), "A_eigenvalues": np.real(ev).tolist(), "top_right_eigvec": top.tolist(),
           "align_top_eigvec": [alignment(g.centers, wi, top) for wi in w], **axes_alignment(g, r.density),
           "max_f": r.density.max(axis=1).tolist(),
           "argmax_final": g.centers[int(np.argmax(r.density[-1]))].tolist()}
    print(f"nonsym n{nside} beta {beta}: final e1/e2/e3 {rec['e1'][-1]:.3f}/{rec['e2'][-1]:.3f}/{rec['e3'][-1]:.3f}, "
          f"{wall:.1f} s", flush=True)
    return rec


def fabs_run(name, nside, beta, t_end):
    B, V = FABS_PAIRS[name]
    return {"nside": nside, "B": B, "V": V, "beta": beta, "t_end": t_end,
            "save_at": np.round(np.arange(0.0, t_end + 1e-9, 0.5), 10), "f0": "perturbed"}


def fabs_case(name, nside, beta, t_end, run, particles=True):
    B, V = FABS_PAIRS[name]
    sp = spectral_data(B, V)
    save = np.round(np.arange(0.0, t_end + 1e-9, 0.5), 10)
    g, r, wall = run
    m = grid_measures(g, r.density, B, V, w2=False)
    rec = {"pair": name, "nside": nside, "beta": beta, "times": save.tolist(), "wall_s": wall,
           "E": sp.E.tolist(), "F": sp.F.tolist(), "F_abs": sp.F_abs.tolist(),
           **{k: v.tolist() for k, v in m.items() if k != "W2"}}
    if particles:
        x0 = sample_uniform(200, 3, rng=np.random.default_rng(0))
        pr = simulate_particles(Attention(B, V, beta), x0, t_end, 0.01, save_at=save)
        w = np.full(200, 1 / 200)
        rec["particles"] = {k: [alignment(X, w, getattr(sp, s)) for X in pr.positions]
                            for k, s in (("align_E", "E"), ("align_F", "F"), ("align_Fabs", "F_abs"))}
    fin = rec["align_F"][-1], rec["align_Fabs"][-1]
    rec["terminal"] = "F_abs" if fin[1] > max(fin[0], rec["align_E"][-1]) else (
        "F" if fin[0] > max(fin[1], rec["align_E"][-1]) else "E")
    if particles:
        p = rec["particles"]
        pf = p["align_F"][-1], p["align_Fabs"][-1], p["align_E"][-1]
        rec["terminal_particles"] = ["F", "F_abs", "E"][int(np.argmax(pf))]
    print(f"{name} n{nside}: final E/F/Fabs {rec['align_E'][-1]:.3f}/{fin[0]:.3f}/{fin[1]:.3f} -> {rec['terminal']}"
          f" (tokens: {rec.get('terminal_particles')}), {wall:.1f} s", flush=True)
    return rec


#: A discretisation error of the second-order scheme falls at least 4x per halving of h.
REFINE_FACTOR = 4.0


def _violation(rec) -> float:
    """Largest step of log E_B against the expected direction between saved times (0 if monotone, up to
    rounding 1e-12 |log E|)."""
    logE = np.asarray(rec["logE"])
    inc = np.diff(logE) * (1 if rec["expected"] == "increasing" else -1)
    inc = np.where(inc >= -1e-12 * np.maximum(1, np.abs(logE[1:])), 0.0, inc)
    return float(max(0.0, -inc.min())) if inc.size else 0.0


def _h2(nside) -> float:
    """Squared mean cell width of HEALPix nside: the grid floor of 1 - alignment for a one-cell cluster."""
    return 4 * np.pi / (12 * nside**2)


def criteria(res) -> list[dict]:
    """Criteria of results.json (MODEL.md "Appendix C"; README "What it reproduces" / "Measured").

    - B = -V, each nside and beta: log E_B decreases at every saved time (the flow minimises E_B).
    - B = V, each beta: E_B increases along the flow up to a discretisation error that vanishes as the
      grid is refined: on the plateau the scheme's numerical diffusion makes it drift down very slightly
      (README). Criterion: the finest grid is monotone, or its worst violation is at least 4x (second
      order per halving of h) below the next coarser grid's. With one grid only (quick mode: nside 4, the
      rising phase), strictly monotone.
    - B = V, finest nside and each beta: the limit is Pi#rho_0 (the +-e1 atoms), 1 - align E <= h^2 (a
      one-cell cluster's spread).
    - Non-symmetric V B^T, each beta: the density concentrates on the top right eigenvector of A,
      1 - alignment <= h^2.
    The F-or-F_abs runs are a search (which pairs end where): no criterion.
    """
    out = []
    for case in GRADIENT:
        recs = [r for r in res["energy"] if r["case"] == case]
        for beta in dict.fromkeys(r["beta"] for r in recs):
            rs = sorted((r for r in recs if r["beta"] == beta), key=lambda r: r["nside"])
            viol = [_violation(r) for r in rs]
            label = f"{case}, beta {beta:g}"
            if rs[0]["expected"] == "decreasing" or len(rs) == 1:
                for r, v in zip(rs, viol):
                    out.append(C.at_most(f"{label}, nside {r['nside']}: log E_B {r['expected']} at every saved time "
                                         "(worst step against it)", v, 0.0, ".2e"))
            else:
                fine, coarse = viol[-1], viol[-2]
                ratio = float("inf") if fine == 0 else coarse / fine
                out.append(C.criterion(
                    f"{label}: log E_B increasing up to a discretisation error, worst violation nside "
                    f"{rs[-2]['nside']} / nside {rs[-1]['nside']} ({coarse:.2e} / {fine:.2e})",
                    ratio, f">= {REFINE_FACTOR:g} (or 0 at the finest)", ratio >= REFINE_FACTOR, ".3g"))
            if rs[0]["expected"] == "increasing":
                r = rs[-1]
                out.append(C.at_most(f"{label}, nside {r['nside']}: limit Pi#rho_0 on E, 1 - final align E "
                                     f"(h^2 = {_h2(r['nside']):.2e})", 1 - r["align_E"][-1], _h2(r["nside"]), ".2e"))
    for r in res["nonsym"]:
        out.append(C.at_most(f"non-symmetric, beta {r['beta']}, nside {r['nside']}: 1 - final alignment with the "
                             f"top right eigenvector of A (h^2 = {_h2(r['nside']):.2e})", 1 - r["align_top_eigvec"][-1],
                             _h2(r["nside"]), ".2e"))
    return out


def results_for(argv) -> Path:
    """The results JSON a run with these arguments writes."""
    return HERE / ("results_quick.json" if "--quick" in argv else "results.json")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--check-only", action="store_true",
                    help="evaluate the criteria of the results JSON on disk (no run); exit 1 if one fails")
    ap.add_argument("--results", default=None, help="with --check-only: this results JSON")
    eng = ap.add_mutually_exclusive_group()
    eng.add_argument("--workers", type=int, default=None, help="LocalCluster workers (default: one per core)")
    eng.add_argument("--scheduler", default=None, help="a running Dask scheduler (or DASK_SCHEDULER_ADDRESS)")
    a = ap.parse_args(argv)
    q = a.quick
    sfx = "_quick" if q else ""
    t0 = time.perf_counter()
    res = {"study": "appendix_c", "machine": machine(),
           "options": options_record()}
    # every density run of the study as the members of sweeps on Dask (the F_abs confirmation run depends
    # on the search's result: a second sweep)
    eng = {"workers": a.workers, "scheduler": a.scheduler}
    energy = [(name, n, beta, 1.0 if q else 10.0)
              for name in GRADIENT for n in ((4,) if q else (8, 16)) for beta in ((10.0,) if q else (10.0, 30.0))]
    nonsym = [] if q else [(16, b, 10.0) for b in (30.0, np.inf)]
    fabs = [] if q else [(name, 8, 30.0, 20.0) for name in FABS_PAIRS]
    runs = [energy_run(*c) for c in energy] + [nonsym_run(*c) for c in nonsym] + [fabs_run(*c) for c in fabs]
    done = run_density_sweep("appendix_c" + sfx, runs, HERE / "sweep_runs" / ("appendix_c" + sfx), **eng)
    ie, inn = len(energy), len(energy) + len(nonsym)
    res["energy"] = [energy_case(*c, run) for c, run in zip(energy, done[:ie])]
    res["nonsym"] = [nonsym_case(*c, run) for c, run in zip(nonsym, done[ie:inn])]
    res["fabs"] = [fabs_case(*c, run) for c, run in zip(fabs, done[inn:])]
    if fabs:
        best = max(res["fabs"], key=lambda r: r["align_Fabs"][-1])
        c = (best["pair"], 16, 30.0, 20.0)
        run = run_density_sweep("appendix_c_confirm", [fabs_run(*c)], HERE / "sweep_runs" / "appendix_c_confirm",
                                **eng)[0]
        res["fabs_confirm"] = fabs_case(*c, run, particles=False)
    res["wall_total_s"] = time.perf_counter() - t0
    (HERE / f"results{sfx}.json").write_text(json.dumps(res))
    write_md(res, sfx)
    figures(res, sfx)
    return res


def write_md(res, sfx):
    L = ["# Appendix C at density level", "", f"Machine: {res['machine']}; total {res['wall_total_s']:.0f} s; "
         f"HEALPix, {options_text()}.", "",
         "## Gradient-flow cases: log E_B of the grid measure along the flow (saved every 0.1)", "",
         "![energy](energy%s.png)" % sfx, "",
         "| case | nside | beta | expected | monotone | worst violation (log E) | log E(0) -> log E(T) | final align E / F | wall s |",
         "|---|---|---|---|---|---|---|---|---|"]
    for r in res["energy"]:
        L.append(f"| {r['case']} | {r['nside']} | {r['beta']:g} | {r['expected']} | {r['monotone']} | "
                 f"{r['worst_violation']:.2e} | {r['logE'][0]:.4f} -> {r['logE'][-1]:.4f} | "
                 f"{r['align_E'][-1]:.3f} / {r['align_F'][-1]:.3f} | {r['wall_s']:.0f} |")
    if res["nonsym"]:
        r0 = res["nonsym"][0]
        L += ["", "## Non-symmetric V B^T", "",
              f"A = V B^T = {np.round(r0['A'], 3).tolist()}, eigenvalues {np.round(r0['A_eigenvalues'], 4).tolist()}, "
              f"top right eigenvector {np.round(r0['top_right_eigvec'], 4).tolist()}.", "",
              "![nonsym](nonsym%s.png)" % sfx, "",
              "| beta | nside | final align e1 / e2 / e3 | final align top eigvec of A | argmax f (final) | wall s |",
              "|---|---|---|---|---|---|"]
        for r in res["nonsym"]:
            L.append(f"| {r['beta']} | {r['nside']} | {r['e1'][-1]:.3f} / {r['e2'][-1]:.3f} / {r['e3'][-1]:.3f} | "
                     f"{r['align_top_eigvec'][-1]:.3f} | {np.round(r['argmax_final'], 3).tolist()} | {r['wall_s']:.0f} |")
    if res["fabs"]:
        L += ["", "## Terminal phase: F or F_abs? (beta = 30, perturbed f0, T = 20)", "", "![fabs](fabs%s.png)" % sfx, "",
              "| pair | nside | final align E / F / F_abs (density) | terminal (density) | tokens final E / F / F_abs | terminal (tokens) |",
              "|---|---|---|---|---|---|"]
        for r in res["fabs"] + [res["fabs_confirm"]]:
            p = r.get("particles")
            ps = f"{p['align_E'][-1]:.3f} / {p['align_F'][-1]:.3f} / {p['align_Fabs'][-1]:.3f}" if p else "-"
            L.append(f"| {r['pair']} | {r['nside']} | {r['align_E'][-1]:.3f} / {r['align_F'][-1]:.3f} / "
                     f"{r['align_Fabs'][-1]:.3f} | {r['terminal']} | {ps} | {r.get('terminal_particles', '-')} |")
    (HERE / f"results{sfx}.md").write_text("\n".join(L) + "\n")


def figures(res, sfx):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    for ax, name in zip(axes, GRADIENT):
        for r in res["energy"]:
            if r["case"] == name:
                ax.plot(r["times"], np.array(r["logE"]) - r["logE"][0], label=f"nside {r['nside']}, beta {r['beta']:g}")
        ax.set_title(f"{name}: log E_B(rho_t) - log E_B(rho_0)", fontsize=9)
        ax.set_xlabel("t")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(HERE / f"energy{sfx}.png", dpi=90)
    plt.close(fig)
    if res["nonsym"]:
        fig, ax = plt.subplots(figsize=(6, 3.8))
        for r, ls in zip(res["nonsym"], ("-", "--")):
            for i, c in enumerate("brg"):
                ax.plot(r["times"], r[f"e{i + 1}"], c + ls, label=f"beta {r['beta']}: align e{i + 1}")
        ax.set_xlabel("t")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(HERE / f"nonsym{sfx}.png", dpi=90)
        plt.close(fig)
    if res["fabs"]:
        n = len(res["fabs"])
        fig, axes = plt.subplots(1, n, figsize=(3.3 * n, 3.3), sharey=True)
        for ax, r in zip(axes, res["fabs"]):
            for k, c in (("align_E", "b"), ("align_F", "r"), ("align_Fabs", "g")):
                ax.plot(r["times"], r[k], c, label=f"density {k}")
                ax.plot(r["times"], r["particles"][k], c + ":", label=f"tokens {k}")
            ax.set_title(r["pair"], fontsize=7)
            ax.set_xlabel("t")
        axes[0].legend(fontsize=6)
        fig.tight_layout()
        fig.savefig(HERE / f"fabs{sfx}.png", dpi=80)
        plt.close(fig)


if __name__ == "__main__":
    sys.exit(C.cli("appendix_c", criteria, main, results_for))
