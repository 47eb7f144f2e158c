"""Unnormalised attention (issue #18 item 3) and the linear stability of the uniform state with and without
noise, against closed forms.

On S^1 with B = V = I, a mode e^{ik theta} of the uniform state grows at
  USA:     lambda_k = (k^2 / beta) e^{-beta} I_k(beta)          (time rescaled by e^{beta}, Attention docs)
  softmax: lambda_k = (k^2 / beta) I_k(beta) / I_0(beta)
and noise subtracts D k^2 (D = sigma^2 / 2). Derivation: the tangential velocity of f0 + eps g is
eps (K * g) with K(psi) = sin(psi) e^{beta (cos psi - 1)} (USA; softmax: e^{beta cos psi} / I_0(beta)), and
int sin(psi) sin(k psi) e^{beta cos psi} dpsi = pi (I_{k-1} - I_{k+1})(beta) = 2 pi k I_k(beta) / beta.
"""
import numpy as np
import pytest
from scipy.special import ive

import spherepde as sp


def test_usa_mean_against_its_formula_and_the_softmax():
    rng = np.random.default_rng(0)
    B, V = rng.normal(size=(3, 3)), rng.normal(size=(3, 3))
    a = sp.Attention(B, V, 4.0, normalization="usa")
    x, y, w = sp.sample_uniform(20, 3, rng=1), sp.sample_uniform(30, 3, rng=2), rng.random(30)
    k = np.exp(4.0 * (np.einsum("id,de,je->ij", x, B, y) - np.linalg.norm(B, 2)))
    want = (w[None, :, None] * y[None] * k[:, :, None]).sum(axis=1)
    np.testing.assert_allclose(a.mean_field(x, y, w), want, rtol=1e-13, atol=1e-15)
    soft = sp.Attention(B, V, 4.0).mean_field(x, y, w, method="direct")
    np.testing.assert_allclose(soft * (k @ w)[:, None], want, rtol=1e-12, atol=1e-15)  # USA = softmax x Z
    assert np.all(k <= 1.0)  # the shift keeps every kernel value <= 1: finite for any beta
    big = sp.Attention(B, V, 1e4, normalization="usa").mean_field(x, y, w)
    assert np.all(np.isfinite(big))
    # tokens: the same mean in the particle code
    xt = sp.sample_uniform(40, 3, rng=3)
    v = sp.particle_velocity(a, xt)
    kt = np.exp(4.0 * (np.einsum("id,de,je->ij", xt, B, xt) - np.linalg.norm(B, 2)))
    m = (kt[:, :, None] * xt[None]).sum(axis=1) / 40
    y_ = m @ V.T
    np.testing.assert_allclose(v, y_ - np.sum(xt * y_, axis=1)[:, None] * xt, rtol=1e-12, atol=1e-14)
    with pytest.raises(ValueError, match="normalization must be one of"):
        sp.Attention(B, V, 1.0, normalization="sparsemax")


@pytest.mark.parametrize("norm", ["usa", "softmax"])
@pytest.mark.parametrize("k, sigma", [(1, 0.0), (3, 0.0), (6, 0.0), (3, 0.2)])
def test_linear_growth_rates_of_the_uniform_state_on_the_circle(norm, k, sigma):
    # measured relative deviation <= 1.4e-3 at 256 cells (the spatial error of the rate); 5e-3 allowed
    beta, eps, T = 5.0, 1e-6, 0.5
    g = sp.TensorGrid(2, 128)
    th = np.arctan2(g.centers[:, 1], g.centers[:, 0])
    model = sp.Attention(np.eye(2), np.eye(2), beta, normalization=norm)
    if sigma:
        model = model + sp.Noise(sigma)
    r = sp.solve(g, model, lambda x: (1 + eps * np.cos(k * np.arctan2(x[:, 1], x[:, 0]))) / (2 * np.pi), T,
                 save_at=[0.0, T], rtol=1e-6)
    amp = [np.sum((f - 1 / (2 * np.pi)) * np.cos(k * th) * g.areas) for f in r.density]
    rate = np.log(amp[1] / amp[0]) / T
    lam = (k * k / beta) * ive(k, beta) / (1.0 if norm == "usa" else ive(0, beta)) - 0.5 * sigma ** 2 * k * k
    assert rate == pytest.approx(lam, rel=5e-3, abs=2e-4)


def test_usa_in_a_config():
    from spherepde.config import ConfigError, parse_config

    base = '''[grid]
type = "tensor"
d = 2
n = 16
[model]
type = "attention"
B = "identity"
V = "identity"
beta = 5.0
normalization = "usa"
[time]
t_end = 0.1
'''
    base = base.replace('B = "identity"', "B = [[1, 0], [0, 1]]").replace('V = "identity"', "V = [[1, 0], [0, 1]]")
    cfg = parse_config(base)
    assert cfg.build_model().normalization == "usa"
    assert "normalization" not in parse_config(base.replace('normalization = "usa"\n', "")).to_dict()["model"]
    with pytest.raises(ConfigError) as exc:
        parse_config(base.replace('"usa"', '"hard"'))
    assert exc.value.key == "model.normalization"
