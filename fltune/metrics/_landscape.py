"""Loss-landscape and eigen-spectrum plots (FedAlign Fig. 1, FedSOL Fig. 8, MAN Fig. 4a).

Why: the papers back λ_max and tr H with pictures of the loss along the top-2 Hessian eigenvectors and of
the top-k spectrum. Drawn headless by :mod:`fltune.metrics.figures` (matplotlib imported only to draw, never
on the workers that compute a landscape).
"""

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from fltune.errors import FLTuneError
from fltune.metrics.figures import new_figure, save_png
from fltune.metrics._hessian import (
    Batch,
    LossFn,
    Vector,
    check_batches,
    check_vector,
    eval_mode,
    to_device,
    top_eigenpairs,
    trainable_parameters,
)


def _axis(span: float, steps: int) -> np.ndarray:
    """``steps`` even offsets over [−span, span]; the middle one is exactly 0 when ``steps`` is odd."""
    if steps < 2:
        raise FLTuneError(f"steps: need at least 2 grid points per axis, got {steps}")
    half = (steps - 1) / 2
    return span * (np.arange(steps) - half) / half


def loss_surface(
    model: nn.Module, loss_fn: LossFn, batches: Sequence[Batch], directions: tuple[Vector, Vector], span: float = 1.0,
    steps: int = 21,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Loss at θ + a·d1 + b·d2 on a ``steps``×``steps`` grid of (a, b) ∈ [−span, span]². Returns ``(alphas, betas,
    grid)``, ``grid[i, j]`` the mean loss over ``batches`` at (alphas[i], betas[j]) in eval mode. Each point is set from
    a saved θ (no drift), restored bit for bit afterwards, even on error."""
    check_batches(batches)
    params = trainable_parameters(model)
    for direction in directions:
        check_vector(direction, params, "directions")
    d1, d2 = ([d.to(p) for d, p in zip(direction, params)] for direction in directions)
    alphas, betas = _axis(span, steps), _axis(span, steps)
    grid = np.empty((steps, steps))
    origin = [p.detach().clone() for p in params]
    with torch.no_grad(), eval_mode(model):
        try:
            for i, a in enumerate(alphas):
                for j, b in enumerate(betas):
                    for p, theta, u, w in zip(params, origin, d1, d2):
                        p.copy_(theta).add_(u, alpha=float(a)).add_(w, alpha=float(b))
                    losses = (float(loss_fn(model, to_device(batch, params[0].device))) for batch in batches)
                    grid[i, j] = sum(losses) / len(batches)
        finally:
            for p, theta in zip(params, origin):
                p.copy_(theta)
    return alphas, betas, grid


def plot_landscape(
    alphas: np.ndarray, betas: np.ndarray, grid: np.ndarray, path: str | Path, title: str
) -> Path:
    """A PNG with the contour map (left) and 3-D surface (right) of a :func:`loss_surface` grid."""
    a, b = np.meshgrid(alphas, betas, indexing="ij")
    fig = new_figure(figsize=(11, 4.5), layout="constrained")
    contour_ax = fig.add_subplot(1, 2, 1)
    filled = contour_ax.contourf(a, b, grid, levels=30, cmap="viridis")
    contour_ax.contour(a, b, grid, levels=10, colors="black", linewidths=0.4)
    fig.colorbar(filled, ax=contour_ax, label="loss")
    surface_ax = fig.add_subplot(1, 2, 2, projection="3d")
    surface_ax.plot_surface(a, b, grid, cmap="viridis", edgecolor="none")
    surface_ax.set_zlabel("loss")
    for ax in (contour_ax, surface_ax):
        ax.set_xlabel(r"$\epsilon_0$ step")
        ax.set_ylabel(r"$\epsilon_1$ step")
    fig.suptitle(title)
    return save_png(fig, path, dpi=120)


def plot_spectrum(eigenvalues: Sequence[float], path: str | Path, title: str) -> Path:
    """A PNG of the top-k eigenvalues against their rank (MAN Fig. 4a), with λ1/λ5 (FedSOL Fig. 8)."""
    if len(eigenvalues) == 0:
        raise FLTuneError("eigenvalues: need at least one eigenvalue to plot")
    fig = new_figure(figsize=(5, 4), layout="constrained")
    ax = fig.add_subplot()
    ax.plot(np.arange(1, len(eigenvalues) + 1), eigenvalues, marker="o", markersize=3)
    ax.axhline(0.0, color="grey", linewidth=0.5)
    ax.set_xlabel("rank (by |λ|)")
    ax.set_ylabel("eigenvalue")
    ax.grid(alpha=0.3)
    has_ratio = len(eigenvalues) >= 5 and eigenvalues[4] != 0
    ax.set_title(f"{title}, λ1/λ5 = {eigenvalues[0] / eigenvalues[4]:.3g}" if has_ratio else title)
    return save_png(fig, path, dpi=120)


@dataclass(frozen=True)
class Landscape:
    """The loss on the plane of the top-2 Hessian eigenvectors: plain data, computed on a worker and drawn
    on the driver."""

    eigenvalues: tuple[float, float]
    alphas: np.ndarray
    betas: np.ndarray
    grid: np.ndarray

    def png(self, path: str | Path, title: str) -> Path:
        """The PNG of :func:`plot_landscape`, its title with λ1, λ2."""
        first, second = self.eigenvalues
        title = f"{title} (λ1 = {first:.4g}, λ2 = {second:.4g})"
        return plot_landscape(self.alphas, self.betas, self.grid, path, title)


def top2_landscape(
    model: nn.Module, loss_fn: LossFn, batches: Sequence[Batch], seed: int = 0, steps: int = 21, span: float = 1.0,
    max_iter: int = 100, tol: float = 1e-3,
) -> Landscape:
    """FedAlign Fig. 1 / FedSOL Fig. 8's data: the loss along the top-2 Hessian eigenvectors. Unit eigenvectors, so
    ``span`` is a Euclidean distance in parameter space, fixed (default ±1.0, the authors' ``np.linspace(-1.0, 1.0,
    41)``, ``mmendiet/FedAlign:pyhessian/compute_hessian.py``) so methods' plots share axes and the sharper model shows
    the steeper bowl."""
    values, vectors = top_eigenpairs(model, loss_fn, batches, k=2, max_iter=max_iter, tol=tol, seed=seed)
    alphas, betas, grid = loss_surface(model, loss_fn, batches, (vectors[0], vectors[1]), span, steps)
    return Landscape((values[0], values[1]), alphas, betas, grid)
