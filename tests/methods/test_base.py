"""``effective_steps``: how far K momentum-SGD steps carry a constant gradient, the divisor of FedNova's a_k
and SCAFFOLD/FedDC's c_k⁺ (the FedSOL authors' ``Lee-Gihun/FedSOL:algorithms/scaffold/ClientTrainer.py``,
``__get_divisor``: new_K = (K − ρ(1 − ρ^K)/(1 − ρ))/(1 − ρ))."""

import pytest
import torch

from fltune.methods.base import effective_steps


@pytest.mark.parametrize(("steps", "momentum", "expected"),
                         [(5, 0.0, 5.0), (50, 0.0, 50.0), (1, 0.9, 1.0), (2, 0.5, 2.5)])
def test_by_hand(steps, momentum, expected):
    """ρ = 0.5, K = 2: g_1 moves w in steps 1 and 2 (1 + ρ), g_2 in step 2 (1): 2.5. ρ = 0 gives K."""
    assert effective_steps(steps, momentum) == pytest.approx(expected)


def test_fedsol_divisor_at_k50_rho09():
    """The issue's figure: K = 50, ρ = 0.9 → (50 − 0.9·(1 − 0.9^50)/0.1)/0.1 ≈ 410.46, not 50."""
    assert effective_steps(50, 0.9) == pytest.approx((50 - 0.9 * (1 - 0.9**50) / 0.1) / 0.1)
    assert effective_steps(50, 0.9) == pytest.approx(410.46, abs=0.01)


@pytest.mark.parametrize("nesterov", [False, True])
@pytest.mark.parametrize(("steps", "momentum"), [(7, 0.9), (50, 0.9), (3, 0.5)])
def test_matches_torch_sgd(steps, momentum, nesterov):
    """With a constant gradient g, K steps of torch's (Nesterov) momentum SGD move w by lr·K_eff·g."""
    w = torch.zeros(1, dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.SGD([w], lr=0.1, momentum=momentum, nesterov=nesterov)
    for _ in range(steps):
        optimizer.zero_grad()
        (2.0 * w).sum().backward()
        optimizer.step()
    assert -w.item() / (0.1 * 2.0) == pytest.approx(effective_steps(steps, momentum, nesterov), rel=1e-9)
