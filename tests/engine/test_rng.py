"""Client sampling and per-client seeds depend only on (seed, round, client id)."""

from fltune.engine.rng import derive_seed, sample_clients


def test_sampling_is_a_function_of_seed_and_round():
    first = sample_clients(0, 3, 100, 10)
    assert first == sample_clients(0, 3, 100, 10)
    assert len(set(first)) == 10 and all(0 <= c < 100 for c in first)
    assert first != sample_clients(0, 4, 100, 10)
    assert first != sample_clients(1, 3, 100, 10)


def test_client_seeds_are_distinct_streams():
    seeds = {derive_seed(0, r, c) for r in range(-1, 5) for c in range(-1, 50)}
    assert len(seeds) == 6 * 51
    assert derive_seed(7, 2, 3) == derive_seed(7, 2, 3)
