"""Figures of results: density maps, diagnostics against time, particle overlays, animations.

Never imported by the core modules. It never selects a matplotlib backend: the functions that return a
figure make it through ``matplotlib.pyplot`` (so it shows in Jupyter and interactive sessions), and
:func:`make_figures` (the runner's and ``spherepde plot``'s figures) builds ``matplotlib.figure.Figure``
objects without pyplot and saves them, which needs no display and no backend.

Functions
---------
::

    sample_map(grid, f, points) -> values at points (nearest cell: healpy vec2pix on HEALPix, a k-d
        tree of the cell centres otherwise)
    color_norm(frames, scale="auto")                  one colour scale (linear or log) for a set of frames
    choose_frames(result, n=4)                         saved times for the maps, chosen from the dynamics
    mollweide_xy(points)                               plot coordinates of points on a Mollweide map
    plot_mollweide(grid, f, ax=None, title=None)      Mollweide map (S^2), healpy's orientation
    plot_orthographic(grid, f, ax=None, view=(1, 0, 0), particles=None)   orthographic view, optional tokens
    plot_circle(grid, f, ax=None)                      density against the angle (S^1, d = 2)
    plot_density(grid, f, ...)                         dispatch on grid.dim
    plot_maps(result, kind="mollweide")                a row of maps at the times of choose_frames
    plot_diagnostics(result)                           mass drift, min/max with the Gronwall bound, sup div v
    plot_concentration(result)                         W2 to Pi#rho_0 and alignment with E, F, F_abs
    animate(result, path, view="mollweide")            GIF through matplotlib's PillowWriter
    make_figures(result, outdir, kinds)                the set the runner and spherepde plot write

Conventions of the maps
-----------------------
* Colour: the density f with respect to the surface measure (per unit area of the unit sphere, i.e. per
  steradian; a probability density integrates to 1 over the area 4 pi), nearest-cell renderings of the
  cell averages (what the solver knows). Every colour bar says so. ``scale="auto"`` (the default) draws a
  logarithmic colour scale when max/min over the frames shown exceeds :data:`LOG_RATIO` (= 100), else
  a linear one; a log scale is floored at :data:`LOG_FLOOR` (= 1e-6) times the maximum (zeros and the
  values below are drawn in the lowest colour; the colour bar's arrow marks them). All maps of a figure
  and all frames of an animation share one colour scale.
* Markers: +-e1, +-e2, +-e3 are labelled on every S^2 map; when the model has B and V (attention,
  zero temperature), the eigenspaces E (top eigenspace of A = V B^T), F (top eigenspace of V) and F_abs
  (eigenspace of V of largest |eigenvalue|), from :func:`spherepde.spectral.spectral_data`, are marked:
  the points +-v for a 1-d space (rings: E red, F orange, F_abs cyan), the great circle for a 2-d one.
* Mollweide: healpy's ``mollview`` convention (its default ``flip="astro"``): the x axis of R^3
  (longitude 0) at the centre, the z axis at the top, longitude increasing to the **left** (east left;
  the sphere seen from inside). The +e2 direction (longitude 90 deg) is thus left of the centre.
* Orthographic: the sphere seen from outside along a view direction v (north up); the hemisphere facing
  away is not drawn through: figures with ``hemispheres="both"`` add a row seen from -v.
"""
from __future__ import annotations

import contextvars
import logging
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
from matplotlib import patheffects
from matplotlib.colors import LogNorm, Normalize
from matplotlib.figure import Figure

__all__ = ["sample_map", "color_norm", "choose_frames", "mollweide_xy", "plot_mollweide", "plot_orthographic",
           "plot_circle", "plot_density", "plot_maps", "plot_mesh", "plot_diagnostics", "plot_concentration", "animate",
           "make_figures", "orthographic_project", "LOG_RATIO", "LOG_FLOOR", "DEFAULT_VIEW"]

log = logging.getLogger(__name__)

#: ``scale="auto"`` uses a log colour scale when max/min of the frames shown exceeds this ratio.
LOG_RATIO = 100.0
#: A log colour scale starts at this fraction of the maximum (zeros and smaller values: lowest colour).
LOG_FLOOR = 1e-6
#: :func:`plot_diagnostics` notes where min f falls below the Gronwall bound by more than this fraction.
GRONWALL_TOL = 1e-3
#: Marker area (points^2) per token of a cell in the token overlays.
TOKEN_AREA = 3.0
#: Edge colour of the token rings.
TOKEN_COLOR = "red"
#: View direction of the orthographic figures: oblique, so that e1, e2 and e3 are all on the visible side.
DEFAULT_VIEW = (1.0, 0.6, 0.45)

# False inside make_figures: figures are plain matplotlib.figure.Figure objects (no pyplot, no backend)
_PYPLOT = contextvars.ContextVar("spherepde_plotting_pyplot", default=True)

_HALO = [patheffects.withStroke(linewidth=2.2, foreground="black")]
_SUBSPACE_STYLE = {"E": dict(color="red", marker="o", ms=15, lw=3.0), "F": dict(color="orange", marker="D", ms=11, lw=1.8),
                   "F_abs": dict(color="cyan", marker="s", ms=8, lw=0.9)}
_SUBSPACE_NAME = {"E": "E (top eigenspace of A = V B$^T$)", "F": "F (top eigenspace of V)",
                  "F_abs": r"F$_{abs}$ (V's largest |eigenvalue|)"}


def _figure(figsize, **kw):
    """A new figure: through pyplot (shown in Jupyter) unless inside :func:`make_figures`."""
    if _PYPLOT.get():
        return plt.figure(figsize=figsize, **kw)
    return Figure(figsize=figsize, **kw)


def _close(fig):
    if _PYPLOT.get():
        plt.close(fig)


def sample_map(grid, f, points) -> np.ndarray:
    """Cell values of ``f`` at unit ``points`` (n, d): the value of the cell containing (HEALPix) or
    nearest to (other grids) each point."""
    f = np.asarray(f, dtype=float)
    return f[_cell_index(grid, points)]


def _cell_index(grid, points) -> np.ndarray:
    pts = np.asarray(points, dtype=float)
    if hasattr(grid, "cell_of"):  # the cell containing each point (an adaptive HEALPix grid)
        return grid.cell_of(pts)
    nside = getattr(grid, "nside", None)
    if nside is not None:
        import healpy as hp

        return hp.vec2pix(nside, pts[:, 0], pts[:, 1], pts[:, 2])
    from scipy.spatial import cKDTree

    tree = getattr(grid, "_plot_kdtree", None)
    if tree is None:
        tree = cKDTree(grid.centers)
        try:
            grid._plot_kdtree = tree
        except AttributeError:  # pragma: no cover - slotted grids
            pass
    return tree.query(pts)[1]


# ---------------------------------------------------------------------------------------------- colour scale
def color_norm(frames, scale: str = "auto", vmin=None, vmax=None):
    """One colour scale for all ``frames`` (an array of densities, any shape).

    Parameters
    ----------
    frames : array_like
        Every value the scale must cover (all maps of a figure, all frames of an animation).
    scale : {"auto", "log", "linear"}
        ``"auto"``: log when max/min of ``frames`` exceeds :data:`LOG_RATIO` (100), or when min <= 0
        (a concentrated state), else linear.
    vmin, vmax : float, optional
        Override the limits. A log scale's lower limit defaults to max(min f, :data:`LOG_FLOOR` * max f):
        values below it (zeros included) are drawn in the lowest colour.

    Returns
    -------
    matplotlib.colors.Normalize or LogNorm
        With ``clipped`` (bool: some values lie below the lower limit) set as an attribute.
    """
    if scale not in ("auto", "log", "linear"):
        raise ValueError(f"scale: got {scale!r}; allowed: 'auto', 'log', 'linear'")
    a = np.asarray(frames, dtype=float)
    a = a[np.isfinite(a)]
    fmax = float(a.max()) if a.size else 1.0
    fmin = float(a.min()) if a.size else 0.0
    if scale == "auto":
        scale = "log" if (fmax > 0 and fmin * LOG_RATIO < fmax) else "linear"
    if scale == "log":
        hi = float(vmax) if vmax is not None else (fmax if fmax > 0 else 1.0)
        lo = float(vmin) if vmin is not None else max(fmin, LOG_FLOOR * hi)
        if not lo > 0:
            lo = LOG_FLOOR * hi
        if lo >= hi:
            lo, hi = 0.9 * hi, 1.1 * hi
        norm = LogNorm(lo, hi, clip=True)
    else:
        lo = float(vmin) if vmin is not None else fmin
        hi = float(vmax) if vmax is not None else fmax
        if hi - lo <= 1e-9 * max(abs(hi), abs(lo), 1e-300):  # a constant map: a small band around it
            pad = 0.1 * abs(hi) if hi != 0 else 1.0
            lo, hi = lo - pad, hi + pad
        norm = Normalize(lo, hi, clip=True)
    norm.clipped = bool(fmin < norm.vmin)
    return norm


def _density_label(norm, dim=3):
    unit = "[sr$^{-1}$]: per unit area of S$^2$, $\\int f\\, dA = 1$" if dim == 3 else \
        "(per unit length of S$^1$, $\\int f\\, d\\theta = 1$)"
    s = f"density f {unit}"
    if isinstance(norm, LogNorm):
        s += f"; log scale from {norm.vmin:.2g}"
    return s


def _colorbar(fig, mappable, ax, norm, dim=3, **kw):
    cb = fig.colorbar(mappable, ax=ax, extend="min" if getattr(norm, "clipped", False) else "neither", **kw)
    cb.set_label(_density_label(norm, dim), fontsize=8)
    cb.ax.tick_params(labelsize=7)
    return cb


def _prepare(img, norm):
    """Clip the image to the scale's floor (a LogNorm would mask zeros as 'bad' pixels)."""
    if isinstance(norm, LogNorm):
        return np.maximum(img, norm.vmin)
    return img


# -------------------------------------------------------------------------------------------------- markers
def _spectral_of(obj):
    """SpectralData of a result (its model's B and V), a model, a SpectralData, or None."""
    if obj is None:
        return None
    if hasattr(obj, "E") and hasattr(obj, "F_abs"):
        return obj
    model = getattr(obj, "model", obj)
    B, V = getattr(model, "B", None), getattr(model, "V", None)
    if B is None or V is None:
        return None
    from .spectral import spectral_data

    try:
        s = spectral_data(B, V)
    except (ValueError, np.linalg.LinAlgError) as exc:  # pragma: no cover - defensive
        log.info("no eigenspace markers: %s", exc)
        return None
    return s if s.dim == 3 else None


def _marker_items(spectral):
    """[(name, kind, data)]: kind "points" (data (m, 3) unit vectors) or "circle" (data (2, 3) basis)."""
    items = []
    if spectral is None:
        return items
    for name in ("E", "F", "F_abs"):
        b = np.asarray(getattr(spectral, name))
        if b.shape[0] == 1:
            items.append((name, "points", np.vstack([b[0], -b[0]])))
        elif b.shape[0] == 2:
            items.append((name, "circle", b))
    return items


_AXES = [(s * np.eye(3)[i], f"{'+' if s > 0 else '-'}e$_{i + 1}$") for i in range(3) for s in (1, -1)]


def _great_circle(basis, n=361):
    t = np.linspace(0, 2 * np.pi, n)
    return np.cos(t)[:, None] * basis[0] + np.sin(t)[:, None] * basis[1]


def _draw_markers_xy(ax, project, spectral, labels=True):
    """Draw +-e_i and the eigenspace markers; ``project(points) -> (x, y, visible)``."""
    for name, kind, data in _marker_items(spectral):
        st = _SUBSPACE_STYLE[name]
        if kind == "points":
            x, y, vis = project(data)
            ax.plot(x[vis], y[vis], ls="none", marker=st["marker"], ms=st["ms"], mfc="none", mec=st["color"],
                    mew=1.6, zorder=4)
        else:
            x, y, vis = project(_great_circle(data))
            x, y = np.where(vis, x, np.nan), np.where(vis, y, np.nan)
            jump = np.nonzero(np.abs(np.diff(x)) > 1.0)[0] + 1  # the Mollweide seam at longitude 180 deg
            x, y = np.insert(x, jump, np.nan), np.insert(y, jump, np.nan)
            ax.plot(x, y, color=st["color"], lw=st["lw"], zorder=4)  # widths differ: coinciding ones show
    if labels:
        pts = np.array([v for v, _ in _AXES])
        x, y, vis = project(pts)
        for (v, lab), xi, yi, ok in zip(_AXES, x, y, vis):
            if not ok:
                continue
            ax.plot([xi], [yi], "+", color="white", ms=7, mew=1.2, zorder=5)
            ax.text(xi, yi, " " + lab, color="white", fontsize=8, ha="left", va="bottom", zorder=6,
                    path_effects=_HALO, clip_on=True)


def _marker_legend(fig, spectral, particles=False, **kw):
    from matplotlib.lines import Line2D

    handles = []
    for name, kind, _ in _marker_items(spectral):
        st = _SUBSPACE_STYLE[name]
        if kind == "points":
            handles.append(Line2D([], [], ls="none", marker=st["marker"], ms=st["ms"] * 0.7, mfc="none",
                                  mec=st["color"], mew=1.6, label=_SUBSPACE_NAME[name] + ": $\\pm v$"))
        else:
            handles.append(Line2D([], [], color=st["color"], lw=st["lw"], label=_SUBSPACE_NAME[name] + ": great circle"))
    if particles:
        handles.append(Line2D([], [], ls="none", marker="o", ms=5, mfc="none", mec=TOKEN_COLOR, mew=0.8,
                              label="tokens (marker area ~ number in the cell)"))
    if handles:
        ncol = len(handles) if fig.get_figwidth() > 3.2 * len(handles) else 2
        fig.legend(handles=handles, fontsize=7, ncol=ncol, frameon=False, **kw)


# ------------------------------------------------------------------------------------------------ Mollweide
def mollweide_xy(points, flip: str = "astro"):
    """Plot coordinates (x, y) in radians of unit ``points`` (n, 3) on a matplotlib Mollweide axes.

    ``flip="astro"`` (healpy's default): x = -longitude (longitude increases to the left);
    ``"geo"``: x = longitude. y = latitude. Longitude is atan2(x_2, x_1), latitude asin(x_3).
    """
    p = np.asarray(points, dtype=float)
    lon = np.where(np.hypot(p[:, 0], p[:, 1]) > 1e-12, np.arctan2(p[:, 1], p[:, 0]), 0.0)  # poles: lon 0
    lat = np.arcsin(np.clip(p[:, 2], -1.0, 1.0))
    return (-lon if flip == "astro" else lon), lat


def _mollweide_image(grid, f, nlon=360, nlat=180, flip="astro"):
    """(x edges, lat edges, image): the pixel at plot abscissa x shows longitude -x (astro) or x (geo)."""
    x = np.linspace(-np.pi, np.pi, nlon + 1)
    lat = np.linspace(-np.pi / 2, np.pi / 2, nlat + 1)
    xc, latc = 0.5 * (x[1:] + x[:-1]), 0.5 * (lat[1:] + lat[:-1])
    X, LAT = np.meshgrid(xc, latc)
    LON = -X if flip == "astro" else X
    pts = np.stack([np.cos(LAT) * np.cos(LON), np.cos(LAT) * np.sin(LON), np.sin(LAT)], axis=-1).reshape(-1, 3)
    return x, lat, sample_map(grid, f, pts).reshape(nlat, nlon)


def _mollweide_markers(ax, spectral, flip="astro"):
    def project(p):
        x, y = mollweide_xy(p, flip)
        return x, y, np.ones(len(x), bool)

    _draw_markers_xy(ax, project, spectral, labels=False)
    for v, lab in _AXES:
        (x,), (y,) = mollweide_xy(v[None], flip)
        if abs(abs(x) - np.pi) < 1e-9:  # -e1 is on the rim (longitude 180 deg): label both ends
            spots = [(np.pi, "right"), (-np.pi, "left")]
        else:
            spots = [(x, "left")]
        for xi, ha in spots:
            ax.plot([xi], [y], "+", color="white", ms=7, mew=1.2, zorder=5, clip_on=False)
            dy = -0.16 if y > 1.5 else (0.06 if y < -1.5 else 0.0)
            ax.text(xi, y + dy, (" " if ha == "left" else "") + lab + (" " if ha == "right" else ""),
                    color="white", fontsize=8, ha=ha, va="bottom" if y < 1.5 else "top", zorder=6,
                    path_effects=_HALO)


def _mollweide_axes_style(ax):
    ax.set_xticks(np.radians([-120, -60, 0, 60, 120]))
    ax.set_xticklabels([])
    ax.set_yticks(np.radians([-60, -30, 0, 30, 60]))
    ax.tick_params(labelsize=6)
    ax.grid(True, alpha=0.3)


def plot_mollweide(grid, f, ax=None, title=None, cmap="viridis", vmin=None, vmax=None, colorbar=True,
                   scale="auto", norm=None, markers=True, flip="astro"):
    """Mollweide map of a density on S^2 in healpy's orientation (``flip="astro"``: longitude increases
    to the left, the sphere seen from inside; ``"geo"`` mirrors it).

    ``scale``/``vmin``/``vmax`` make the colour scale (:func:`color_norm`) unless ``norm`` is given.
    ``markers``: ``True`` (default) labels +-e1, +-e2, +-e3; a result, a model with B and V, or a
    SpectralData adds the E, F, F_abs markers; ``None``/``False`` draws none.
    """
    if grid.dim != 3:
        raise ValueError(f"plot_mollweide needs a grid of S^2 (dim 3), got dim {grid.dim}")
    if ax is None:
        fig = _figure((8, 4.5))
        ax = fig.add_subplot(111, projection="mollweide")
    norm = norm if norm is not None else color_norm(f, scale, vmin, vmax)
    x, lat, img = _mollweide_image(grid, f, flip=flip)
    mesh = ax.pcolormesh(x, lat, _prepare(img, norm), cmap=cmap, norm=norm, shading="flat", rasterized=True)
    _mollweide_axes_style(ax)
    if markers is not None and markers is not False:
        _mollweide_markers(ax, _spectral_of(markers) if markers is not True else None, flip)
    if title:
        ax.set_title(title, fontsize=9)
    if colorbar:
        _colorbar(ax.figure, mesh, ax, norm, orientation="horizontal", fraction=0.05, pad=0.05)
    return ax


# --------------------------------------------------------------------------------------------- orthographic
def _view_basis(view):
    """Orthonormal (e_depth, e_right, e_up) for a view from direction ``view`` (towards the origin)."""
    c = np.asarray(view, dtype=float)
    c = c / np.linalg.norm(c)
    up0 = np.array([0.0, 0.0, 1.0]) if abs(c[2]) < 0.99 else np.array([0.0, 1.0, 0.0])
    right = np.cross(up0, c)
    right /= np.linalg.norm(right)
    up = np.cross(c, right)
    return c, right, up


def orthographic_project(points, view=(1.0, 0.0, 0.0)):
    """Project unit points onto the image plane of an orthographic view from ``view``.

    Returns ``(u, v, front)``: image coordinates in the unit disk and a mask of the visible hemisphere.
    """
    c, right, up = _view_basis(view)
    p = np.asarray(points, dtype=float)
    return p @ right, p @ up, p @ c >= 0


def _token_clusters(grid, particles, weights=None):
    """Tokens grouped by grid cell: (mean unit position (m, 3), count (m,))."""
    x = np.asarray(particles, dtype=float)
    cell = _cell_index(grid, x)
    uniq, inv, cnt = np.unique(cell, return_inverse=True, return_counts=True)
    pos = np.zeros((len(uniq), 3))
    np.add.at(pos, inv, x)
    pos /= np.maximum(np.linalg.norm(pos, axis=1, keepdims=True), 1e-300)
    return pos, cnt


def plot_orthographic(grid, f, ax=None, view=(1.0, 0.0, 0.0), particles=None, title=None, cmap="viridis",
                      vmin=None, vmax=None, npix=300, colorbar=True, scale="auto", norm=None, markers=True):
    """Orthographic view of a density on S^2 from direction ``view`` (seen from outside, north up).

    ``particles`` (n, 3): the tokens on the visible hemisphere only (none from the back shown through),
    grouped by grid cell, marker area proportional to the number of tokens in the cell. ``scale``,
    ``norm``, ``markers``: as :func:`plot_mollweide` (markers on the visible side).
    """
    if grid.dim != 3:
        raise ValueError(f"plot_orthographic needs a grid of S^2 (dim 3), got dim {grid.dim}")
    if ax is None:
        ax = _figure((5, 5)).subplots()
    c, right, up = _view_basis(view)
    s = np.linspace(-1, 1, npix)
    U, Vv = np.meshgrid(s, s)
    r2 = U**2 + Vv**2
    inside = r2 <= 1.0
    depth = np.sqrt(np.clip(1.0 - r2, 0.0, None))
    pts = depth[..., None] * c + U[..., None] * right + Vv[..., None] * up
    vals = sample_map(grid, f, pts[inside])
    norm = norm if norm is not None else color_norm(vals, scale, vmin, vmax)
    img = np.full(U.shape, np.nan)
    img[inside] = _prepare(vals, norm)
    im = ax.imshow(img, origin="lower", extent=(-1, 1, -1, 1), cmap=cmap, norm=norm, interpolation="nearest")
    ax.add_patch(plt.Circle((0, 0), 1.0, fill=False, lw=0.8, color="k"))
    if markers is not None and markers is not False:
        _draw_markers_xy(ax, lambda p: orthographic_project(p, view),
                         _spectral_of(markers) if markers is not True else None)
    if particles is not None:
        pos, cnt = _token_clusters(grid, particles)
        u, v, front = orthographic_project(pos, view)
        # hollow rings: a cell holding many tokens gets a large ring that does not hide the density under it
        ax.scatter(u[front], v[front], s=TOKEN_AREA * cnt[front], facecolors="none", edgecolors=TOKEN_COLOR,
                   linewidths=0.8, zorder=7)
    ax.set_xlim(-1.05, 1.05)
    ax.set_ylim(-1.05, 1.05)
    ax.set_aspect("equal")
    ax.axis("off")
    if title:
        ax.set_title(title, fontsize=9)
    if colorbar:
        _colorbar(ax.figure, im, ax, norm, fraction=0.046, pad=0.04)
    return ax


def plot_circle(grid, f, ax=None, title=None, label=None, scale="linear", **kw):
    """Density on S^1 (d = 2) against the angle theta = atan2(x_2, x_1) in [-pi, pi); ``scale="log"``
    (or ``"auto"``, as :func:`color_norm`) draws a log y axis."""
    if grid.dim != 2:
        raise ValueError(f"plot_circle needs a grid of S^1 (dim 2), got dim {grid.dim}")
    if ax is None:
        ax = _figure((6, 3.5)).subplots()
    theta = np.arctan2(grid.centers[:, 1], grid.centers[:, 0])
    order = np.argsort(theta)
    ax.plot(theta[order], np.asarray(f)[order], label=label, **kw)
    ax.set_xlabel(r"$\theta$")
    ax.set_ylabel("density f (per unit length of S$^1$)")
    ax.set_xlim(-np.pi, np.pi)
    if scale != "linear" and isinstance(color_norm(f, scale), LogNorm):
        ax.set_yscale("log")
    if title:
        ax.set_title(title)
    return ax


def plot_density(grid, f, ax=None, kind="mollweide", **kw):
    """Dispatch on ``grid.dim``: a line plot for S^1, a Mollweide or orthographic map for S^2."""
    if grid.dim == 2:
        return plot_circle(grid, f, ax=ax, **kw)
    if grid.dim == 3:
        return (plot_mollweide if kind == "mollweide" else plot_orthographic)(grid, f, ax=ax, **kw)
    raise ValueError(f"no density map for S^{grid.dim - 1} (dim {grid.dim}); plot the diagnostics instead")


# ------------------------------------------------------------------------------------------- time series
def plot_diagnostics(result, fig=None):
    """Mass drift, min and max density with the Gronwall lower bound, and sup div v, against time."""
    d = result.diagnostics
    t = np.asarray(d["time"])
    if fig is None:
        fig = _figure((11, 3.5))
    axs = fig.subplots(1, 3)
    m = np.asarray(d["mass"])
    axs[0].plot(t, (m - m[0]) / m[0])
    axs[0].set_title("relative mass drift")
    axs[0].set_ylabel(r"$(M_t - M_0) / M_0$")
    axs[1].semilogy(t, d["max"], label="max f")
    axs[1].semilogy(t, np.maximum(d["min"], 1e-300), label="min f")
    if "gronwall" in d:
        g = np.asarray(d["gronwall"])
        axs[1].semilogy(t, np.maximum(g, 1e-300), "--", label="Gronwall bound")
        below = np.nonzero(np.asarray(d["min"]) < (1.0 - GRONWALL_TOL) * g)[0]
        if below.size:  # say why, where it happens: the bound is the continuum's, not every limiter's
            t0 = float(t[below[0]])
            limiter = getattr(getattr(result, "options", None), "limiter", None)
            axs[1].axvline(t0, color="0.5", ls=":", lw=0.8, label=f"min f < bound from t = {t0:.3g}")
            why = (f"the bound is the PDE's; limiter '{limiter}' does not keep it, 'maximum' does"
                   if limiter != "maximum" else "beyond the step tolerance of limiter 'maximum'")
            axs[1].set_title("density extremes\n" + why, fontsize=7)
    axs[1].legend(fontsize=8)
    if not axs[1].get_title():
        axs[1].set_title("density extremes")
    axs[1].set_ylabel("density f (per unit area)")
    axs[2].plot(t, d["sup_div"])
    axs[2].set_title(r"sup div$_S$ v (discrete)")
    for a in axs:
        a.set_xlabel("t")
    fig.tight_layout()
    return fig


def _events(c, particles=False):
    """{label: time} of the E-phase exit and the E-to-F transition in a concentration series."""
    from .diagnostics import exit_time, transition_time

    out = {}
    t = np.asarray(c.get("times", []), dtype=float)
    for pre, who in ([("", "PDE")] + ([("particles_", "particles")] if particles else [])):
        aE, aF = c.get(pre + "alignment_E"), c.get(pre + "alignment_F")
        if aE is None or aF is None or len(aE) != len(t):
            continue
        te = exit_time(t, aE)
        tef = transition_time(t, aE, aF)
        if np.isfinite(te):
            out[f"$t_{{exit}}$ ({who})"] = te
        if np.isfinite(tef):
            out[f"$t_{{EF}}$ ({who})"] = tef
    return out


def plot_concentration(result, fig=None):
    """W2(rho_t, Pi#rho_0) and alignments int |P_S x|^2 drho_t (S = E, F, F_abs), PDE and particles; the
    exit time of the E phase and the E-to-F transition time (:mod:`spherepde.diagnostics`) as dotted
    vertical lines where they happen."""
    c = result.metadata.get("concentration") or {}
    if not c:
        raise ValueError("the result has no concentration diagnostics (needs a model with B and V)")
    t = np.asarray(c["times"])
    if fig is None:
        fig = _figure((10, 3.8))
    a0, a1 = fig.subplots(1, 2)
    a0.semilogy(t, np.maximum(c["w2_limit"], 1e-16), label="PDE")
    if "w2_floor" in c:  # no density on the grid is closer to Pi#rho_0: a plateau there is the grid's
        a0.semilogy(t, np.maximum(c["w2_floor"], 1e-16), color="0.5", ls="-.", lw=0.9,
                    label="grid floor of W2")
    a1.plot(t, c["alignment_E"], label="E (PDE)")
    a1.plot(t, c["alignment_F"], label="F (PDE)")
    a1.plot(t, c["alignment_F_abs"], ":", label=r"F$_{abs}$ (PDE)")
    pc = {k[len("particles_"):]: v for k, v in c.items() if k.startswith("particles_")}
    if pc:
        a0.semilogy(t, np.maximum(pc["w2_limit"], 1e-16), "--", label="particles")
        a1.plot(t, pc["alignment_E"], "--", label="E (particles)")
        a1.plot(t, pc["alignment_F"], "--", label="F (particles)")
    for lab, te in _events(c, particles=bool(pc)).items():
        for a in (a0, a1):
            a.axvline(te, color="0.5", ls=":", lw=1)
        a1.text(te, 1.0, " " + lab, rotation=90, va="top", ha="right", fontsize=7, color="0.3")
    a0.set_title(r"$W_2(\rho_t, \Pi_\#\rho_0)$")
    a1.set_title(r"alignment $\int |P_S x|^2 d\rho_t$")
    a1.set_ylim(-0.02, 1.02)
    for a in (a0, a1):
        a.set_xlabel("t")
        # below the axes: inside, the legend covered the curves and the event labels
        a.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=3, frameon=False)
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------------------------------ frame choice
def _frame_indices(n, k):
    return sorted(set(np.linspace(0, n - 1, min(n, k)).round().astype(int).tolist()))


def choose_frames(result, n: int = 4, particles: bool = False):
    """Saved-time indices for a row of maps, chosen from the dynamics, and a label for each.

    Rule: the first and the last saved time; the saved times nearest to the events of the
    concentration series when they happen in the run (the E-phase exit time t_exit and the E-to-F
    transition time t_EF of :func:`spherepde.diagnostics.exit_time` / ``transition_time``; those of the
    token overlay too when ``particles``); and up to ``n - 2`` more, spread evenly in the accumulated
    change of the state s(t) = sum over saved steps of |increment of the feature vector| (each is the
    saved time farthest in s from the frames already chosen), the features being the alignments with
    E, F, F_abs (PDE, and tokens when ``particles``) and log10 of max f, each scaled to its range over
    the run (a feature varying by less than 1e-3 of its scale is left out). Frames thus fall where the
    diagnostics change most, not at fixed fractions of the run; a run whose state does not change gets
    frames evenly spaced in time.

    Returns
    -------
    (list of int, list of str)
        Increasing indices into ``result.times`` and their labels ("start", "end", "t_exit (PDE)", ...,
        "" for the change-spaced frames).
    """
    times = np.asarray(result.times, dtype=float)
    m = len(times)
    if m <= max(n, 2):
        return list(range(m)), ["start"] + [""] * (m - 2) + ["end"] if m > 1 else ["start"]
    c = result.metadata.get("concentration") or {}
    feats = []
    if c and len(np.asarray(c.get("times", []))) == m:
        pre = [""] + (["particles_"] if particles else [])
        for p in pre:
            for k in ("alignment_E", "alignment_F", "alignment_F_abs"):
                if p + k in c:
                    feats.append(np.asarray(c[p + k], dtype=float))
    fmax = np.array([np.max(f) for f in result.density], dtype=float)
    feats.append(np.log10(np.maximum(fmax, 1e-300)))
    cols = []
    for a in feats:
        a = np.nan_to_num(a)
        rng = a.max() - a.min()
        if rng > 1e-3 * max(1.0, np.abs(a).max()):
            cols.append((a - a.min()) / rng)
    chosen = {0: "start", m - 1: "end"}
    for lab, te in (_events(c, particles) if c else {}).items():
        i = int(np.argmin(np.abs(times - te)))
        chosen.setdefault(i, lab.replace("$", "").replace("{", "").replace("}", ""))
    if cols:
        X = np.stack(cols, axis=1)
        s = np.concatenate([[0.0], np.cumsum(np.linalg.norm(np.diff(X, axis=0), axis=1))])
    else:
        s = np.zeros(m)
    if s[-1] <= 0:  # nothing changes: evenly spaced in time
        for i in _frame_indices(m, n)[1:-1]:
            chosen.setdefault(int(i), "")
    else:
        for _ in range(n - 2):  # greedy: the saved time farthest, in accumulated change, from those chosen
            dist = np.min(np.abs(s[:, None] - s[sorted(chosen)][None, :]), axis=1)
            i = int(np.argmax(dist))
            if dist[i] <= 1e-3 * s[-1]:
                break
            chosen[i] = ""
    idx = sorted(chosen)
    return idx, [chosen[i] for i in idx]


def _values(result, idx) -> np.ndarray:
    """Every cell value of the saved states ``idx`` (states on grids of different sizes too)."""
    return np.concatenate([np.ravel(np.asarray(result.density[i], dtype=float)) for i in idx])


# ---------------------------------------------------------------------------------------------- map rows
def plot_mesh(result, indices=None, n=4, fig=None):
    """Mollweide maps of the mesh levels of a run on an adaptive grid: the nside of the cell at each point,
    at a few saved times (default :func:`choose_frames`), one discrete colour per level, with the number of
    cells of each state. ValueError for a grid without levels (a uniform grid has one)."""
    import matplotlib
    from matplotlib.colors import BoundaryNorm, ListedColormap

    grid0 = result.grid_at(0)
    if not hasattr(grid0, "order"):
        raise ValueError(f"plot_mesh needs a result on an adaptive HEALPix grid, got {type(grid0).__name__}")
    idx = choose_frames(result, n=n)[0] if indices is None else list(indices)
    kmin, kmax = int(grid0.order_min), int(grid0.order_max)
    levels = np.arange(kmin, kmax + 1)
    cmap = ListedColormap(matplotlib.colormaps["viridis"](np.linspace(0.05, 0.95, len(levels))))
    norm = BoundaryNorm(np.arange(kmin - 0.5, kmax + 1.0), cmap.N)
    k = len(idx)
    fig = fig or _figure((3.6 * k + 0.8, 3.0), layout="constrained")
    axes, mesh = [], None
    for j, i in enumerate(idx):
        g = result.grid_at(i)
        ax = fig.add_subplot(1, k, j + 1, projection="mollweide")
        x, lat, img = _mollweide_image(g, np.asarray(g.order, float), 480, 240)
        mesh = ax.pcolormesh(x, lat, img, cmap=cmap, norm=norm, shading="flat", rasterized=True)
        _mollweide_axes_style(ax)
        ax.set_title(f"t = {result.times[i]:.3g}: {g.n_cells} cells", fontsize=9)
        axes.append(ax)
    cb = fig.colorbar(mesh, ax=axes, orientation="horizontal", location="bottom", fraction=0.06, pad=0.02,
                      shrink=0.4, aspect=40, ticks=levels)
    cb.ax.set_xticklabels([str(1 << int(v)) for v in levels], fontsize=7)
    cb.set_label("nside of the cell (mesh level)", fontsize=8)
    fig.suptitle("adaptive mesh levels; Mollweide, healpy orientation (flip='astro')", fontsize=8)
    return fig


def plot_maps(result, indices=None, kind="mollweide", particles=True, view=DEFAULT_VIEW, scale="auto",
              hemispheres="both", n=4, fig=None):
    """A row of density maps at a few saved times, one colour scale and one labelled colour bar.

    ``indices``: default :func:`choose_frames` (``n`` change-spaced frames plus the events).
    ``kind``: "mollweide" (healpy orientation) or "orthographic", seen from ``view`` and, when
    ``hemispheres="both"``, in a second row from ``-view`` ("front": the visible side only); with the
    token overlay when ``particles`` and the result has one (tokens on the drawn hemisphere only).
    ``scale``: as :func:`color_norm`, over all the maps shown. Markers: +-e_i and, for a model with B
    and V, the eigenspaces E, F, F_abs.
    """
    if kind not in ("mollweide", "orthographic"):
        raise ValueError(f"kind: got {kind!r}; allowed: 'mollweide', 'orthographic'")
    if hemispheres not in ("both", "front"):
        raise ValueError(f"hemispheres: got {hemispheres!r}; allowed: 'both', 'front'")
    grid = result.grid
    pp = result.metadata.get("particles") or {}
    use_pp = bool(particles and pp and kind != "mollweide")
    if indices is None:
        idx, labels = choose_frames(result, n=n, particles=use_pp)
    else:
        idx, labels = list(indices), [""] * len(indices)
    titles = [f"t = {result.times[i]:.3g}" + (f" ({lab})" if lab else "") for i, lab in zip(idx, labels)]
    if grid.dim == 2:
        fig = fig or _figure((7, 4))
        ax = fig.subplots()
        for i, title in zip(idx, titles):
            plot_circle(grid, result.density[i], ax=ax, label=title)
        if isinstance(color_norm(_values(result, idx), scale), LogNorm):
            ax.set_yscale("log")
        ax.legend(fontsize=8)
        return fig
    if grid.dim != 3:
        raise ValueError(f"no density map for S^{grid.dim - 1} (dim {grid.dim})")
    norm = color_norm(_values(result, idx), scale)
    spectral = _spectral_of(result)
    k = len(idx)
    rows = 2 if (kind != "mollweide" and hemispheres == "both") else 1
    size = (3.6 * k + 0.8, 2.9) if kind == "mollweide" else (2.7 * k + 0.9, 2.7 * rows + 0.9)
    fig = fig or _figure(size, layout="constrained")
    axes = []
    mappable = None
    for j, (i, title) in enumerate(zip(idx, titles)):
        if kind == "mollweide":
            ax = fig.add_subplot(1, k, j + 1, projection="mollweide")
            plot_mollweide(result.grid_at(i), result.density[i], ax=ax, title=title, norm=norm, colorbar=False,
                           markers=spectral if spectral is not None else True)
            mappable = ax.collections[0]
            axes.append(ax)
            continue
        pts = pp["positions"][i] if (use_pp and i < len(pp["positions"])) else None
        for r, (v, side) in enumerate([(np.asarray(view, float), "+v"), (-np.asarray(view, float), "-v")][:rows]):
            ax = fig.add_subplot(rows, k, r * k + j + 1)
            plot_orthographic(result.grid_at(i), result.density[i], ax=ax, title=title if r == 0 else None,
                              particles=pts,
                              view=v, norm=norm, colorbar=False, npix=220,
                              markers=spectral if spectral is not None else True)
            if j == 0:
                ax.text(-1.12, 0, f"seen from {side}", rotation=90, ha="right", va="center", fontsize=8,
                        transform=ax.transData)
            mappable = ax.images[0]
            axes.append(ax)
    if kind == "mollweide":
        _colorbar(fig, mappable, axes, norm, orientation="horizontal", location="bottom", fraction=0.06, pad=0.02,
                  shrink=0.4, aspect=40)
    else:
        _colorbar(fig, mappable, axes, norm, orientation="vertical", fraction=0.04, pad=0.01, shrink=0.9)
    v = np.asarray(view, float) / np.linalg.norm(view)
    if kind == "mollweide":
        conv = ("Mollweide, healpy orientation (flip='astro'): +e1 at the centre, +e3 at the top, longitude "
                "increasing to the left (the sphere seen from inside)")
    else:
        conv = (f"orthographic, seen from outside along v = ({v[0]:.2f}, {v[1]:.2f}, {v[2]:.2f})"
                + (" and from -v" if rows == 2 else "") + ", north (+e3) up; only the facing hemisphere is drawn")
    fig.suptitle(conv, fontsize=8)
    _marker_legend(fig, spectral, particles=use_pp, loc="outside lower center")
    return fig


# ------------------------------------------------------------------------------------------------ animation
def animate(result, path, view="mollweide", fps=6, max_frames=60, dpi=80, scale="auto"):
    """Write a GIF of the saved densities (matplotlib's PillowWriter; no external tools).

    ``view``: "mollweide" (healpy orientation) or a 3-vector for an orthographic view, then drawn from
    ``view`` and from ``-view`` side by side, with the token overlay when present (tokens on the drawn
    hemisphere only). One colour scale (:func:`color_norm` over every frame) and one labelled colour bar
    for the whole animation; the markers of :func:`plot_mollweide`.
    """
    from matplotlib.animation import FuncAnimation, PillowWriter

    grid = result.grid
    idx = _frame_indices(len(result.times), max_frames)
    pp = result.metadata.get("particles") or {}
    norm = color_norm(_values(result, idx), scale)
    spectral = _spectral_of(result) if grid.dim == 3 else None
    mk = spectral if spectral is not None else True
    if grid.dim == 2:
        fig = _figure((6, 3.5))
        ax = fig.subplots()
        theta = np.arctan2(grid.centers[:, 1], grid.centers[:, 0])
        o = np.argsort(theta)
        (line,) = ax.plot(theta[o], result.density[idx[0]][o])
        if isinstance(norm, LogNorm):
            ax.set_yscale("log")
            ax.set_ylim(norm.vmin, norm.vmax * 1.5)
        else:
            ax.set_ylim(min(0.0, norm.vmin), norm.vmax * 1.05)
        ax.set_xlim(-np.pi, np.pi)
        ax.set_xlabel(r"$\theta$")
        ax.set_ylabel("density f (per unit length of S$^1$)")
        fig.tight_layout()

        def update(k):
            line.set_ydata(result.density[idx[k]][o])
            ax.set_title(f"t = {result.times[idx[k]]:.3g}")
            return (line,)
    elif grid.dim == 3 and isinstance(view, str) and view == "mollweide":
        fig = _figure((7, 4.4))
        ax = fig.add_subplot(111, projection="mollweide")
        x, lat, img = _mollweide_image(result.grid_at(idx[0]), result.density[idx[0]], 240, 120)
        mesh = ax.pcolormesh(x, lat, _prepare(img, norm), shading="flat", norm=norm, cmap="viridis")
        _mollweide_axes_style(ax)
        _mollweide_markers(ax, spectral)
        _colorbar(fig, mesh, ax, norm, orientation="horizontal", fraction=0.05, pad=0.05)
        fig.suptitle("Mollweide, healpy orientation (flip='astro'): longitude increasing to the left", fontsize=7)

        def update(k):
            _, _, im = _mollweide_image(result.grid_at(idx[k]), result.density[idx[k]], 240, 120)
            mesh.set_array(_prepare(im, norm).ravel())
            ax.set_title(f"t = {result.times[idx[k]]:.3g}", fontsize=9)
            return (mesh,)
    elif grid.dim == 3:
        from matplotlib.cm import ScalarMappable

        fig = _figure((8.2, 4.2))
        axs = fig.subplots(1, 2)
        fig.subplots_adjust(left=0.02, right=0.86, bottom=0.04, top=0.88, wspace=0.05)
        cax = fig.add_axes([0.88, 0.12, 0.025, 0.7])
        cb = fig.colorbar(ScalarMappable(norm=norm, cmap="viridis"), cax=cax,
                          extend="min" if norm.clipped else "neither")
        cb.set_label(_density_label(norm), fontsize=7)
        cb.ax.tick_params(labelsize=6)
        vv = np.asarray(view, float)

        def update(k):
            i = idx[k]
            pts = pp["positions"][i] if pp else None
            for ax, v, side in ((axs[0], vv, "+v"), (axs[1], -vv, "-v")):
                ax.clear()
                plot_orthographic(result.grid_at(i), result.density[i], ax=ax, view=v, particles=pts, npix=160,
                                  norm=norm,
                                  title=f"seen from {side}", colorbar=False, markers=mk)
            fig.suptitle(f"t = {result.times[i]:.3g}", fontsize=10)
            return ()
    else:
        raise ValueError(f"no animation for dim {grid.dim}")
    anim = FuncAnimation(fig, update, frames=len(idx), blit=False)
    anim.save(str(path), writer=PillowWriter(fps=fps), dpi=dpi)
    _close(fig)
    return Path(path)


def make_figures(result, outdir, kinds=("maps", "diagnostics", "concentration")):
    """Write the figures named in ``kinds`` (see :data:`spherepde.config.PLOTS`) into ``outdir``.

    Returns the list of paths written. Kinds that do not apply (maps for d = 4, concentration without
    B and V, particles without an overlay run) are skipped with a log message. The figures are
    ``matplotlib.figure.Figure`` objects saved directly (no pyplot, no backend, no display needed).
    """
    token = _PYPLOT.set(False)
    try:
        return _make_figures(result, outdir, kinds)
    finally:
        _PYPLOT.reset(token)


def _make_figures(result, outdir, kinds):
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    written = []

    def save(fig, name):
        p = out / name
        fig.savefig(p, dpi=110)
        written.append(p)

    dim = result.grid.dim
    for kind in kinds:
        try:
            if kind == "maps" and dim in (2, 3):
                save(plot_maps(result, kind="mollweide"), "maps_mollweide.png" if dim == 3 else "maps_circle.png")
                if hasattr(result.grid, "order"):  # an adaptive grid: its mesh levels too
                    save(plot_mesh(result), "mesh_levels.png")
                if dim == 3:
                    save(plot_maps(result, kind="orthographic", particles=False), "maps_orthographic.png")
            elif kind == "diagnostics":
                save(plot_diagnostics(result), "diagnostics.png")
            elif kind == "concentration" and result.metadata.get("concentration"):
                save(plot_concentration(result), "concentration.png")
            elif kind == "particles" and result.metadata.get("particles") and dim == 3:
                save(plot_maps(result, kind="orthographic", particles=True), "particles_overlay.png")
            elif kind == "animation" and dim in (2, 3):
                view = "mollweide" if not result.metadata.get("particles") else DEFAULT_VIEW
                written.append(animate(result, out / "density.gif", view=view))
            else:
                log.info("figure %r does not apply to this result: skipped", kind)
        except ValueError as exc:
            log.warning("figure %r skipped: %s", kind, exc)
    return written
