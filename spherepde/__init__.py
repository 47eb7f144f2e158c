"""spherepde: the density of tokens in a mean-field transformer, on the sphere.

Finite volumes on HEALPix (S^2) and tensor grids (S^(d-1)) for the nonlocal continuity equation
d_t f + div_S(f v[f]) = 0 of mean-field self-attention, with its zero-temperature limit, particle
simulations and the diagnostics of the concentration theory. Conventions (B vs B^T, V vs V^T) are in
``docs/user_guide.md`` and ``spherepde.models``.
"""
from .models import Model, Prescribed, ZeroTemperature

__version__ = "0.1.0"

__all__ = ["Model", "Prescribed", "ZeroTemperature", "__version__"]
