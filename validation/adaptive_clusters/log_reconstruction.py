"""A prototype, not part of the package: transport with a reconstruction of log f, measured on the bump proxy.

Superseded on 2026-12-05 by the package's ``Options(scheme="log-quadratic")`` (a Numba kernel with a step-independent
outflow bound; README.md); kept as the record of the prototype's numbers.

The positivity-preserving schemes smear a bump a few cells wide and move its centroid by a fraction of a
cell per radian (``bump_proxy.md``); the unlimited scheme keeps it but goes negative. A reconstruction of
log f is positive by construction: in cell i, f(x) = f_i exp(L_i(u)) / <exp(L_i)>_i, with u = B_i (x - xbar_i)
the cell's tangent coordinates, L_i the least-squares fit (over the 8-cell stencil, through 0 at the
centre) of log f_n - log f_i at the neighbours' mean positions, linear ("log-linear": 2 coefficients) or
quadratic ("log-quadratic": 5), and <.>_i the mean over the cell (its quadrature rule, 32 points), so that
the cell mean is f_i exactly. A von Mises-Fisher bump is exp(kappa c . x): its log is linear in the ambient
x, nearly quadratic in u, so the log-quadratic form holds it with no limiter. Fluxes are the upwind sums
of a_g f(X_g) over each face's Gauss points (the same rule as the package's moments); each cell's outflows
over a stage are scaled down where they would exceed its content (positivity of the stage; conservative,
since each face flux is computed once); SSP-RK3 at outflow Courant number 0.4. Cells at 0 take log 1e-300.

The problem is bump_proxy.py's on a uniform HEALPix grid (this prototype is NumPy, for uniform grids only):
a vMF bump of width ``w`` carried one radian by a rigid rotation, alone or with a contraction of rate 1
towards the moving centre; the exact centroid stays on the rotated centre. Widths are chosen so that w / h
matches the adaptive clusters' (w = 0.003 on nside_max 1024 cells: w / h ~ 3; bump_proxy's 0.006 and 0.003
on nside_max 256: 1.5 and 0.75). The package's schemes run through ``spherepde.solve`` on the same grid.

Usage: python validation/adaptive_clusters/log_reconstruction.py   (about 40 minutes on 2 cores)
Writes log_reconstruction.md beside this file.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parents[1]))

from validation.adaptive_clusters.bump_proxy import _centre0, bump, flow, measure  # noqa: E402

TINY = 1e-300
CFL = 0.4


def _monomials(u, R):
    cols = [u[..., 0], u[..., 1]]
    if R == 5:
        cols += [u[..., 0] ** 2, u[..., 0] * u[..., 1], u[..., 1] ** 2]
    return np.stack(cols, -1)


def _cell_sums(g, own, nbr):
    """Per cell, the sum of ``own`` over the faces it owns and of ``nbr`` over those it neighbours."""
    out = np.zeros(g.n_cells)
    np.add.at(out, g.owner, own)
    np.add.at(out, g.neighbour, nbr)
    return out


class LogReconstruction:
    """Right-hand side of the continuity equation with the log-f reconstruction (R = 2 or 5 coefficients)."""

    def __init__(self, g, R, vel, steady):
        self.g, self.R, self.vel, self.steady = g, R, vel, steady
        B, st = g.tangent_basis, g.stencil
        u = np.einsum("ntk,nsk->nst", B, g.xbar[st] - g.xbar[:, None, :])
        Phi = _monomials(u, R) * (st != np.arange(g.n_cells)[:, None])[..., None]  # padding rows: no equation
        self.C = np.linalg.pinv(Phi)  # (N, R, S)
        self.Po = _monomials(np.einsum("ftk,fgk->fgt", B[g.owner], g.face_points - g.xbar[g.owner][:, None]), R)
        self.Pn = _monomials(np.einsum("ftk,fgk->fgt", B[g.neighbour],
                                       g.face_points - g.xbar[g.neighbour][:, None]), R)
        self.Pq = _monomials(np.einsum("ntk,nqk->nqt", B, g.cell_points - g.xbar[:, None]), R)
        self._a = None

    def weights(self, t):
        if self._a is None or not self.steady:
            g = self.g
            F, G, _ = g.face_points.shape
            v = self.vel(g.face_points.reshape(-1, 3), t).reshape(F, G, 3)
            self._a = np.einsum("fgk,fgk->fg", v, g.face_normals)
        return self._a

    def rate(self, t):
        """Largest outflow Courant rate (outflow coefficient over area)."""
        g, a = self.g, self.weights(t)
        tot = _cell_sums(g, np.maximum(a, 0).sum(1), -np.minimum(a, 0).sum(1))
        return (tot / g.areas).max()

    def __call__(self, f, t, dt):
        return self.rhs(f, self.weights(t), dt)

    def rhs(self, f, a, dt):
        """df/dt of the forward-Euler stage of step dt from f, with the normal-velocity weights a (F, G)."""
        g = self.g
        y = np.log(np.maximum(f, TINY))
        r = np.einsum("nrs,ns->nr", self.C, y[g.stencil] - y[:, None])
        Lq = np.einsum("nqr,nr->nq", self.Pq, r)
        top = Lq.max(1)
        mean = np.exp(Lq - top[:, None]) @ g.cell_weights  # <exp(L - top)>, the cell-mean normalisation
        o, n = g.owner, g.neighbour
        vo = f[o][:, None] * np.exp(np.einsum("fgr,fr->fg", self.Po, r[o]) - top[o][:, None]) / mean[o][:, None]
        vn = f[n][:, None] * np.exp(np.einsum("fgr,fr->fg", self.Pn, r[n]) - top[n][:, None]) / mean[n][:, None]
        out_o = (np.maximum(a, 0) * vo).sum(1)
        out_n = -(np.minimum(a, 0) * vn).sum(1)
        tot = _cell_sums(g, out_o, out_n)
        cap = (1 - 1e-12) * f * g.areas / dt
        s = np.where(tot > cap, cap / np.where(tot > 0, tot, 1.0), 1.0)
        flux = out_o * s[o] - out_n * s[n]
        return -_cell_sums(g, flux, -flux) / g.areas


def solve_log(g, R, vel, steady, f, T):
    rhs = LogReconstruction(g, R, vel, steady)
    t, n = 0.0, 0
    while t < T - 1e-12:
        dt = min(CFL / rhs.rate(t), T - t)
        f1 = np.maximum(f + dt * rhs(f, t, dt), 0.0)  # each stage >= 0 up to rounding (the cap): clip that
        f2 = np.maximum(0.75 * f + 0.25 * (f1 + dt * rhs(f1, t + dt, dt)), 0.0)
        f = np.maximum(f / 3 + 2 / 3 * (f2 + dt * rhs(f2, t + 0.5 * dt, dt)), 0.0)
        t += dt
        n += 1
    return f, n


def run_case(nside, width, contraction, schemes, T=1.0):
    import spherepde as sp

    g = sp.HealpixGrid(nside)
    c0 = _centre0()
    vel = flow(contraction)
    f0 = g.cell_average(bump(width))
    h = np.sqrt(4 * np.pi / g.n_cells)
    w0 = float(np.sqrt(((f0 * g.areas) * np.arccos(np.clip(g.xbar @ c0, -1, 1)) ** 2).sum() / (f0 @ g.areas)))
    rows = []
    for name in schemes:
        t0 = time.perf_counter()
        if name.startswith("log"):
            f, n = solve_log(g, 2 if name == "log-linear" else 5, vel, contraction == 0, f0.copy(), T)
        else:
            kw = {"linear": {}, "quadratic": {"scheme": "quadratic"}, "unlimited": {"limiter": "none"}}[name]
            # (the method of lines, as reported: the default would interpolate the time-dependent field)
            r = sp.solve(g, sp.Prescribed(vel, steady=contraction == 0), f0, t_end=T, field_time="exact", **kw)
            f, n = r.density[-1], r.n_steps
        res = {k: v for k, v in measure(g, f, T).items() if k not in ("centre", "track")}
        res.update(scheme=name, steps=n, wall=time.perf_counter() - t0, drift=res["mass"] / float(f0 @ g.areas) - 1)
        rows.append(res)
        print(f"nside {nside} w {width} c {contraction} {name}: {res}", flush=True)
    return dict(nside=nside, h=h, width=width, contraction=contraction, w0=w0,
                exact_w=w0 * np.exp(-contraction * T), rows=rows)


CASES = [  # (nside, width, contraction, schemes)
    (64, 0.024, 0.0, ["linear", "quadratic", "unlimited", "log-linear", "log-quadratic"]),
    (64, 0.012, 1.0, ["linear", "quadratic", "unlimited", "log-linear", "log-quadratic"]),
    (64, 0.048, 1.0, ["linear", "quadratic", "unlimited", "log-quadratic"]),
    (128, 0.024, 1.0, ["linear", "quadratic", "log-quadratic"]),
]


def main():
    out = [run_case(*c) for c in CASES]
    L = ["# A reconstruction of log f on the bump proxy (validation/adaptive_clusters/log_reconstruction.py)", "",
         "A prototype outside the package (see the script's docstring). Centroid error at t = 1 (rad; along-track "
         "+: ahead of the exact centre), rms angular width (the exact one: the initial cell averages' width, times "
         "e^-t with the contraction), min f, mass drift, steps and wall time (the log rows are NumPy).", "",
         "| nside (h) | w (w / h) | flow | scheme | centroid error | along-track | width (exact) | min f | mass drift | "
         "steps | wall s |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in out:
        flow = "rotation + contraction" if c["contraction"] else "rotation"
        for r in c["rows"]:
            L.append(f"| {c['nside']} ({c['h']:.4f}) | {c['width']:g} ({c['width'] / c['h']:.2f}) | {flow} | "
                     f"{r['scheme']} | {r['error']:.2e} | {r['along']:+.2e} | {r['width']:.2e} ({c['exact_w']:.2e}) | "
                     f"{r['min']:.1e} | {r['drift']:+.1e} | {r['steps']} | {r['wall']:.0f} |")
    (HERE / "log_reconstruction.md").write_text("\n".join(L) + "\n")
    print("\n".join(L))


if __name__ == "__main__":
    main()
