"""Models: validation, the zero-temperature field and its closed-form divergence, Prescribed fields."""
import numpy as np
import pytest

from spherepde.models import Prescribed, ZeroTemperature

B_PAPER = np.diag([-1.0, -1.0, 1.0])
V_PAPER = np.diag([-1.0, 1.0, -2.0])


def _unit(n, d, seed=0):
    x = np.random.default_rng(seed).normal(size=(n, d))
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_singular_B_names_condition_number():
    with pytest.raises(ValueError, match="condition number"):
        ZeroTemperature(np.diag([1.0, 1.0, 0.0]), V_PAPER)
    with pytest.raises(ValueError, match="condition number"):
        ZeroTemperature(np.diag([1.0, 1.0, 1e-14]), V_PAPER)


def test_bad_matrices():
    with pytest.raises(ValueError, match="V must be 3 x 3"):
        ZeroTemperature(B_PAPER, np.eye(2))
    with pytest.raises(ValueError, match="B must have finite"):
        ZeroTemperature(np.array([[1, np.nan, 0], [0, 1, 0], [0, 0, 1.0]]), V_PAPER)


def test_velocity_tangent_and_paper_value():
    m = ZeroTemperature(B_PAPER, V_PAPER)
    x = _unit(100, 3)
    v = m.velocity(x)
    assert np.abs(np.einsum("ij,ij->i", x, v)).max() < 1e-15
    # B orthogonal: |B^T x| = 1, so v = P_x(A x), A = diag(1, -1, -2)
    Ax = x * np.array([1.0, -1.0, -2.0])
    assert np.allclose(v, Ax - np.einsum("ij,ij->i", x, Ax)[:, None] * x, atol=1e-15)
    assert m.speed_bound() == 2.0


@pytest.mark.parametrize("d", [2, 3, 4])
def test_divergence_formula_against_finite_differences(d):
    rng = np.random.default_rng(d)
    B = np.eye(d) + 0.4 * rng.normal(size=(d, d))
    V = rng.normal(size=(d, d))
    m = ZeroTemperature(B, V)
    x = _unit(50, d, seed=1)
    # surface divergence of a tangent field = trace of the ambient Jacobian of its 0-homogeneous
    # extension restricted to the tangent plane; central differences of step 1e-5 (error ~1e-9).
    e = 1e-5
    div = np.zeros(len(x))
    for i in range(len(x)):
        P = np.eye(d) - np.outer(x[i], x[i])
        J = np.zeros((d, d))
        for k in range(d):
            dk = np.zeros(d)
            dk[k] = e
            xp = (x[i] + dk) / np.linalg.norm(x[i] + dk)
            xm = (x[i] - dk) / np.linalg.norm(x[i] - dk)
            J[:, k] = (m.velocity(xp[None])[0] - m.velocity(xm[None])[0]) / (2 * e)
        div[i] = np.trace(P @ J @ P)
    assert np.allclose(m.divergence(x), div, atol=1e-7)


def test_prescribed_rotation_and_errors():
    rot = Prescribed.rigid_rotation([0, 0, 1], omega=2.0)
    x = _unit(10, 3)
    assert np.allclose(rot.field(x), 2.0 * np.cross([0, 0, 1], x))
    assert rot.steady and rot.speed_bound() == 2.0
    with pytest.raises(TypeError, match="velocity must be a callable"):
        Prescribed(3.0)
    bad = Prescribed(lambda x, t: np.full_like(x, np.nan))
    with pytest.raises(ValueError, match="NaN"):
        bad.field(x, 0.0)
    wrong = Prescribed(lambda x, t: x[:, :2])
    with pytest.raises(ValueError, match="must return shape"):
        wrong.field(x, 0.0)


@pytest.mark.parametrize("scale", [1e200, 1e-160, 3.0])
def test_zero_temperature_field_does_not_depend_on_the_scale_of_B(scale):
    """Regression (issue #21 item 6): |B^T x| overflowed for B = 1e200 P (v = 0, silently) and lost
    digits at 1e-160 (1.4e-5 error). v_inf and div v_inf are invariant under B -> c B (c > 0)."""
    from spherepde import ZeroTemperature, exact_zero_temperature
    from spherepde.sampling import sample_uniform

    P, V = np.diag([-1.0, -1.0, 1.0]), np.diag([-1.0, 1.0, -2.0])
    x = sample_uniform(50, 3, rng=np.random.default_rng(3))
    ref, big = ZeroTemperature(P, V), ZeroTemperature(scale * P, V)
    np.testing.assert_allclose(big.velocity(x), ref.velocity(x), rtol=1e-14, atol=1e-15)
    np.testing.assert_allclose(big.divergence(x), ref.divergence(x), rtol=1e-13, atol=1e-14)
    f0 = lambda y: np.full(len(y), 1 / (4 * np.pi))  # noqa: E731
    np.testing.assert_allclose(exact_zero_temperature(big, f0, x, 0.5), exact_zero_temperature(ref, f0, x, 0.5),
                               rtol=1e-12)


def test_complex_inputs_and_unsupported_dimensions_are_errors():
    """Regression (issue #21 item 10): complex B, V or f0 were cast to real with only a ComplexWarning, and
    TensorGrid(5, 8) was built though the kernels stop at d = 4."""
    import spherepde as sp

    P, V = np.diag([-1.0, -1.0, 1.0]), np.diag([-1.0, 1.0, -2.0])
    with pytest.raises(ValueError, match="B must be real"):
        ZeroTemperature(P + 1j, V)
    with pytest.raises(ValueError, match="V must be real"):
        sp.Attention(P, V.astype(complex), 2.0)
    g = sp.HealpixGrid(2)
    with pytest.raises(ValueError, match="f0 must be real"):
        sp.solve(g, ZeroTemperature(P, V), np.full(g.n_cells, 1 / (4 * np.pi)) + 0j, 0.1)
    with pytest.raises(ValueError, match="points must be real"):
        ZeroTemperature(P, V).velocity(np.array([[1.0 + 1j, 0, 0]]))
    with pytest.raises(ValueError, match=r"d must be an integer in 2\.\.4"):
        sp.TensorGrid(5, 8)
