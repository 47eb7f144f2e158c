"""Many tokens: the softmax over the tokens through the certified evaluator (issue #17 item 4), against
the direct sums, with its bound reported."""
import numpy as np

import spherepde as sp
from spherepde import particles

P = np.diag([-1.0, -1.0, 1.0])
V = np.diag([-1.0, 1.0, -2.0])


def test_many_tokens_use_the_certified_field_within_its_bound(monkeypatch):
    """Above FAST_PAIRS token pairs the velocity comes from the evaluator: the tokens' velocities agree with
    the direct softmax sums to sigma_max(V) x the bound (v = P_x(V m), |P_x| <= 1), the run reports that
    bound (<= tol) and the methods; below, the direct kernel (bound 0, no methods). 3000 tokens, beta 30,
    tol 1e-10, the pruned method; the threshold is lowered so that both paths run on the same tokens."""
    x0 = sp.sample_uniform(3000, 3, rng=4)
    w = np.random.default_rng(1).random(3000) + 0.5
    w /= w.sum()
    model = sp.Attention(P, V, 30.0, tol=1e-10, method="pruned")  # (at this size "auto" picks direct sums)
    fast = sp.particle_velocity(model, x0, weights=w)  # 9e6 pairs > FAST_PAIRS: the evaluator
    monkeypatch.setattr(particles, "FAST_PAIRS", 1e12)
    ref = sp.particle_velocity(model, x0, weights=w)  # the direct kernel
    r_ref = sp.simulate_particles(model, x0, 0.05, 0.01, weights=w)
    monkeypatch.setattr(particles, "FAST_PAIRS", 1e6)
    r = sp.simulate_particles(model, x0, 0.05, 0.01, weights=w)
    smax = float(np.linalg.norm(V, 2))
    assert np.abs(fast - ref).max() <= smax * 1e-10 + 1e-14
    assert r_ref.field_bound == 0.0 and r_ref.field_methods == ()
    assert 0.0 < r.field_bound <= 1e-10 and r.field_methods == ("pruned",)
    # five Euler steps: the positions differ by at most ~5 dt sigma_max(V) bound (no amplification at this scale)
    assert np.abs(r.positions - r_ref.positions).max() <= 5 * 0.01 * smax * 1e-10 * 10


def test_many_tokens_through_a_multihead_sum(monkeypatch):
    """Composite models take the same path per head: two heads plus a local term, above the threshold,
    equal the direct kernels to the heads' bounds."""
    x0 = sp.sample_uniform(1500, 3, rng=2)
    model = sp.MultiHead([sp.Attention(P, V, 20.0, tol=1e-10, method="pruned"), sp.Attention(np.eye(3), V, 5.0)]) \
        + sp.Prescribed.rigid_rotation([0.0, 0.0, 1.0])
    monkeypatch.setattr(particles, "FAST_PAIRS", 1e6)
    fast = sp.particle_velocity(model, x0)
    r = sp.simulate_particles(model, x0, 0.02, 0.01)
    monkeypatch.setattr(particles, "FAST_PAIRS", 1e12)
    ref = sp.particle_velocity(model, x0)
    assert np.abs(fast - ref).max() <= 2 * 1e-10 + 1e-13  # weights 1/2 each, |V| = 2, bounds 1e-10 and 1e-12
    assert 0.0 < r.field_bound <= 1e-10 and r.field_methods == ("direct", "pruned")
