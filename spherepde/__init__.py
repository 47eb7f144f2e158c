"""spherepde: the density of tokens in a mean-field transformer, on the sphere.

Finite volumes on HEALPix (S^2) and tensor grids (S^(d-1)) for the nonlocal continuity equation
d_t f + div_S(f v[f]) = 0 of mean-field self-attention, with its zero-temperature limit, particle
simulations and the diagnostics of the concentration theory.

Conventions (one place, kept everywhere): attention score <x, B y> with B = Q^T K; value map y -> V y;
A = V B^T; zero-temperature field v_inf(x) = P_x(V B^T x) / |B^T x|; densities are with respect to the
surface measure (a probability density integrates to 1; the area of S^2 is 4 pi).
"""
import os as _os

# Numba's OpenMP layer busy-waits between parallel regions by default; on a shared or loaded machine
# that made small kernels 10-20x slower (measured: 4.8 s against 0.22 s for a 136-step nside-8 run).
# Passive waiting costs nothing measurable on the large kernels. Set before numba loads OpenMP; an
# explicit user setting wins.
_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from .diagnostics import alignment, concentration_diagnostics, interaction_energy
from .exact import characteristics_backward, exact_cell_averages, exact_zero_temperature
from .grids import AdaptiveHealpixGrid, Grid, HealpixGrid, TensorGrid
from .io import load, save_result, write_fits
from .models import (Attention, FeedForward, Layers, Model, MultiHead, Noise, Prescribed, Sum,
                     ZeroTemperature)
from .particles import ParticleResult, particle_velocity, simulate_particles
from .sampling import (sample_grid_density, sample_uniform, sample_vmf, sample_vmf_mixture,
                       vmf_mean_resultant)
from .solver import Options, Result, Solver, solve
from .spectral import (SpectralData, limit_measure, lyapunov_vp, lyapunov_vp_uniform, projection, spectral_data,
                       vp_cell_averages)
from .sweeps import load_sweep, open_sweep, sweep
from .wasserstein import coarsen_measure, wasserstein2, wasserstein2_two_atoms

__version__ = "0.1.0"

__all__ = [
    "AdaptiveHealpixGrid", "Attention", "FeedForward", "Layers", "MultiHead", "Noise", "Sum", "Grid", "HealpixGrid", "Model", "Options", "ParticleResult", "Prescribed", "Result",
    "Solver", "SpectralData", "TensorGrid", "ZeroTemperature", "alignment", "characteristics_backward",
    "coarsen_measure", "concentration_diagnostics", "exact_cell_averages", "exact_zero_temperature",
    "interaction_energy", "limit_measure", "load", "save_result", "write_fits", "lyapunov_vp", "particle_velocity", "projection",
    "sample_grid_density", "sample_uniform", "sample_vmf", "sample_vmf_mixture", "simulate_particles",
    "solve", "spectral_data", "sweep", "open_sweep", "load_sweep", "vmf_mean_resultant", "vp_cell_averages", "lyapunov_vp_uniform", "wasserstein2", "wasserstein2_two_atoms",
    "__version__",
]
