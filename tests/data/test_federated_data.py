"""FederatedData: pooling protocol, no train/test leakage, on-disk partition cache."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from fltune.data import federated
from fltune.data.federated import build_federated_data
from fltune.data.partitions import aligned_test_split
from fltune.errors import FLTuneError

SIMFAFL = {"kind": "dirichlet_prior", "num_clients": 100, "seed": 0, "alpha": 0.5, "eval_fraction": 0.3,
           "pool_test": True}


def test_pooled_protocol_tests_on_the_union_of_held_out_splits(fmnist, tmp_path: Path) -> None:
    data = build_federated_data(fmnist, **SIMFAFL, cache_dir=tmp_path)

    assert len(data.x) == 70000 and data.input_shape == (1, 28, 28) and data.num_clients == 100
    assert {len(t) for t in data.client_train} == {490} and {len(e) for e in data.client_eval} == {210}
    train, held_out = np.concatenate(data.client_train), np.concatenate(data.client_eval)
    assert len(np.intersect1d(train, held_out)) == 0  # nothing tested is trained on
    assert torch.equal(data.test_y, data.y[np.sort(held_out)]) and len(data.test_x) == 21000


def test_unpooled_protocol_tests_on_the_dataset_test_split(fmnist, tmp_path: Path) -> None:
    data = build_federated_data(fmnist, kind="iid", num_clients=10, seed=0, cache_dir=tmp_path)

    assert data.x is fmnist.train_x and data.test_x is fmnist.test_x
    assert all(len(e) == 0 for e in data.client_eval)
    assert sum(len(t) for t in data.client_train) == 60000


def test_pooling_needs_a_held_out_fraction(fmnist, tmp_path: Path) -> None:
    with pytest.raises(FLTuneError, match=r"partition\.eval_fraction"):
        build_federated_data(fmnist, kind="iid", num_clients=10, seed=0, pool_test=True, cache_dir=tmp_path)


def test_classes_default_to_the_papers_k(fmnist, tmp_path: Path) -> None:
    data = build_federated_data(fmnist, kind="classes", num_clients=20, seed=0, cache_dir=tmp_path)

    assert {len(np.unique(data.y[t].numpy())) for t in data.client_train} == {3}  # FMNIST: k = 3


def test_second_build_reads_the_cache(fmnist, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = build_federated_data(fmnist, **SIMFAFL, cache_dir=tmp_path)
    files = list(tmp_path.iterdir())
    monkeypatch.setattr(federated, "partition", lambda *a, **k: pytest.fail("cache miss"))
    second = build_federated_data(fmnist, **SIMFAFL, cache_dir=tmp_path)

    assert len(files) == 1 and files[0].suffix == ".npz" and list(tmp_path.iterdir()) == files
    for a, b in zip(first.client_train + first.client_eval, second.client_train + second.client_eval):
        assert np.array_equal(a, b)


@pytest.mark.parametrize("change", [{"seed": 1}, {"alpha": 0.3}, {"num_clients": 50}, {"eval_fraction": 0.2},
                                    {"kind": "iid"}, {"pool_test": False}])
def test_any_changed_parameter_gets_its_own_file(fmnist, tmp_path: Path, change: dict) -> None:
    build_federated_data(fmnist, **SIMFAFL, cache_dir=tmp_path)
    build_federated_data(fmnist, **{**SIMFAFL, **change}, cache_dir=tmp_path)

    assert len(list(tmp_path.glob("*.npz"))) == 2


def test_concurrent_builds_agree_and_leave_no_temporary_files(fmnist, tmp_path: Path) -> None:
    results = [None] * 4

    def build(i: int) -> None:
        results[i] = build_federated_data(fmnist, **SIMFAFL, cache_dir=tmp_path).client_train

    threads = [threading.Thread(target=build, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    assert [p.suffix for p in tmp_path.iterdir()] == [".npz"]
    assert all(all(np.array_equal(a, b) for a, b in zip(results[0], r)) for r in results[1:])


@pytest.mark.parametrize("damage", ["truncated", "not_npz", "empty", "sizes_disagree"])
def test_a_damaged_cache_file_is_rebuilt(fmnist, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         damage: str) -> None:
    first = build_federated_data(fmnist, **SIMFAFL, cache_dir=tmp_path)
    [path] = tmp_path.iterdir()
    good = path.read_bytes()
    if damage == "sizes_disagree":  # parses as an .npz, but its arrays no longer fit together
        with np.load(path) as stored:
            arrays = dict(stored)
        arrays["train_sizes"] = arrays["train_sizes"] + 1
        np.savez(path, **arrays)
    else:
        path.write_bytes({"truncated": good[: len(good) // 2], "not_npz": b"<html>", "empty": b""}[damage])
    second = build_federated_data(fmnist, **SIMFAFL, cache_dir=tmp_path)
    monkeypatch.setattr(federated, "partition", lambda *a, **k: pytest.fail("the rebuilt file was not kept"))
    third = build_federated_data(fmnist, **SIMFAFL, cache_dir=tmp_path)

    assert list(tmp_path.iterdir()) == [path]
    for again in (second, third):
        assert all(np.array_equal(a, b) for a, b in zip(first.client_train, again.client_train))


def test_a_directory_in_the_cache_files_place_is_one_line(fmnist, tmp_path: Path) -> None:
    build_federated_data(fmnist, **SIMFAFL, cache_dir=tmp_path)
    [path] = tmp_path.iterdir()
    path.unlink()
    path.mkdir()
    with pytest.raises(FLTuneError, match=r"^partition\.cache_dir: cannot write .*npz \(Is a directory\)"):
        build_federated_data(fmnist, **SIMFAFL, cache_dir=tmp_path)


def test_validation_split_comes_out_of_training_and_leaves_the_rest_as_it_was(fmnist, tmp_path: Path) -> None:
    plain = build_federated_data(fmnist, **SIMFAFL, cache_dir=tmp_path)
    cached = sorted(p.read_bytes() for p in tmp_path.iterdir())
    data = build_federated_data(fmnist, **SIMFAFL, val_fraction=0.2, cache_dir=tmp_path)

    assert sorted(p.read_bytes() for p in tmp_path.iterdir()) == cached  # the same cache file, untouched
    for train, val, before, held_before, held in zip(data.client_train, data.client_val, plain.client_train,
                                                     plain.client_eval, data.client_eval):
        assert len(val) == 98 and len(np.intersect1d(train, val)) == 0  # 20 % of each client's 490
        assert np.array_equal(np.sort(np.concatenate([train, val])), before)  # carved from its training data
        assert np.array_equal(held, held_before)  # the held-out (test) split does not move
    assert all(len(v) == 0 for v in plain.client_val)
    x, y = data.split("val")
    assert len(y) == 9800 and torch.equal(y, data.y[np.sort(np.concatenate(data.client_val))])


def test_a_run_without_test_data_holds_none(fmnist, tmp_path: Path) -> None:
    data = build_federated_data(fmnist, **SIMFAFL, val_fraction=0.1, cache_dir=tmp_path).without_test()
    assert len(data.test_x) == len(data.test_y) == 0 and all(len(e) == 0 for e in data.client_eval)
    assert all(len(v) == 49 for v in data.client_val)  # 10 % of each client's 490


@pytest.mark.parametrize("field", ["eval_fraction", "val_fraction"])
def test_a_fraction_that_holds_out_nothing_at_all_is_refused_with_the_smallest_that_would(
        fmnist, tmp_path: Path, field: str) -> None:
    """Each client holds out round(f·n) of its n samples: a fraction > 0 too small for that to reach one
    anywhere gives a split with nothing in it, which every figure it exists for would then fail to read."""
    sizes = {"eval_fraction": 700, "val_fraction": 490}[field]  # what each SimFAFL client splits (70/30)
    with pytest.raises(FLTuneError, match=rf"^partition\.{field}: 0\.0005 holds out no sample of any client "
                                          rf"\(the largest has {sizes}\); allowed: 0, or above 0\.5/{sizes} = "):
        build_federated_data(fmnist, **{**SIMFAFL, field: 0.0005}, cache_dir=tmp_path)
    data = build_federated_data(fmnist, **{**SIMFAFL, field: 0.5 / sizes + 1e-6}, cache_dir=tmp_path)
    assert all(len(idx) == 1 for idx in data.held_out({"eval_fraction": "test", "val_fraction": "val"}[field])[0])


def test_held_out_names_each_clients_split_and_what_it_was_drawn_from(fmnist, tmp_path: Path) -> None:
    data = build_federated_data(fmnist, **SIMFAFL, val_fraction=0.2, cache_dir=tmp_path)
    held, drawn_from = data.held_out("test")
    assert held is data.client_eval and drawn_from == [700] * 100
    held, drawn_from = data.held_out("val")
    assert held is data.client_val and drawn_from == [490] * 100


def test_the_object_store_shares_one_copy_of_the_pool(fmnist, tmp_path: Path, ray_session) -> None:
    """Workers read the pool in place from Ray's object store (no private copy per process), and get the
    same tensors the driver put."""
    import ray

    data = build_federated_data(fmnist, kind="iid", num_clients=10, seed=0, cache_dir=tmp_path)
    ref = ray.put(data)
    first, second = ray.get(ref), ray.get(ref)

    assert first.x.data_ptr() == second.x.data_ptr() != data.x.data_ptr()  # both views of the stored copy
    for name in ("x", "y", "test_x", "test_y"):
        assert torch.equal(getattr(first, name), getattr(data, name))
        assert getattr(first, name).dtype == getattr(data, name).dtype
    assert all(np.array_equal(a, b) for a, b in zip(first.client_train, data.client_train))


def test_a_client_left_without_training_samples_is_refused_by_the_data() -> None:
    """60 samples over 50 clients (1 or 2 each), 60 % of each held out for validation: a client of one
    sample keeps none to train on. The data refuse it, so a job's driver does too, before any trial."""
    from fltune.config import build_config
    from fltune.engine.builders import load_data

    cfg = build_config(overrides=["data.dataset=synthetic", "data.subsample=0.01", "federation.clients=50",
                                  "partition.kind=iid", "partition.val_fraction=0.6"])
    with pytest.raises(FLTuneError, match=r"^federation\.clients: 40 of 50 clients got no training samples; "
                                          r"allowed: fewer clients or a less skewed partition$"):
        load_data(cfg)


def test_fedsols_aligned_test_split_follows_each_clients_labels(fmnist, tmp_path: Path) -> None:
    """FedSOL's test_align: int(1000·p_c) test samples of each class c per client (float32, as the code's
    tensors), drawn from the dataset's test split, which joins the pool after the training samples."""
    data = build_federated_data(fmnist, kind="dirichlet", alpha=0.1, num_clients=20, seed=0, test_per_client=1000,
                                cache_dir=tmp_path)

    assert len(data.x) == 70000 and torch.equal(data.x[60000:], fmnist.test_x) and data.test_x is fmnist.test_x
    for train, held_out in zip(data.client_train, data.client_eval, strict=True):
        assert held_out.min() >= 60000 and len(np.unique(held_out)) == len(held_out)
        shares = np.bincount(data.y[train].numpy(), minlength=10).astype(np.float32) / np.float32(len(train))
        expected = [min(1000, int(np.float32(1000) * p)) for p in shares]  # FMNIST's test split: 1000 per class
        assert np.bincount(data.y[held_out].numpy(), minlength=10).tolist() == expected
    assert len({tuple(e[:5]) for e in data.client_eval}) > 1  # each client draws its own
    again = build_federated_data(fmnist, kind="dirichlet", alpha=0.1, num_clients=20, seed=0, test_per_client=1000,
                                 cache_dir=tmp_path)
    assert all(np.array_equal(a, b) for a, b in zip(data.client_eval, again.client_eval, strict=True))
    assert all(np.array_equal(a, b) for a, b in zip(data.client_train, build_federated_data(
        fmnist, kind="dirichlet", alpha=0.1, num_clients=20, seed=0, cache_dir=tmp_path).client_train, strict=True))


def test_float32_shares_give_the_codes_counts() -> None:
    """A share of 251/1000 of 1000 is 251 in float64 but 250 in float32, the code's torch arithmetic."""
    labels = np.array([0] * 251 + [1] * 749)
    picked = aligned_test_split([labels], np.repeat([0, 1], 800), 2, 1000, seed=0)[0]
    assert np.bincount(np.repeat([0, 1], 800)[picked]).tolist() == [250, 749]
