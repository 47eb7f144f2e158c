"""Reduced cluster dynamics (issue #17 item 2): the K-cluster ODE, its two-cluster reductions and their
linearisations at e1 and on the stall cone, in closed form where possible and numerically otherwise.

After collapse the density is a few clusters, and a cluster much narrower than 1 / (beta ||B||) moves like
a point mass (``validation/adaptive_clusters`` checks this against the PDE on adaptive grids): K clusters
at c_k with masses p_k obey the weighted particle system

    dc_k/dt = P_{c_k}(V m(c_k)),   m(x) = sum_j p_j c_j e^{beta <x, B c_j>} / sum_j p_j e^{beta <x, B c_j>},

which is ``simulate_particles(Attention(B, V, beta), centres, weights=masses)``. Paper matrices
B = diag(-1, -1, 1), V = diag(-1, 1, -2) (lambda = -1, 1, -2).

1. **Two antipodal clusters of equal mass** (+-c): m(c) = c tanh(beta <c, B c>), so

       dc/dt = tanh(beta <c, B c>) P_c(V c),

   from c = e1 (<c, B c> = -1) the Oja flow of -V (rate ~1 towards e3), stopping on the cone <c, B c> = 0,
   where m = 0: c* = (e1 + e3) / sqrt 2 (align E = align F_abs = 1/2, align F = 0). Checked: the weighted
   particle velocity equals the formula, and the reduced ODE's path equals the two-particle system's.
2. **The linearisation at +-e1, any masses** (derived in README.md): the modes along e_k (k = 2, 3) of the two
   clusters decouple, with the 2 x 2 Jacobian

       J_k = [[lambda_k pi_1 + mu, lambda_k (1 - pi_1)], [lambda_k pi_2, lambda_k (1 - pi_2) - nu]],

   pi_1 = p_1 e^-beta / (p_1 e^-beta + p_2 e^beta), mu = 2 pi_1 - 1, pi_2 = p_1 e^beta / (p_1 e^beta + p_2 e^-beta),
   nu = 2 pi_2 - 1. Equal masses: the antipodal mode (b = -a) grows at -tanh(beta) (lambda_k + 1) (e3: tanh beta,
   the exit from E), the translation (a = b) at lambda_k - tanh(beta) (e2: 1 - tanh beta = 2 / (e^{2 beta} + 1),
   neutral to O(e^{-2 beta})). Checked against the numerical Jacobian of the weighted particle system.
3. **The stall cone**: the Jacobian at +-c* (equal masses), numerically and in closed form (README.md):
   its unstable mode (both clusters translating along e2, rate 1) is what breaks the stall. Checked: a run
   of the two-particle system from the stall state with a small perturbation along it leaves at that rate.
4. **The transition law** of the two-cluster system: the times of both exits against the perturbation eps,
   t = a + b log(1/eps), with b against the inverse rates of items 2 and 3.

Usage: python validation/cluster_dynamics/run.py [--quick]   (seconds: ODEs only)
Writes results.json, results.md and cluster_dynamics.png beside this file (quick: *_quick.*).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parents[1]))
from validation import criteria as C  # noqa: E402

B = np.diag([-1.0, -1.0, 1.0])
V = np.diag([-1.0, 1.0, -2.0])
LAM = np.diag(V)
BETAS = (10.0, 30.0, 100.0)
MASSES = ((0.5, 0.5), (0.6, 0.4), (0.8, 0.2))
E1, E3 = np.eye(3)[0], np.eye(3)[2]
CSTAR = (E1 + E3) / np.sqrt(2.0)


def _model(beta):
    import spherepde as sp

    return sp.Attention(B, V, beta)


def velocity(beta, x, p):
    """Weighted particle velocities of clusters x (K, 3) with masses p (spherepde.particle_velocity)."""
    import spherepde as sp

    return sp.particle_velocity(_model(beta), x, weights=np.asarray(p, float) / np.sum(p))


def reduced(beta, c):
    """tanh(beta <c, B c>) P_c(V c), the antipodal equal-mass reduction."""
    vc = V @ c
    return np.tanh(beta * (c @ B @ c)) * (vc - (c @ vc) * c)


def tangent_basis(x):
    """Two orthonormal tangent vectors at the unit vector x."""
    a = E3 if abs(x[2]) < 0.9 else E1
    t1 = np.cross(x, a)
    t1 /= np.linalg.norm(t1)
    return np.stack([t1, np.cross(x, t1)])


def jacobian(beta, x, p, h=1e-6):
    """Jacobian (2K, 2K) of the weighted particle system at the configuration x (K, 3), in tangent
    coordinates (central differences along the retraction x -> (x + s t) / |x + s t|)."""
    K = x.shape[0]
    T = [tangent_basis(xk) for xk in x]
    J = np.empty((2 * K, 2 * K))
    for k in range(K):
        for i in range(2):
            cols = []
            for s in (h, -h):
                y = x.copy()
                y[k] = (x[k] + s * T[k][i]) / np.linalg.norm(x[k] + s * T[k][i])
                v = velocity(beta, y, p)
                cols.append(np.concatenate([T[j] @ v[j] for j in range(K)]))
            J[:, 2 * k + i] = (cols[0] - cols[1]) / (2 * h)
    return J


def closed_form_e1(beta, p):
    """Eigenvalues of J_k (k = 2, 3) at (e1, -e1) with masses p (module docstring), sorted."""
    p1, p2 = np.asarray(p, float) / np.sum(p)
    out = []
    for lam in LAM[1:]:
        pi1 = 1.0 / (1.0 + (p2 / p1) * np.exp(2 * beta))
        pi2 = 1.0 / (1.0 + (p2 / p1) * np.exp(-2 * beta))
        mu, nu = 2 * pi1 - 1, 2 * pi2 - 1
        Jk = np.array([[lam * pi1 + mu, lam * (1 - pi1)], [lam * pi2, lam * (1 - pi2) - nu]])
        out += list(np.linalg.eigvals(Jk).real)
    return sorted(out)


def rk4_path(f, x0, t_end, dt):
    """Classical RK4 on g(x) = f(x / |x|), then x / |x|: the scheme of ``simulate_particles(method="rk4")``."""
    def g(y):
        return f(y / np.linalg.norm(y, axis=-1, keepdims=True))

    x, out = x0.copy(), [x0.copy()]
    for _ in range(int(round(t_end / dt))):
        k1 = g(x)
        k2 = g(x + 0.5 * dt * k1)
        k3 = g(x + 0.5 * dt * k2)
        k4 = g(x + dt * k3)
        x = x + dt / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
        x /= np.linalg.norm(x, axis=-1, keepdims=True)
        out.append(x.copy())
    return np.array(out)


def study(quick: bool) -> dict:
    import spherepde as sp

    res = {"betas": list(BETAS), "masses": [list(m) for m in MASSES]}
    rng = np.random.default_rng(0)
    # 1. the reduction: velocities and paths
    cs = rng.normal(size=(50, 3))
    cs /= np.linalg.norm(cs, axis=1)[:, None]
    vel_err = 0.0
    for beta in BETAS:
        for c in cs:
            v = velocity(beta, np.stack([c, -c]), (0.5, 0.5))
            vel_err = max(vel_err, float(np.abs(v[0] - reduced(beta, c)).max()), float(np.abs(v[1] + v[0]).max()))
    res["reduction_velocity_error"] = vel_err
    T, dt = (15.0, 0.01) if quick else (20.0, 0.005)
    paths = {}
    path_err = 0.0
    for beta in BETAS:
        c0 = E1 + 1e-3 * E3
        c0 /= np.linalg.norm(c0)
        red = rk4_path(lambda c: reduced(beta, c), c0, T, dt)
        pr = sp.simulate_particles(_model(beta), np.stack([c0, -c0]), T, dt, method="rk4", weights=[0.5, 0.5],
                                   save_at="all")
        path_err = max(path_err, float(np.abs(pr.positions[:, 0] - red).max()))
        paths[beta] = red
        c_end = red[-1]
        res.setdefault("stall", []).append({
            "beta": beta, "t": T, "cBc": float(c_end @ B @ c_end), "align_E": float(c_end[0] ** 2),
            "align_Fabs": float(c_end[2] ** 2), "align_F": float(c_end[1] ** 2),
            "distance_to_cstar": float(np.arccos(min(1.0, abs(c_end @ CSTAR)))),
            # the time the path is halfway between e1 and c* (angle pi / 8 from e1); log(1e3) / 1 predicted
            "t_half": _first_time(np.arccos(np.clip(red[:, 0], -1, 1)) >= np.pi / 8, dt),
        })
    res["reduction_path_error"] = path_err
    res["paths"] = {str(b): paths[b][:: max(1, len(paths[b]) // 400)].tolist() for b in BETAS}
    # 2. linearisation at +-e1
    rows = []
    for beta in BETAS:
        for p in MASSES:
            num = sorted(np.linalg.eigvals(jacobian(beta, np.stack([E1, -E1]), p)).real)
            cf = closed_form_e1(beta, p)
            rows.append({"beta": beta, "masses": list(p), "numerical": [float(v) for v in num],
                         "closed_form": [float(v) for v in cf],
                         "max_abs_diff": float(np.max(np.abs(np.array(num) - np.array(cf))))})
    res["e1"] = rows
    # 3. the stall cone (equal masses): eigenvalues, and an exit along the most unstable mode
    cone = []
    for beta in BETAS:
        x = np.stack([CSTAR, -CSTAR])
        v0 = float(np.abs(velocity(beta, x, (0.5, 0.5))).max())
        J = jacobian(beta, x, (0.5, 0.5))
        w, vec = np.linalg.eig(J)
        i = int(np.argmax(w.real))
        lam_max = float(w.real[i])
        mode = vec[:, i].real
        mode /= np.linalg.norm(mode)
        kind = "translation (both clusters move alike)" if _is_translation(x, mode) else "antipodal (c, -c kept)"
        eps = 1e-6
        y = np.stack([x[k] + eps * (tangent_basis(x[k]).T @ mode[2 * k: 2 * k + 2]) for k in range(2)])
        y /= np.linalg.norm(y, axis=1)[:, None]
        t_run = min(12.0 / max(lam_max, 1e-3), 40.0)
        pr = sp.simulate_particles(_model(beta), y, t_run, 1e-3 if beta > 30 else 2e-3, method="rk4",
                                   weights=[0.5, 0.5], save_at=np.linspace(0, t_run, 121))
        dev = np.linalg.norm(pr.positions - x[None], axis=2).max(axis=1)
        sel = (dev > 10 * eps) & (dev < 1e-3)  # the linear regime
        rate = float(np.polyfit(pr.times[sel], np.log(dev[sel]), 1)[0]) if sel.sum() >= 3 else float("nan")
        cone.append({"beta": beta, "velocity_at_cstar": v0, "eigenvalues": sorted(float(v) for v in w.real),
                     "closed_form": closed_form_cstar(beta),
                     "most_unstable": lam_max, "mode": kind, "fitted_exit_rate": rate,
                     "time_to_leave_from_1e-6": float(np.log(1e-3 / eps) / lam_max) if lam_max > 0 else None})
    res["cone"] = cone
    res["law"] = transition_law(quick)
    res["quick"] = quick
    return res


def transition_law(quick: bool) -> list[dict]:
    """The times of the two exits against the perturbation eps, two clusters of equal mass (the weighted
    particle system, RK4): from (c0, -c0), c0 = e1 + eps e3 normalised, until align E < 3/4 (the exit
    from E, predicted slope 1 / tanh(beta) in log(1/eps)); from the stall (c*, -c*) with both clusters moved
    by eps along e2, until they are 0.1 rad from it (the exit from the stall, predicted slope 1 / 1).
    Fit t = a + b log(1/eps)."""
    import spherepde as sp

    epss = (1e-2, 1e-4, 1e-6) if quick else (1e-2, 1e-3, 1e-4, 1e-5, 1e-6, 1e-8)
    out = []
    for beta in BETAS:
        model = _model(beta)
        for stage in ("exit from E", "exit from the stall"):
            ts = []
            for eps in epss:
                if stage == "exit from E":
                    c0 = (E1 + eps * E3) / np.linalg.norm(E1 + eps * E3)
                    x0 = np.stack([c0, -c0])
                else:
                    x0 = np.stack([CSTAR + eps * np.eye(3)[1], -CSTAR + eps * np.eye(3)[1]])
                    x0 /= np.linalg.norm(x0, axis=1)[:, None]
                T = 4.0 + 1.5 * np.log(1.0 / eps)
                save = np.arange(0.0, T + 1e-9, 0.01)
                pr = sp.simulate_particles(model, x0, T, 0.01, method="rk4", weights=[0.5, 0.5], save_at=save)
                if stage == "exit from E":
                    flag = pr.positions[:, 0, 0] ** 2 < 0.75
                else:
                    flag = np.arccos(np.clip(pr.positions[:, :, :] @ np.array([1.0, 0.0, 1.0]) / np.sqrt(2), -1, 1)
                                     * np.array([1.0, -1.0])).max(axis=1) > 0.1
                ts.append(float(pr.times[np.argmax(flag)]) if flag.any() else float("nan"))
            b, a = np.polyfit(np.log(1.0 / np.array(epss)), ts, 1)
            pred = 1.0 / np.tanh(beta) if stage == "exit from E" else 1.0
            out.append({"beta": beta, "stage": stage, "eps": list(epss), "t": ts, "a": float(a), "b": float(b),
                        "b_predicted": float(pred)})
    return out


def _first_time(flags, dt) -> float | None:
    return float(dt * np.argmax(flags)) if flags.any() else None


def closed_form_cstar(beta) -> list:
    """Eigenvalues at (c*, -c*), equal masses (README.md): antipodal modes -beta and 0 (along the cone),
    translations -(beta / 2 + 3 / 2) and +1 (along e2)."""
    return sorted([-beta, 0.0, -(beta / 2 + 1.5), 1.0])


def _is_translation(x, mode) -> bool:
    """Whether a tangent mode of the pair (c, -c) moves both clusters in the same direction in R^3."""
    d0 = tangent_basis(x[0]).T @ mode[:2]
    d1 = tangent_basis(x[1]).T @ mode[2:]
    return float(d0 @ d1) > 0


def criteria(res) -> list[dict]:
    out = [C.at_most("two antipodal equal clusters: weighted-particle velocity - tanh(beta <c,Bc>) P_c(Vc) (max)",
                     res["reduction_velocity_error"], 1e-13, ".1e"),
           C.at_most("reduced ODE path - two-particle path (RK4, same steps; max over t)",
                     res["reduction_path_error"], 1e-10, ".1e")]
    for s in res["stall"]:
        out.append(C.at_most(f"beta {s['beta']:g}: the reduced path ends on the stall cone (|<c,Bc>| at t = {s['t']:g})",
                             abs(s["cBc"]), 1e-3, ".1e"))
    worst = max(r["max_abs_diff"] / max(1.0, max(abs(v) for v in r["closed_form"])) for r in res["e1"])
    out.append(C.at_most("Jacobian at +-e1: closed-form eigenvalues - numerical (max, relative to max(1, |lambda|))",
                         worst, 1e-5, ".1e"))
    for c in res["cone"]:
        out.append(C.at_most(f"beta {c['beta']:g}: +-c* is a fixed point (max |v|)", c["velocity_at_cstar"], 1e-12, ".1e"))
        d = max(abs(a - b) for a, b in zip(c["eigenvalues"], c["closed_form"])) / max(1.0, c["beta"])
        out.append(C.at_most(f"beta {c['beta']:g}: Jacobian at +-c*: closed-form eigenvalues - numerical (relative to "
                             "max(1, beta))", d, 1e-5, ".1e"))
        rel = abs(c["fitted_exit_rate"] - c["most_unstable"]) / abs(c["most_unstable"]) if c["most_unstable"] else 1.0
        out.append(C.at_most(f"beta {c['beta']:g}: exit rate from the stall (fitted) vs the largest eigenvalue "
                             f"{c['most_unstable']:.4g} (relative)", rel, 0.02, ".2e"))
    # the fitted slope of t against log(1/eps) is the inverse growth rate up to the nonlinear offset's drift,
    # which the fit over 2-4 decades leaves at the per cent level: 3 %
    for r in res.get("law", []):
        out.append(C.at_most(f"beta {r['beta']:g}, {r['stage']}: slope of t against log(1/eps) vs 1 / rate = "
                             f"{r['b_predicted']:.4g} (relative)", abs(r["b"] - r["b_predicted"]) / r["b_predicted"],
                             0.03, ".2e"))
    collapse = HERE / "collapse.json"  # collapse.py: what the collapse leaves of the two seeds (both log(beta))
    if collapse.exists():
        from validation.cluster_dynamics.collapse import criteria as collapse_criteria

        out += collapse_criteria(json.loads(collapse.read_text()))
    return out


def write_md(res, path):
    L = ["# Reduced cluster dynamics (validation/cluster_dynamics)", "",
         "Paper matrices; K clusters as weighted particles. See README.md for the derivations.", "",
         f"Antipodal equal-mass reduction: velocity error {res['reduction_velocity_error']:.1e}, path error "
         f"{res['reduction_path_error']:.1e} (reduced ODE against the two-particle system, RK4).", "",
         "| beta | from c = e1 + 1e-3 e3: t to angle pi/8 | at t | <c,Bc> | align E | align F_abs | align F |",
         "|---|---|---|---|---|---|---|"]
    for s in res["stall"]:
        th = "not reached" if s["t_half"] is None else f"{s['t_half']:.2f}"
        L.append(f"| {s['beta']:g} | {th} | {s['t']:g} | {s['cBc']:.1e} | {s['align_E']:.4f} | "
                 f"{s['align_Fabs']:.4f} | {s['align_F']:.1e} |")
    L += ["", "Linearisation at (e1, -e1): eigenvalues (numerical Jacobian of the weighted particles; closed form "
          "of the README in brackets):", "", "| beta | masses | eigenvalues | closed form | max diff |", "|---|---|---|---|---|"]
    for r in res["e1"]:
        L.append(f"| {r['beta']:g} | {r['masses'][0]:g} / {r['masses'][1]:g} | "
                 + ", ".join(f"{v:.6g}" for v in r["numerical"]) + " | "
                 + ", ".join(f"{v:.6g}" for v in r["closed_form"]) + f" | {r['max_abs_diff']:.1e} |")
    L += ["", "The stall cone, c* = (e1 + e3) / sqrt 2, equal masses:", "",
          "| beta | eigenvalues of the Jacobian | closed form | most unstable | its mode | fitted exit rate | "
          "time to grow 1e-6 -> 1e-3 |",
          "|---|---|---|---|---|---|---|"]
    for c in res["cone"]:
        L.append(f"| {c['beta']:g} | " + ", ".join(f"{v:.4g}" for v in c["eigenvalues"]) + " | "
                 + ", ".join(f"{v:.4g}" for v in c["closed_form"])
                 + f" | {c['most_unstable']:.4g} | {c['mode']} | {c['fitted_exit_rate']:.4g} | "
                 + (f"{c['time_to_leave_from_1e-6']:.2f}" if c["time_to_leave_from_1e-6"] else "never") + " |")
    L += ["", "The transition law of the two-cluster system: t = a + b log(1/eps) (exit from E: align E < 3/4; exit "
          "from the stall: 0.1 rad from it):", "",
          "| beta | stage | eps | t | a | b | 1 / rate |", "|---|---|---|---|---|---|---|"]
    for r in res.get("law", []):
        L.append(f"| {r['beta']:g} | {r['stage']} | " + ", ".join(f"{e:.0e}" for e in r["eps"]) + " | "
                 + ", ".join(f"{t:.2f}" for t in r["t"]) + f" | {r['a']:.3f} | {r['b']:.4f} | {r['b_predicted']:.4f} |")
    if (HERE / "collapse.md").exists():  # collapse.py's report, whose criteria join these
        # (as text, not a link: the documentation's pages are the studies' READMEs, and a link to another .md
        # file of the study is an unknown document there)
        L += ["", "What the collapse leaves of the two seeds, both log(beta) of the terminal phase in closed form: "
              "`validation/cluster_dynamics/collapse.md` (`collapse.py`; README, its last section; its figure below)."]
    L.append("")
    Path(path).write_text("\n".join(L))


def plot(res, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 2, figsize=(10, 3.8))
    for b in res["betas"]:
        p = np.array(res["paths"][str(b)])
        t = np.linspace(0, res["stall"][0]["t"], len(p))
        ax[0].plot(t, p[:, 0] ** 2, label=f"align E, beta {b:g}")
        ax[0].plot(t, p[:, 2] ** 2, "--", label=f"align F_abs, beta {b:g}")
    ax[0].set_xlabel("t")
    ax[0].set_title("two antipodal clusters: e1 -> the stall cone (the three beta coincide)", fontsize=9)
    ax[0].legend(fontsize=6)
    for c in res["cone"]:
        ax[1].plot([c["beta"]] * len(c["eigenvalues"]), c["eigenvalues"], "o", color="C0")
    for r in res["e1"]:
        if r["masses"] == [0.5, 0.5]:
            ax[1].plot([r["beta"]] * 4, r["numerical"], "x", color="C3")
    ax[1].set_xscale("log")
    ax[1].set_yscale("symlog", linthresh=1.0)
    ax[1].axhline(0, color="k", lw=0.6)
    ax[1].set_xlabel("beta")
    ax[1].set_ylabel("eigenvalue (symlog)")
    ax[1].set_title("Jacobian eigenvalues: at +-e1 (x), on the stall cone (o)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


results_for = C.quick_results(HERE)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="paths to T = 15 (not 20) and three eps (not six)")
    a = ap.parse_args(argv)
    res = study(a.quick)
    C.save_outputs(HERE, "cluster_dynamics", res, a.quick, write_md, plot)
    print(Path(HERE / ("results_quick.md" if a.quick else "results.md")).read_text())
    return 0


if __name__ == "__main__":
    sys.exit(C.cli("cluster_dynamics", criteria, main, results_for))
