"""Figures of results: density maps, diagnostics against time, particle overlays, animations.

Never imported by the core modules (it imports matplotlib with the non-interactive Agg backend).

Functions
---------
sample_map(grid, f, points) -> values at points (nearest cell: healpy ``vec2pix`` on HEALPix, a k-d tree
    of the cell centres otherwise)
plot_mollweide(grid, f, ax=None, title=None)      Mollweide map (S^2)
plot_orthographic(grid, f, ax=None, view=(1, 0, 0), particles=None)   orthographic view, optional tokens
plot_circle(grid, f, ax=None)                      density against the angle (S^1, d = 2)
plot_density(grid, f, ...)                         dispatch on ``grid.dim``
plot_diagnostics(result)                           mass drift, min/max with the Gronwall bound, sup div v
plot_concentration(result)                         W2 to Pi#rho_0 and alignment with E, F, F_abs
animate(result, path, view="mollweide")            GIF through matplotlib's PillowWriter
make_figures(result, outdir, kinds)                the set the runner and ``spherepde plot`` write

Maps are nearest-cell renderings of the cell averages (what the solver knows), with the x axis of
R^3 at longitude 0 and the z axis at the north pole (healpy's convention).
"""
from __future__ import annotations

import logging
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

__all__ = ["sample_map", "plot_mollweide", "plot_orthographic", "plot_circle", "plot_density",
           "plot_diagnostics", "plot_concentration", "animate", "make_figures", "orthographic_project"]

log = logging.getLogger(__name__)


def sample_map(grid, f, points) -> np.ndarray:
    """Cell values of ``f`` at unit ``points`` (n, d): the value of the cell containing (HEALPix) or
    nearest to (other grids) each point."""
    f = np.asarray(f, dtype=float)
    pts = np.asarray(points, dtype=float)
    nside = getattr(grid, "nside", None)
    if nside is not None:
        import healpy as hp

        return f[hp.vec2pix(nside, pts[:, 0], pts[:, 1], pts[:, 2])]
    from scipy.spatial import cKDTree

    tree = getattr(grid, "_plot_kdtree", None)
    if tree is None:
        tree = cKDTree(grid.centers)
        try:
            grid._plot_kdtree = tree
        except AttributeError:  # pragma: no cover - slotted grids
            pass
    return f[tree.query(pts)[1]]


def _mollweide_image(grid, f, nlon=360, nlat=180):
    lon = np.linspace(-np.pi, np.pi, nlon + 1)
    lat = np.linspace(-np.pi / 2, np.pi / 2, nlat + 1)
    lonc, latc = 0.5 * (lon[1:] + lon[:-1]), 0.5 * (lat[1:] + lat[:-1])
    LON, LAT = np.meshgrid(lonc, latc)
    pts = np.stack([np.cos(LAT) * np.cos(LON), np.cos(LAT) * np.sin(LON), np.sin(LAT)], axis=-1).reshape(-1, 3)
    return lon, lat, sample_map(grid, f, pts).reshape(nlat, nlon)


def plot_mollweide(grid, f, ax=None, title=None, cmap="viridis", vmin=None, vmax=None, colorbar=True):
    """Mollweide map of a density on S^2 (longitude increases to the right, as seen from outside)."""
    if grid.dim != 3:
        raise ValueError(f"plot_mollweide needs a grid of S^2 (dim 3), got dim {grid.dim}")
    if ax is None:
        fig = plt.figure(figsize=(8, 4.5))
        ax = fig.add_subplot(111, projection="mollweide")
    lon, lat, img = _mollweide_image(grid, f)
    mesh = ax.pcolormesh(lon, lat, img, cmap=cmap, vmin=vmin, vmax=vmax, shading="flat", rasterized=True)
    ax.set_xticklabels([])
    ax.grid(True, alpha=0.3)
    if title:
        ax.set_title(title)
    if colorbar:
        ax.figure.colorbar(mesh, ax=ax, orientation="horizontal", fraction=0.05, pad=0.05)
    return ax


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


def plot_orthographic(grid, f, ax=None, view=(1.0, 0.0, 0.0), particles=None, title=None, cmap="viridis",
                      vmin=None, vmax=None, npix=300, colorbar=True):
    """Orthographic view of a density on S^2 from direction ``view``; ``particles`` (n, 3) are drawn as
    points on the visible hemisphere (projected with :func:`orthographic_project`)."""
    if grid.dim != 3:
        raise ValueError(f"plot_orthographic needs a grid of S^2 (dim 3), got dim {grid.dim}")
    if ax is None:
        _, ax = plt.subplots(figsize=(5, 5))
    c, right, up = _view_basis(view)
    s = np.linspace(-1, 1, npix)
    U, Vv = np.meshgrid(s, s)
    r2 = U**2 + Vv**2
    inside = r2 <= 1.0
    depth = np.sqrt(np.clip(1.0 - r2, 0.0, None))
    pts = depth[..., None] * c + U[..., None] * right + Vv[..., None] * up
    img = np.full(U.shape, np.nan)
    img[inside] = sample_map(grid, f, pts[inside])
    im = ax.imshow(img, origin="lower", extent=(-1, 1, -1, 1), cmap=cmap, vmin=vmin, vmax=vmax)
    ax.add_patch(plt.Circle((0, 0), 1.0, fill=False, lw=0.8, color="k"))
    if particles is not None:
        u, v, front = orthographic_project(particles, view)
        ax.plot(u[front], v[front], "o", ms=2.5, mfc="white", mec="k", mew=0.4, ls="none")
    ax.set_xlim(-1.05, 1.05)
    ax.set_ylim(-1.05, 1.05)
    ax.set_aspect("equal")
    ax.axis("off")
    if title:
        ax.set_title(title)
    if colorbar:
        ax.figure.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    return ax


def plot_circle(grid, f, ax=None, title=None, label=None, **kw):
    """Density on S^1 (d = 2) against the angle theta = atan2(x_2, x_1) in [-pi, pi)."""
    if grid.dim != 2:
        raise ValueError(f"plot_circle needs a grid of S^1 (dim 2), got dim {grid.dim}")
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3.5))
    theta = np.arctan2(grid.centers[:, 1], grid.centers[:, 0])
    order = np.argsort(theta)
    ax.plot(theta[order], np.asarray(f)[order], label=label, **kw)
    ax.set_xlabel(r"$\theta$")
    ax.set_ylabel("density")
    ax.set_xlim(-np.pi, np.pi)
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


def plot_diagnostics(result, fig=None):
    """Mass drift, min and max density with the Gronwall lower bound, and sup div v, against time."""
    d = result.diagnostics
    t = np.asarray(d["time"])
    if fig is None:
        fig = plt.figure(figsize=(11, 3.5))
    axs = fig.subplots(1, 3)
    m = np.asarray(d["mass"])
    axs[0].plot(t, (m - m[0]) / m[0])
    axs[0].set_title("relative mass drift")
    axs[1].semilogy(t, d["max"], label="max f")
    axs[1].semilogy(t, np.maximum(d["min"], 1e-300), label="min f")
    if "gronwall" in d:
        axs[1].semilogy(t, np.maximum(d["gronwall"], 1e-300), "--", label="Gronwall bound")
    axs[1].legend(fontsize=8)
    axs[1].set_title("density extremes")
    axs[2].plot(t, d["sup_div"])
    axs[2].set_title(r"sup div$_S$ v (discrete)")
    for a in axs:
        a.set_xlabel("t")
    fig.tight_layout()
    return fig


def plot_concentration(result, fig=None):
    """W2(rho_t, Pi#rho_0) and alignments int |P_S x|^2 drho_t (S = E, F, F_abs), PDE and particles."""
    c = result.metadata.get("concentration") or {}
    if not c:
        raise ValueError("the result has no concentration diagnostics (needs a model with B and V)")
    t = np.asarray(c["times"])
    if fig is None:
        fig = plt.figure(figsize=(10, 3.8))
    a0, a1 = fig.subplots(1, 2)
    a0.semilogy(t, np.maximum(c["w2_limit"], 1e-16), label="PDE")
    a1.plot(t, c["alignment_E"], label="E (PDE)")
    a1.plot(t, c["alignment_F"], label="F (PDE)")
    a1.plot(t, c["alignment_F_abs"], ":", label=r"F$_{abs}$ (PDE)")
    pc = {k[len("particles_"):]: v for k, v in c.items() if k.startswith("particles_")}
    if pc:
        a0.semilogy(t, np.maximum(pc["w2_limit"], 1e-16), "--", label="particles")
        a1.plot(t, pc["alignment_E"], "--", label="E (particles)")
        a1.plot(t, pc["alignment_F"], "--", label="F (particles)")
    a0.set_title(r"$W_2(\rho_t, \Pi_\#\rho_0)$")
    a1.set_title(r"alignment $\int |P_S x|^2 d\rho_t$")
    a1.set_ylim(-0.02, 1.02)
    for a in (a0, a1):
        a.set_xlabel("t")
        a.legend(fontsize=8)
    fig.tight_layout()
    return fig


def _frame_indices(n, k):
    return sorted(set(np.linspace(0, n - 1, min(n, k)).round().astype(int).tolist()))


#: View direction of the orthographic figures: oblique, so that e1, e2 and e3 are all on the visible side.
DEFAULT_VIEW = (1.0, 0.6, 0.45)


def plot_maps(result, indices=None, kind="mollweide", particles=True, view=DEFAULT_VIEW):
    """A row of density maps at a few saved times (``indices``: default 4 spread over the run); for
    ``kind="orthographic"``, seen from ``view``, with the particle overlay when ``particles``."""
    grid = result.grid
    idx = _frame_indices(len(result.times), 4) if indices is None else list(indices)
    if grid.dim == 2:
        fig, ax = plt.subplots(figsize=(7, 4))
        for i in idx:
            plot_circle(grid, result.density[i], ax=ax, label=f"t = {result.times[i]:.3g}")
        ax.legend(fontsize=8)
        return fig
    pp = result.metadata.get("particles") or {}
    fig = plt.figure(figsize=(4.2 * len(idx), 3.2 if kind == "mollweide" else 4.2))
    for j, i in enumerate(idx):
        title = f"t = {result.times[i]:.3g}"
        if kind == "mollweide":
            ax = fig.add_subplot(1, len(idx), j + 1, projection="mollweide")
            plot_mollweide(grid, result.density[i], ax=ax, title=title)
        else:
            ax = fig.add_subplot(1, len(idx), j + 1)
            pts = pp["positions"][i] if (particles and pp and i < len(pp["positions"])) else None
            plot_orthographic(grid, result.density[i], ax=ax, title=title, particles=pts, view=view)
    fig.tight_layout()
    return fig


def animate(result, path, view="mollweide", fps=6, max_frames=60, dpi=80):
    """Write a GIF of the saved densities (matplotlib's PillowWriter; no external tools).

    ``view``: "mollweide" or a 3-vector for an orthographic view (particles overlaid when present).
    """
    from matplotlib.animation import FuncAnimation, PillowWriter

    grid = result.grid
    idx = _frame_indices(len(result.times), max_frames)
    pp = result.metadata.get("particles") or {}
    if grid.dim == 2:
        fig, ax = plt.subplots(figsize=(6, 3.5))
        theta = np.arctan2(grid.centers[:, 1], grid.centers[:, 0])
        o = np.argsort(theta)
        (line,) = ax.plot(theta[o], result.density[idx[0]][o])
        ax.set_ylim(0, float(np.max(result.density)) * 1.05)
        ax.set_xlim(-np.pi, np.pi)

        def update(k):
            line.set_ydata(result.density[idx[k]][o])
            ax.set_title(f"t = {result.times[idx[k]]:.3g}")
            return (line,)
    elif grid.dim == 3 and isinstance(view, str) and view == "mollweide":
        fig = plt.figure(figsize=(7, 4))
        ax = fig.add_subplot(111, projection="mollweide")
        lon, lat, img = _mollweide_image(grid, result.density[idx[0]], 240, 120)
        mesh = ax.pcolormesh(lon, lat, img, shading="flat")
        ax.set_xticklabels([])

        def update(k):
            _, _, im = _mollweide_image(grid, result.density[idx[k]], 240, 120)
            mesh.set_array(im.ravel())
            mesh.set_clim(im.min(), im.max())
            ax.set_title(f"t = {result.times[idx[k]]:.3g}")
            return (mesh,)
    elif grid.dim == 3:
        fig, ax = plt.subplots(figsize=(4.5, 4.5))

        def update(k):
            ax.clear()
            i = idx[k]
            pts = pp["positions"][i] if pp else None
            plot_orthographic(grid, result.density[i], ax=ax, view=view, particles=pts, npix=160,
                              title=f"t = {result.times[i]:.3g}", colorbar=False)
            return ()
    else:
        raise ValueError(f"no animation for dim {grid.dim}")
    anim = FuncAnimation(fig, update, frames=len(idx), blit=False)
    anim.save(str(path), writer=PillowWriter(fps=fps), dpi=dpi)
    plt.close(fig)
    return Path(path)


def make_figures(result, outdir, kinds=("maps", "diagnostics", "concentration")):
    """Write the figures named in ``kinds`` (see :data:`spherepde.config.PLOTS`) into ``outdir``.

    Returns the list of paths written. Kinds that do not apply (maps for d = 4, concentration without
    B and V, particles without an overlay run) are skipped with a log message.
    """
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    written = []

    def save(fig, name):
        p = out / name
        fig.savefig(p, dpi=110)
        plt.close(fig)
        written.append(p)

    dim = result.grid.dim
    for kind in kinds:
        try:
            if kind == "maps" and dim in (2, 3):
                save(plot_maps(result, kind="mollweide"), "maps_mollweide.png" if dim == 3 else "maps_circle.png")
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
