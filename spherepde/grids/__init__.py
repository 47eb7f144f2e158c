"""Grids: geometry only (cells, faces, quadrature, reconstruction stencils)."""
from .adaptive import AdaptiveHealpixGrid
from .base import Grid
from .healpix import HealpixGrid
from .tensor import TensorGrid

__all__ = ["AdaptiveHealpixGrid", "Grid", "HealpixGrid", "TensorGrid"]
