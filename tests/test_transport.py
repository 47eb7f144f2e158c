"""Time-dependent prescribed fields with a time structure (``Prescribed.separable``, issue #22): the same
answer as the field given as velocity(x, t), with each spatial mode evaluated once per run; fields of any
time dependence as Numba-compiled point functions (``Prescribed.compiled``)."""
import math

import numba
import numpy as np
import pytest

import spherepde as sp


def _deform_modes(counter):
    """Nair-Lauritzen case 1 (non-divergent deformation) as cos(pi t / 5) times a steady field, plus a
    rigid rotation with a sin(t) factor: two modes."""
    def v1(x):
        counter[0] += 1
        lon = np.arctan2(x[:, 1], x[:, 0])
        lat = np.arcsin(np.clip(x[:, 2], -1, 1))
        u = 2.4 * np.sin(lon) ** 2 * np.sin(2 * lat)
        v = 2.4 * np.sin(2 * lon) * np.cos(lat)
        e_lon = np.stack([-np.sin(lon), np.cos(lon), 0 * lon], 1)
        e_lat = np.stack([-np.sin(lat) * np.cos(lon), -np.sin(lat) * np.sin(lon), np.cos(lat)], 1)
        return u[:, None] * e_lon + v[:, None] * e_lat

    def v2(x):
        counter[1] += 1
        return np.cross([0.3, 0.0, 1.0], x)

    return [(lambda t: np.cos(np.pi * t / 5), v1), (np.sin, v2)]


@pytest.mark.parametrize("scheme", ["linear", "quadratic"])
def test_separable_field_equals_the_plain_field(scheme):
    """The modes give the solver the same normal-velocity weights up to rounding (sum_k c_k (v_k . W)
    against (sum_k c_k v_k) . W): densities agree to 1e-12 relative, in the same steps; the spatial
    modes are evaluated once (the plain field is called at every stage)."""
    g = sp.HealpixGrid(8)
    calls = [0, 0]
    sep = sp.Prescribed.separable(_deform_modes(calls), max_speed=4.0)
    plain = sp.Prescribed(sep.velocity, max_speed=4.0)
    f0 = lambda x: 1.0 + np.exp(4 * (x[:, 0] - 1))  # noqa: E731
    r1 = sp.solve(g, sep, f0, 1.0, scheme=scheme)
    assert calls == [1, 1]
    r2 = sp.solve(g, plain, f0, 1.0, scheme=scheme, field_time="exact")  # (the method of lines: "auto" interpolates)
    # the plain field: at every new stage time of the default SSP-RK(4,3) (stage times t, t + dt / 2,
    # t + dt, t + dt / 2) but the first, whose time t + dt of the step before is reused (a field of t
    # alone), and the fourth (the second's time), so twice per attempt, plus the start
    # and the step that lands on t_end (its end time is t_end itself, not the sum t + dt)
    attempts = r2.n_steps + int(np.sum(r2.diagnostics["rejected"]))
    assert 2 * r2.n_steps < calls[0] <= 2 * attempts + 2
    assert r1.n_steps == r2.n_steps
    assert np.abs(r1.density[-1] - r2.density[-1]).max() < 1e-12 * np.abs(r2.density[-1]).max()
    # and the field itself (particles, diagnostics) is the sum of the modes
    x = g.centers[:5]
    assert np.allclose(sep.field(x, 0.7), plain.field(x, 0.7), rtol=0, atol=1e-15)


def test_one_mode_scales_its_moments():
    """A single mode c(t) v(x) (the deformational flows): the solver keeps the moments of +v and -v and
    carries |c(t)| with them (max(c a, 0) = |c| max(+-a, 0) exactly; a stage with moments |c| m and step dt
    is the stage with m and step |c| dt, and the Courant rates scale by |c|), with no pass over the faces
    and no scaled copy per stage. The same
    answer as the plain field through the sign change of c at t = 2.5, to rounding: measured 1.0e-11
    relative at t = 3 (|c| times the moments rounds differently from the moments of c a, and the limiter
    amplifies such differences over the 3 time units); a wrong sign or scale would be O(1)."""
    g = sp.HealpixGrid(8)
    calls = [0, 0]
    mode = _deform_modes(calls)[:1]
    sep = sp.Prescribed.separable(mode, max_speed=3.6)
    plain = sp.Prescribed(sep.velocity, max_speed=3.6)
    f0 = lambda x: 1.0 + np.exp(4 * (x[:, 0] - 1))  # noqa: E731
    r1 = sp.solve(g, sep, f0, 3.0, scheme="quadratic")
    r2 = sp.solve(g, plain, f0, 3.0, scheme="quadratic", field_time="exact")  # (the method of lines)
    assert calls[0] > 2 * r2.n_steps
    assert r1.n_steps == r2.n_steps
    assert np.abs(r1.density[-1] - r2.density[-1]).max() < 1e-10 * np.abs(r2.density[-1]).max()
    assert np.abs(r1.density[-1] - f0(g.centers)).max() > 1e-2  # the flow did move the density


def test_separable_bad_input_is_named():
    with pytest.raises(ValueError, match="at least one"):
        sp.Prescribed.separable([])
    with pytest.raises(TypeError, match=r"modes\[0\]"):
        sp.Prescribed.separable([(1.0, lambda x: x)])
    g = sp.HealpixGrid(2)
    bad = sp.Prescribed.separable([(lambda t: np.nan, lambda x: np.cross([0, 0, 1.0], x))])
    with pytest.raises(ValueError, match="NaN"):
        sp.solve(g, bad, lambda x: np.ones(len(x)), 1.0)


def test_moment_pool_hands_out_only_arrays_nobody_holds(monkeypatch):
    """The solver reuses moment arrays (page faults of fresh ones cost 45 % of a two-mode field's moment
    pass at nside 256) only when no memo still holds them. Runs with a time-dependent two-mode field and
    with attention (moments at every stage, extrapolated weights, rejected steps) give the bits of runs
    without the pool; a pool that reused its arrays without asking (every count taken as free) is caught:
    its answer differs."""
    import spherepde.solver as solver_mod

    g = sp.HealpixGrid(8)
    calls = [0, 0]
    two = sp.Prescribed.separable(_deform_modes(calls), max_speed=4.0)
    f0 = lambda x: 1.0 + np.exp(4 * (x[:, 0] - 1))  # noqa: E731
    att = sp.Attention(np.diag([-1.0, -1.0, 1.0]), np.diag([-1.0, 1.0, -2.0]), 10.0)

    real_refs, real_arrays = solver_mod._refs, solver_mod.Solver._moment_arrays
    handed = []

    def counted(self, pooled=True):
        pair = real_arrays(self, pooled)
        handed.append(id(pair[0]))
        return pair

    monkeypatch.setattr(solver_mod.Solver, "_moment_arrays", counted)

    def run(model, free, steps=25):
        monkeypatch.setattr(solver_mod, "_FREE_REFS", free)
        # the mutation (free > 100): any count passes
        monkeypatch.setattr(solver_mod, "_refs", (lambda a: free) if free > 100 else real_refs)
        handed.clear()
        s = sp.Solver(g, model, f0, sp.Options(rtol=1e-4))
        for _ in range(steps):
            s.step()
        return s.f.copy(), s.t, (len(s._pool), len(handed), len(set(handed)))

    free = solver_mod._FREE_REFS
    assert free > 0  # CPython: reference counts exist, so the pool is on
    for model in (two, att):
        pooled, t1, n_pool = run(model, free)
        fresh, t2, n_fresh = run(model, 0)
        # pool: at most _POOL arrays, many more hand-outs (every state and stage needs moments)
        assert n_fresh[0] == 0 and 0 < n_pool[0] <= solver_mod._POOL and n_pool[1] > 3 * n_pool[0], n_pool
        assert t1 == t2 and np.array_equal(pooled, fresh)
        wrong, _, _ = run(model, 10**6)  # reuses the first pair whoever holds it
        assert not np.array_equal(wrong, fresh)


@numba.njit
def _precessing(x, t, out):
    """A rotation about an axis that precesses about e3 (time dependence of no finite separable form in
    the solver's sense: its modes would be cos t, sin t and 1, but here it is a plain function of t)."""
    a0, a1, a2 = 0.3 * math.cos(2.0 * t), 0.3 * math.sin(2.0 * t), 1.0
    out[0] = a1 * x[2] - a2 * x[1] + 0.2 * x[2]  # plus a non-tangent part, which the solver drops
    out[1] = a2 * x[0] - a0 * x[2]
    out[2] = a0 * x[1] - a1 * x[0]


def _precessing_np(x, t=0.0):
    a = np.array([0.3 * np.cos(2.0 * t), 0.3 * np.sin(2.0 * t), 1.0])
    v = np.cross(a, x)
    v[:, 0] += 0.2 * x[:, 2]
    return v


@pytest.mark.parametrize("grid", ["healpix", "adaptive"])
def test_compiled_field_equals_the_numpy_field(grid):
    """Prescribed.compiled: the solver forms the normal weights in its own compiled loop (the tangent part
    of the kernel's vector dotted with the face normals), the NumPy field goes through field() and an
    einsum: the same weights up to rounding, so the same steps and densities to 1e-12 relative; on an
    adaptive grid that regrids too. velocity(x, t) of the compiled model is the kernel at any points."""
    g = sp.HealpixGrid(8) if grid == "healpix" else sp.AdaptiveHealpixGrid(4, 16)
    comp = sp.Prescribed.compiled(_precessing, max_speed=1.6)
    plain = sp.Prescribed(_precessing_np, max_speed=1.6)
    f0 = lambda x: 0.1 + np.exp(6 * (x[:, 0] - 1))  # noqa: E731
    r1 = sp.solve(g, comp, f0, 1.5)
    r2 = sp.solve(g, plain, f0, 1.5)
    assert r1.n_steps == r2.n_steps
    assert np.abs(r1.density[-1] - r2.density[-1]).max() < 1e-12 * np.abs(r2.density[-1]).max()
    c0, c1 = ((r1.density[i] * r1.grid_at(i).areas) @ r1.grid_at(i).centers for i in (0, -1))
    assert np.linalg.norm(c1 - c0) > 1e-2 * np.linalg.norm(c0)  # the flow did move the density
    x = sp.HealpixGrid(4).centers
    assert np.array_equal(comp.velocity(x, 0.7), _precessing_np(x, 0.7))
    assert np.allclose(comp.field(x, 0.7), plain.field(x, 0.7), rtol=0, atol=1e-15)
    # particles take the same field
    p1 = sp.simulate_particles(comp, x[:20], 0.5, 0.05).positions[-1]
    p2 = sp.simulate_particles(plain, x[:20], 0.5, 0.05).positions[-1]
    assert np.abs(p1 - p2).max() < 1e-14


@numba.njit
def _blows_up(x, t, out):
    out[0] = -x[1]
    out[1] = x[0]
    out[2] = 0.0 if t < 0.5 else math.nan


def test_compiled_field_bad_input_is_named():
    with pytest.raises(TypeError, match="numba.njit"):
        sp.Prescribed.compiled(lambda x, t, out: None)
    g = sp.HealpixGrid(4)
    with pytest.raises(ValueError, match="_blows_up.*NaN or inf at t = "):
        sp.solve(g, sp.Prescribed.compiled(_blows_up, max_speed=1.0), lambda x: np.ones(len(x)), 1.0)


# ------------------------------------------------------------- Options.field_time = "interpolate"
def _counted_plain(counter, max_speed=4.0):
    """The two-mode deformational field of _deform_modes as a plain velocity(x, t), its calls counted."""
    sep = sp.Prescribed.separable(_deform_modes([0, 0]), max_speed=max_speed)

    def vel(x, t):
        counter[0] += 1
        return sep.velocity(x, t)

    return sp.Prescribed(vel, max_speed=max_speed)


def test_interpolated_field_error_follows_rtol():
    """field_time="interpolate": the field is evaluated at time nodes and interpolated linearly between,
    the nodes placed so that the predicted relative error is <= rtol / 2. Fixed steps (the same 250 steps
    for both runs), so the difference to the exact-field run is the interpolation's alone. Measured
    (nside 8, to t = 2.5, the deformation's largest): the difference is 0.78 rtol of the change the run makes
    at rtol 1e-3 and 1e-4 (9.7x apart), with 39 and 115 field evaluations against 501. Asserted: within rtol
    of the change (the field's relative error is <= rtol / 2 by construction; the density's relative error
    then stays within about that of the change it makes), a ratio of 5 to 20 between the two rtols (the
    error is second order in the node spacing H and H^2 ~ rtol: a wrong spacing rule, e.g. H ~ rtol, or an
    extrapolation, would not give 10), the recorded predicted error <= rtol / 2, and at most a tenth of the
    exact run's evaluations at rtol 1e-3."""
    g = sp.HealpixGrid(8)
    n = [0]
    plain = _counted_plain(n)
    f0 = lambda x: 1.0 + np.exp(4 * (x[:, 0] - 1))  # noqa: E731
    r0 = sp.solve(g, plain, f0, 2.5, error_control=False, max_dt=0.01)
    exact_calls, n[0] = n[0], 0
    change = g.areas @ np.abs(r0.density[-1] - r0.density[0])
    diffs = []
    for rtol in (1e-3, 1e-4):
        r = sp.solve(g, plain, f0, 2.5, error_control=False, max_dt=0.01, field_time="interpolate", rtol=rtol)
        assert r.n_steps == r0.n_steps
        diffs.append(g.areas @ np.abs(r.density[-1] - r0.density[-1]) / change)
        assert diffs[-1] <= rtol, (rtol, diffs[-1])
        assert 0 < r.diagnostics["field_error"].max() <= 0.5 * rtol
        if rtol == 1e-3:
            assert n[0] <= exact_calls / 10, (n[0], exact_calls)
    assert 5 < diffs[0] / diffs[1] < 20, diffs


def test_interpolation_nodes_meet_the_tolerance_between_them():
    """The node control against the truth: for a field c(t) v(x) the interpolation's relative error is that
    of c alone, so every interval the run used (the nodes collected after each step) is checked on a fine
    sampling: max |c - linear interpolant| / max |c| at the interval's three nodes (the scale the control
    uses) <= rtol. That is twice the target rtol / 2: the control predicts an interval's error from the
    curvature over it and the interval before, so the true error can exceed the target (measured worst
    0.62 rtol for cos t, 0.70 rtol for cos 3t: 1.2-1.4x the target; 72 and 198 nodes). The first interval
    has its midpoint as a node, so it is checked too. An interval that missed the target at the closest
    spacing the control allows (an eighth of the step) is evaluated exactly instead: it is exempt, and the
    field must have been called inside it (measured: none for cos t; for cos 3t the 2 intervals placed
    during the first attempt, a CFL step the error control then cut to a third). And the spacing follows
    the field: 3x the frequency, about 3x the nodes (H ~ sqrt(rtol / |c''|))."""
    g = sp.HealpixGrid(4)
    rtol = 1e-3
    counts = []
    for w in (1.0, 3.0):
        called = []

        def c(t, w=w, called=called):
            called.append(t)
            return math.cos(w * t)

        model = sp.Prescribed(lambda x, t, c=c: c(t) * np.cross([0.0, 0.0, 1.0], x), max_speed=1.0)
        s = sp.Solver(g, model, lambda x: 1.0 + x[:, 0], sp.Options(field_time="interpolate", rtol=rtol))
        seen = {}
        while s.t < 4.0:
            s.step()
            seen.update(zip(s._nodes, s._node_errs))
        nodes = sorted(seen)
        counts.append(len(nodes))
        worst, skipped = 0.0, 0
        for p, a, b in zip(nodes[:-2], nodes[1:-1], nodes[2:]):
            if seen[b] > rtol / 2:  # missed at the closest spacing: evaluated exactly, not interpolated
                skipped += 1
                assert any(a < u < b for u in called), (w, a, b)
                continue
            u = np.linspace(a, b, 41)
            lin = c(a) + (c(b) - c(a)) * (u - a) / (b - a)
            err = np.abs(np.cos(w * u) - lin).max() / max(abs(c(p)), abs(c(a)), abs(c(b)))
            worst = max(worst, err)
        assert worst <= rtol, (w, worst)
        assert skipped <= 2, (w, skipped)
    assert 2.0 < counts[1] / counts[0] < 4.5, counts


def test_interpolated_field_resumes_bit_for_bit(tmp_path):
    """The node times travel in the checkpoint (their weights are re-evaluated, the field being a function
    of t): a run stopped, written, read and continued equals the uninterrupted run to the last bit."""
    from spherepde.io import read_checkpoint, write_checkpoint

    g = sp.HealpixGrid(4)
    model = sp.Prescribed.compiled(_precessing, max_speed=1.6)
    opts = sp.Options(field_time="interpolate")
    f0 = lambda x: 0.1 + np.exp(6 * (x[:, 0] - 1))  # noqa: E731
    a = sp.Solver(g, model, f0, opts)
    for _ in range(15):
        a.step()
    write_checkpoint(tmp_path / "c.h5", a.get_state())
    assert len(a._nodes) >= 2
    for _ in range(15):
        a.step()
    b = sp.Solver(g, model, f0, opts)
    b.set_state(read_checkpoint(tmp_path / "c.h5")[0])
    for _ in range(15):
        b.step()
    assert b.t == a.t and np.array_equal(b.f, a.f)


def test_interpolated_moments_in_pairs_give_the_same_bits(monkeypatch):
    """Two stage times of a step between the same two nodes get their moments in one pass
    (fv.lerp_moments_pair, Solver._pair_moments): the run equals, to the last bit, the run that makes
    one pass per stage time, and the pair pass is in fact taken on most steps (SSP-RK(4,3) asks for
    t + dt / 2 and t + dt; a node between them, or a stage rejected by its CFL check, falls back to single
    passes). A pair kernel that wrote the first time's moments into both sets, or a prefetched set served
    for another time, changes the bits."""
    from spherepde.kernels import fv

    calls = [0]
    pair = fv.lerp_moments_pair

    def counted(*args):
        calls[0] += 1
        return pair(*args)

    monkeypatch.setattr(fv, "lerp_moments_pair", counted)
    g = sp.HealpixGrid(8)
    model = sp.Prescribed.compiled(_precessing, max_speed=1.6)
    f0 = lambda x: 0.1 + np.exp(6 * (x[:, 0] - 1))  # noqa: E731
    runs = {}
    for on in (True, False):
        monkeypatch.setattr(sp.Solver, "_pair_moments", on)
        s = sp.Solver(g, model, f0, sp.Options(field_time="interpolate"))
        for _ in range(40):
            s.step()
        runs[on] = (s.t, s.f.copy(), calls[0])
    assert runs[True][0] == runs[False][0] and np.array_equal(runs[True][1], runs[False][1])
    # measured 28 of the 40 steps paired (at nside 8 a step is a third of the node spacing, so a node often
    # falls between t + dt / 2 and t + dt); none when off
    assert runs[True][2] >= 20 and runs[False][2] == runs[True][2], calls


def test_interpolated_pairs_survive_rejected_steps(monkeypatch):
    """Prefetched pairs serve their attempt only, and a set without face moments can be a state's. A field
    that speeds up e^6-fold within a CFL step makes attempts fail their last stage's CFL check and retry at
    half the step, whose end is the failed attempt's mid-stage: that state reuses the mid-stage's set, which
    has no face moments and carries its rates (the divergence of the record among them, interpolated from
    the nodes' per-cell values). Checked: the run completes with rejections, the recorded sup_div is finite
    (a set that lacked its rates recorded NaN), and the bits equal those of the run that makes every set
    whole and alone."""
    g = sp.HealpixGrid(4)
    model = sp.Prescribed(lambda x, t: math.exp(30.0 * t) * np.cross([0.0, 0.0, 1.0], x), max_speed=1.0)
    f0 = lambda x: 1.0 + x[:, 0]  # noqa: E731
    runs = {}
    for on in (True, False):
        monkeypatch.setattr(sp.Solver, "_pair_moments", on)
        s = sp.Solver(g, model, f0, sp.Options(field_time="interpolate", error_control=False))
        for _ in range(12):
            s.step()
        runs[on] = (s.t, s.f.copy(), sum(s.diag["rejected"]), s.diag["sup_div"])
    assert runs[True][2] > 0 and runs[True][2] == runs[False][2]
    assert np.all(np.isfinite(runs[True][3]))
    assert runs[True][0] == runs[False][0] and np.array_equal(runs[True][1], runs[False][1])


@pytest.mark.parametrize("grid", ["adaptive", "layers"])
def test_interpolated_field_across_regrids_and_layers(grid):
    """A regrid keeps the node times and re-evaluates their weights on the new cells; a layer boundary ends
    the nodes (the next layer's field is another function). Either way the run stays within rtol of the
    change (measured 1.8e-4 adaptive, 3.9e-4 layers, at rtol 1e-3) of the exact field's run, in the same
    fixed steps. Mutation checked: keeping the first layer's nodes after t = 0.5 fails (the old field
    interpolated into the new layer's interval)."""
    f0 = lambda x: 0.1 + np.exp(6 * (x[:, 0] - 1))  # noqa: E731
    if grid == "adaptive":
        g, model = sp.AdaptiveHealpixGrid(4, 16), sp.Prescribed(_precessing_np, max_speed=1.6)
    else:
        g = sp.HealpixGrid(8)
        other = sp.Prescribed(lambda x, t: -2.0 * _precessing_np(x, t), max_speed=3.2)
        model = sp.Layers([(0.0, sp.Prescribed(_precessing_np, max_speed=1.6)), (0.5, other)])
    r0 = sp.solve(g, model, f0, 1.0, error_control=False, max_dt=0.01)
    r1 = sp.solve(g, model, f0, 1.0, error_control=False, max_dt=0.01, field_time="interpolate")
    assert r1.n_steps == r0.n_steps
    d0, d1 = r0.density[-1], r1.density[-1]
    if grid == "adaptive":
        assert r1.grid_at(-1).n_cells == r0.grid_at(-1).n_cells != r0.grid_at(0).n_cells  # it did regrid
        a0 = r0.grid_at(-1).areas
        change = a0 @ np.abs(d0 - r0.grid_at(-1).cell_average(f0))
    else:
        a0 = g.areas
        change = a0 @ np.abs(d0 - r0.density[0])
    assert a0 @ np.abs(d1 - d0) <= 1e-3 * change, (a0 @ np.abs(d1 - d0) / change)


@pytest.mark.parametrize("case", ["linear", "maximum", "quadratic", "log-quadratic", "tensor d=4"])
def test_interpolated_moments_on_every_scheme(case):
    """The interpolated moment sets serve every scheme: without face moments where the stage reads only the
    cell-major set (linear, quadratic, log-quadratic: for the last, the point weights themselves), whole
    where limiter="maximum" reads the face moments, on S^2 and S^3. Against the exact field's run in the same
    100 fixed steps (a precessing rotation, nside 8 / a 6^3 tensor grid on S^3): within rtol (1e-3) of the
    change the run makes (measured 1.2e-4 on HEALPix, 2.2e-4 on S^3), and not equal to it (the interpolation
    is in use); mass to round-off (1e-13: 100 steps of sums of O(1) terms), positive, the recorded
    divergence finite (it comes from the nodes' per-cell values, not from face moments)."""
    g = sp.TensorGrid(4, 6) if case == "tensor d=4" else sp.HealpixGrid(8)
    opts = {"maximum": {"limiter": "maximum"}, "quadratic": {"scheme": "quadratic"},
            "log-quadratic": {"scheme": "log-quadratic"}}.get(case, {})

    def precessing(x, t=0.0):  # a rotation in the (x0, x1) plane plus one in (x0, x_last) that oscillates
        M = np.zeros((g.dim, g.dim))
        M[0, 1], M[1, 0] = -1.0, 1.0
        M[0, -1], M[-1, 0] = 0.3 * np.cos(2 * t), -0.3 * np.cos(2 * t)
        return x @ M.T

    model = sp.Prescribed(precessing, dim=g.dim, max_speed=1.5)
    f0 = lambda x: 0.1 + np.exp(6 * (x[:, 0] - 1))  # noqa: E731
    r0 = sp.solve(g, model, f0, 1.0, error_control=False, max_dt=0.01, **opts)
    r1 = sp.solve(g, model, f0, 1.0, error_control=False, max_dt=0.01, field_time="interpolate", **opts)
    assert r1.n_steps == r0.n_steps == 100
    a, d0, d1 = g.areas, r0.density[-1], r1.density[-1]
    diff = a @ np.abs(d1 - d0) / (a @ np.abs(d0 - r0.density[0]))
    assert 0 < diff <= 1e-3, diff
    assert abs(a @ d1 / (a @ r1.density[0]) - 1) <= 1e-13 and d1.min() > 0
    assert np.all(np.isfinite(r1.diagnostics["sup_div"]))


def test_field_time_is_validated():
    with pytest.raises(ValueError, match="field_time must be one of"):
        sp.Options(field_time="linear")
