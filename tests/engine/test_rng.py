"""Client sampling and per-client seeds depend only on (seed, round, client id)."""

import numpy as np

from fltune.config import FederationConfig
from fltune.engine.rng import derive_seed, round_clients


def test_sampling_is_a_function_of_seed_and_round():
    fed = FederationConfig(clients=100, fraction=0.1, seed=0)
    first = round_clients(fed, 3)
    assert first == round_clients(fed, 3)
    assert len(set(first)) == 10 and all(0 <= c < 100 for c in first)
    assert first != round_clients(fed, 4)
    assert first != round_clients(fed.model_copy(update={"seed": 1}), 3)


def test_client_seeds_are_distinct_streams():
    seeds = {derive_seed(0, r, c) for r in range(-1, 5) for c in range(-1, 50)}
    assert len(seeds) == 6 * 51
    assert derive_seed(7, 2, 3) == derive_seed(7, 2, 3)


def test_bernoulli_sampling_takes_each_client_with_the_fraction_and_never_nobody():
    """MAN's (FedDyn's) protocol: each client on its own with probability p, a function of (seed, round); the
    count varies around N·p (10 ± 3 for 100 × 0.1); a round that drew nobody draws again."""
    fed = FederationConfig(clients=100, fraction=0.1, sampling="bernoulli", seed=0)
    rounds = [round_clients(fed, r) for r in range(1, 401)]
    assert rounds[2] == round_clients(fed, 3) != round_clients(fed.model_copy(update={"seed": 1}), 3)
    counts = np.array([len(c) for c in rounds])
    assert len(set(counts)) > 5 and abs(counts.mean() - 10) < 0.6 and 2 < counts.std() < 4
    shares = np.bincount(np.concatenate(rounds), minlength=100) / len(rounds)
    assert abs(shares.mean() - 0.1) < 0.01
    rare = FederationConfig(clients=3, fraction=0.01, sampling="bernoulli")
    assert all(round_clients(rare, r) for r in range(1, 50))
