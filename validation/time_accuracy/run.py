"""Time accuracy of the paper's runs: a tolerance ladder against a tight reference (issue #15).

``python validation/time_accuracy/run.py [--quick]`` writes results.md and results.json beside this file
and exits non-zero when a criterion fails.

1. The paper setting (beta = 100, B = diag(-1,-1,1), V = diag(-1,1,-2), field recomputed at most every 8
   steps, T = 20) on HEALPix nside 16, uniform and 5 %-perturbed f0 (fig3_density's), run with fixed CFL
   steps (the scheme before error control, SSP-RK2, SSP-RK3 and SSP-RK(4,3)), with the default error
   control (SSP-RK(4,3), rtol 1e-3), SSP-RK3 at rtol 1e-3 (the default before SSP-RK(4,3)), both at rtol
   1e-2, SSP-RK2 at rtol 1e-3, against SSP-RK3 at rtol 1e-5. For each:
   steps, rejected attempts, wall time, the largest L1 distance (mass fraction) to the reference over
   the saved times, and the observables of Figure 4 (final alignment with E, t_exit, t_EF, min W2).
2. The linear growth rate of a small mode of the uniform state (issue #15's reproducer: B = V = I,
   beta = 10, perturbation 1e-4 (3 z^2 - 1), nside 16): default against a tiny fixed step, and the
   one-step answer of the CFL bound alone.

Criteria: (a) the default is within 2e-3 (L1, mass fraction) of the reference at every saved time and
within 1 % of it in t_exit and t_EF where they occur; (b) the growth rate of the default within rel. 1e-3
of the tiny-step reference. The spatial error at this resolution is far larger (the nside 32 / 64 runs of
fig4_concentration differ by tens of percent in t_exit), so (a) says the time error is negligible there.
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

import spherepde as sp  # noqa: E402
from validation import criteria as C  # noqa: E402
from validation.fig3_density.common import (PAPER_B, PAPER_V, grid_measures, machine,  # noqa: E402
                                            perturbed_uniform, transition_time)
from validation.fig4_concentration.run import exit_time  # noqa: E402

VARIANTS = {  # name -> solver options (on top of field_interval = 8)
    "fixed CFL, ssprk2 (before #15)": dict(stepper="ssprk2", error_control=False),
    "fixed CFL, ssprk3": dict(stepper="ssprk3", error_control=False),
    "fixed CFL, ssprk43": dict(stepper="ssprk43", error_control=False),
    "default: ssprk43, rtol 1e-3": dict(),
    "ssprk3, rtol 1e-3 (default before SSP-RK(4,3))": dict(stepper="ssprk3"),
    "ssprk43, rtol 1e-2": dict(rtol=1e-2),
    "ssprk3, rtol 1e-2": dict(stepper="ssprk3", rtol=1e-2),
    "ssprk2, rtol 1e-3": dict(stepper="ssprk2"),
    "reference: ssprk3, rtol 1e-5": dict(stepper="ssprk3", rtol=1e-5),
}
REF = "reference: ssprk3, rtol 1e-5"
DEFAULT = "default: ssprk43, rtol 1e-3"


def ladder(nside, f0_kind, t_end, quick):
    g = sp.HealpixGrid(nside)
    model = sp.Attention(PAPER_B, PAPER_V, 100.0, tol=1e-10)
    f0 = np.full(g.n_cells, 1 / (4 * np.pi)) if f0_kind == "uniform" else perturbed_uniform(g.centers)
    save = np.round(np.arange(0.0, t_end + 1e-9, 0.25), 10)
    runs = {}
    names = [DEFAULT, REF, "fixed CFL, ssprk2 (before #15)"] if quick else list(VARIANTS)
    for name in names:
        t0 = time.perf_counter()
        r = sp.solve(g, model, f0, t_end, save_at=save, field_interval=8, **VARIANTS[name])
        wall = time.perf_counter() - t0
        m = grid_measures(g, r.density, PAPER_B, PAPER_V)
        runs[name] = {"steps": r.n_steps, "rejected": int(r.diagnostics["rejected"].sum()), "wall_s": wall,
                      "density": r.density, "align_E": m["align_E"], "align_F": m["align_F"], "W2": m["W2"],
                      "t_exit": exit_time(save, m["align_E"]), "t_EF": transition_time(save, m["align_E"], m["align_F"]),
                      "min_W2": float(np.min(m["W2"]))}
        print(f"nside {nside} {f0_kind} {name}: {r.n_steps} steps, {wall:.1f} s", flush=True)
    ref = runs[REF]
    rows = []
    for name, r in runs.items():
        dist = max(float(np.abs(a - b) @ g.areas) for a, b in zip(r["density"], ref["density"]))
        rows.append({"variant": name, "steps": r["steps"], "rejected": r["rejected"], "wall_s": r["wall_s"],
                     "max_L1_to_ref": dist, "final_align_E": float(r["align_E"][-1]),
                     "t_exit": r["t_exit"], "t_EF": r["t_EF"], "min_W2": r["min_W2"]})
    return {"nside": nside, "f0": f0_kind, "t_end": t_end, "rows": rows}


def growth_rate(nside):
    g = sp.HealpixGrid(nside)
    model = sp.Attention(np.eye(3), np.eye(3), 10.0)
    f0 = g.cell_average(lambda x: (1 + 1e-4 * (3 * x[:, 2] ** 2 - 1)) / (4 * np.pi))
    save = [0.0, 1.0, 2.0]

    def rate(r):
        a = [float(np.abs(f - g.mass(f) / (4 * np.pi)) @ g.areas) for f in r.density[1:]]
        return float(np.log(a[1] / a[0]))

    out = {}
    for name, kw in {"default": {}, "tiny fixed step 1e-3": dict(error_control=False, max_dt=1e-3),
                     "CFL bound alone (before #15)": dict(error_control=False, stepper="ssprk2")}.items():
        r = sp.solve(g, model, f0, 2.0, save_at=save, **kw)
        out[name] = {"steps": r.n_steps, "rate": rate(r)}
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--check-only", action="store_true",
                    help="evaluate the criteria of the results JSON on disk (no run); exit 1 if one fails")
    ap.add_argument("--results", default=None, help="with --check-only: this results JSON")
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    nside, t_end = (8, 5.0) if a.quick else (16, 20.0)
    res = {"study": "time_accuracy", "machine": machine(), "quick": a.quick,
           "ladders": [ladder(nside, f0, t_end, a.quick) for f0 in ("uniform", "perturbed")],
           "growth": growth_rate(8 if a.quick else 16)}
    res["wall_total_s"] = time.perf_counter() - t0
    res["checks"] = criteria(res)
    (HERE / ("results_quick.json" if a.quick else "results.json")).write_text(json.dumps(res, indent=1))
    write_md(res, "_quick" if a.quick else "")
    ok = C.exit_status(res["checks"]) == 0
    print("time_accuracy:", "PASS" if ok else "FAIL")
    return 0 if ok else 1


def criteria(res) -> list[dict]:
    """Criteria (a) and (b) of the module docstring, from results.json.

    (a) per f0: the default (SSP-RK(4,3), rtol 1e-3) is within 2e-3 (L1, mass fraction) of the rtol 1e-5
    reference at every saved time, and within 1 % of it in t_exit and t_EF where the reference has them;
    (b) the growth rate of the small mode under the default within rel. 1e-3 of the tiny fixed step.
    """
    out = []
    for lad in res["ladders"]:
        rows = {r["variant"]: r for r in lad["rows"]}
        d, ref = rows[DEFAULT], rows[REF]
        out.append(C.at_most(f"{lad['f0']}: default within 2e-3 of the reference (max L1 over saved times)",
                             d["max_L1_to_ref"], 2e-3, ".3e"))
        for k in ("t_exit", "t_EF"):
            if ref[k] is not None and np.isfinite(ref[k]):
                rel = abs(d[k] - ref[k]) / ref[k] if d[k] is not None and np.isfinite(d[k]) else float("inf")
                out.append(C.at_most(f"{lad['f0']}: default {k} within 1 % of the reference", rel, 0.01, ".3e"))
    gr = res["growth"]
    tiny = gr["tiny fixed step 1e-3"]["rate"]
    rel = abs(gr["default"]["rate"] - tiny) / abs(tiny)
    out.append(C.at_most("growth rate of the small mode within rel. 1e-3 of the tiny step", rel, 1e-3, ".3e"))
    return out


def results_for(argv) -> Path:
    """The results JSON a run with these arguments writes."""
    return HERE / ("results_quick.json" if "--quick" in argv else "results.json")


def _f(x, fmt="{:.3f}"):
    return fmt.format(x) if np.isfinite(x) else "-"


def write_md(res, sfx):
    L = ["# Time accuracy of the paper's runs (issue #15)", "",
         f"Machine: {res['machine']}; total {res['wall_total_s']:.0f} s. Paper matrices, beta = 100, HEALPix, "
         "field recomputed at most every 8 steps, saved every 0.25. Distances are L1 (mass fractions) to the "
         "reference run, the largest over the saved times.", ""]
    for lad in res["ladders"]:
        L += [f"## nside {lad['nside']}, {lad['f0']} f0, T = {lad['t_end']:g}", "",
              "| variant | steps | rejected | wall s | max L1 to reference | final align E | t_exit | t_EF | min W2 |",
              "|---|---|---|---|---|---|---|---|---|"]
        for r in lad["rows"]:
            L.append(f"| {r['variant']} | {r['steps']} | {r['rejected']} | {r['wall_s']:.1f} | {r['max_L1_to_ref']:.2e} | "
                     f"{r['final_align_E']:.4f} | {_f(r['t_exit'])} | {_f(r['t_EF'])} | {r['min_W2']:.4f} |")
        L.append("")
    gr = res["growth"]
    L += ["## Linear growth of a small mode of the uniform state (B = V = I, beta = 10, eps = 1e-4)", "",
          "| run | steps | growth rate ln(a(2)/a(1)) |", "|---|---|---|"]
    for k, v in gr.items():
        L.append(f"| {k} | {v['steps']} | {v['rate']:.6f} |")
    L += ["", C.section(criteria(res))]
    (HERE / f"results{sfx}.md").write_text("\n".join(L) + "\n")


if __name__ == "__main__":
    sys.exit(C.cli("time_accuracy", criteria, main, results_for))
