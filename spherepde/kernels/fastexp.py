"""A branch-free, vectorisable exponential for Numba kernels.

Functions
---------
fexp_ftz(x)
    The same, but 0 wherever exp(x) would be subnormal (x < -708.40): subnormal operands cost
    ~100 cycles each on x86, so hot sums whose terms are relative to a largest term of order 1 use
    this one (a dropped term is < 2.3e-308 times its weight).
fexp_floor(x)
    exp(max(x, EXP_FLOOR)) for x <= 0: the cheapest form (no flush, no upper clamp, never subnormal),
    for hot sums that can afford a floor of exp(-600) = 2.6e-261 (relative to a largest term >= 1e-200
    after normalising the weights to <= 1, N such terms change nothing at any tolerance). Degree-10
    minimax polynomial (``P1``..``P10``, :func:`poly10`): 7.1e-16 relative compiled alone.
fma(a, b, c), opaque(x), poly10(r, ...)
    Building blocks for hand-staged kernels (attention's ``direct3``): an FMA LLVM keeps as written, an
    identity that keeps constants out of the constant pool, the Estrin evaluation of the polynomial.
fexp(x)
    exp(x) for float64 x <= 0 (also correct up to x = 660), relative error <= 3e-14 on [-708, 0]
    (normal results), exactly 0 below -745.2 and for x = -inf. Inlined at every call site.

numba's ``math.exp`` calls libm and does not vectorise with pip's llvmlite (no SVML); this version is
straight-line float code (Cody-Waite range reduction, a degree-11 Taylor polynomial (fexp, fexp_ftz) or the
degree-10 minimax one (fexp_floor), Estrin's scheme, on
|r| <= ln(2)/2, and 2^k built by an int -> float bit cast), so loops that call it vectorise.

Accuracy: <= 9e-15 relative on [-708, 0] compiled alone; inlined into a caller compiled with
fastmath 'reassoc', LLVM may merge the two-part ln2 reduction, which raises the worst case (at
x ~ -708, |k| ~ 1000) to 3.3e-14; for |x| <= 40 it stays below 1e-15.
Kernels that inline it are cached by numba (``cache=True``), and numba's cache does not track this
file: after editing it, delete ``spherepde/kernels/__pycache__/*.nbi`` and ``*.nbc``.
"""
from __future__ import annotations

import numba as nb
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

__all__ = ["fexp", "fexp_ftz", "fexp_floor", "fma", "opaque", "poly10", "EXP_UNDERFLOW", "EXP_FTZ", "EXP_FLOOR",
           "SHIFTER", "P1", "P2", "P3", "P4", "P5", "P6", "P7", "P8", "P9", "P10", "Q1",
           "Q2", "Q3", "Q4", "Q5", "Q6", "Q7", "Q8", "Q9", "Q10"]

#: Below this argument exp(x) rounds to 0 in float64 (half the smallest subnormal).
EXP_UNDERFLOW = -745.1332191019412

#: Below this argument exp(x) is subnormal (< 2^-1022); :func:`fexp_ftz` returns 0 there.
EXP_FTZ = -708.3964185322641

#: :func:`fexp_floor` returns exp(EXP_FLOOR) = 2.6e-261 for every argument below this.
EXP_FLOOR = -600.0

_LOG2E = 1.4426950408889634
_LN2_HI = 0.6931471803691238  # ln 2 with the low 32 bits of the mantissa cleared: k * LN2_HI is exact
_LN2_LO = 1.9082149292705877e-10
# 1.5 * 2^52: adding it rounds to the nearest integer and leaves that integer in the low mantissa bits
_SHIFTER = 6755399441055744.0
_SHIFTER_BITS = 0x4338000000000000
# the same plus the exponent bias: the low 11 bits of the sum's mantissa are k + 1023 (0 <= k + 1023 < 2048),
# and shifting the bits left by 52 drops everything above them
_SHIFTER_BIASED = _SHIFTER + 1023.0
_TWO_M60 = 2.0**-60
#: 1.5 * 2^52: fma(q, c, SHIFTER) rounds q c to an integer k held in the low mantissa bits (two's complement)
SHIFTER = _SHIFTER

# Degree-10 minimax polynomial for exp(r) on |r| <= ln(2)/2 (1 + 1e-9), relative error, p(0) = 1 exactly:
# Remez exchange in long double, coefficients rounded to float64; max |p(r) e^-r - 1| = 4.5e-16
# (with the float64 coefficients, measured on 2e5 points in long double). One term less than the
# degree-11 Taylor polynomial (truncation 6.4e-15) and 14x more accurate.
P1 = 1.0000000000000122
P2 = 0.500000000000001
P3 = 0.1666666666649313
P4 = 0.041666666666521496
P5 = 0.008333333404033173
P6 = 0.0013888888947951494
P7 = 0.00019841149883210768
P8 = 2.4801487196698453e-05
P9 = 2.764772462862938e-06
P10 = 2.7632699168662627e-07

# The same polynomial for 2^r on |r| <= 1/2 (2^r = exp(r ln 2)): Q_k = P_k ln(2)^k, computed in long
# double and rounded to float64 (tested against P_k ln(2)^k; max relative error of 2^r, measured: see tests).
Q1 = 0.6931471805599537
Q2 = 0.2402265069591012
Q3 = 0.055504108664243657
Q4 = 0.009618129107594967
Q5 = 0.0013333558259550095
Q6 = 0.0001540353045888524
Q7 = 1.5252641587767369e-05
Q8 = 1.3215433449411714e-06
Q9 = 1.0211476557016954e-07
Q10 = 7.074209537385563e-09

# 1/n! for n = 2..11 (Taylor: |r|^12/12! <= 6.4e-15 relative on |r| <= ln(2)/2)
_C2 = 1.0 / 2.0
_C3 = 1.0 / 6.0
_C4 = 1.0 / 24.0
_C5 = 1.0 / 120.0
_C6 = 1.0 / 720.0
_C7 = 1.0 / 5040.0
_C8 = 1.0 / 40320.0
_C9 = 1.0 / 362880.0
_C10 = 1.0 / 3628800.0
_C11 = 1.0 / 39916800.0


@intrinsic
def _f2i(typingctx, x):
    """Reinterpret the bits of a float64 as an int64."""
    if not isinstance(x, types.Float):
        return None

    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], context.get_value_type(types.int64))

    return types.int64(types.float64), codegen


@intrinsic
def _i2f(typingctx, x):
    """Reinterpret the bits of an int64 as a float64."""
    if not isinstance(x, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], context.get_value_type(types.float64))

    return types.float64(types.int64), codegen


@intrinsic
def fma(typingctx, a, b, c):
    """a * b + c rounded once (``llvm.fma.f64``; vectorises to vfmadd). Unlike ``a * b + c`` under
    fastmath 'contract'/'reassoc', LLVM keeps it as written (it neither splits nor re-merges it)."""
    if not all(isinstance(v, types.Float) for v in (a, b, c)):
        return None

    def codegen(context, builder, sig, args):
        ty = context.get_value_type(types.float64)
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ty, [ty, ty, ty]), "llvm.fma.f64")
        return builder.call(fn, [context.cast(builder, v, t, types.float64) for v, t in zip(args, sig.args)])

    return types.float64(a, b, c), codegen


@intrinsic
def opaque(typingctx, x):
    """The float64 ``x`` unchanged, through an empty inline asm that LLVM cannot see through.

    For loop-invariant constants of hot vectorised loops: numba compiles with the large code model,
    so LLVM addresses each constant-pool entry through a 64-bit immediate in a general register and,
    under register pressure, re-broadcasts constants from memory inside the loop (with register
    shuffles for the addresses). An opaque value is an ordinary loop invariant instead: broadcast
    once, kept in a ymm register or spilled to the stack. In the direct kernel's loops this made the
    difference between 13 and 6 cycles per 4 evaluations (stage 1, Zen 3).
    """
    if not isinstance(x, types.Float):
        return None

    def codegen(context, builder, sig, args):
        ty = context.get_value_type(types.float64)
        v = context.cast(builder, args[0], sig.args[0], types.float64)
        return builder.asm(ir.FunctionType(ty, [ty]), "", "=x,0", [v], side_effect=False)

    return types.float64(x), codegen


@nb.njit(inline="always")
def poly10(r, one, c1, c2, c3, c4, c5, c6, c7, c8, c9, c10):
    """sum_k c_k r^k (c_0 = ``one``) by Estrin's scheme: 12 multiply-adds, dependency depth 5."""
    r2 = r * r
    r4 = r2 * r2
    q0 = (one + c1 * r) + (c2 + c3 * r) * r2
    q1 = (c4 + c5 * r) + (c6 + c7 * r) * r2
    q2 = (c8 + c9 * r) + c10 * r2
    return q0 + r4 * (q1 + r4 * q2)


@nb.njit(inline="always", cache=False)
def fexp(x):
    """exp(x) without branches: vectorises inside loops.

    Parameters
    ----------
    x : float64
        Argument; intended for x <= 0 (shifted exponents). Values are clamped to [-746, 660].

    Returns
    -------
    float64
        exp(x), relative error <= 3e-14 where the result is normal; gradual underflow
        to exactly 0 below -745.13 (and for x = -inf).

    Notes
    -----
    x = k ln2 + r with k = round(x / ln2), |r| <= ln2 / 2 (Cody-Waite, two-part ln2), exp(r) by a
    degree-11 polynomial, and 2^k = 2^(k+60) 2^-60 from exponent bits, so that subnormal results
    (k < -1022) round once, correctly, and everything below the threshold is 0.
    """
    x = min(max(x, -746.0), 660.0)
    # np.floor (float result; math.floor returns an int, whose conversion does not vectorise on
    # AVX2), not the add-and-subtract-1.5*2^52 trick: callers compiled with fastmath 'reassoc' would
    # fold (t + S) - S to t. The integer k is read from the bits of kf + S, which nothing can fold.
    kf = np.floor(x * _LOG2E + 0.5)
    k = _f2i(kf + _SHIFTER) - _SHIFTER_BITS
    r = x - kf * _LN2_HI
    r = r - kf * _LN2_LO
    # degree 11 by Estrin's scheme: shorter dependency chains than Horner, 1.6x the throughput in
    # vectorised loops; truncation |r|^12 / 12! <= 6.4e-15 relative
    r2 = r * r
    r4 = r2 * r2
    r8 = r4 * r4
    q0 = (1.0 + r) + (_C2 + _C3 * r) * r2
    q1 = (_C4 + _C5 * r) + (_C6 + _C7 * r) * r2
    q2 = (_C8 + _C9 * r) + (_C10 + _C11 * r) * r2
    p = q0 + q1 * r4 + q2 * r8
    # p * 2^(k + 60) is normal and exact for k >= -1082; the final * 2^-60 rounds once (correctly
    # into the subnormal range, to 0 below the threshold). No int64 arithmetic shift: AVX2 has none.
    return (p * _i2f((k + (1023 + 60)) << 52)) * _TWO_M60


@nb.njit(inline="always")
def fexp_ftz(x):
    """exp(x), flushed to 0 where the result would be subnormal (x < EXP_FTZ); branch-free."""
    # clamp first: a subnormal intermediate costs the same microcode assist even if discarded
    e = fexp(max(x, EXP_FTZ))
    return e if x >= EXP_FTZ else 0.0


@nb.njit(inline="always")
def fexp_floor(x):
    """exp(max(x, EXP_FLOOR)) for x <= 0 (valid up to x = 709): 2^k from the bits of k + 1023 directly.

    About 15% fewer vector instructions than :func:`fexp_ftz` (no upper clamp, no flush select, no
    second scaling, the degree-10 minimax polynomial): relative error <= 7.1e-16 compiled alone
    (measured on 1e7 points of [-600, 0]), <= 2.1e-14 inlined with 'reassoc' (LLVM merges the two-part
    reduction into one FMA with float64 ln 2, off by |k| 2.3e-17, |k| <= 866). The result is never subnormal (>= 2.6e-261), so multiplying it by a weight <= 1
    stays normal unless the weight is below ~1e-47.
    """
    x = max(x, EXP_FLOOR)
    kf = np.floor(x * _LOG2E + 0.5)
    scale = _i2f(_f2i(kf + _SHIFTER_BIASED) << 52)
    r = x - kf * _LN2_HI
    r = r - kf * _LN2_LO
    return poly10(r, 1.0, P1, P2, P3, P4, P5, P6, P7, P8, P9, P10) * scale
