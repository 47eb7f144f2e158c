"""TensorGrid: geometry against closed forms, divergence theorem, transport through solve, HEALPix agreement,
the exact solution of the divergent flow v = P_x(b), and a quick exact-solution convergence run."""
import importlib.util
import math
from pathlib import Path

import numpy as np
import pytest
from scipy import integrate

from spherepde import ZeroTemperature
from spherepde.grids.healpix import HealpixGrid
from spherepde.grids.tensor import TensorGrid, embed, sin_power_integral, sphere_area, to_angles
from spherepde.solver import solve

ROOT = Path(__file__).resolve().parents[1]
GRIDS = [(2, 8), (3, 8), (4, 6)]


def _load_run():
    spec = importlib.util.spec_from_file_location("conv_tensor", ROOT / "validation" / "convergence_tensor" / "run.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def linear_field(M):
    def u(x):
        mx = x @ M.T
        return mx - np.einsum("ij,ij->i", x, mx)[:, None] * x

    return u


@pytest.mark.parametrize("d,n", GRIDS)
@pytest.mark.parametrize("reduced", [True, False])
def test_volumes_sum_to_sphere_and_match_quadrature(d, n, reduced):
    g = TensorGrid(d, n, reduced=reduced)
    assert g.dim == d
    assert np.isclose(g.areas.sum(), sphere_area(d), rtol=1e-13)
    assert np.isclose(sphere_area(d), {2: 2 * np.pi, 3: 4 * np.pi, 4: 2 * np.pi**2}[d])
    assert np.all(g.areas > 0)
    # an independent check of a few cell volumes: scipy nquad of the volume element
    for c in (0, g.n_cells // 3, g.n_cells - 1):
        lo, hi = g.lo[c], g.hi[c]

        def jac(*a):
            return np.prod([np.sin(a[j]) ** (d - 2 - j) for j in range(d - 2)])

        val, _ = integrate.nquad(jac, [(lo[j], hi[j]) for j in range(d - 1)], opts={"epsabs": 1e-13})
        assert np.isclose(g.areas[c], val, rtol=1e-10)


def test_sin_power_integral_closed_form():
    a, b = 0.3, 2.1
    for m in range(6):
        ref, _ = integrate.quad(lambda t: np.sin(t) ** m, a, b, epsabs=1e-14)
        assert np.isclose(sin_power_integral(m, a, b), ref, rtol=1e-13)


@pytest.mark.parametrize("d,n", GRIDS)
def test_face_areas_closed_form(d, n):
    g = TensorGrid(d, n, face_order=6)
    # the Gauss rule of each face reproduces its exact (closed-form) measure
    meas = np.linalg.norm(g.face_normals, axis=2).sum(axis=1)
    assert np.allclose(meas, g.face_length, rtol=1e-9)
    # the first-angle faces at psi_1 = c tile the sphere S^(d-2) of radius sin c: total area
    # |S^(d-2)| sin^(d-2) c (for d = 2 the faces are points with unit "area")
    if d >= 3:
        sel = g.face_axis == 0
        plane = to_angles(g.face_points[sel, 0])[:, 0]
        planes = np.round(plane / (np.pi / n)).astype(int)
        for p in np.unique(planes):
            tot = g.face_length[sel][planes == p].sum()
            assert np.isclose(tot, sphere_area(d - 1) * np.sin(p * np.pi / n) ** (d - 2), rtol=1e-12)
    # no degenerate face is listed, and normals point from owner to neighbour
    assert np.all(g.face_length > 0)
    out = np.einsum("fk,fk->f", g.face_normals.sum(axis=1), g.xbar[g.neighbour] - g.xbar[g.owner])
    assert np.all(out > 0)
    assert np.all(g.owner != g.neighbour)


@pytest.mark.parametrize("d", [2, 3, 4])
def test_divergence_theorem(d):
    rng = np.random.default_rng(d)
    M = rng.standard_normal((d, d))
    A = M - M.T
    ns = {2: (8, 16, 32), 3: (8, 16, 32), 4: (4, 8, 16)}[d]
    errs = []
    for n in ns:
        g = TensorGrid(d, n)
        exact = g.cell_average(lambda x: np.trace(M) - d * np.einsum("ij,ij->i", x, x @ M.T))
        err = g.discrete_divergence(linear_field(M)) - exact
        errs.append(np.abs(err) @ g.areas / g.total_area)
        h = np.pi / n
        assert np.abs(err).max() < 0.05 * h**2, (n, np.abs(err).max())
        # rigid rotation: exactly divergence free; the discrete divergence is quadrature round-off
        assert np.abs(g.discrete_divergence(linear_field(A))).max() < 1e-4
    # at least second order in L1 (in fact much higher: only quadrature errors remain)
    assert errs[-1] < errs[0] * (ns[0] / ns[-1]) ** 2 or errs[-1] < 1e-12


@pytest.mark.parametrize("d,n", GRIDS)
def test_mass_and_positivity_through_solve(d, n):
    g = TensorGrid(d, n)
    rng = np.random.default_rng(3)
    B = np.eye(d) + 0.3 * rng.standard_normal((d, d))
    V = np.diag(np.linspace(1.0, -1.0, d))
    c = np.ones(d) / np.sqrt(d)

    def f0(x):  # a sharp bump on a tiny background: positivity is the limiter's job
        return 1e-6 + np.exp(-30.0 * np.sum((x - c) ** 2, axis=1))

    r = solve(g, ZeroTemperature(B, V), f0, 1.0)
    m = r.diagnostics["mass"]
    assert abs(m[-1] / m[0] - 1) < 1e-13
    assert r.diagnostics["min"].min() >= 0
    assert r.density[-1].min() > 0


@pytest.mark.parametrize("d", [2, 3, 4])
def test_sampling_and_cell_of(d):
    g = TensorGrid(d, 6)
    rng = np.random.default_rng(0)
    cells = np.repeat([0, g.n_cells // 2, g.n_cells - 1], 4000)
    x = g.sample_in_cells(cells, rng)
    assert np.allclose(np.linalg.norm(x, axis=1), 1.0)
    assert np.array_equal(g.cell_of(x), cells)
    # uniform in the cell: the sample mean is the cell mean position
    for c in np.unique(cells):
        mean = x[cells == c].mean(axis=0)
        assert np.linalg.norm(mean - g.xbar[c]) < 0.03
    # embed and to_angles are inverse
    ang = to_angles(x)
    assert np.allclose(embed(ang), x)


def test_healpix_and_tensor_agree_on_s2():
    """The paper's zero-temperature problem at t = 0.5 on both S^2 grids: mass, mean and second moments
    of the two numerical densities agree with the true moments (and so with each other) to
    discretisation error, and the piecewise-constant densities agree pointwise in L1."""
    from spherepde.exact import exact_zero_temperature

    model = ZeroTemperature(np.diag([-1.0, -1.0, 1.0]), np.diag([-1.0, 1.0, -2.0]))

    def f0(x):
        return 1.0 + 0.5 * np.exp(-3 * np.sum((x - np.array([0.6, 0.0, 0.8])) ** 2, axis=1))

    monos = [(None, None)] + [(a, None) for a in range(3)] + [(a, b) for a in range(3) for b in range(a, 3)]

    def mono(x, a, b):
        return np.ones(len(x)) if a is None else (x[:, a] if b is None else x[:, a] * x[:, b])

    # true moments int f_t x^alpha dA, by quadrature of the exact solution on a fine grid
    pts, w, _ = TensorGrid(3, 24)._cell_quadrature(3, slice(None))
    fw = exact_zero_temperature(model, f0, pts, 0.5) * w
    true = np.array([fw @ mono(pts, a, b) for a, b in monos])
    moments, dens = {}, {}
    for name, g in (("healpix", HealpixGrid(12)), ("tensor", TensorGrid(3, 16))):
        f = solve(g, model, f0, 0.5).density[-1]
        basis = np.stack([g.cell_average(lambda x, a=a, b=b: mono(x, a, b)) for a, b in monos], 1) * g.areas[:, None]
        moments[name] = basis.T @ f
        dens[name] = (g, f)
        assert abs(moments[name][0] / true[0] - 1) < 1e-6  # mass
        assert np.abs(moments[name] - true).max() < 0.01 * true[0], (name, moments[name] - true)
    diff = np.abs(moments["healpix"] - moments["tensor"]).max()
    assert diff < 0.01 * true[0]
    # pointwise: both piecewise-constant densities at the same random points
    x = HealpixGrid(4).sample_in_cells(np.repeat(np.arange(192), 20), 0)
    fh = dens["healpix"][1][dens["healpix"][0].cell_of(x)]
    ft = dens["tensor"][1][dens["tensor"][0].cell_of(x)]
    fe = exact_zero_temperature(model, f0, x, 0.5)
    err_h, err_t = np.mean(np.abs(fh - fe)), np.mean(np.abs(ft - fe))
    assert np.mean(np.abs(fh - ft)) <= err_h + err_t
    assert np.mean(np.abs(fh - ft)) < 0.3 * np.mean(fe)  # piecewise-constant values of a peaked density


@pytest.mark.parametrize("d", [2, 3, 4])
def test_divergent_flow_formula(d):
    """f(x, t) = f0(x0) (sin t0 / sin t)^(d-1) solves d_t f + div(f P_x(b)) = 0: mass is conserved, and
    it matches backward characteristics with the log-Jacobian int div (div P_x(b) = -(d-1) <x, b>)."""
    run = _load_run()
    b = 0.7 * run.b_vector(d)
    f0 = run.f0_for(d)
    fx = run.divergent_exact(b, f0)
    g = TensorGrid(d, 12 if d < 4 else 8)
    m0 = g.mass(g.cell_average(f0, order=6))
    for t in (0.3, 1.0):
        assert np.isclose(g.mass(g.cell_average(lambda x: fx(x, t), order=6)), m0, rtol=2e-4)
    x = g.sample_in_cells(np.arange(0, g.n_cells, max(1, g.n_cells // 40)), 1)
    T = 0.8

    def rhs(s, y):  # backward: Y' = -P_Y(b), L' = div = -(d-1) <Y, b>
        Y = y[:d]
        return np.concatenate([-(b - (Y @ b) * Y), [-(d - 1) * (Y @ b)]])

    for xi in x:
        sol = integrate.solve_ivp(rhs, (0, T), np.concatenate([xi, [0.0]]), rtol=1e-11, atol=1e-12)
        Y, L = sol.y[:d, -1], sol.y[d, -1]
        ref = f0((Y / np.linalg.norm(Y))[None])[0] * np.exp(-L)
        assert np.isclose(fx(xi[None], T)[0], ref, rtol=1e-7)


def test_quick_convergence():
    """Quick mode of validation/convergence_tensor: errors fall at second order on the small grids."""
    run = _load_run()
    out = run.run(quick=True, dims=(2, 3, 4), names=("rotation", "divergent"))
    for key, v in out.items():
        rows = v["rows"]
        assert all(r["mass_drift"] < 1e-13 for r in rows)
        L1 = [r["L1"] for r in rows]
        assert all(a > b for a, b in zip(L1, L1[1:])), (key, L1)
        assert rows[-1]["order_L1"] > 1.7, (key, rows[-1]["order_L1"])


def test_plot_hooks(tmp_path):
    mpl = pytest.importorskip("matplotlib")
    mpl.use("Agg")
    import matplotlib.pyplot as plt

    for d in (2, 3, 4):
        g = TensorGrid(d, 4)
        ax = g.plot(g.centers[:, 0])
        assert ax is not None
        plt.close("all")


def test_bad_input():
    with pytest.raises(ValueError):
        TensorGrid(3, (4,))
    with pytest.raises(ValueError):
        TensorGrid(1, 4)
    with pytest.raises(TypeError):
        TensorGrid(3, 2.5)
    g = TensorGrid(3, 4)
    with pytest.raises(ValueError):
        g.sample_in_cells([g.n_cells])
    assert math.isclose(g.total_area, 4 * math.pi)


def test_circle_fft_mean_field():
    """FFT path on the circle (B = s R(alpha)) against the direct kernel, with its bound; falls back
    to the direct kernel when the bound fails (concentrated density) or B is not a scaled rotation."""
    from spherepde.kernels.circle import circle_mean_field, rotation_scale
    from spherepde.models.attention import Attention

    th = 0.7
    R = np.array([[np.cos(th), -np.sin(th)], [np.sin(th), np.cos(th)]])
    assert np.allclose(rotation_scale(1.5 * R), (1.5, th))
    assert rotation_scale(np.diag([1.0, 2.0])) is None and rotation_scale(np.diag([1.0, -1.0])) is None
    g = TensorGrid(2, 128)
    phi0 = 0.5 * (g.lo[0, 0] + g.hi[0, 0])
    assert np.allclose(g.centers, np.stack([np.cos(phi0 + 2 * np.pi * np.arange(256) / 256),
                                            np.sin(phi0 + 2 * np.pi * np.arange(256) / 256)], 1))
    rng = np.random.default_rng(0)
    w = (rng.random(g.n_cells) + 0.1) * g.areas
    for beta in (1.0, 20.0):
        model = Attention(1.5 * R, np.eye(2), beta, method="direct")
        m, info = circle_mean_field(model, phi0, w, return_info=True)
        ref = model.mean_field(g.centers, g.centers, w)
        assert info["method"] == "fft"
        assert np.abs(m - ref).max() <= info["bound"] + 1e-13
    # a very concentrated density at large beta s: the bound cannot be certified -> direct
    model = Attention(1.5 * R, np.eye(2), 20.0, method="direct")
    wc = np.exp(60 * (g.centers[:, 0] - 1)) * g.areas
    m, info = circle_mean_field(model, phi0, wc, return_info=True)
    assert info["method"] == "direct"
    assert np.allclose(m, model.mean_field(g.centers, g.centers, wc))
    model = Attention(np.diag([1.0, 2.0]), np.eye(2), 5.0, method="direct")
    assert circle_mean_field(model, phi0, w, return_info=True)[1]["method"] == "direct"
