"""Numba kernels: all jitted code of spherepde lives here (flat arrays and scalars in, no objects)."""
