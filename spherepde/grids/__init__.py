"""Grids: geometry only (cells, faces, quadrature, reconstruction stencils)."""
from .base import Grid
from .healpix import HealpixGrid

__all__ = ["Grid", "HealpixGrid"]
