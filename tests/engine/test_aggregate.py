"""The weighted sum must not depend on how clients are grouped across workers (determinism, 1 vs N), and
summing block by block (to bound its float64 temporaries) must give the whole-array formula's bits."""

import math

import numpy as np
import ray

from fltune.engine.aggregate import BLOCK, GRID_BITS, WeightedSum


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


def test_block_by_block_sums_give_the_whole_array_formulas_bits():
    """Over several blocks and a part of one: coarse = round(w·v·2^GRID_BITS) / 2^GRID_BITS, fine = w·v −
    coarse, each summed client after client, and the mean (Σ coarse + Σ fine) / Σ w cast to float32."""
    rng = np.random.default_rng(2)
    shape = (2 * BLOCK + 123, 3)
    updates = [(float(rng.integers(1, 600)),
                {"w": (rng.standard_normal(shape) * 10.0 ** rng.uniform(-6, 1, shape)).astype(np.float32)})
               for _ in range(4)]
    acc = WeightedSum()
    for weight, update in updates:
        acc.add(weight, update)
    scale = 2.0 ** GRID_BITS
    terms = [u["w"].astype(np.float64) * w for w, u in updates]
    coarse = [np.round(t * scale) / scale for t in terms]
    coarse_sum, fine_sum = coarse[0], terms[0] - coarse[0]
    for term, part in zip(terms[1:], coarse[1:]):
        coarse_sum, fine_sum = coarse_sum + part, fine_sum + (term - part)
    mean = ((coarse_sum + fine_sum) / math.fsum(sorted(w for w, _ in updates))).astype(np.float32)
    assert acc.coarse["w"].tobytes() == coarse_sum.tobytes() and acc.fine["w"].tobytes() == fine_sum.tobytes()
    assert acc.mean()["w"].shape == shape and acc.mean()["w"].tobytes() == mean.tobytes()


def test_merging_partials_from_the_object_store_leaves_them_as_they_were(ray_session):
    """Another worker's partial arrives read-only from Ray's object store: a merge adds to a copy of it
    and gives the bits of summing every client in one place."""
    updates = _updates(seed=3)
    parts = [WeightedSum(), WeightedSum()]
    for i, (weight, update) in enumerate(updates):
        parts[i % 2].add(weight, update)
    received = [ray.get(ray.put(part)) for part in parts]
    before = [part.coarse["w"].tobytes() for part in received]
    total = WeightedSum()
    for part in received:
        total.merge(part)
    assert not received[0].coarse["w"].flags.writeable
    assert [part.coarse["w"].tobytes() for part in received] == before
    one = _grouped(updates, [list(range(len(updates)))])
    assert all(total.mean()[key].tobytes() == one[key].tobytes() for key in one)
