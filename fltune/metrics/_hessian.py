"""Hessian metrics from exact Hessian-vector products (docs/methods.md §4), and the curvature probe's work on a worker.

Why: λ_max and the trace H_T (FedAlign Table 1, MAN Table 2), λ1/λ5 (FedSOL Fig. 8) and H_N, H_D (FedAlign
Eq. 3–4) only need H applied to vectors, which a double backward gives exactly without forming H.

H is the Hessian, w.r.t. the trainable parameters, of the *unweighted mean over ``batches``* of ``loss_fn``
(with equal batches, PyHessian's, ``mmendiet/FedAlign:pyhessian/hessian.py``), in eval mode, one batch's graph
alive at a time. Random vectors come from a CPU ``torch.Generator(seed)``: the same on CPU and CUDA.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Generic, NamedTuple, TypeVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fltune.config import ExperimentConfig, HessianConfig
from fltune.data.augment import to_float
from fltune.data.federated import FederatedData
from fltune.engine.builders import build_model_for
from fltune.engine.rng import derive_seed
from fltune.engine.transfer import load_state
from fltune.errors import FLTuneError
from fltune.metrics.figures import new_figure, save_png

if TYPE_CHECKING:
    from fltune.methods.base import State

Batch = tuple[Tensor, Tensor]
LossFn = Callable[[nn.Module, Batch], Tensor]
"""``(model, (x, y)) -> scalar loss``."""
Vector = list[Tensor]
"""A vector in parameter space: one tensor per trainable parameter tensor, in ``named_parameters`` order."""


def cross_entropy_loss(model: nn.Module, batch: Batch) -> Tensor:
    """The default ``loss_fn``: mean cross-entropy of the logits, the training loss the papers analyse."""
    x, y = batch
    return F.cross_entropy(model(x), y)


def trainable_parameters(model: nn.Module) -> dict[str, nn.Parameter]:
    """The parameters H is taken over (``requires_grad``), by name, in the order every :data:`Vector` follows."""
    named = {name: p for name, p in model.named_parameters() if p.requires_grad}
    if not named:
        raise FLTuneError("model: it has no trainable parameters to take a Hessian over")
    return named


@contextmanager
def eval_mode(model: nn.Module) -> Iterator[None]:
    """Eval mode for the duration; then each module gets back its own flag (a frozen BN stays frozen)."""
    modes = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for module, training in modes:
            module.training = training


def check_batches(batches: Sequence[Batch]) -> None:
    """A fixed, non-empty list of batches: the estimators pass over it many times."""
    if len(batches) == 0:
        raise FLTuneError("batches: need at least one (x, y) batch")


def check_vector(vec: Vector, params: Sequence[Tensor], field: str) -> None:
    """``vec`` must hold one tensor per parameter tensor, shaped alike (``zip`` would silently truncate)."""
    if [v.shape for v in vec] != [p.shape for p in params]:
        raise FLTuneError(f"{field}: needs one tensor per trainable parameter tensor, with the same shapes")


def hvp(
    model: nn.Module, loss_fn: LossFn, batches: Sequence[Batch], vec: Vector, params: Sequence[Tensor] | None = None,
) -> Vector:
    """H·v, H being the Hessian of the mean over ``batches`` of ``loss_fn`` w.r.t. ``params``. A subset of ``params``
    gives that block of H (e.g. one layer's, MAN Theorem 1)."""
    params = list(trainable_parameters(model).values() if params is None else params)
    check_batches(batches)
    check_vector(vec, params, "vec")
    with eval_mode(model):
        return _mean_hvp(model, loss_fn, batches, params, [v.to(p) for v, p in zip(vec, params)])


def _mean_hvp(
    model: nn.Module, loss_fn: LossFn, batches: Sequence[Batch], params: list[Tensor], vec: Vector
) -> Vector:
    """Σ_b H_b·v / |batches|, accumulated batch by batch (one batch's graph alive at a time)."""
    total = [torch.zeros_like(p) for p in params]
    for batch in batches:
        for acc, part in zip(total, _batch_hvp(model, loss_fn, batch, params, vec)):
            acc.add_(part)
    return [acc / len(batches) for acc in total]


def _batch_hvp(model: nn.Module, loss_fn: LossFn, batch: Batch, params: list[Tensor], vec: Vector) -> Vector:
    """H_b·v = ∇_θ⟨∇_θ L_b, v⟩ by double backward; the graph dies with this frame. Unreached parameters get zero rows; a
    loss linear in every parameter (H = 0, not differentiable twice) is answered directly."""
    loss = loss_fn(model, tuple(t.to(params[0].device) for t in batch))
    grads = torch.autograd.grad(loss, params, create_graph=True, allow_unused=True, materialize_grads=True)
    grad_dot_v = sum((g * v).sum() for g, v in zip(grads, vec))
    if not grad_dot_v.requires_grad:
        return [torch.zeros_like(p) for p in params]
    return list(torch.autograd.grad(grad_dot_v, params, allow_unused=True, materialize_grads=True))


def _dot(a: Vector, b: Vector) -> float:
    return float(sum((x * y).sum() for x, y in zip(a, b)))


def _normalized(v: Vector) -> Vector:
    """v/‖v‖ over all tensors together; a zero vector (H = 0 on the deflated space) stays zero."""
    norm = _dot(v, v) ** 0.5
    return v if norm == 0 else [x / norm for x in v]


def _orthogonalized(v: Vector, basis: list[Vector]) -> Vector:
    """Gram–Schmidt: v minus its components along the orthonormal ``basis`` (deflation)."""
    for b in basis:
        coefficient = _dot(v, b)
        v = [x - coefficient * y for x, y in zip(v, b)]
    return v


def _power_iteration(
    apply_h: Callable[[Vector], Vector], start: Vector, found: list[Vector], max_iter: int, tol: float
) -> tuple[float, Vector]:
    """The eigenpair of largest |λ| of H restricted to the complement of ``found`` (orthonormal). Rayleigh quotient
    vᵀHv, stopped at a relative change < ``tol`` (PyHessian's rule) or ``max_iter``; each iterate is re-orthogonalised
    so round-off cannot bring ``found`` back."""
    v = _normalized(_orthogonalized(start, found))
    eigenvalue = None
    for _ in range(max_iter):
        hv = apply_h(v)
        previous, eigenvalue = eigenvalue, _dot(hv, v)
        if previous is not None and abs(eigenvalue - previous) < tol * abs(previous):
            break
        v = _normalized(_orthogonalized(hv, found))
    return eigenvalue, v


def top_eigenpairs(
    model: nn.Module, loss_fn: LossFn, batches: Sequence[Batch], k: int = 1, max_iter: int = 100, tol: float = 1e-3,
    seed: int = 0,
) -> tuple[list[float], list[Vector]]:
    """The k eigenvalues of H largest in *magnitude*, with unit eigenvectors (λ_max: FedAlign Table 1, MAN Table 2;
    λ1/λ5 and the landscape axes: FedSOL Fig. 8). Power iteration with deflation from seeded normal starts; values keep
    their sign (near a minimum they are positive, MAN Fig. 4b). The error shrinks by |λ_{i+1}/λ_i| per step, so the stop
    can fire early when that is near 1: lower ``tol`` for k > 1 or at indefinite points (e.g. initialisation)."""
    check_batches(batches)
    params = list(trainable_parameters(model).values())
    generator = torch.Generator().manual_seed(seed)
    apply_h = partial(_mean_hvp, model, loss_fn, batches, params)
    values: list[float] = []
    vectors: list[Vector] = []
    with eval_mode(model):
        for _ in range(k):
            start = [torch.randn(p.shape, generator=generator).to(p) for p in params]
            value, vector = _power_iteration(apply_h, start, vectors, max_iter, tol)
            values.append(value)
            vectors.append(vector)
    return values, vectors


MIN_TRACE_SAMPLES = 10
"""Samples Hutchinson draws before its stop rule may fire: a standard error from fewer is itself too noisy."""


class TraceEstimate(NamedTuple):
    """A Hutchinson estimate: the mean of the samples, its standard error, and how many samples it took."""

    value: float
    se: float
    samples: int


def _hutchinson(
    model: nn.Module, loss_fn: LossFn, batches: Sequence[Batch], max_iter: int, tol: float, seed: int, per_tensor: bool,
) -> tuple[Tensor, Tensor, int]:
    """(mean, standard error, n) of Rademacher samples vᵀHv (Hutchinson 1989, FedAlign ref. [7]), float64.
    ``per_tensor`` splits each sample by parameter tensor. Stops after :data:`MIN_TRACE_SAMPLES` once the standard error
    is below ``tol`` × the mean (norms), or at ``max_iter``: unlike a moved-mean rule it cannot fire on one lucky
    sample. Welford's update."""
    check_batches(batches)
    params = list(trainable_parameters(model).values())
    generator = torch.Generator().manual_seed(seed)
    mean = squares = torch.zeros(())
    n = 0
    with eval_mode(model):
        while n < max_iter:
            v = [(torch.randint(0, 2, p.shape, generator=generator) * 2 - 1).to(p) for p in params]  # ±1 each
            hv = _mean_hvp(model, loss_fn, batches, params, v)
            sample = torch.stack([(h * x).sum() for h, x in zip(hv, v)]).detach().double().cpu()
            if not per_tensor:
                sample = sample.sum(0, keepdim=True)
            n += 1
            delta = sample - mean
            mean = mean + delta / n
            squares = squares + delta * (sample - mean)
            if n >= MIN_TRACE_SAMPLES and _standard_error(squares, n).norm() < tol * mean.norm():
                break
    return mean, _standard_error(squares, n), n


def _standard_error(squares: Tensor, n: int) -> Tensor:
    """√(s²/n) from Welford's sum of squared deviations (s² unbiased); 0 for a single sample."""
    return (squares / (n - 1) / n).sqrt() if n > 1 else torch.zeros_like(squares)


def hessian_trace(
    model: nn.Module, loss_fn: LossFn, batches: Sequence[Batch], max_iter: int = 100, tol: float = 1e-2, seed: int = 0,
) -> TraceEstimate:
    """tr H by Hutchinson (H_T: FedAlign Table 1, MAN Table 2) with its standard error; unbiased, per-sample
    variance 2·Σ_{i≠j} H_ij²."""
    mean, se, n = _hutchinson(model, loss_fn, batches, max_iter, tol, seed, False)
    return TraceEstimate(float(mean[0]), float(se[0]), n)


def layer_traces(
    model: nn.Module, loss_fn: LossFn, batches: Sequence[Batch], max_iter: int = 100, tol: float = 1e-2, seed: int = 0,
) -> dict[str, float]:
    """Per parameter tensor, its part of tr H: the d_i the authors feed into FedAlign Eq. 3–4 in place of
    Diag(H) (PyHessian's ``trace()`` ``diag``, ``mmendiet/FedAlign:pyhessian/compute_hessian.py``)."""
    means, _, _ = _hutchinson(model, loss_fn, batches, max_iter, tol, seed, True)
    return dict(zip(trainable_parameters(model), means.tolist()))


def cross_client_consistency(traces: Sequence[dict[str, float]]) -> dict[str, float]:
    """``hessian_hn``, ``hessian_hd``: H_N, H_D of FedAlign Eq. 3–4 from each client's :func:`layer_traces` d_i. H_N = mean over all N² ordered pairs
    of (‖d_i‖ − ‖d_j‖)², H_D of cos(d_i, d_j), both *including* i = j as the authors' ``np.mean`` does
    (``mmendiet/FedAlign:pyhessian/parse_logs.py``). Layers matched by name. Example: d = (3, 0), (0, 4), (6, 0) give
    H_N = 28/9, H_D = 5/9."""
    if len(traces) == 0:
        raise FLTuneError("traces: need the layer traces of at least one client")
    names = list(traces[0])
    if any(set(t) != set(names) for t in traces):
        raise FLTuneError("traces: every client needs the same layer names")
    d = np.array([[t[name] for name in names] for t in traces], dtype=np.float64)
    norms = np.linalg.norm(d, axis=1)
    if np.any(norms == 0):
        raise FLTuneError("traces: a client's layer traces are all zero; its direction is undefined")
    h_n = np.mean((norms[:, None] - norms[None, :]) ** 2)
    unit = d / norms[:, None]
    h_d = np.mean(unit @ unit.T)
    return {"hessian_hn": float(h_n), "hessian_hd": float(h_d)}


# --- the loss landscape along the top-2 eigenvectors, and the spectrum --------------------------------------


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
    """Loss at θ + a·d1 + b·d2 on a ``steps``×``steps`` grid of (a, b) ∈ [−span, span]². Each point is set from a
    saved θ (no drift), restored bit for bit afterwards, even on error."""
    check_batches(batches)
    params = list(trainable_parameters(model).values())
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
                    losses = (float(loss_fn(model, tuple(t.to(params[0].device) for t in batch))) for batch in batches)
                    grid[i, j] = sum(losses) / len(batches)
        finally:
            for p, theta in zip(params, origin):
                p.copy_(theta)
    return alphas, betas, grid


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
        """A PNG with the contour map (left) and 3-D surface (right), its title with λ1, λ2."""
        a, b = np.meshgrid(self.alphas, self.betas, indexing="ij")
        fig = new_figure(figsize=(11, 4.5), layout="constrained")
        contour_ax = fig.add_subplot(1, 2, 1)
        filled = contour_ax.contourf(a, b, self.grid, levels=30, cmap="viridis")
        contour_ax.contour(a, b, self.grid, levels=10, colors="black", linewidths=0.4)
        fig.colorbar(filled, ax=contour_ax, label="loss")
        surface_ax = fig.add_subplot(1, 2, 2, projection="3d")
        surface_ax.plot_surface(a, b, self.grid, cmap="viridis", edgecolor="none")
        surface_ax.set_zlabel("loss")
        for ax in (contour_ax, surface_ax):
            ax.set_xlabel(r"$\epsilon_0$ step")
            ax.set_ylabel(r"$\epsilon_1$ step")
        first, second = self.eigenvalues
        fig.suptitle(f"{title} (λ1 = {first:.4g}, λ2 = {second:.4g})")
        return save_png(fig, path, dpi=120)


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


# --- the curvature probe's work on a worker ------------------------------------------------------------------


T = TypeVar("T")

PROBE_ROUND = -1
"""RNG stream of the probe batches: fixed for the whole run, apart from every training round."""


def probe_batches(data: FederatedData, indices: np.ndarray, hcfg: HessianConfig, seed: int, client: int,
                  device: torch.device) -> list[Batch]:
    """``hcfg.batches`` batches of ``hcfg.batch_size`` drawn once from ``indices`` (no augmentation)."""
    rng = np.random.default_rng(derive_seed(seed, PROBE_ROUND, client))
    take = min(len(indices), hcfg.batches * hcfg.batch_size)
    chosen = torch.tensor(np.sort(rng.choice(indices, size=take, replace=False)), dtype=torch.long)
    return [
        (to_float(data.x[part], data.mean, data.std).to(device), data.y[part].to(device))
        for part in torch.split(chosen, hcfg.batch_size)
    ]


def global_curvature(model: nn.Module, batches: list[Batch], hcfg: HessianConfig, seed: int) -> dict[str, float]:
    """λ1 … λk (by magnitude), λ1/λk and the trace of the global model's training-loss Hessian."""
    values, _ = top_eigenpairs(model, cross_entropy_loss, batches, hcfg.top_k, hcfg.max_iter, hcfg.tol, seed)
    out = {f"hessian_lambda_{i + 1}": v for i, v in enumerate(values)}
    out["hessian_lambda_max"] = values[0]
    if len(values) > 1:
        out[f"hessian_lambda_1_over_{len(values)}"] = values[0] / values[-1] if values[-1] else float("inf")
    trace = hessian_trace(model, cross_entropy_loss, batches, hcfg.max_iter, hcfg.trace_tol, seed)
    out["hessian_trace"], out["hessian_trace_se"] = trace.value, trace.se
    return out


def consistency_batches(data: FederatedData, client: int, shared: list[Batch], hcfg: HessianConfig, seed: int,
                        device: torch.device) -> list[Batch]:
    """The batches client ``client``'s model is probed on for H_N/H_D (``metrics.hessian.probe_data``). ``shared``: the
    global model's batches, the same for every client, as the FedAlign authors' ``pyhessian/compute_hessian.py``
    measures every client model on the full training loader (curvature on common data). ``own``: the client's own
    training data, which adds how the clients' data differ."""
    if hcfg.probe_data == "shared":
        return shared
    return probe_batches(data, data.client_train[client], hcfg, seed, client, device)


def client_traces(model: nn.Module, batches: list[Batch], hcfg: HessianConfig, seed: int) -> dict[str, float]:
    """A local model's per-layer Hessian traces d_i, the input of H_N and H_D (FedAlign Eq. 3–4)."""
    return layer_traces(model, cross_entropy_loss, batches, hcfg.max_iter, hcfg.trace_tol, seed)


def global_landscape(model: nn.Module, batches: list[Batch], hcfg: HessianConfig, seed: int) -> Landscape:
    """The loss along the global model's top-2 eigenvectors (FedAlign Fig. 1), for the end-of-run PNG."""
    return top2_landscape(model, cross_entropy_loss, batches, seed=seed, max_iter=hcfg.max_iter, tol=hcfg.tol)


@dataclass(frozen=True)
class CurvatureTask(Generic[T]):
    """One piece of a Hessian probe (``curvature.HessianProbe``), run on a worker: batches are drawn there from the
    run's data and seed, so only the weights travel."""

    measure: Callable[[nn.Module, list[Batch], HessianConfig, int], T]
    state: State
    client: int | None = None

    def __call__(self, cfg: ExperimentConfig, data: FederatedData, device: torch.device) -> T:
        hcfg, seed = cfg.metrics.hessian, cfg.federation.seed
        model = build_model_for(cfg, data).to(device)
        load_state(model, self.state)
        batches = probe_batches(data, np.concatenate(data.client_train), hcfg, seed, -1, device)
        if self.client is not None:
            batches = consistency_batches(data, self.client, batches, hcfg, seed, device)
        return self.measure(model, batches, hcfg, seed)
