"""The weighted sum must not depend on how clients are grouped across workers (determinism, 1 vs N)."""

import numpy as np

from fltune.engine.aggregate import WeightedSum


def _updates(seed: int = 0, clients: int = 7) -> list[tuple[float, dict[str, np.ndarray]]]:
    rng = np.random.default_rng(seed)
    return [
        (float(rng.integers(1, 600)), {
            "w": (rng.standard_normal(4000) * 10.0 ** rng.uniform(-6, 1, 4000)).astype(np.float32),
            "count": np.array(rng.integers(0, 100), dtype=np.int64),
        })
        for _ in range(clients)
    ]


def _grouped(updates, groups: list[list[int]]) -> dict[str, np.ndarray]:
    partials = []
    for group in groups:
        part = WeightedSum()
        for i in group:
            part.add(*updates[i])
        partials.append(part)
    total = partials[0]
    for part in partials[1:]:
        total.merge(part)
    return total.mean()


def test_grouping_and_order_give_identical_bits():
    updates = _updates()
    one = _grouped(updates, [list(range(7))])
    two = _grouped(updates, [[6, 0, 3], [5, 1, 4, 2]])
    three = _grouped(updates, [[2], [4, 0], [6, 5, 3, 1]])
    for key in one:
        assert one[key].tobytes() == two[key].tobytes() == three[key].tobytes()


def test_mean_matches_weighted_average_and_keeps_dtypes():
    updates = _updates(seed=1)
    mean = _grouped(updates, [list(range(7))])
    weights = np.array([w for w, _ in updates])
    expected = sum(w * u["w"].astype(np.float64) for w, u in updates) / weights.sum()
    np.testing.assert_allclose(mean["w"], expected, rtol=1e-6, atol=1e-12)
    assert mean["w"].dtype == np.float32 and mean["count"].dtype == np.int64


def test_equal_weights_of_identical_updates_return_the_update():
    value = {"w": np.linspace(-3, 3, 101, dtype=np.float32)}
    acc = WeightedSum()
    for _ in range(3):
        acc.add(1.0, value)
    assert acc.total_weight == 3.0
    assert np.array_equal(acc.mean()["w"], value["w"])
