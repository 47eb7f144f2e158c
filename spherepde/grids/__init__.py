"""Grids: geometry only (cells, faces, quadrature, reconstruction stencils)."""
from .base import Grid
from .healpix import HealpixGrid
from .tensor import TensorGrid

__all__ = ["Grid", "HealpixGrid", "TensorGrid"]
