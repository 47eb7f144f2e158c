"""Numba kernels of the dual-tree method of the attention mean (:class:`spherepde.evaluation.methods.Tree`).

The sums are D_i = sum_j w_j exp(<u_i, y_j>) and N_i = sum_j w_j y_j exp(<u_i, y_j>), u_i = beta B^T x_i
(the kernel centre times its concentration kappa), over unit sources y_j. Targets (in u-space) and sources
are each sorted into a complete binary tree of balls (centre, radius); heap numbering, node k has the
children 2k + 1 and 2k + 2, the leaves are the last level.

For a target node T (centre u0, radius r_T) and a source node S (centre c, radius r_S), with u = u0 + du,
y = c + delta:

    <u, y> = <u, c> + <u0, delta> + <du, delta>,

so exp(<u, y>) = exp(<u, c>) exp(<u0, delta>) exp(<du, delta>), and only the last factor couples a target
to a source. |<du, delta>| <= rho = r_T r_S, and on [-rho, rho] e^t is replaced by q(t) = sum_{k <= p} c_k t^k,
its Chebyshev series truncated at degree p (:func:`cheb_exp_coeffs`; the c_k depend on the pair's rho). By
the multinomial theorem t^k = sum_{|a| = k} k! du^a delta^a / a!, so the pair's sums are the source moments

    A_a = g_|a| sum_j w_j exp(<u0, delta_j> - s) delta_j^a / a!   (and the same times y_j),  g_k = k! c_k,

formed once per pair, evaluated at each target as exp(<u, c> + s - shift_i) sum_a du^a A_a. The series'
tail gives |e^t - q(t)| <= 2 sum_{k > p} I_k(rho) <= 2 e^(rho^2 / 4) (rho / 2)^(p+1) / (p+1)! /
(1 - rho / (2p + 4)) (I_k the modified Bessel functions, the series' coefficients), so that e^-rho <= e^t
makes it a relative error of the pair's (positive) sums (:func:`expansion_error`). The Taylor polynomial
(g_k = 1) has the Lagrange remainder rho^(p+1) e^(2 rho) / (p+1)! instead: the Chebyshev bound is 2^p / 2
times smaller, so a degree serves about twice the rho, and the traversal expands pairs higher in the trees
(at n = 1e5, kappa 300: half the expansions, 23 % fewer terms; ``validation/bench_particles.md``). That is
the far field of a fast Gauss transform, with the coupling
second order in the two radii, so that a whole cluster of tokens interacts with another through one
expansion.

A pair whose exponent is bounded above by log(eta_p / W) + (a lower bound of log D_i for every target of
T) is pruned: its mass is <= eta_p (W_S / W) D_i, so all the pruned mass is <= eta_p D_i. Leaf pairs that
no expansion serves are summed directly.
"""
from __future__ import annotations

import math

import numba as nb
import numpy as np

from .fastexp import fexp_ftz

__all__ = ["balanced_tree", "node_balls", "leaf_lower_bounds", "traverse", "moments", "evaluate",
           "monomial_tables", "chebyshev_table", "cheb_exp_coeffs", "expansion_error", "rho_max_table"]

#: reductions vectorised (the sums' order changes, not their bound)
_FMR = {"reassoc", "contract", "nsz", "arcp"}
#: Points per block of the vectorised loops (the leaf size bounds a leaf's targets).
_CH = 128
#: Chunks of the moments' parallel loop (:func:`moments`).
MOMENT_CHUNKS = 512


def monomial_tables(d: int, pmax: int):
    """Exponents of the monomials of degree <= pmax in d variables in graded order, with, for a != 0, the
    index of a - e_k (k = the last axis where a_k > 0), k, and 1 / a_k; and the count with degree <= p."""
    alphas = [tuple([0] * d)]
    counts = [1]
    for deg in range(1, pmax + 1):
        # all compositions of deg into d parts, in a fixed (lexicographic) order
        def rec(prefix, left, k):
            if k == d - 1:
                yield prefix + (left,)
                return
            for v in range(left, -1, -1):
                yield from rec(prefix + (v,), left - v, k + 1)
        alphas.extend(rec((), deg, 0))
        counts.append(len(alphas))
    index = {a: i for i, a in enumerate(alphas)}
    P = len(alphas)
    par = np.zeros(P, dtype=np.int64)
    ax = np.zeros(P, dtype=np.int64)
    inv = np.ones(P)
    for i, a in enumerate(alphas[1:], start=1):
        k = max(j for j in range(d) if a[j] > 0)
        b = list(a)
        b[k] -= 1
        par[i], ax[i], inv[i] = index[tuple(b)], k, 1.0 / a[k]
    return par, ax, inv, np.array(counts, dtype=np.int64)


def chebyshev_table(pmax: int) -> np.ndarray:
    """Tm[m, k]: the coefficient of s^k in the Chebyshev polynomial T_m(s), m, k <= pmax (integers, exact in
    double for pmax <= 40)."""
    Tm = np.zeros((pmax + 1, pmax + 1))
    Tm[0, 0] = 1.0
    if pmax >= 1:
        Tm[1, 1] = 1.0
    for m in range(2, pmax + 1):
        Tm[m, 1:] = 2.0 * Tm[m - 1, :-1]
        Tm[m] -= Tm[m - 2]
    return Tm


@nb.njit(cache=True)
def cheb_exp_coeffs(rho, p, Tm, g, gabs):
    """The degree-p truncated Chebyshev series of e^t on [-rho, rho] in monomials, sum_k c_k t^k, as g[k] =
    k! c_k (1 for the Taylor polynomial), k <= p; gabs[k] = k! sum_m |a_m [s^k] T_m| rho^(m-k) (the sum of
    the terms that make c_k: a bound of |c_k| and of the rounding in forming it). The series is
    e^(rho s) = I_0(rho) + 2 sum_m I_m(rho) T_m(s); with I_m(rho) = (rho / 2)^m Ih_m, Ih_m = sum_j (rho^2 /
    4)^j / (j! (j + m)!) (positive terms, summed to full precision), a_m / rho^m = 2^(1-m) Ih_m (Ih_0 for m =
    0) needs no division by rho, so rho = 0 gives the Taylor coefficients exactly."""
    x2 = 0.25 * rho * rho
    ah = np.empty(p + 1)
    fm = 1.0  # m!
    for m in range(p + 1):
        if m > 0:
            fm *= m
        term = 1.0 / fm
        s = term
        j = 1
        while term > 1e-18 * s:
            term *= x2 / (j * (j + m))
            s += term
            j += 1
        ah[m] = s if m == 0 else s * 2.0 ** (1 - m)
    fk = 1.0  # k!
    for k in range(p + 1):
        if k > 0:
            fk *= k
        c = 0.0
        ca = 0.0
        rk = 1.0  # rho^(m - k)
        for m in range(k, p + 1):
            t = ah[m] * rk * Tm[m, k]
            c += t
            ca += abs(t)
            rk *= rho
        g[k] = fk * c
        gabs[k] = fk * ca


@nb.njit(cache=True)
def expansion_error(r, p, Tm, nmono):
    """Bound of the relative error of a pair's sums expanded at degree p with rho = r_T r_S = r: the
    truncated Chebyshev series' tail, 2 e^(r^2 / 4) (r / 2)^(p+1) / (p+1)! / (1 - r / (2p + 4)), plus
    rounding, eps sum_k (3p + 68 + nmono[k]) gabs_k r^k / k! (:func:`cheb_exp_coeffs`), both against a result
    >= e^-r times the pair's mass: times e^r. inf where the tail's bound does not hold (r >= 2p + 4).

    The rounding: a target's sum is sum_a du^a A_a with A_a = g_k sum_j m_j delta_j^a / a! (k = |a|, m_j >= 0);
    its terms of degree k add up in magnitude to <= sum_j m_j gabs_k (sum_q |du_q delta_j,q|)^k / k!, and
    sum_q |du_q delta_j,q| <= |du| |delta_j| <= r (Cauchy-Schwarz). Each monomial carries <= 2p + 2
    roundings, forming g_k <= p + 2 more, the moments' sums over the sources are counted as 64 eps like the
    direct sums, and the P terms are summed from the highest degree down: a term of degree k is in at most
    nmono[k] (the monomials of degree <= k) of the partial sums, each addition rounding relative to its
    partial sum."""
    if r >= 2.0 * (p + 2):
        return np.inf
    g = np.empty(p + 1)
    gabs = np.empty(p + 1)
    cheb_exp_coeffs(r, p, Tm, g, gabs)
    tail = 2.0 * math.exp(0.25 * r * r + (p + 1) * math.log(0.5 * r) - math.lgamma(p + 2.0)) / (
        1.0 - r / (2.0 * p + 4.0)) if r > 0.0 else 0.0
    rnd = 0.0
    zk = 1.0
    fk = 1.0
    for k in range(p + 1):
        if k > 0:
            zk *= r
            fk *= k
        rnd += (3 * p + 68 + nmono[k]) * gabs[k] * zk / fk
    return math.exp(r) * (tail + 2.220446049250313e-16 * rnd)


@nb.njit(cache=True)
def rho_max_table(eta, pmax, Tm, nmono):
    """For each degree p <= pmax, the largest rho with :func:`expansion_error` <= eta (bisection; the bound
    grows with rho); -1 where no rho > 0 meets it."""
    out = np.full(pmax + 1, -1.0)
    for p in range(pmax + 1):
        if expansion_error(1e-300, p, Tm, nmono) > eta:
            continue
        lo, hi = 0.0, 1.0
        while expansion_error(hi, p, Tm, nmono) <= eta and hi < 1e3:
            lo, hi = hi, 2.0 * hi
        for _ in range(60):
            mid = 0.5 * (lo + hi)
            if expansion_error(mid, p, Tm, nmono) <= eta:
                lo = mid
            else:
                hi = mid
        out[p] = lo
    return out


@nb.njit(cache=True)
def node_balls(P, start, end):
    """Centre (bounding-box midpoint) and radius (largest distance to the centre, widened by a rounding
    margin) of each node's points P[start[k]:end[k]]."""
    nn = start.shape[0]
    d = P.shape[1]
    C = np.zeros((nn, d))
    R = np.zeros(nn)
    lo = np.empty(d)
    hi = np.empty(d)
    for k in range(nn):
        a, b = start[k], end[k]
        for q in range(d):
            lo[q] = np.inf
            hi[q] = -np.inf
        for j in range(a, b):
            for q in range(d):
                v = P[j, q]
                if v < lo[q]:
                    lo[q] = v
                if v > hi[q]:
                    hi[q] = v
        for q in range(d):
            C[k, q] = 0.5 * (lo[q] + hi[q]) if b > a else 0.0
        r2 = 0.0
        for j in range(a, b):
            s = 0.0
            for q in range(d):
                t = P[j, q] - C[k, q]
                s += t * t
            if s > r2:
                r2 = s
        nc = 0.0
        for q in range(d):
            nc += C[k, q] * C[k, q]
        R[k] = math.sqrt(r2) * (1.0 + 1e-12) + 1e-14 * (1.0 + math.sqrt(nc))
    return C, R


@nb.njit(inline="always")
def _dot(A, i, B, j, d):
    s = 0.0
    for q in range(d):
        s += A[i, q] * B[j, q]
    return s


@nb.njit(inline="always")
def _norm(A, i, d):
    s = 0.0
    for q in range(d):
        s += A[i, q] * A[i, q]
    return math.sqrt(s)


@nb.njit(parallel=True, cache=True)
def leaf_lower_bounds(tc, tr, t0, nt, sc, sr, slogw, s0, ns, out, gap):
    """out[a] = max over the source leaves S of log W_S + (the smallest exponent <u, y> over the target
    leaf t0 + a and S): a lower bound of log D_i for every target of that leaf; gap[a] = max over S of
    log W_S + (the largest exponent) minus out[a] (how far above the bound a term's exponent can lie)."""
    d = tc.shape[1]
    for a in nb.prange(nt):
        T = t0 + a
        nu = _norm(tc, T, d)
        best = -np.inf
        top = -np.inf
        for b in range(ns):
            S = s0 + b
            if slogw[S] == -np.inf:
                continue
            dot = _dot(tc, T, sc, S, d)
            wid = nu * sr[S] + tr[T] * (_norm(sc, S, d) + sr[S])
            v = slogw[S] + dot - wid
            if v > best:
                best = v
            v = slogw[S] + dot + wid
            if v > top:
                top = v
        out[a] = best
        gap[a] = top - best


@nb.njit(cache=True)
def _grow(a, n):
    b = np.empty(max(2 * a.shape[0], n), dtype=a.dtype)
    b[:a.shape[0]] = a
    return b


#: The cost of an expansion term (a source or target times a monomial) in units of a directly summed
#: target-source product (measured: ~2e9 terms and ~5e8 products per second on 2 threads).
_TERM = 0.25


@nb.njit(inline="always")
def _exp_cost(nT, nS, rho, rho_max, nmono):
    """The cost of expanding a pair (in direct products), inf where no degree serves rho."""
    for q in range(rho_max.shape[0]):
        if rho <= rho_max[q]:
            return (nS + nT) * float(nmono[q]) * _TERM
    return np.inf


@nb.njit(inline="always")
def _split_cost(k, start, end, rad, first_leaf, n_other, r_other, other_leaf, rho_max, nmono):
    """The modelled cost of splitting node k against a node of n_other points and radius r_other: each
    child's pair expanded, or summed directly where both are leaves and that is cheaper."""
    c = 0.0
    for k2 in (2 * k + 1, 2 * k + 2):
        n2 = float(end[k2] - start[k2])
        direct = n_other * n2 if other_leaf and k2 >= first_leaf else np.inf
        c += min(_exp_cost(n_other, n2, r_other * rad[k2], rho_max, nmono), direct)
    return c


@nb.njit(cache=True)
def traverse(tdepth, tstart, tend, tc, tr, lbmin, sdepth, sstart, send, sc, sr, slogw, log_prune, log_w, rho_max,
             log_step, nmono):
    """The dual-tree traversal from the pair of roots (serial: it only decides). Returns the expansions
    (T, S, p), the leaf pairs to sum directly (T, S), and the stats (target-source products summed
    directly, expansion terms (sources + targets) x monomials, pairs pruned, pairs expanded).

    A pair is pruned where the exponent's upper bound over it is <= the targets' lower bound of log D
    plus ``log_prune`` (= log(eta_p / W)); expanded at the smallest degree p with r_T r_S <= rho_max[p]
    where that costs less than the direct sums and less than splitting either node once (its two
    children's pairs expanded, or summed directly at leaves: a one-level look-ahead, since a split lowers
    the degree); summed directly at two leaves; else the node whose radius loosens the bound more is
    split.

    The degree tables by slack: ``rho_max[j, p]`` is the radius of degree p for the pair relative error
    eps_j = eps_0 exp(j ``log_step``). A pair whose mass bound W_S exp(up) lies below (W_S / W) exp(lbmin)
    by the factor exp(slack) (slack = lbmin - up - ``log_w``) may use the row j = floor(slack / log_step)
    (capped at the last): its error eps_j (its sums) <= eps_0 (W_S / W) D_i. Summed over a partition of the
    sources that is <= eps_0 D_i, and the pairs at row 0 add <= eps_0 D_i more: 2 eps_0 in all (the
    setup's budget). Light pairs (far below the targets' sums) are so expanded at lower degrees."""
    d = tc.shape[1]
    nrow = rho_max.shape[0]
    tfirst_leaf = (1 << tdepth) - 1
    sfirst_leaf = (1 << sdepth) - 1
    stackT = np.empty(4 * (tdepth + sdepth + 4), dtype=np.int64)
    stackS = np.empty(4 * (tdepth + sdepth + 4), dtype=np.int64)
    eT = np.empty(1024, dtype=np.int64)
    eS = np.empty(1024, dtype=np.int64)
    eP = np.empty(1024, dtype=np.int64)
    dT = np.empty(1024, dtype=np.int64)
    dS = np.empty(1024, dtype=np.int64)
    ne = 0
    nd = 0
    stats = np.zeros(4)
    stackT[0] = 0
    stackS[0] = 0
    sp = 1
    while sp > 0:
        sp -= 1
        T = stackT[sp]
        S = stackS[sp]
        if slogw[S] == -np.inf or tend[T] <= tstart[T]:
            continue
        nu = _norm(tc, T, d)
        ncs = _norm(sc, S, d)
        up = _dot(tc, T, sc, S, d) + nu * sr[S] + tr[T] * (ncs + sr[S])
        if up <= lbmin[T] + log_prune:
            stats[2] += 1.0
            continue
        nT = float(tend[T] - tstart[T])
        nS = float(send[S] - sstart[S])
        tleaf = T >= tfirst_leaf
        sleaf = S >= sfirst_leaf
        direct_cost = nT * nS
        slack = lbmin[T] - up - log_w
        row = 0
        if slack >= log_step:
            row = min(nrow - 1, int(slack / log_step))
        rm = rho_max[row]
        exp_cost = _exp_cost(nT, nS, tr[T] * sr[S], rm, nmono)
        if exp_cost < direct_cost:
            # one level of look-ahead: expand now unless splitting one side (its children expanded, or
            # summed directly where cheaper) is expected to cost less
            split = np.inf
            if not sleaf:
                split = _split_cost(S, sstart, send, sr, sfirst_leaf, nT, tr[T], tleaf, rm, nmono)
            if not tleaf:
                split = min(split, _split_cost(T, tstart, tend, tr, tfirst_leaf, nS, sr[S], sleaf, rm, nmono))
            if exp_cost <= split:
                p = 0
                rho = tr[T] * sr[S]
                while rho > rm[p]:
                    p += 1
                if ne == eT.shape[0]:
                    eT = _grow(eT, ne + 1)
                    eS = _grow(eS, ne + 1)
                    eP = _grow(eP, ne + 1)
                eT[ne] = T
                eS[ne] = S
                eP[ne] = p
                ne += 1
                stats[1] += (nS + nT) * float(nmono[p])
                stats[3] += 1.0
                continue
        if tleaf and sleaf:
            if nd == dT.shape[0]:
                dT = _grow(dT, nd + 1)
                dS = _grow(dS, nd + 1)
            dT[nd] = T
            dS[nd] = S
            nd += 1
            stats[0] += direct_cost
            continue
        # split the node whose radius loosens the exponent's bound more
        if (not tleaf) and (sleaf or tr[T] * ncs >= nu * sr[S]):
            stackT[sp] = 2 * T + 1
            stackS[sp] = S
            stackT[sp + 1] = 2 * T + 2
            stackS[sp + 1] = S
        else:
            stackT[sp] = T
            stackS[sp] = 2 * S + 1
            stackT[sp + 1] = T
            stackS[sp + 1] = 2 * S + 2
        sp += 2
    return eT[:ne].copy(), eS[:ne].copy(), eP[:ne].copy(), dT[:nd].copy(), dS[:nd].copy(), stats


@nb.njit(parallel=True, fastmath=_FMR, cache=True)
def moments(eT, eS, eP, off, tc, tr, YsT, ws, sstart, send, sc, sr, nmono, par, ax, inv, Tm, A):
    """The source moments of every expansion: A[off[e] + a, k] = g_|a| sum_j w_j exp(<u0, delta_j> - s)
    delta_j^a / a! (k = 0) and the same times y_j[k - 1] (k = 1..3), u0 the target node's centre, delta_j =
    y_j - c_S, s = |u0| r_S (>= every <u0, delta_j>: no overflow), g the pair's Chebyshev weights at rho =
    r_T r_S (:func:`cheb_exp_coeffs`; ``Tm`` = :func:`chebyshev_table`). Parallel over MOMENT_CHUNKS chunks
    of the expansions taken with a stride (so that each thread gets a share of the large ones), each chunk
    with its work arrays allocated once: allocated per expansion, the threads' allocations contended (two
    threads were 1.4x one; 2.0x like this, measured at n = 1e5, kappa 300)."""
    d = tc.shape[1]
    pmax = nmono.shape[0] - 1
    ne = eT.shape[0]
    nch = min(ne, MOMENT_CHUNKS)
    for ch in nb.prange(nch):
        g = np.empty(pmax + 1)
        gabs = np.empty(pmax + 1)
        mono = np.empty((nmono[pmax], _CH))
        dl = np.empty((d, _CH))
        y = np.zeros((3, _CH))
        for e in range(ch, ne, nch):
            T, S, p = eT[e], eS[e], eP[e]
            P = nmono[p]
            o = off[e]
            nu = _norm(tc, T, d)
            s_shift = nu * sr[S]
            cheb_exp_coeffs(tr[T] * sr[S], p, Tm, g, gabs)
            for a in range(P):
                for k in range(4):
                    A[o + a, k] = 0.0
            for j0 in range(sstart[S], send[S], _CH):
                n = min(_CH, send[S] - j0)
                for jj in range(n):
                    t = 0.0
                    for q in range(d):
                        v = YsT[q, j0 + jj] - sc[S, q]
                        dl[q, jj] = v
                        t += tc[T, q] * v
                    mono[0, jj] = ws[j0 + jj] * fexp_ftz(t - s_shift)
                for q in range(3):
                    for jj in range(n):
                        y[q, jj] = YsT[q, j0 + jj]
                for a in range(1, P):
                    pa, k, c = par[a], ax[a], inv[a]
                    for jj in range(n):
                        mono[a, jj] = mono[pa, jj] * dl[k, jj] * c
                for a in range(P):
                    s0 = 0.0
                    s1 = 0.0
                    s2 = 0.0
                    s3 = 0.0
                    for jj in range(n):
                        m = mono[a, jj]
                        s0 += m
                        s1 += m * y[0, jj]
                        s2 += m * y[1, jj]
                        s3 += m * y[2, jj]
                    A[o + a, 0] += s0
                    A[o + a, 1] += s1
                    A[o + a, 2] += s2
                    A[o + a, 3] += s3
            q = 0
            for a in range(P):  # the graded order: monomial a has degree q while a < nmono[q]
                while a >= nmono[q]:
                    q += 1
                for k in range(4):
                    A[o + a, k] *= g[q]


@nb.njit(parallel=True, fastmath=_FMR, cache=True)
def evaluate(tdepth, tstart, tend, UtT, shift, tc, sr, sc, eptr, eS, eP, off, A, dptr, dS, sstart, send, YsT, ws,
             nmono, par, ax, F, l0, l1):
    """F[i] = the shifted sums at the targets of the leaves l0 <= l < l1 (numbered from the first leaf),
    parallel over those leaves: each leaf takes the expansions of its ancestors (and its own) and its direct
    leaf pairs. ``eptr``/``dptr``: CSR pointers by target node into the expansions (sorted by T) and by
    target leaf into the direct pairs; only the expansions of those leaves and their ancestors are read from
    ``A`` (the caller's batches, :meth:`spherepde.evaluation.methods._TreeSetup.sums`)."""
    d = tc.shape[1]
    first = (1 << tdepth) - 1
    for lb in nb.prange(l1 - l0):
        l = l0 + lb
        leaf = first + l
        i0, i1 = tstart[leaf], tend[leaf]
        n = i1 - i0
        if n <= 0:
            continue
        Pmax = nmono[nmono.shape[0] - 1]
        mono = np.empty((Pmax, _CH))
        du = np.empty((d, _CH))
        fac = np.empty(_CH)
        acc = np.zeros((4, _CH))
        tmp = np.empty((4, _CH))
        u = np.zeros((3, _CH))
        sh = np.empty(_CH)
        for q in range(d):
            for ii in range(n):
                u[q, ii] = UtT[q, i0 + ii]
        for ii in range(n):
            sh[ii] = shift[i0 + ii]
        T = leaf
        nu = 0.0
        while True:
            e0, e1 = eptr[T], eptr[T + 1]
            if e1 > e0:
                # the targets' monomials du^a once per node, to the highest degree of its expansions
                Pn = 1
                for e in range(e0, e1):
                    Pn = max(Pn, nmono[eP[e]])
                for q in range(d):
                    for ii in range(n):
                        du[q, ii] = u[q, ii] - tc[T, q]
                for ii in range(n):
                    mono[0, ii] = 1.0
                for a in range(1, Pn):
                    pa, k = par[a], ax[a]
                    for ii in range(n):
                        mono[a, ii] = mono[pa, ii] * du[k, ii]
                nu = _norm(tc, T, d)
            for e in range(e0, e1):
                S, p = eS[e], eP[e]
                P = nmono[p]
                o = off[e]
                s_shift = nu * sr[S]
                cs0, cs1, cs2 = sc[S, 0], sc[S, 1], (sc[S, 2] if d > 2 else 0.0)  # the source node's centre
                for ii in range(n):
                    fac[ii] = fexp_ftz(u[0, ii] * cs0 + u[1, ii] * cs1 + u[2, ii] * cs2 + s_shift - sh[ii])
                for k in range(4):
                    for ii in range(n):
                        tmp[k, ii] = 0.0
                # highest degree first: each rounding relative to a small tail. Four degrees a pass over the
                # targets, as one chain of FMAs per sum (the same operations in the same order as one degree
                # a pass: the same bits, checked on the benchmark's fields; 'reassoc' would let LLVM regroup a
                # chain, which keeps each rounding within the bound's per-degree count), with a quarter of the
                # loads and stores of the partial sums. One degree a pass stored 4 vectors per 4 FMAs and was
                # bound by the stores (this loop is 1.8x faster, measured at n = 1e5, kappa 300; a pass of 8
                # degrees spills registers and is slower)
                a = P - 1
                while a >= 3:
                    c0, c1, c2, c3 = A[o + a, 0], A[o + a, 1], A[o + a, 2], A[o + a, 3]
                    d0, d1, d2, d3 = A[o + a - 1, 0], A[o + a - 1, 1], A[o + a - 1, 2], A[o + a - 1, 3]
                    e0, e1, e2, e3 = A[o + a - 2, 0], A[o + a - 2, 1], A[o + a - 2, 2], A[o + a - 2, 3]
                    g0, g1, g2, g3 = A[o + a - 3, 0], A[o + a - 3, 1], A[o + a - 3, 2], A[o + a - 3, 3]
                    for ii in range(n):
                        m, mb, mc, md = mono[a, ii], mono[a - 1, ii], mono[a - 2, ii], mono[a - 3, ii]
                        tmp[0, ii] = (((tmp[0, ii] + m * c0) + mb * d0) + mc * e0) + md * g0
                        tmp[1, ii] = (((tmp[1, ii] + m * c1) + mb * d1) + mc * e1) + md * g1
                        tmp[2, ii] = (((tmp[2, ii] + m * c2) + mb * d2) + mc * e2) + md * g2
                        tmp[3, ii] = (((tmp[3, ii] + m * c3) + mb * d3) + mc * e3) + md * g3
                    a -= 4
                while a >= 0:
                    c0, c1, c2, c3 = A[o + a, 0], A[o + a, 1], A[o + a, 2], A[o + a, 3]
                    for ii in range(n):
                        m = mono[a, ii]
                        tmp[0, ii] += m * c0
                        tmp[1, ii] += m * c1
                        tmp[2, ii] += m * c2
                        tmp[3, ii] += m * c3
                    a -= 1
                for k in range(4):
                    for ii in range(n):
                        acc[k, ii] += fac[ii] * tmp[k, ii]
            if T == 0:
                break
            T = (T - 1) // 2
        Y0, Y1, Y2 = YsT[0], YsT[1], YsT[2]
        for e in range(dptr[l], dptr[l + 1]):
            S = dS[e]
            j0, j1 = sstart[S], send[S]
            for ii in range(n):
                u0, u1, u2, h = u[0, ii], u[1, ii], u[2, ii], sh[ii]
                s0 = 0.0
                s1 = 0.0
                s2 = 0.0
                s3 = 0.0
                for j in range(j0, j1):
                    g = ws[j] * fexp_ftz(u0 * Y0[j] + u1 * Y1[j] + u2 * Y2[j] - h)
                    s0 += g
                    s1 += g * Y0[j]
                    s2 += g * Y1[j]
                    s3 += g * Y2[j]
                acc[0, ii] += s0
                acc[1, ii] += s1
                acc[2, ii] += s2
                acc[3, ii] += s3
        for k in range(4):
            for ii in range(n):
                F[i0 + ii, k] = acc[k, ii]


@nb.njit(cache=True)
def _select(idx, key, a, b, kth):
    """Reorder idx[a:b] so that key[idx[kth]] is the (kth - a)-th smallest, smaller keys before it and
    larger after (Hoare quickselect, median-of-three pivots)."""
    lo, hi = a, b - 1
    while hi > lo:
        mid = (lo + hi) // 2
        x, y, z = key[idx[lo]], key[idx[mid]], key[idx[hi]]
        piv = max(min(x, y), min(max(x, y), z))
        i, j = lo, hi
        while i <= j:
            while key[idx[i]] < piv:
                i += 1
            while key[idx[j]] > piv:
                j -= 1
            if i <= j:
                t = idx[i]
                idx[i] = idx[j]
                idx[j] = t
                i += 1
                j -= 1
        if kth <= j:
            hi = j
        elif kth >= i:
            lo = i
        else:
            return


@nb.njit(cache=True)
def balanced_tree(P, depth):
    """Complete binary tree of recursive median bisection of the points P (n, d), each node split along
    its coordinate of largest spread: (order, start, end), nodes in heap order."""
    n, d = P.shape
    order = np.arange(n)
    nn = (1 << (depth + 1)) - 1
    start = np.zeros(nn, dtype=np.int64)
    end = np.zeros(nn, dtype=np.int64)
    end[0] = n
    key = np.empty(n)
    for k in range((1 << depth) - 1):
        a, b = start[k], end[k]
        half = (b - a) // 2
        if b - a >= 2:
            best, axis = -1.0, 0
            for q in range(d):
                lo, hi = np.inf, -np.inf
                for j in range(a, b):
                    v = P[order[j], q]
                    lo = min(lo, v)
                    hi = max(hi, v)
                if hi - lo > best:
                    best, axis = hi - lo, q
            for j in range(a, b):
                key[order[j]] = P[order[j], axis]
            _select(order, key, a, b, a + half)
        start[2 * k + 1], end[2 * k + 1] = a, a + half
        start[2 * k + 2], end[2 * k + 2] = a + half, b
    return order, start, end
