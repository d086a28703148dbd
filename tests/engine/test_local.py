"""The client optimiser ``make_optimizer`` builds from the training section: Nesterov SGD when
``training.nesterov`` (FedAlign's every method: ``SGD(..., momentum=0.9, nesterov=True)``,
``mmendiet/FedAlign:methods/fedavg.py``), plain momentum SGD otherwise."""

import pytest
import torch

from fltune.config import build_config
from fltune.engine.local import make_optimizer
from fltune.methods.base import effective_steps


def two_steps(*overrides: str) -> float:
    """w after two steps of d(2w)/dw = 2 from w = 0 at lr 0.1 with the configured optimiser."""
    training = build_config(overrides=["training.momentum=0.9", *overrides]).training
    w = torch.zeros(1, dtype=torch.float64, requires_grad=True)
    optimizer = make_optimizer([w], training, lr=0.1)
    for _ in range(2):
        optimizer.zero_grad()
        (2.0 * w).sum().backward()
        optimizer.step()
    return w.item()


def test_nesterov_setting_reaches_the_optimiser():
    """Heavy ball moves w by lr·g·(1 + 1.9) = 0.58 in two steps; Nesterov by lr·g·(1.9 + 2.71) = 0.922."""
    assert make_optimizer([torch.zeros(1, requires_grad=True)], build_config().training, 0.1).defaults["nesterov"] is False
    assert two_steps() == pytest.approx(-0.1 * 2.0 * 2.9, abs=1e-12)
    assert two_steps("training.nesterov=true") == pytest.approx(-0.1 * 2.0 * 4.61, abs=1e-12)
    assert 4.61 == pytest.approx(effective_steps(2, 0.9, nesterov=True))
