"""The dual-tree method of the attention mean (issue #17 item 4: many tokens in clusters): exact against
the direct sums to its certified bound, its expansions really used, its remainder bound not vacuous,
chosen by "auto" for clustered tokens and not for spread-out ones."""
import math

import numpy as np
import pytest

import spherepde as sp
from spherepde import particles
from spherepde.evaluation import REGISTRY, Targets, kernel_centres
from spherepde.evaluation import methods as M
from spherepde.kernels import tree as tree_kernels

P = np.diag([-1.0, -1.0, 1.0])
V = np.diag([-1.0, 1.0, -2.0])


def _clusters(n, kappa, rng, d=3):
    """n points in three clusters of concentration kappa (width ~ 1 / sqrt(kappa))."""
    c = np.array([[1.0, 0.0, 0.0], [-0.6, 0.8, 0.0], [0.0, 0.6, 0.8]])[:, :d]
    c /= np.linalg.norm(c, axis=1)[:, None]
    x = c[rng.integers(0, 3, n)] + rng.normal(size=(n, d)) / math.sqrt(kappa)
    return x / np.linalg.norm(x, axis=1)[:, None]


def _twin(x, y, w, B, beta):
    """NumPy reference of the softmax mean (shifted per target, in blocks of targets)."""
    out = np.empty_like(x)
    for a in range(0, len(x), 500):
        s = beta * (x[a:a + 500] @ B @ y.T)
        s -= s.max(axis=1, keepdims=True)
        k = np.exp(s) * w
        out[a:a + 500] = (k @ y) / k.sum(axis=1, keepdims=True)
    return out


def _run(model, x, y, w):
    ev = model.evaluator()
    p = Targets(x, *kernel_centres(model, x), y, w)
    setup = M._tree_setup(ev, p)
    stats = setup.stats.copy()
    out = np.full(x.shape, np.nan)
    info = sp.evaluation.FieldInfo()
    bad = REGISTRY["tree"].run(ev, p, out, info)
    return out, info, bad, stats


@pytest.mark.parametrize("kappa, tol", [(3000.0, 1e-12), (1e5, 1e-12), (300.0, 1e-10)])
def test_tree_meets_its_bound_on_clustered_tokens(kappa, tol):
    """6000 tokens in three clusters (kappa 300: width 0.06 rad, the attention scale 0.01 rad at beta
    100 is 6x narrower; 3000: 0.018 rad; 1e5: 0.003 rad), beta 100, the paper's matrices, unequal weights: every
    target certified, the error against the NumPy twin below the reported bound (plus the twin's own
    rounding, sums of 6000 terms: ~1e-15), the bound <= 0.9 tol; expansions and pruning both used (the
    stats of the plan), so the sums are not the direct ones in disguise. (At tol 1e-12 and kappa 300 the
    tree expands only from ~2e4 tokens on: at 6000 it sums 48 % of the products directly.)"""
    rng = np.random.default_rng(3)
    x = _clusters(6000, kappa, rng)
    w = rng.random(6000) + 0.5
    w /= w.sum()
    model = sp.Attention(P, V, 100.0, tol=tol)
    out, info, bad, stats = _run(model, x, x, w)
    assert bad is None and info.chain == [("tree", 6000, 0)]
    ref = _twin(x, x, w, P, 100.0)
    assert np.abs(out - ref).max() <= info.bound + 5e-15
    assert 0.0 < info.bound <= 0.9 * tol
    direct, terms, pruned, expanded = stats
    assert expanded > 0 and pruned > 0 and terms > 0
    assert direct < 0.5 * 6000**2  # most of the N M products are replaced by expansions or pruned


def test_tree_in_two_dimensions_and_for_separate_targets():
    """d = 2 (tokens on the circle) and targets that are not the sources: the same bound holds."""
    rng = np.random.default_rng(5)
    B2, V2 = np.diag([-1.0, 1.0]), np.diag([1.0, -1.0])
    y = _clusters(5000, 2000.0, rng, d=2)
    x = rng.normal(size=(3000, 2))
    x /= np.linalg.norm(x, axis=1)[:, None]
    w = np.full(5000, 1 / 5000)
    model = sp.Attention(B2, V2, 50.0, tol=1e-11)
    out, info, bad, stats = _run(model, x, y, w)
    assert bad is None and stats[3] > 0
    assert np.abs(out - _twin(x, y, w, B2, 50.0)).max() <= info.bound + 5e-15


def test_tree_keeps_a_light_cluster_that_dominates_by_its_exponent():
    """A cluster of weight 1e-20 a token where the kernel is e^{+beta} (at e1, for targets near -e1)
    against e^0 and e^-beta for 4000 tokens of weight 1 (at e3-ish and -e1): at beta 60 the light cluster
    carries all but 1e-8 of the softmax. Its node masses are 1e-18 beside 4000, below the rounding of
    any cumulative sum: they must be summed exactly (a node's mass is never a difference of partial
    sums) or the cluster is pruned as weightless. (It sorts last in the source tree, where the partial sums
    are largest.)"""
    rng = np.random.default_rng(7)
    c = np.array([[-1.0, 0.0, 0.0], [0.0, 0.6, 0.8]])
    heavy = c[rng.integers(0, 2, 4000)] + rng.normal(size=(4000, 3)) * 1e-2
    light = np.array([1.0, 0.0, 0.0]) + rng.normal(size=(200, 3)) * 1e-3  # <-e1, B e1> = +1
    y = np.vstack([heavy, light])
    y /= np.linalg.norm(y, axis=1)[:, None]
    w = np.concatenate([np.full(4000, 1.0), np.full(200, 1e-20)])
    x = -np.array([1.0, 0.0, 0.0]) + rng.normal(size=(500, 3)) * 1e-2
    x /= np.linalg.norm(x, axis=1)[:, None]
    model = sp.Attention(P, V, 60.0, tol=1e-12)
    out, info, bad, _ = _run(model, x, y, w)
    ref = _twin(x, y, w, P, 60.0)
    assert np.abs(ref - y[4000:].mean(axis=0)).max() < 0.01  # the light cluster is the field there
    assert bad is None and np.abs(out - ref).max() <= info.bound + 5e-15


@pytest.mark.parametrize("p", [2, 6, 10])
def test_expansion_radius_meets_the_remainder_bound_and_is_not_vacuous(p):
    """rho_max[p]: the polynomial the moments carry (the truncated Chebyshev series of e^s on [-rho, rho],
    from ``cheb_exp_coeffs``) misses e^s by <= eta relative, everywhere on [-rho, rho] (checked on 2001
    points against math.exp; the misses are >= 1e-15, far above double rounding); with the radius 3
    rho_max (and the series of that interval) it misses by more than eta, so the radius is not needlessly
    small. And the radius is larger than the Taylor polynomial's (Lagrange bound): the series is what
    lowers the degrees."""
    eta = 1e-12
    Tm = M._tree_chebyshev(16)
    rho = M._tree_rho_max(eta, 3, 16)[p]
    assert rho > 0

    def miss(r):
        g, gabs = np.empty(p + 1), np.empty(p + 1)
        tree_kernels.cheb_exp_coeffs(r, p, Tm, g, gabs)
        c = [g[k] / math.factorial(k) for k in range(p + 1)]
        worst = 0.0
        for s in np.linspace(-r, r, 2001):
            q = 0.0
            for ck in reversed(c):
                q = q * s + ck
            worst = max(worst, abs(math.exp(s) - q) / math.exp(s))
        return worst

    assert 1e-15 < miss(rho) <= eta
    assert miss(3 * rho) > eta

    def lagrange(r):
        return r ** (p + 1) * math.exp(2 * r) / math.factorial(p + 1)

    assert lagrange(rho) > eta  # the Taylor polynomial would need a smaller radius at this degree


def test_chebyshev_weights_are_taylor_at_zero_radius_and_bounded_by_their_absolute_sums():
    """g_k = k! c_k: at rho = 0 the series is the Taylor polynomial (g = 1 exactly); for rho > 0 the
    weights differ from 1 by O(rho^2) (the series' first correction) and gabs >= |g|; the monomial sum
    equals the Chebyshev sum I_0(rho) + 2 sum_m I_m(rho) T_m(s) at a few points (scipy's Bessel functions)."""
    from scipy import special
    Tm = M._tree_chebyshev(16)
    g, gabs = np.empty(9), np.empty(9)
    tree_kernels.cheb_exp_coeffs(0.0, 8, Tm, g, gabs)
    assert np.all(g == 1.0)
    for rho in (0.01, 0.5, 2.0):
        tree_kernels.cheb_exp_coeffs(rho, 8, Tm, g, gabs)
        assert np.all(gabs >= np.abs(g))
        if rho == 0.01:
            assert np.abs(g - 1.0).max() < rho**2
        for s in (-1.0, -0.3, 0.7, 1.0):
            mono = sum(g[k] / math.factorial(k) * (rho * s) ** k for k in range(9))
            cheb = special.iv(0, rho) + 2 * sum(special.iv(m, rho) * math.cos(m * math.acos(s)) for m in range(1, 9))
            assert abs(mono - cheb) <= 1e-14 * cheb


def test_auto_picks_the_tree_for_clusters_and_not_for_spread_out_tokens():
    """20000 tokens, beta 100, tol 1e-12 (the default): in clusters (kappa 1e5) "auto" plans the tree and
    takes it (modelled ~0.07 s against the pruned method's ~0.45 s); uniform tokens keep the pruned sums
    (the tree only prunes there). Both fields within tol of the direct sums."""
    rng = np.random.default_rng(11)
    model = sp.Attention(P, V, 100.0)
    for x, want in ((_clusters(20000, 1e5, rng), "tree"), (sp.sample_uniform(20000, 3, rng=1), "pruned")):
        w = np.full(len(x), 1 / len(x))
        m, info = model.mean_field(x, x, w, return_info=True)
        assert info.methods == (want,), info.chain
        sel = rng.choice(len(x), 400, replace=False)
        assert np.abs(m[sel] - _twin(x[sel], x, w, P, 100.0)).max() <= 1e-12


def test_tokens_in_clusters_run_through_the_tree(monkeypatch):
    """simulate_particles above FAST_PAIRS: 3000 clustered tokens (method="tree") against the direct
    kernel, five Euler steps: the reported bound <= tol and the paths within 5 dt sigma_max(V) bound
    (x10 slack, as for the other methods)."""
    rng = np.random.default_rng(2)
    x0 = _clusters(3000, 3000.0, rng)
    model = sp.Attention(P, V, 100.0, tol=1e-11, method="tree")
    monkeypatch.setattr(particles, "FAST_PAIRS", 1e6)
    r = sp.simulate_particles(model, x0, 0.05, 0.01)
    monkeypatch.setattr(particles, "FAST_PAIRS", 1e12)
    r_ref = sp.simulate_particles(model, x0, 0.05, 0.01)
    assert r.field_methods == ("tree",) and 0.0 < r.field_bound <= 1e-11
    smax = float(np.linalg.norm(V, 2))
    assert np.abs(r.positions - r_ref.positions).max() <= 5 * 0.01 * smax * 1e-11 * 10


def test_tree_is_refused_where_it_cannot_serve():
    """The unnormalised attention and d = 4 name the reason; a tol below the exponents' rounding
    (kappa eps) makes it refuse every target, and the chain then takes them (pruned)."""
    with pytest.raises(ValueError, match="softmax normaliser"):
        sp.Attention(P, V, 10.0, method="tree", normalization="usa").mean_field(np.eye(3), np.eye(3), np.ones(3))
    with pytest.raises(ValueError, match="d = 4"):
        sp.Attention(np.eye(4), np.eye(4), 10.0, method="tree").mean_field(np.eye(4), np.eye(4), np.ones(4))
    rng = np.random.default_rng(4)
    x = _clusters(2000, 1e4, rng)
    w = np.full(2000, 1 / 2000)
    model = sp.Attention(P, V, 1e3, tol=1e-13, method="tree")  # rounding ~ 3 kappa eps = 6.7e-13 > tol
    m, info = model.mean_field(x, x, w, return_info=True)
    assert info.chain[0] == ("tree", 2000, 2000) and info.chain[-1][2] == 0
    assert np.abs(m - _twin(x, x, w, P, 1e3)).max() <= 1e-13


def test_tree_refuses_where_a_term_could_overflow():
    """beta 2e4 on spread-out tokens: a leaf's terms may lie ~1e3 above its shift, where exp overflows; the
    tree refuses (no inf, no NaN) and the pruned sums take every target, within tol of the direct ones."""
    rng = np.random.default_rng(8)
    x = sp.sample_uniform(3000, 3, rng=3)
    w = np.full(3000, 1 / 3000)
    model = sp.Attention(P, V, 2e4, tol=1e-8, method="tree")
    m, info = model.mean_field(x, x, w, return_info=True)
    assert info.chain[0] == ("tree", 3000, 3000) and info.chain[-1][2] == 0
    sel = rng.choice(3000, 200, replace=False)
    assert np.abs(m[sel] - _twin(x[sel], x, w, P, 2e4)).max() <= 1e-8


def test_light_pairs_take_lower_degrees_within_their_share_of_the_budget():
    """The degree tables by slack (kernels.tree.traverse): every expanded pair's coupling r_T r_S is within
    the radius of its degree in the row its slack allows (slack = lbmin_T - up - log W, recomputed here
    from the plan's node balls: row floor(slack / step), capped), and some pairs do use a row above 0 (a
    degree the full-accuracy row would not allow at their radius); the sums stay within the bound
    (test_tree_meets_its_bound_on_clustered_tokens, and here against the NumPy twin)."""
    rng = np.random.default_rng(13)
    x = _clusters(20000, 300.0, rng)
    w = np.full(20000, 1 / 20000)
    model = sp.Attention(P, V, 100.0, tol=1e-10)
    ev = model.evaluator()
    p = Targets(x, *kernel_centres(model, x), x, w)
    s = M._tree_setup(ev, p)
    eT, eS, eP, _, _, _ = s._plan()
    tc, tr, sc, sr = s.tc, s.tr, s.sc, s.sr
    up = (tc[eT] * sc[eS]).sum(1) + np.linalg.norm(tc[eT], axis=1) * sr[eS] \
        + tr[eT] * (np.linalg.norm(sc[eS], axis=1) + sr[eS])
    slack = s.lbmin[eT] - up - math.log(w.sum())
    row = np.clip(np.floor(slack / M.TREE_SLACK_STEP), 0, M.TREE_SLACK_ROWS - 1).astype(int)
    rho = tr[eT] * sr[eS]
    assert np.all(rho <= s.rho_max[row, eP] * (1 + 1e-12))
    relaxed = rho > s.rho_max[0, eP]
    assert relaxed.sum() > 0.05 * len(eT), relaxed.sum()
    out, info, bad, _ = _run(model, x, x, w)
    sel = rng.choice(20000, 500, replace=False)
    assert bad is None and np.abs(out[sel] - _twin(x[sel], x, w, P, 100.0)).max() <= info.bound + 5e-15


def test_auto_skips_the_fast_transforms_for_a_while_after_they_refused_every_target():
    """12000 tokens in clusters of width 0.06 rad, beta 100, tol 1e-10: "auto" tries the fast transforms
    first (modelled cheapest; at 6000 tokens, since the pruned sums' cost model counts their share of the
    sources on the tokens themselves, it takes the pruned sums at once), which refuse every target (their bound fails away from the bulk of the
    mass, and here every token is in a cluster's tails at the attention scale). They are then skipped for
    FAST_SKIP_EVALS evaluations and tried again after; the skip count is part of get_state, so an evaluator
    restored from it makes the same choices. Every field within tol of the direct sums."""
    from spherepde.evaluation import evaluator as E
    rng = np.random.default_rng(12)
    x = _clusters(12000, 300.0, rng)
    w = np.full(12000, 1 / 12000)
    ev = sp.Attention(P, V, 100.0, tol=1e-10).evaluator()
    firsts, refused = [], []
    sel = rng.choice(12000, 300, replace=False)
    ref = _twin(x[sel], x, w, P, 100.0)
    for k in range(E.FAST_SKIP_EVALS + 2):
        if k == 3:
            state = ev.get_state()
            assert state["fast_skip"] == E.FAST_SKIP_EVALS - 2
            ev2 = sp.Attention(P, V, 100.0, tol=1e-10).evaluator()
            ev2.set_state(state)
            assert ev2.mean_field(x, x, w)[1].methods == ev.mean_field(x, x, w)[1].methods
            ev.set_state(state)  # the extra call above is not counted
        m, info = ev.mean_field(x, x, w)
        firsts.append(info.methods[0])
        refused.append(info.refused("fast_spectral"))
        assert np.abs(m[sel] - ref).max() <= 1e-10
    assert firsts[0] == "fast_spectral" and refused[0] == 12000
    assert "fast_spectral" not in firsts[1:E.FAST_SKIP_EVALS + 1]
    assert firsts[E.FAST_SKIP_EVALS + 1] == "fast_spectral"
    ev.set_state({})
    assert "fast_skip" not in ev.memory


@pytest.mark.parametrize("budget", [1, 4000, 40000])
def test_moments_in_batches_give_the_same_bits_within_the_budget(monkeypatch, budget):
    """The expansions' moments formed and evaluated in batches of target leaves (TREE_MOMENT_BYTES, the memory
    bound of the paper-scale adaptive run) give the unbatched sums bit for bit (each moment and each
    target's sums are the same operations in the same order), and the working set follows the budget: at a
    budget of one row every expansion above the resident depth still fits (the peak is the resident part plus
    the largest subtree's), at the larger budgets it is at most max(budget, that peak)."""
    rng = np.random.default_rng(5)
    x = _clusters(20000, 300.0, rng)
    w = rng.random(20000) + 0.5
    w /= w.sum()
    model = sp.Attention(P, V, 100.0, tol=1e-10)
    ev = model.evaluator()
    p = Targets(x, *kernel_centres(model, x), x, w)
    whole = M._TreeSetup(ev, p)
    F0 = whole.sums()
    rows0 = whole.moment_rows
    assert whole.stats[3] > 100  # expansions really used: there is something to batch
    monkeypatch.setattr(M, "TREE_MOMENT_BYTES", 32 * budget)
    part = M._TreeSetup(ev, p)
    F1 = part.sums()
    assert np.array_equal(F0, F1)
    assert part.moment_rows < rows0  # batched: a smaller working set
    eT, eS, eP = part.plan[:3]
    _, _, batches = M._moment_batches(np.sort(eT), part.nmono[eP[np.argsort(eT, kind="stable")]], part.tdepth, budget)
    assert len(batches) > 2  # the resident part and at least two batches of leaves
    # every expansion formed exactly once, every leaf evaluated exactly once
    formed = np.concatenate([b[0] for b in batches])
    assert np.array_equal(np.sort(formed), np.arange(eT.shape[0]))
    leaves = np.concatenate([np.arange(b[1], b[2]) for b in batches])
    assert np.array_equal(leaves, np.arange(2 ** part.tdepth))
    # the working set against an independent count: the smallest peak over the resident depths k (the
    # expansions above k plus the heaviest subtree at depth k)
    T = np.sort(eT)
    sizes = part.nmono[eP[np.argsort(eT, kind="stable")]]
    depth = np.array([int(t + 1).bit_length() - 1 for t in T])
    peaks = []
    for k in range(1, part.tdepth + 1):
        anc = np.array([((t + 1) >> (dt - k)) if dt >= k else -1 for t, dt in zip(T, depth)])
        heavy = max(sizes[anc == a].sum() for a in set(anc[anc >= 0]))
        peaks.append(sizes[depth < k].sum() + heavy)
    assert part.moment_rows <= max(budget, min(peaks))
    # and within each batch the moments read (resident and the batch's own) do not overlap
    rows, off, _ = M._moment_batches(T, sizes, part.tdepth, budget)
    for sel, _, _ in batches[1:]:
        idx = np.concatenate([batches[0][0], sel])
        by = np.argsort(off[idx])
        o, ends = off[idx][by], (off[idx] + sizes[idx])[by]
        assert np.all(o[1:] >= ends[:-1]) and ends[-1] <= rows
