r"""Time steppers of the finite-volume solver: SSP Runge-Kutta schemes with embedded error estimates.

Contents
--------
SSPStepper      a scheme in Shu-Osher form with its embedded lower-order solution (one frozen class).
STEPPERS        the registry, name -> SSPStepper; ``register_stepper`` adds one.
StepController  the step-size rule of the error control (error per unit step, see Notes).

Each stage is a convex combination of forward-Euler stages, ``u_s = alpha_s u_0 + (1 - alpha_s)
(u_{s-1} + h_s dt L(u_{s-1}, t + c_s dt))``, so positivity and exact mass conservation of one forward-Euler
stage carry over to every accepted step, as long as each forward-Euler stage h_s dt is within the
forward-Euler limit: the step may be 1 / max_s h_s (the SSP coefficient) times that limit. The embedded
solution is a fixed linear combination of the stage values ``[u_0, u_1, ..., u_s, extra...]``; it is used
only to estimate the error, never as the answer (it need not be positive).

========  ======  ========================================  ===============  =========  ========
name      order   stages (alpha, c), h_s = 1 unless given   embedded         stages     SSP
                                                                             per step   coeff.
========  ======  ========================================  ===============  =========  ========
euler     1       (0, 0)                                    Heun (order 2),  2          1
                                                            one extra stage
ssprk2    2       (0, 0), (1/2, 1)                          Euler = u_1      2          1
ssprk3    3       (0, 0), (3/4, 1), (1/3, 1/2)              Heun = 2u_2-u_0  3          1
ssprk43   3       (0, 0), (0, 1/2), (2/3, 1), (0, 1/2);     2u_3 - u_0       4          2
                  h_s = 1/2 for every stage                 (order 2)
========  ======  ========================================  ===============  =========  ========

SSP-RK(4,3) (Spiteri and Ruuth 2002; Kraaijevanger 1991) is SSP-RK3 with a fourth stage and twice the SSP
coefficient: per unit time it takes 4 / 2 = 2 stages per forward-Euler step against SSP-RK3's 3, so where
the CFL limit sets the step it costs 2/3 of SSP-RK3. Its embedded solution 2 u_3 - u_0 = u_0 + dt (k_1 +
k_2 + k_3) / 3 (k_s the stage slopes) has sum b = 1 and sum b c = 1/2: order 2, as SSP-RK3's Heun.

Notes
-----
The error estimate of a step is ``e = u_new - u_emb``, the local error of the embedded (lower-order)
solution; the step advances with the higher-order one (local extrapolation). The step is accepted when

.. math:: \mathrm{err} = \frac{\|e\|_b}{\mathrm{atol}\,M + \mathrm{rtol}\,\|u_{\rm new} - u_0\|_b} \le 1,
          \qquad \|g\|_b = \sum_{\rm blocks\ b} \Big|\sum_{i \in b} g_i\,|C_i|\Big|,\quad M = \sum_i u_{0,i} |C_i|,

an *error per unit step* criterion (Shampine, "Numerical Solution of Ordinary Differential Equations",
1994, sec. 5.1): the error of a step is measured against the change the step makes, not against the size
of the density. It is invariant under the amplitude of a perturbation, so a perturbation of the uniform
state of size 1e-4 is integrated to the same relative accuracy as one of size 1 (a criterion relative to
the density would accept one step over the whole run; issue #15), and the global error is about
``rtol`` times the total variation of the solution path. ``atol`` (a fraction of the mass) is the floor
under which differences are round-off. The norm is the mass norm at twice the cell size: the error's
mass summed over blocks of about 2 x 2 cells (``Grid.error_blocks``), since the positivity limiter moves
mass between a nearly empty cell and its neighbour by amounts that depend on the step size itself and do
not shrink with it; those exchanges cancel in the blocks (measured numbers in ``Grid.error_blocks``). Since ``e`` scales as ``dt^(q+1)`` and the change as ``dt``, the
ratio scales as ``dt^q`` with q the embedded order, and the next step is
``dt * clip(0.9 err^(-1/q), 0.2, 4)`` (no growth right after a rejection).

References
----------
C.-W. Shu, S. Osher, J. Comput. Phys. 77 (1988) 439-471 (the schemes).
R. J. Spiteri, S. J. Ruuth, SIAM J. Numer. Anal. 40 (2002) 469-491 (SSP-RK(4,3), its coefficient 2).
I. Higueras et al., "Embedded pairs for optimal explicit strong stability preserving Runge-Kutta
methods", J. Comput. Appl. Math. 2019 / arXiv:1812.09935 (the SSPRK(3,3)-Heun pair).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["SSPStepper", "STEPPERS", "register_stepper", "StepController"]


@dataclass(frozen=True)
class SSPStepper:
    """An SSP Runge-Kutta scheme in Shu-Osher form with an embedded error estimate.

    Attributes
    ----------
    name : str
    stages : tuple of (alpha, c)
        Stage s: ``alpha u_0 + (1 - alpha)(u_{s-1} + h_s dt L(u_{s-1}, t + c dt))``; the last is the answer.
    order : int
        Order of the answer.
    embedded : tuple of float
        Weights of the embedded solution over the values ``[u_0, u_1, ..., u_S, extra_1, ...]``.
    embedded_order : int
        Its order q (the error ratio scales as dt^q).
    extra : tuple of (alpha, c)
        Stages computed after the answer, only for the estimate (from the answer onwards, as above).
    fractions : tuple of float
        h_s of every stage, ``stages`` then ``extra`` (empty: all 1): the forward-Euler step of stage s is
        h_s dt, so the step may be :attr:`ssp_coefficient` = 1 / max h_s times the forward-Euler limit.
    """

    name: str
    stages: tuple
    order: int
    embedded: tuple
    embedded_order: int
    extra: tuple = ()
    fractions: tuple = ()

    def __post_init__(self):
        if self.fractions and (len(self.fractions) != len(self.stages) + len(self.extra)
                               or not all(0.0 < h <= 1.0 for h in self.fractions)):
            raise ValueError(f"stepper {self.name!r}: fractions needs one h in (0, 1] per stage and extra stage")
        n = 1 + len(self.stages) + len(self.extra)
        if len(self.embedded) != n:
            raise ValueError(f"stepper {self.name!r}: embedded needs {n} weights (u_0, stages, extra), "
                             f"got {len(self.embedded)}")
        if abs(sum(self.embedded) - 1.0) > 1e-12:
            raise ValueError(f"stepper {self.name!r}: embedded weights must sum to 1 (consistency)")

    @property
    def stage_fractions(self) -> tuple:
        """h_s of every stage (``stages`` then ``extra``)."""
        return tuple(self.fractions) or (1.0,) * (len(self.stages) + len(self.extra))

    @property
    def ssp_coefficient(self) -> float:
        """1 / max h_s: the step may be this many forward-Euler limits (CFL steps)."""
        return 1.0 / max(self.stage_fractions)

    @property
    def n_stages(self) -> int:
        """Stages per attempted step with the error estimate (answer + extra)."""
        return len(self.stages) + len(self.extra)


#: Registered schemes by name.
STEPPERS: dict[str, SSPStepper] = {}


def register_stepper(stepper: SSPStepper) -> SSPStepper:
    """Add ``stepper`` to :data:`STEPPERS` (keyed by its name) and return it."""
    STEPPERS[stepper.name] = stepper
    return stepper


register_stepper(SSPStepper("euler", ((0.0, 0.0),), 1, (0.0, 0.0, 1.0), 1, extra=((0.5, 1.0),)))
register_stepper(SSPStepper("ssprk2", ((0.0, 0.0), (0.5, 1.0)), 2, (0.0, 1.0, 0.0), 1))
register_stepper(SSPStepper("ssprk3", ((0.0, 0.0), (0.75, 1.0), (1.0 / 3.0, 0.5)), 3, (-1.0, 0.0, 2.0, 0.0), 2))
register_stepper(SSPStepper("ssprk43", ((0.0, 0.0), (0.0, 0.5), (2.0 / 3.0, 1.0), (0.0, 0.5)), 3,
                            (-1.0, 0.0, 0.0, 2.0, 0.0), 2, fractions=(0.5, 0.5, 0.5, 0.5)))


@dataclass
class StepController:
    """Proposes the next step from the error ratio of the last (see the module Notes)."""

    exponent: float
    safety: float = 0.9
    min_factor: float = 0.2
    max_factor: float = 4.0

    def factor(self, err: float, after_reject: bool = False) -> float:
        hi = 1.0 if after_reject else self.max_factor
        if err <= 0.0:
            return hi
        return float(np.clip(self.safety * err ** (-self.exponent), self.min_factor, hi))
