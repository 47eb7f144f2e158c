"""Input validation shared by the package: every error names the parameter and what is allowed."""
from __future__ import annotations

import numpy as np

__all__ = ["as_matrix", "as_points", "positive_int", "finite_float", "real_array"]


def real_array(value, name: str) -> np.ndarray:
    """``value`` as a float64 array; a complex value is an error naming ``name`` (numpy would drop the
    imaginary part with only a warning)."""
    try:
        a = np.asarray(value)
        if np.iscomplexobj(a):
            raise ValueError(f"{name} must be real, got complex values")
        return np.array(a, dtype=float)
    except (TypeError, ValueError) as exc:
        if "complex" in str(exc):
            raise
        raise ValueError(f"{name} must be an array of real numbers ({exc})") from None


def as_matrix(value, name: str, d: int | None = None) -> np.ndarray:
    """Return ``value`` as a finite float64 square matrix, or raise ``ValueError`` naming ``name``."""
    a = real_array(value, name)
    if a.ndim != 2 or a.shape[0] != a.shape[1]:
        raise ValueError(f"{name} must be a square matrix (d x d), got shape {a.shape}")
    if d is not None and a.shape[0] != d:
        raise ValueError(f"{name} must be {d} x {d}, got shape {a.shape}")
    if a.shape[0] < 2:
        raise ValueError(f"{name} must be at least 2 x 2 (the sphere S^(d-1) needs d >= 2), got {a.shape}")
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{name} must have finite entries (no NaN or inf)")
    a.setflags(write=False)
    return a


def as_points(x, d: int, name: str = "points") -> np.ndarray:
    """Return ``x`` as a float64 array of shape (n, d), or raise ``ValueError`` naming ``name``."""
    a = x if isinstance(x, np.ndarray) and x.dtype == np.float64 else real_array(x, name)
    if a.ndim == 1 and a.shape[0] == d:
        a = a[None, :]
    if a.ndim != 2 or a.shape[1] != d:
        raise ValueError(f"{name} must have shape (n, {d}), got {a.shape}")
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{name} must be finite (no NaN or inf)")
    return a


def positive_int(value, name: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an integer >= {minimum}, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value}")
    return int(value)


def finite_float(value, name: str, *, low=None, high=None, low_open=False, high_open=False) -> float:
    if isinstance(value, (bool, np.bool_)):  # float(True) is 1.0: a flag passed for a number is a mistake
        raise TypeError(f"{name} must be a real number, got {value!r}")
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a real number, got {value!r}") from None
    if not np.isfinite(v):
        raise ValueError(f"{name} must be finite, got {v}")
    if low is not None and (v < low or (low_open and v == low)):
        raise ValueError(f"{name} must be {'>' if low_open else '>='} {low}, got {v}")
    if high is not None and (v > high or (high_open and v == high)):
        raise ValueError(f"{name} must be {'<' if high_open else '<='} {high}, got {v}")
    return v
