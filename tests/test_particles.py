"""Particle kernels and simulate_particles: NumPy twins, invariants, orders, validation."""
import numpy as np
import pytest
from scipy.special import logsumexp

from spherepde.kernels.particles import exp_nonpositive, hardmax_mean, softmax_mean
from spherepde.models import Prescribed, ZeroTemperature
from spherepde.particles import SCHEMES, particle_velocity, simulate_particles
from spherepde.sampling import sample_uniform
from spherepde.spectral import projection, spectral_data

B_PAPER = np.diag([-1.0, -1.0, 1.0])
V_PAPER = np.diag([-1.0, 1.0, -2.0])


class FakeAttention:
    """Stand-in for spherepde.models.Attention: only the attributes the particle code reads."""

    def __init__(self, B, V, beta):
        self.B = np.asarray(B, float)
        self.V = np.asarray(V, float)
        self.beta = beta
        self.dim = self.B.shape[0]


def twin_softmax(x, y, w, B, beta):
    """Plain NumPy reference: full score matrix and scipy's log-sum-exp."""
    with np.errstate(divide="ignore"):
        z = beta * x @ B @ y.T + np.log(w)[None, :]
    lse = logsumexp(z, axis=1)
    return np.exp(z - lse[:, None]) @ y, lse


def twin_hardmax(x, y, w, B):
    s = x @ B @ y.T
    s[:, w == 0] = -np.inf
    return y[np.argmax(s, axis=1)]


def test_exp_nonpositive_matches_numpy():
    x = np.concatenate([-np.logspace(-12, np.log10(699.0), 20001), [0.0, -0.0, -701.0, -np.inf]])
    out, scratch = np.empty_like(x), np.empty_like(x)
    exp_nonpositive(x, out, scratch)
    ref = np.exp(x)
    ref[x <= -700.0] = 0.0  # documented flush below EXP_CUTOFF
    # degree-13 Taylor on |r| <= ln2/2 plus Cody-Waite reduction: a few ulp (measured 2.2e-16)
    np.testing.assert_allclose(out, ref, rtol=1e-15, atol=0.0)


@pytest.mark.parametrize("d", [3, 4])
@pytest.mark.parametrize("beta", [0.0, 1.0, 100.0, 1e4])
def test_softmax_kernel_matches_numpy_twin(d, beta):
    rng = np.random.default_rng(d + int(beta))
    x = sample_uniform(157, d, rng)
    y = sample_uniform(203, d, rng)
    w = rng.random(203)
    w[5] = 0.0  # zero-weight source must be ignored
    B = rng.standard_normal((d, d))
    mean, lse = np.empty_like(x), np.empty(157)
    with np.errstate(divide="ignore"):
        logw = np.log(w)
    softmax_mean(x, np.ascontiguousarray(y.T), logw, B, beta, mean, lse)
    ref_mean, ref_lse = twin_softmax(x, y, w, B, beta)
    # scores reach beta |B| ~ 3e4: the lse carries ~1e-16 relative error of its largest term
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-13, atol=1e-12)
    # the mean is a convex combination of unit vectors: absolute error ~ a few eps * condition of exp
    np.testing.assert_allclose(mean, ref_mean, atol=1e-10 * max(1.0, beta / 100))


def test_softmax_kernel_stable_at_huge_beta():
    rng = np.random.default_rng(0)
    x = sample_uniform(50, 3, rng)
    w = np.full(50, 1 / 50)
    mean, lse = np.empty_like(x), np.empty(50)
    softmax_mean(x, np.ascontiguousarray(x.T), np.log(w), B_PAPER, 1e8, mean, lse)
    assert np.all(np.isfinite(mean)) and np.all(np.isfinite(lse))
    # at beta = 1e8 the softmax is the hardmax (score gaps >> 1/beta for random points)
    hard = np.empty_like(x)
    hardmax_mean(x, np.ascontiguousarray(x.T), np.log(w), B_PAPER, hard)
    np.testing.assert_allclose(mean, hard, atol=1e-12)


def test_hardmax_kernel_matches_twin_and_ties():
    rng = np.random.default_rng(1)
    x = sample_uniform(80, 3, rng)
    y = sample_uniform(90, 3, rng)
    w = rng.random(90)
    w[np.argmax(x[0] @ B_PAPER @ y.T)] = 0.0  # the best source of target 0 has no mass: skipped
    out = np.empty_like(x)
    with np.errstate(divide="ignore"):
        hardmax_mean(x, np.ascontiguousarray(y.T), np.log(w), B_PAPER, out)
    # the kernel returns (w_j y_j) / w_j: equal to y_j up to one rounding
    np.testing.assert_allclose(out, twin_hardmax(x, y, w, B_PAPER), rtol=0, atol=4e-16)
    # exact tie between two sources: the weighted average of the tied sources
    ys = np.array([[0.0, 0.6, 0.8], [0.0, -0.6, 0.8], [1.0, 0, 0]])
    t = np.array([[0.0, 0.0, 1.0]])  # <t, I y> ties between ys[0] and ys[1]
    wt = np.array([0.25, 0.75, 1.0])
    out = np.empty_like(t)
    hardmax_mean(t, np.ascontiguousarray(ys.T), np.log(wt), np.eye(3), out)
    np.testing.assert_allclose(out[0], 0.25 * ys[0] + 0.75 * ys[1], atol=1e-15)


def test_particle_velocity_softmax_matches_twin():
    rng = np.random.default_rng(2)
    x = sample_uniform(120, 3, rng)
    w = rng.random(120)
    model = FakeAttention(B_PAPER, V_PAPER, 30.0)
    v = particle_velocity(model, x, weights=w)
    m, _ = twin_softmax(x, x, w / w.sum(), B_PAPER, 30.0)
    vm = m @ V_PAPER.T
    ref = vm - np.sum(x * vm, axis=1)[:, None] * x
    np.testing.assert_allclose(v, ref, atol=1e-12)
    np.testing.assert_allclose(np.sum(v * x, axis=1), 0.0, atol=1e-14)  # tangent


def test_euler_is_algorithm_1():
    rng = np.random.default_rng(3)
    x0 = sample_uniform(40, 3, rng)
    model = FakeAttention(B_PAPER, V_PAPER, 100.0)
    res = simulate_particles(model, x0, 0.02, 0.01, save_at="all")
    x = x0.copy()
    for _ in range(2):
        m, _ = twin_softmax(x, x, np.full(40, 1 / 40), B_PAPER, 100.0)
        vm = m @ V_PAPER.T
        y = x + 0.01 * (vm - np.sum(x * vm, axis=1)[:, None] * x)
        x = y / np.linalg.norm(y, axis=1)[:, None]
    np.testing.assert_allclose(res.times, [0.0, 0.01, 0.02], atol=1e-15)
    np.testing.assert_allclose(res.positions[-1], x, atol=1e-13)
    assert res.method == "euler" and res.rule == "softmax" and res.positions.shape == (3, 40, 3)


def test_zero_temperature_is_independent_tokens():
    rng = np.random.default_rng(4)
    x0 = sample_uniform(30, 3, rng)
    model = ZeroTemperature(B_PAPER, V_PAPER)
    full = simulate_particles(model, x0, 0.5, 0.05, method="rk4")
    alone = simulate_particles(model, x0[:1], 0.5, 0.05, method="rk4")
    assert full.rule == "independent"
    np.testing.assert_allclose(full.positions[-1, 0], alone.positions[-1, 0], atol=1e-15)


def test_pi_invariant_along_zero_temperature_paths():
    # generic Assumption-1 pair with dim E = 2: A symmetric with a double top eigenvalue, B random
    rng = np.random.default_rng(5)
    Q, _ = np.linalg.qr(rng.standard_normal((3, 3)))
    A = Q @ np.diag([1.0, 1.0, -1.5]) @ Q.T
    B = rng.standard_normal((3, 3)) + 2 * np.eye(3)
    V = A @ np.linalg.inv(B.T)
    s = spectral_data(B, V).check()
    assert s.k == 2
    x0 = sample_uniform(200, 3, rng)
    res = simulate_particles(ZeroTemperature(B, V), x0, 2.0, 0.01, method="rk4", save_at=[0.5, 1.0, 2.0])
    pi0 = projection(x0, s.E)
    for xt in res.positions:
        # RK4 global error ~ C dt^4 = O(1e-8) here; tokens near E^perp amplify it by 1/|P_E x|
        np.testing.assert_allclose(projection(xt, s.E), pi0, atol=1e-7)
    # and the flow really moves the tokens (the test is not vacuous)
    assert np.max(np.abs(res.positions[-1] - x0)) > 0.1


def _order(model, method, dts, ref_dt, t_end=1.0, n=20):
    x0 = sample_uniform(n, 3, 7)
    ref = simulate_particles(model, x0, t_end, ref_dt, method="rk4").positions[-1]
    errs = [np.max(np.abs(simulate_particles(model, x0, t_end, h, method=method).positions[-1] - ref))
            for h in dts]
    return np.log2(np.array(errs[:-1]) / np.array(errs[1:]))


def test_euler_order_one():
    # reference: RK4 at dt = 1/320, error ~1e-10, negligible against Euler errors ~1e-3
    orders = _order(FakeAttention(B_PAPER, V_PAPER, 5.0), "euler", [0.02, 0.01, 0.005], 1 / 320)
    # asymptotic regime reached at these steps (observed orders 0.97-1.0)
    assert np.all((orders > 0.85) & (orders < 1.15)), orders


def test_rk4_order_four():
    orders = _order(FakeAttention(B_PAPER, V_PAPER, 5.0), "rk4", [0.2, 0.1, 0.05], 1 / 640)
    # reference error (dt = 1/640) is (0.05 * 640)^4 ~ 1e6 times below the smallest error measured
    assert np.all((orders > 3.6) & (orders < 4.5)), orders


def test_scheme_registry_orders_on_rotation():
    # rigid rotation: exact solution known, every registered scheme at its nominal order
    axis = np.array([0.3, -0.2, 1.0])
    model = Prescribed.rigid_rotation(axis, omega=1.0)
    x0 = sample_uniform(10, 3, 8)
    a = axis / np.linalg.norm(axis)

    def exact(x, t):
        c, s_ = np.cos(t), np.sin(t)
        return x * c + np.cross(a, x) * s_ + np.outer(x @ a, a) * (1 - c)

    for name, scheme in SCHEMES.items():
        order = scheme.order
        errs = [np.max(np.abs(simulate_particles(model, x0, 1.0, h, method=name).positions[-1]
                              - exact(x0, 1.0))) for h in (0.1, 0.05)]
        assert abs(np.log2(errs[0] / errs[1]) - order) < 0.3, (name, errs)


def test_save_at_off_grid_and_prescribed_time():
    model = Prescribed(lambda x, t: np.cross([0.0, 0.0, t], x), dim=3)  # omega(t) = t
    x0 = np.array([[1.0, 0.0, 0.0]])
    res = simulate_particles(model, x0, 1.0, 0.03, save_at=[0.0, 0.1234, 1.0], method="rk4")
    np.testing.assert_allclose(res.times, [0.0, 0.1234, 1.0], atol=0)
    # angle = int_0^t s ds = t^2 / 2
    for t, x in zip(res.times, res.positions):
        np.testing.assert_allclose(x[0], [np.cos(t**2 / 2), np.sin(t**2 / 2), 0.0], atol=1e-8)
    assert res.rule == "prescribed"


def test_hardmax_option_is_a_different_limit():
    x0 = sample_uniform(60, 3, 9)
    zt = ZeroTemperature(B_PAPER, V_PAPER)
    alg2 = simulate_particles(zt, x0, 0.5, 0.01)
    hard = simulate_particles(zt, x0, 0.5, 0.01, hardmax=True)
    assert hard.rule == "hardmax" and alg2.rule == "independent"
    assert np.max(np.abs(hard.positions[-1] - alg2.positions[-1])) > 1e-2
    # hardmax of an attention model ignores beta
    h2 = simulate_particles(FakeAttention(B_PAPER, V_PAPER, 1.0), x0, 0.5, 0.01, hardmax=True)
    np.testing.assert_array_equal(h2.positions, hard.positions)
    with pytest.raises(ValueError, match="hardmax=True needs a model with attention matrices B and V"):
        simulate_particles(Prescribed.rigid_rotation([0, 0, 1]), x0, 0.1, 0.01, hardmax=True)


def test_input_validation_messages():
    model = ZeroTemperature(B_PAPER, V_PAPER)
    x0 = sample_uniform(5, 3, 0)
    with pytest.raises(ValueError, match=r"x0 must have shape \(n, 3\)"):
        simulate_particles(model, x0[:, :2], 1.0, 0.1)
    with pytest.raises(ValueError, match="x0 rows must be unit vectors"):
        simulate_particles(model, 2 * x0, 1.0, 0.1)
    with pytest.raises(ValueError, match="dt must be > 0"):
        simulate_particles(model, x0, 1.0, 0.0)
    with pytest.raises(ValueError, match="t_end must be >= 0"):
        simulate_particles(model, x0, -1.0, 0.1)
    with pytest.raises(ValueError, match=r"save_at must lie within \[0, t_end\]"):
        simulate_particles(model, x0, 1.0, 0.1, save_at=[0.5, 1.5])
    with pytest.raises(ValueError, match="save_at must be strictly increasing"):
        simulate_particles(model, x0, 1.0, 0.1, save_at=[0.5, 0.2])
    with pytest.raises(ValueError, match="method must be one of"):
        simulate_particles(model, x0, 1.0, 0.1, method="rk45")
    with pytest.raises(ValueError, match=r"weights must have shape \(5,\)"):
        simulate_particles(model, x0, 1.0, 0.1, weights=[1, 2])
    with pytest.raises(ValueError, match="model.beta must be finite"):
        simulate_particles(FakeAttention(B_PAPER, V_PAPER, np.inf), x0, 1.0, 0.1)
    with pytest.raises(TypeError, match="model must"):
        simulate_particles(object(), x0, 1.0, 0.1)
    res = simulate_particles(model, x0, 0.0, 0.1)
    assert res.times.tolist() == [0.0] and res.n_steps == 0


def test_agrees_with_attention_model_when_available():
    attention = pytest.importorskip("spherepde.models.attention")
    x = sample_uniform(400, 3, 10)
    w = np.random.default_rng(10).random(400)
    for beta in (1.0, 100.0, 1e4):
        model = attention.Attention(B_PAPER, V_PAPER, beta)
        ours = particle_velocity(model, x, weights=w)
        # Attention guarantees |m_hat - m| <= tol = 1e-12, so |v_hat - v| <= sigma_max(V) 1e-12 = 2e-12
        np.testing.assert_allclose(ours, model.velocity_measure(x, x, w / w.sum()), atol=1e-11)
