"""Partitions of docs/methods.md §0 on real Fashion-MNIST labels: coverage, determinism, each kind's rule."""

from __future__ import annotations

import re

import numpy as np
import pytest

from fltune.data.partitions import check_held_out, partition, split_train_eval
from fltune.errors import FLTuneError

KINDS = {
    "iid": {},
    "classes": {"classes_per_client": 3},
    "dirichlet_prior": {"alpha": 0.5},
    "dirichlet": {"alpha": 0.5},
    "shards": {"shards_per_client": 2},
    "class_shards": {"shards_per_client": 2},
}
PLACES_EVERY_SAMPLE = {"iid", "dirichlet", "shards", "class_shards"}  # classes/dirichlet_prior drop len % N samples


@pytest.mark.parametrize("kind", KINDS)
def test_every_sample_lands_in_at_most_one_client(kind: str, pooled_labels: np.ndarray) -> None:
    parts = partition(pooled_labels, 10, kind, 100, seed=0, **KINDS[kind])

    everything = np.concatenate(parts)
    assert len(parts) == 100
    assert all(p.dtype == np.int64 and (np.diff(p) > 0).all() for p in parts)  # sorted, no repeats
    assert len(np.unique(everything)) == len(everything)  # no sample in two clients
    expected = len(pooled_labels) if kind in PLACES_EVERY_SAMPLE else 100 * (len(pooled_labels) // 100)
    assert len(everything) == expected


@pytest.mark.parametrize("kind", KINDS)
def test_seed_determines_the_partition(kind: str, fmnist) -> None:
    labels = fmnist.train_y.numpy()
    first, again, other = (partition(labels, 10, kind, 50, seed=s, **KINDS[kind]) for s in (7, 7, 8))

    assert all(np.array_equal(a, b) for a, b in zip(first, again))
    assert not all(np.array_equal(a, b) for a, b in zip(first, other))


def test_classes_gives_client_j_classes_j_to_j_plus_k_in_near_equal_counts(pooled_labels: np.ndarray) -> None:
    """FMNIST pooled, 100 clients × 3 classes: each class is owned by 30 clients who need 7000 = all of it."""
    parts = partition(pooled_labels, 10, "classes", 100, seed=0, classes_per_client=3)

    for j, part in enumerate(parts):
        counts = np.bincount(pooled_labels[part], minlength=10)
        owned = [(j + t) % 10 for t in range(3)]
        assert np.flatnonzero(counts).tolist() == sorted(owned)
        assert len(part) == 700
        assert counts[owned].max() - counts[owned].min() <= 1  # 233/233/234


def test_classes_short_class_is_made_up_from_other_owned_classes() -> None:
    """4 clients × 2 classes, class 0 has 2 samples: clients 0 ({0,1}) and 3 ({3,0}) fill up elsewhere."""
    labels = np.repeat(np.arange(4), [2, 10, 10, 10])  # 32 samples → 8 per client
    parts = partition(labels, 4, "classes", 4, seed=0, classes_per_client=2)

    assert [len(p) for p in parts] == [8, 8, 8, 8]
    for j, part in enumerate(parts):
        assert set(labels[part].tolist()) <= {j, (j + 1) % 4}
    assert sum(int((labels[p] == 0).sum()) for p in parts) == 2


def test_classes_leaves_a_client_short_rather_than_give_it_a_foreign_class() -> None:
    """k = 1: client 0 owns only class 0 (1 sample) and cannot reach 11 // 2 = 5 samples."""
    labels = np.repeat([0, 1], [1, 10])
    parts = partition(labels, 2, "classes", 2, seed=0, classes_per_client=1)

    assert [labels[p].tolist() for p in parts] == [[0], [1] * 5]


def test_classes_sizes_stay_equal_with_unequal_classes() -> None:
    """Skewed classes and 37 clients (C ∤ N): the stealing chains still give every client its size."""
    labels = np.random.default_rng(1).choice(10, 20_000, p=np.r_[0.02, np.full(8, 0.1), 0.18])
    parts = partition(labels, 10, "classes", 37, seed=0, classes_per_client=4)

    assert {len(p) for p in parts} == {20_000 // 37}
    for j, part in enumerate(parts):
        assert set(labels[part].tolist()) <= {(j + t) % 10 for t in range(4)}


def test_dirichlet_prior_equal_sizes_on_the_simfafl_pool(pooled_labels: np.ndarray) -> None:
    parts = partition(pooled_labels, 10, "dirichlet_prior", 100, seed=0, alpha=0.5)

    assert {len(p) for p in parts} == {700}


def test_dirichlet_prior_concentration_follows_alpha(fmnist) -> None:
    """Small δ → clients dominated by one class; huge δ → close to the uniform 10 % per class."""
    labels = fmnist.train_y.numpy()

    def top_class_share(alpha: float) -> float:
        parts = partition(labels, 10, "dirichlet_prior", 50, seed=0, alpha=alpha)
        return float(np.mean([np.bincount(labels[p], minlength=10).max() / len(p) for p in parts]))

    assert top_class_share(0.05) > 0.6
    assert top_class_share(1000.0) < 0.15


def test_dirichlet_respects_min_size_and_sizes_differ(fmnist) -> None:
    parts = partition(fmnist.train_y.numpy(), 10, "dirichlet", 100, seed=0, alpha=0.1, min_size=30)

    sizes = [len(p) for p in parts]
    assert min(sizes) >= 30
    assert max(sizes) > 2 * min(sizes)


def test_shards_give_each_client_s_label_sorted_shards(fmnist) -> None:
    """60 000 samples, 6000 per class → 200 shards of 300, never straddling two classes."""
    labels = fmnist.train_y.numpy()
    parts = partition(labels, 10, "shards", 100, seed=0, shards_per_client=2)

    assert {len(p) for p in parts} == {600}
    assert all(len(np.unique(labels[p])) <= 2 for p in parts)
    assert all(np.bincount(labels[p]).max() % 300 == 0 for p in parts)


def test_class_shards_cut_each_class_alone_as_fedsols_code(fmnist) -> None:
    """Unequal classes (FMNIST's train split subsampled unevenly): every class is cut into s·N/C shards of
    its own, so no client holds more than s classes and sizes follow the classes' sizes."""
    labels = fmnist.train_y.numpy()
    keep = np.flatnonzero((labels != 3) | (np.arange(len(labels)) % 2 == 0))  # class 3 has half the samples
    labels = labels[keep]
    parts = partition(labels, 10, "class_shards", 100, seed=0, shards_per_client=2)
    assert all(1 <= len(np.unique(labels[p])) <= 2 for p in parts)
    for part in parts:  # each class's part is a whole number of that class's shards (20 a class)
        counts = np.bincount(labels[part], minlength=10)
        for c in np.flatnonzero(counts):
            size = (labels == c).sum() // 20
            assert counts[c] in {k * size + extra for k in (1, 2) for extra in range(3)}
    assert len(np.concatenate(parts)) == len(labels)  # every sample placed once
    straddles = partition(labels, 10, "shards", 100, seed=0, shards_per_client=2)
    assert max(len(np.unique(labels[p])) for p in straddles) > 2  # equal-size shards mix classes


def test_class_shards_give_a_client_left_without_shards_the_previous_clients_samples() -> None:
    """9 classes over 20 clients × 2: 9·⌊40/9⌋ = 36 shards, the plan padded to 40 with repeated labels whose
    shards are gone by then, so (as the code does) the last clients copy the previous client's samples."""
    labels = np.repeat(np.arange(9), 40)
    parts = partition(labels, 9, "class_shards", 20, seed=0, shards_per_client=2)
    assert len(parts) == 20 and all(len(p) for p in parts)
    assert np.array_equal(parts[-1], parts[-2]) and np.array_equal(parts[-2], parts[-3])
    assert len(np.unique(np.concatenate(parts))) == len(labels)


def test_split_train_eval_holds_out_a_fraction_of_each_client() -> None:
    parts = [np.arange(0, 700), np.arange(700, 710), np.array([], dtype=np.int64)]
    train, held_out = split_train_eval(parts, 0.3, seed=0)

    assert [len(t) for t in train] == [490, 7, 0]
    for part, t, e in zip(parts, train, held_out):
        assert np.array_equal(np.sort(np.concatenate([t, e])), part)
        assert (np.diff(t) > 0).all() and (np.diff(e) > 0).all()
    again, _ = split_train_eval(parts, 0.3, seed=0)
    assert all(np.array_equal(a, b) for a, b in zip(train, again))
    no_eval_train, no_eval = split_train_eval(parts, 0.0, seed=0)
    assert all(len(e) == 0 for e in no_eval) and all(np.array_equal(a, b) for a, b in zip(no_eval_train, parts))


LABELS = np.repeat(np.arange(10), 10)  # 100 samples


@pytest.mark.parametrize("kind, clients, kwargs, field", [
    ("iid", 0, {}, "federation.clients"),
    ("iid", 101, {}, "federation.clients"),
    ("classes", 10, {"classes_per_client": 0}, "partition.classes_per_client"),
    ("classes", 10, {"classes_per_client": 11}, "partition.classes_per_client"),
    ("classes", 10, {}, "partition.classes_per_client"),
    ("shards", 10, {"shards_per_client": 11}, "partition.shards_per_client"),
    ("shards", 10, {"shards_per_client": 0}, "partition.shards_per_client"),
    ("dirichlet", 10, {"min_size": 11}, "partition.min_size"),
    # 20 clients ≥ 5 fits in 100 samples, but at α = 0.001 each class goes whole to one client: 10 stay empty
    ("dirichlet", 20, {"alpha": 1e-3, "min_size": 5}, "partition.min_size"),
])
def test_bad_inputs_name_the_config_field(kind: str, clients: int, kwargs: dict, field: str) -> None:
    with pytest.raises(FLTuneError, match=field.replace(".", r"\.")) as err:
        partition(LABELS, 10, kind, clients, seed=0, **kwargs)
    assert "\n" not in str(err.value)


def test_check_held_out_names_both_bounds_when_nothing_at_all_is_held_out():
    """Nothing held out anywhere: the bound for one sample of the largest client, and, when sizes differ,
    the one for a sample of every client (what the personalized protocol will ask next)."""
    sizes = [10, 60]
    held, _ = split_train_eval([np.arange(n) for n in sizes], 0.005, seed=0)
    with pytest.raises(FLTuneError, match=re.escape(
            "partition.eval_fraction: 0.005 holds out no sample of any client (the largest has 60); allowed: 0, "
            "or above 0.5/60 = 0.00833; above 0.5/10 = 0.05 for one of every client")):
        check_held_out("partition.eval_fraction", 0.005, [idx[:0] for idx in held], sizes)


def test_check_held_out_refuses_a_client_left_without_only_when_each_client_is_scored():
    sizes = [10, 60]
    train, held = split_train_eval([np.arange(n) for n in sizes], 0.02, seed=0)
    assert [len(h) for h in held] == [0, 1]
    check_held_out("partition.val_fraction", 0.02, held, sizes)  # the union has a sample: fine
    with pytest.raises(FLTuneError, match=re.escape(
            "partition.val_fraction: 0.02 holds out no sample of 1 of 2 clients, and each is scored; "
            "allowed: above 0.5/10 = 0.05 (the smallest client has 10 samples)")):
        check_held_out("partition.val_fraction", 0.02, held, sizes, each_client="each is scored")
    train, held = split_train_eval([np.arange(n) for n in sizes], 0.0501, seed=0)
    assert [len(h) for h in held] == [1, 3]
