"""What each method declares for the cost metrics (FedAlign Table 5): models held, passes per step."""

from __future__ import annotations

import pytest

from fltune.methods import METHODS, get_method
from fltune.methods.base import Method


@pytest.mark.parametrize("name, stored, passes", [
    ("fedavg", 1, 1), ("fedprox", 2, 1), ("moon", 3, 5 / 3), ("ditto", 2, 2), ("scaffold", 3, 1),
    ("feddyn", 3, 1), ("feddc", 4, 1), ("fedsam", 2, 2), ("fedasam", 2, 2), ("fedspeed", 4, 2),
    ("fedsol", 3, 2), ("fedntd", 2, 4 / 3), ("fedalign", 1, 1), ("fedsam+man", 2, 2), ("proximal", 2, 2),
])
def test_models_held_and_passes_per_step(name: str, stored: float, passes: float) -> None:
    method = get_method(name)
    instance = method(method.Params())
    assert (instance.stored_models, instance.passes_per_step) == pytest.approx((stored, passes))


def test_gradaug_passes_grow_with_its_subnetworks() -> None:
    method = get_method("gradaug")
    assert method(method.Params(n=3)).passes_per_step == 4.0


@pytest.mark.parametrize("name", sorted(METHODS))
def test_every_method_declares_its_cost(name: str) -> None:
    """``Method`` has no default (issue 11 item 8; optional since issue 77): every built-in declares both."""
    instance = get_method(name)(get_method(name).Params())
    assert instance.stored_models >= 1 and instance.passes_per_step >= 1
    assert not hasattr(Method, "stored_models") and not hasattr(Method, "passes_per_step")
