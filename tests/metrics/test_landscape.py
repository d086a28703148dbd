"""Loss surface along two directions and the PNGs drawn from it (FedAlign Fig. 1, FedSOL Fig. 8)."""

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import Tensor, nn

from fltune.errors import FLTuneError
from fltune.metrics._hessian import Landscape, cross_entropy_loss, loss_surface, plot_spectrum, top2_landscape

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Iterator[None]:
    """One torch thread, as in test_hessian.py: tiny tensors on shared cores crawl at OpenMP barriers."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class Bowl(nn.Module):
    """θ ∈ R², θ = (0.5, −1) at start."""

    def __init__(self) -> None:
        super().__init__()
        self.theta = nn.Parameter(torch.tensor([0.5, -1.0], dtype=torch.float64))


def bowl_loss(model: nn.Module, _batch: object) -> Tensor:
    """θ0² + 3·θ1², so along e0, e1 the surface is (0.5 + a)² + 3·(b − 1)²."""
    return model.theta[0] ** 2 + 3 * model.theta[1] ** 2


NO_DATA = [(torch.zeros(1), torch.zeros(1))]
E0, E1 = [torch.tensor([1.0, 0.0])], [torch.tensor([0.0, 1.0])]


def tiny_classifier() -> tuple[nn.Module, list[tuple[Tensor, Tensor]]]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Dropout(0.3), nn.Linear(8, 3))
    generator = torch.Generator().manual_seed(1)
    batches = [(torch.randn(10, 4, generator=generator), torch.randint(0, 3, (10,), generator=generator))
               for _ in range(2)]
    return model, batches


def test_grid_axes_and_values_match_the_closed_form() -> None:
    """grid[i, j] is the loss at (alphas[i], betas[j]); the axes span ±span with 0 exactly in the middle."""
    alphas, betas, grid = loss_surface(Bowl(), bowl_loss, NO_DATA, (E0, E1), span=2.0, steps=5)
    np.testing.assert_array_equal(alphas, [-2.0, -1.0, 0.0, 1.0, 2.0])
    np.testing.assert_array_equal(betas, alphas)
    a, b = np.meshgrid(alphas, betas, indexing="ij")
    np.testing.assert_allclose(grid, (0.5 + a) ** 2 + 3 * (b - 1) ** 2, rtol=1e-12)


def test_centre_is_the_plain_eval_loss_and_model_is_restored() -> None:
    model, batches = tiny_classifier()
    model.train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    directions = tuple([torch.randn_like(p) for p in model.parameters()] for _ in range(2))
    alphas, betas, grid = loss_surface(model, cross_entropy_loss, batches, directions, span=0.5, steps=7)
    assert grid.shape == (7, 7) and len(alphas) == len(betas) == 7
    assert model.training and model[2].training
    assert all(torch.equal(model.state_dict()[k], v) for k, v in before.items())
    model.eval()
    with torch.no_grad():
        plain = sum(float(cross_entropy_loss(model, batch)) for batch in batches) / len(batches)
    assert grid[3, 3] == pytest.approx(plain, rel=1e-12)
    assert not np.allclose(grid, plain)


def test_parameters_restored_when_the_loss_fails_midway() -> None:
    model = Bowl()
    calls = 0

    def failing(m: nn.Module, batch: object) -> Tensor:
        nonlocal calls
        calls += 1
        if calls == 4:
            raise RuntimeError("boom")
        return bowl_loss(m, batch)

    with pytest.raises(RuntimeError, match="boom"):
        loss_surface(model, failing, NO_DATA, (E0, E1), steps=3)
    assert model.theta.tolist() == [0.5, -1.0]


def test_bad_grid_or_directions_are_refused() -> None:
    with pytest.raises(FLTuneError, match="steps"):
        loss_surface(Bowl(), bowl_loss, NO_DATA, (E0, E1), steps=1)
    with pytest.raises(FLTuneError, match="directions"):
        loss_surface(Bowl(), bowl_loss, NO_DATA, (E0, [torch.ones(3)]))


def assert_png(path: Path) -> None:
    assert path.stat().st_size > 1000
    assert path.read_bytes()[:8] == PNG_MAGIC


def test_the_top2_landscape_png_is_written(tmp_path: Path) -> None:
    model, batches = tiny_classifier()
    path = top2_landscape(model, cross_entropy_loss, batches, steps=5).png(tmp_path / "plots" / "landscape.png", "l")
    assert path == tmp_path / "plots" / "landscape.png"
    assert_png(path)


def test_plots_from_given_values(tmp_path: Path) -> None:
    axis = np.linspace(-1, 1, 9)
    a, b = np.meshgrid(axis, axis, indexing="ij")
    assert_png(Landscape((2.0, 4.0), axis, axis, a**2 + 2 * b**2).png(tmp_path / "bowl.png", "bowl"))
    assert_png(plot_spectrum([5.0, 3.0, -1.0, 0.8, 0.5, 0.2], tmp_path / "spectrum.png", "spectrum"))
    with pytest.raises(FLTuneError, match="eigenvalues"):
        plot_spectrum([], tmp_path / "empty.png", "empty")
