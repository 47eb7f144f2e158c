r"""FFT path for the attention mean field on the circle S^1 (d = 2) when B is a rotation times a scale.

For B = s R(alpha) (s > 0, R a rotation) and x = (cos a, sin a), y = (cos b, sin b),

    <x, B y> = s cos(a - b - alpha),

so the softmax weights exp(beta <x, B y>) depend on a - b only: on N equally spaced points
a_j = a_0 + j 2 pi / N (the cells of a uniform ``TensorGrid(2, n)``) the numerator and the denominator of
m_beta are circular convolutions, O(N log N) by FFT instead of O(N^2):

    D_i = sum_j K_{i-j} w_j,  N_i = sum_j K_{i-j} w_j y_j,  m_i = N_i / D_i,
    K_k = exp(beta s (cos(k 2 pi / N - alpha) - 1))   (shifted by the maximum, so K <= 1).

Error bound (checked at run time; otherwise the direct ``Attention.mean_field`` is used). With
eps_F a bound on the relative 2-norm error of one floating-point FFT (Higham, *Accuracy and Stability
of Numerical Algorithms*, 2nd ed., Thm 24.2: eps_F = L eta / (1 - L eta), eta = mu + gamma_4 (sqrt 2 + mu),
L = log2 N for radix 2; we take mu = u and a generous L = 2 ceil(log2 N) + 8 to cover the mixed-radix
and Bluestein paths of numpy's pocketfft), the computed convolution c = IFFT(FFT(K) FFT(v)) satisfies

    |c_hat - c|_inf <= E(v) = 3 eps_F (|K|_2 |v|_1 + |K|_1 |v|_2) + 2 u |K|_1 |v|_1,

and then, per target and component, |m_hat - m| <= (E(w y_c) + |m_c| E(w)) / (D_hat - E(w)). The FFT
path is used only if this is <= ``tol`` at every target (it fails when beta s is large and some target
sees only exponentially small weights; the direct kernel, which shifts the exponent per target, is
then used).
"""
from __future__ import annotations

import math

import numpy as np

__all__ = ["rotation_scale", "circle_fft", "circle_mean_field", "fft_error_constant"]

_U = np.finfo(float).eps / 2


def rotation_scale(B, rtol: float = 1e-12):
    """(s, alpha) if the 2x2 matrix B equals s R(alpha) with s > 0, else None."""
    B = np.asarray(B, float)
    if B.shape != (2, 2):
        return None
    s2 = 0.5 * np.sum(B * B)
    if s2 == 0 or np.linalg.det(B) <= 0:
        return None
    if np.max(np.abs(B.T @ B - s2 * np.eye(2))) > rtol * s2:
        return None
    s = math.sqrt(s2)
    return s, math.atan2(B[1, 0], B[0, 0])


def fft_error_constant(N: int) -> float:
    """eps_F of the module docstring for length-N FFTs."""
    L = 2 * math.ceil(math.log2(max(N, 2))) + 8
    gamma4 = 4 * _U / (1 - 4 * _U)
    eta = _U + gamma4 * (math.sqrt(2.0) + _U)
    return L * eta / (1 - L * eta)


#: Default accuracy demanded of the FFT path (the direct kernel's rounding is ~1e-13; the bound above
#: is a worst case and typically 1e-12 to 1e-11 for N up to 1e4 and moderate beta s).
FFT_TOL = 1e-10


def circle_fft(B, beta: float, phi0: float, weights, tol: float = FFT_TOL, normalised: bool = True):
    """(m, bound): m_beta at the N equally spaced points phi0 + j 2 pi / N of the circle (sources =
    targets) by FFT, with the error bound of the module docstring; (None, bound) where the bound exceeds
    ``tol`` or B is not a rotation times a scale (bound None then). ``weights`` (N,) >= 0, not all zero.

    ``normalised=False``: the unnormalised attention (USA) m_i = N_i = sum_j K_{i-j} w_j y_j, whose kernel
    K = exp(beta s (cos - 1)) is already e^{beta (<x, B y> - s_B)} (s_B = s for B = s R), with the absolute
    bound E(w y_c) per component."""
    w = np.asarray(weights, float)
    N = w.shape[0]
    rs = rotation_scale(B)
    if rs is None or N < 2 or not (np.all(np.isfinite(w)) and np.all(w >= 0) and w.sum() > 0):
        return None, None
    s, alpha = rs
    ang = phi0 + 2 * np.pi * np.arange(N) / N
    pts = np.stack([np.cos(ang), np.sin(ang)], axis=1)
    k = 2 * np.pi * np.arange(N) / N
    K = np.exp(beta * s * (np.cos(k - alpha) - 1.0))
    Kf = np.fft.rfft(K)
    vs = [w, w * pts[:, 0], w * pts[:, 1]]
    conv = [np.fft.irfft(Kf * np.fft.rfft(v), n=N) for v in vs]
    eF = fft_error_constant(N)
    K1, K2 = np.abs(K).sum(), np.linalg.norm(K)

    def E(v):
        return 3 * eF * (K2 * np.abs(v).sum() + K1 * np.linalg.norm(v)) + 2 * _U * K1 * np.abs(v).sum()

    if not normalised:
        m = np.stack([conv[1], conv[2]], axis=1)
        bound = float(max(E(vs[1]), E(vs[2])))
        return (m, bound) if bound <= float(tol) else (None, bound)
    D = conv[0]
    ED = E(w)
    if not np.all(D > ED):
        return None, float("inf")
    m = np.stack([conv[1] / D, conv[2] / D], axis=1)
    bound = float(np.max((np.array([E(vs[1]), E(vs[2])])[None, :] + np.abs(m) * ED) / (D - ED)[:, None]))
    return (m, bound) if bound <= float(tol) else (None, bound)


def circle_mean_field(model, phi0: float, weights, tol: float = FFT_TOL, return_info: bool = False):
    """m_beta at the N equally spaced points phi0 + j 2 pi / N of the circle, sources = targets: the FFT
    (:func:`circle_fft`) where its bound meets ``tol``, else ``model.mean_field`` (direct sums).

    Parameters
    ----------
    model : spherepde.Attention with d = 2.
    phi0 : angle of the first point; weights : (N,) masses w_j >= 0 (density times cell length).
    tol : float, default 1e-10: required bound on |m_hat - m| at every point (else the direct path).
    return_info : also return a dict (``method``: "fft" or "direct", ``bound``: the error bound).

    Returns
    -------
    m : (N, 2) ndarray [, info]
    """
    w = np.asarray(weights, float)
    m, bound = circle_fft(model.B, model.beta, phi0, w, tol) if model.dim == 2 else (None, None)
    if m is not None:
        info = {"method": "fft", "bound": bound}
    else:
        N = w.shape[0]
        ang = phi0 + 2 * np.pi * np.arange(N) / N
        pts = np.stack([np.cos(ang), np.sin(ang)], axis=1)
        info = {"method": "direct", "bound": None if bound is None or not np.isfinite(bound) else bound}
        m = model.mean_field(pts, pts, w)
    return (m, info) if return_info else m
