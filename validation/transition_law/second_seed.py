"""The "second seed" at the exit at beta 100: the equation's, or the grid's? (issue #17 items 2-4)

After the exit from E at beta >= 100, the density's stall seed mean(x2) (the translation of both clusters along
e2) does not grow from what the collapse left of it, as the tokens' does. At beta 100, eps 1e-3 it went from
3.8e-5 to 0.022 in 2 time units, and at beta 300, eps 1e-2 it changed sign (`token_ensembles/README.md`). That
was recorded as a second seed of the same class, not explained.

The test here uses the symmetry. The paper's B and V are diagonal, so the equation is equivariant under
x -> -x. The perturbed f0 is 1 + eps (x1 x2 + x2 + x3 x1 / 2). Its only part that is odd under x -> -x is
b x2, with b = eps. Under the equation, odd moments such as mean(x2) come from b alone, and they do so at
every order: with b = 0 the density stays even and mean(x2) stays 0. So the study runs Figure 4's setting at
beta 100 (eps 0.05, attended refinement on nside 32 base cells, ``[initial] type = "quadratic"`` with the
even part of f0 and the odd part b x2) for three values of b: 0, eps / 10 and eps. It does this on two finest
levels, and splits mean(x2) of every saved state into the two clusters (cells within 0.1 rad of +-c, c the
principal axis of the second moment) and the rest.

- With b = 0, mean(x2) must stay at round-off if the discrete scheme keeps the symmetry. The HEALPix grid is
  antipodally symmetric.
- Where the equation's linear dynamics carries the seed, mean(x2) / b is the same curve for b = eps / 10 and
  for b = eps.
- If the grid moves the clusters, what mean(x2) does after the exit depends on b nonlinearly, and its size
  follows the cell.

Writes second_seed.md, second_seed.json and second_seed.png beside this file. The runs go in
``sweep_runs/seed_*`` (not committed; a run there is resumed or reused).

Usage: python validation/transition_law/second_seed.py [--levels 128 256] [--b 0 0.005 0.05] [--t-end 11]
       [--report-only]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
EPS = 0.05
BETA = 100.0
NSIDE_MIN = 32  # Figure 4's base level at this beta (FALLBACK_LADDERS[0]); --nside-min: the tails' resolution
CLUSTER_RADIUS = 0.1  # rad: the clusters' cells (at beta 100 the tails beyond hold < 1e-2 of the mass after t = 4)
#: The drift's sources: all cells, then only those holding at least these fractions of the heaviest cell's mass.
CUTS = (0.0, 1e-9, 1e-6)
#: Where the drift is read: the saved times nearest t_exit plus these.
DRIFT_AT = (-0.25, 0.0, 0.25, 0.5, 1.0)


def run_name(nside_max: int, b: float, nside_min: int = NSIDE_MIN) -> str:
    """A run's name and directory: seed_<nside_max>_b<b over eps, its "0." written "0">: seed_256_b1 for b = eps,
    seed_256_b01 for eps / 10, seed_256_b0 for 0; "_min64" added for a base level other than NSIDE_MIN."""
    return (f"seed_{nside_max}_b{b / EPS:g}".replace("b0.", "b0")
            + ("" if nside_min == NSIDE_MIN else f"_min{nside_min}"))


def config(nside_max: int, b: float, t_end: float, nside_min: int = NSIDE_MIN) -> dict:
    """Figure 4's beta 100 setting with f0 = 1 + eps (x1 x2 + x3 x1 / 2) + b x2 (over 4 pi): the perturbed f0 for b = eps."""
    from validation.fig4_concentration.adaptive import FALLBACK_LADDERS

    grid = dict(FALLBACK_LADDERS[0], type="adaptive", nside_max=int(nside_max), nside_min=int(nside_min))
    q12, q13 = EPS / 2, EPS / 4  # x^T Q x = eps x1 x2 + eps x1 x3 / 2
    return {"name": run_name(nside_max, b, nside_min), "grid": grid,
            "model": {"type": "attention", "B": "paper", "V": "paper", "beta": BETA, "tol": 1e-10},
            "time": {"t_end": float(t_end), "save_every": 0.25},
            "initial": {"type": "quadratic", "Q": [[0.0, q12, q13], [q12, 0.0, 0.0], [q13, 0.0, 0.0]],
                        "b": [0.0, float(b), 0.0], "sample": "average"},
            "scheme": {"cfl": 0.8, "field_interval": 10},
            "output": {"checkpoint_every": 30.0, "plots": []}}


def split(result) -> list[dict]:
    """Per saved state: t, its mass, mean(x2), its clusters' and tails' parts, the tails' mass, each cluster's
    centroid x2, the clusters' axis c and align E (``spherepde.diagnostics.alignment`` with the E of the paper's
    B and V at the cell centres, as the runs' concentration diagnostics have it)."""
    from spherepde.config import MATRIX_PRESETS
    from spherepde.diagnostics import alignment
    from spherepde.spectral import spectral_data

    E = spectral_data(MATRIX_PRESETS["paper"]["B"], MATRIX_PRESETS["paper"]["V"]).E
    rows = []
    for i, t in enumerate(result.times):
        g = result.grid_at(i)
        w = np.asarray(result.density[i]) * g.areas
        x = g.xbar / np.linalg.norm(g.xbar, axis=1)[:, None]
        c = np.linalg.eigh((x * w[:, None]).T @ x)[1][:, -1]
        cos = x @ c
        near = np.abs(cos) > np.cos(CLUSTER_RADIUS)
        m2 = float(w @ x[:, 1])
        cl = float(w[near] @ x[near, 1])
        cen = [float(w[s] @ x[s, 1] / w[s].sum()) for s in (near & (cos > 0), near & (cos < 0))]
        rows.append({"t": float(t), "mass": float(w.sum()), "mean_x2": m2, "clusters": cl, "tails": m2 - cl,
                     "tail_mass": float(1 - w[near].sum()), "centroid_x2": cen,
                     "axis": [float(v) for v in c * np.sign(c[0] or 1.0)], "align_E": alignment(g.centers, w, E)})
    return rows


def drift(result, i: int) -> dict:
    """The equation's d mean(x2)/dt at saved state i: int f v2 with v the attention velocity of the state's
    cells as point masses (``Attention.velocity_measure``, no tolerance), at the cells holding >= 1e-6 of the
    heaviest cell's mass; with all cells as sources, then without those below each of CUTS (the tails)."""
    import spherepde as sp
    from spherepde.config import MATRIX_PRESETS

    g = result.grid_at(i)
    m = np.maximum(np.asarray(result.density[i]) * g.areas, 0.0)
    x = g.centers
    tgt = np.flatnonzero(m >= 1e-6 * m.max())
    p = MATRIX_PRESETS["paper"]
    model = sp.Attention(p["B"], p["V"], BETA, tol=1e-10)
    out = {"t": float(result.times[i]), "mean_x2": float(m @ x[:, 1])}
    for cut in CUTS:
        src = np.flatnonzero(m >= cut * m.max())
        v = model.velocity_measure(x[tgt], x[src], m[src])
        out[f"{cut:g}"] = {"drift": float(m[tgt] @ v[:, 1]), "left_out": float(m.sum() - m[src].sum())}
    return out


def run(levels, bs, t_end, nside_min: int = NSIDE_MIN) -> dict:
    from spherepde.diagnostics import exit_time
    from spherepde.config import parse_config
    from spherepde.runner import run_experiment

    out = {}
    for n in levels:
        for b in bs:
            cfg = config(n, b, t_end, nside_min)
            res = run_experiment(parse_config(cfg), HERE / "sweep_runs" / cfg["name"], figures=False)
            rows = split(res)
            t = [r["t"] for r in rows]
            out[cfg["name"]] = {"nside_max": n, "nside_min": nside_min, "b": b, "rows": rows, "wall_s": float(res.wall_time),
                                "steps": int(res.n_steps),
                                "t_exit": exit_time(t, [r["align_E"] for r in rows]),
                                "mass_drift": max(abs(r["mass"] - 1) for r in rows)}
            te, times = out[cfg["name"]]["t_exit"], np.asarray(res.times)
            out[cfg["name"]]["drift"] = ([drift(res, int(np.argmin(abs(times - te - d)))) for d in DRIFT_AT]
                                         if b and np.isfinite(te) else [])
            print(cfg["name"], f"t_exit {te:.3f}", flush=True)
    return out


def report(rec: dict) -> str:
    names = sorted(rec, key=lambda k: (rec[k].get("nside_min", NSIDE_MIN), rec[k]["nside_max"], rec[k]["b"]))
    lines = ["# The second seed at the exit, beta 100 (validation/transition_law/second_seed.py)", "",
             f"Figure 4's setting at beta {BETA:g} (the paper's B and V, attended refinement, nside_min {NSIDE_MIN} "
             "unless the table says another, rtol 1e-3, "
             f"cfl 0.8), f0 = (1 + {EPS:g} (x1 x2 + x3 x1 / 2) + b x2) / (4 pi): the perturbed f0 for b = {EPS:g}, "
             "its even part for b = 0. mean(x2) = sum of f |C| x2 over the cells; 'clusters' the cells within "
             f"{CLUSTER_RADIUS:g} rad of +-c (c the principal axis), 'tails' the rest. align E at the cell centres, "
             "as in the runs' concentration diagnostics; t_exit its first fall below 0.9.", "",
             "| nside_min | nside_max | b | t_exit | max abs mean(x2), t <= 8 | mean(x2) at t = 8 / b | after the exit: mean(x2) at "
             "9, 9.5, 10, 10.5, 11 | the most abs after 8.5 (t) | max abs tails' part, t >= 4 | mass drift | steps, solver wall s |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for k in names:
        r = rec[k]
        rows = r["rows"]
        t = np.array([x["t"] for x in rows])
        m = np.array([x["mean_x2"] for x in rows])
        tails = np.array([x["tails"] for x in rows])[t >= 4.0]  # once collapsed (before: no clusters to split by)
        pre = np.abs(m[t <= 8.0 + 1e-9]).max()
        at8 = m[np.argmin(abs(t - 8.0))]
        post = [m[np.argmin(abs(t - s))] for s in (9.0, 9.5, 10.0, 10.5, 11.0) if s <= t[-1] + 1e-9]
        late = t >= 8.5 - 1e-9
        j = np.argmax(np.abs(m[late]))
        lines.append(f"| {r.get('nside_min', NSIDE_MIN)} | {r['nside_max']} | {r['b']:g} | {r['t_exit']:.3f} | {pre:.2e} | "
                     f"{(at8 / r['b']) if r['b'] else float('nan'):.4f} | {', '.join(f'{v:+.2e}' for v in post)} | "
                     f"{m[late][j]:+.2e} ({t[late][j]:g}) | {np.abs(tails).max():.1e} | {r['mass_drift']:.1e} | "
                     f"{r['steps']}, {r['wall_s']:.0f} |")
    lines += ["", "The equation's d mean(x2)/dt at the exit (the state's own velocity field, summed over its cells as point "
              "masses, at the cells holding >= 1e-6 of the heaviest cell's mass), with every cell as a source and "
              "without the cells below 1e-9 and 1e-6 of the heaviest cell's mass (the tails; the mass they hold in "
              "brackets):", "",
              "| nside_min | nside_max | b | t | mean(x2) | drift, all sources | without < 1e-9 max | without < 1e-6 max |",
              "|---|---|---|---|---|---|---|---|"]
    for k in names:
        r = rec[k]
        for d in r.get("drift", []):
            cells = [f"{d[f'{c:g}']['drift']:+.2e}" + (f" ({d[f'{c:g}']['left_out']:.1e})" if c else "") for c in CUTS]
            lines.append(f"| {r.get('nside_min', NSIDE_MIN)} | {r['nside_max']} | {r['b']:g} | {d['t']:g} | {d['mean_x2']:+.2e} | " + " | ".join(cells) + " |")
    return "\n".join(lines + [""])


def plot(rec: dict, path: Path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 2, figsize=(11, 4))
    styles = {128: "-", 256: "--", 512: ":"}
    for k in sorted(rec, key=lambda k: (rec[k]["nside_max"], rec[k]["b"])):
        r = rec[k]
        t = np.array([x["t"] for x in r["rows"]])
        m = np.array([x["mean_x2"] for x in r["rows"]])
        lab = f"nside_max {r['nside_max']}, b = {r['b']:g}" + (f", nside_min {r['nside_min']}" if r.get("nside_min", NSIDE_MIN) != NSIDE_MIN else "")
        ls = styles.get(r["nside_max"], "-.")
        if r["b"]:
            ax[0].plot(t, m / r["b"], ls, label=lab)
        ax[1].semilogy(t, np.maximum(np.abs(m), 1e-18), ls, label=lab)
    ax[0].set(xlabel="t", ylabel="mean(x2) / b", title="the seed over its size (linear response: one curve)")
    ax[1].set(xlabel="t", ylabel="|mean(x2)|", title="|mean(x2)| (b = 0: the symmetry kept)")
    for a in ax:
        a.grid(alpha=0.3)
        a.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--levels", type=int, nargs="+", default=[128, 256])
    ap.add_argument("--b", type=float, nargs="+", default=[0.0, 0.005, EPS])
    ap.add_argument("--t-end", type=float, default=11.0)
    ap.add_argument("--nside-min", type=int, default=NSIDE_MIN, help="the base level, where the tails are carried")
    ap.add_argument("--report-only", action="store_true")
    a = ap.parse_args(argv)
    path = HERE / "second_seed.json"
    rec = json.loads(path.read_text()) if path.exists() else {}
    if not a.report_only:
        rec.update(run(a.levels, a.b, a.t_end, a.nside_min))
        path.write_text(json.dumps(rec, indent=1))
    text = report(rec)
    (HERE / "second_seed.md").write_text(text)
    plot(rec, HERE / "second_seed.png")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
