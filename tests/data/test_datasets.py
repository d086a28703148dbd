"""The dataset registry (data/datasets.py): unknown names, synthetic data, subsampling."""

from __future__ import annotations


import numpy as np
import pytest
import torch

from fltune.data import datasets
from fltune.data.datasets import DATASETS, NUM_CLASSES, load_dataset
from fltune.errors import FLTuneError

def test_unknown_dataset_lists_the_allowed_ones() -> None:
    with pytest.raises(FLTuneError, match=r"data\.dataset: unknown dataset 'coco'; allowed: fmnist, mnist"):
        load_dataset("coco")
    with pytest.raises(FLTuneError, match=r"data\.dataset: unknown dataset 'imagenet'; did you mean tinyimagenet\?"):
        load_dataset("imagenet")
    assert set(NUM_CLASSES) == set(DATASETS)


def test_synthetic_is_deterministic_balanced_and_learnable(tmp_path) -> None:
    ds = load_dataset("synthetic")
    regenerated = load_dataset("synthetic", root=tmp_path)  # another root: regenerated, not the cached one

    assert regenerated is not ds
    assert torch.equal(regenerated.train_x, ds.train_x) and torch.equal(regenerated.test_y, ds.test_y)
    assert ds.train_x.shape == (6000, 1, 28, 28) and ds.test_x.shape == (1000, 1, 28, 28)
    assert torch.bincount(ds.train_y).tolist() == [600] * 10
    # nearest class mean of the train split classifies the test split
    means = torch.stack([ds.train_x[ds.train_y == c].float().mean(0) for c in range(10)]).flatten(1)
    predicted = torch.cdist(ds.test_x.float().flatten(1), means).argmin(1)
    assert (predicted == ds.test_y).float().mean() > 0.9


def test_subsample_is_seeded_stratified_and_identity_at_one() -> None:
    ds = load_dataset("synthetic")
    assert datasets.subsample(ds, 1.0, seed=0) is ds
    small = datasets.subsample(ds, 0.2, seed=0)
    for full_y, part_y in ((ds.train_y, small.train_y), (ds.test_y, small.test_y)):
        full, part = np.bincount(full_y.numpy()), np.bincount(part_y.numpy())
        assert np.array_equal(part, np.round(0.2 * full).astype(int))  # every class shrunk alike
    again, other = datasets.subsample(ds, 0.2, seed=0), datasets.subsample(ds, 0.2, seed=1)
    assert torch.equal(again.train_x, small.train_x) and not torch.equal(other.train_x, small.train_x)
    assert small.mean == ds.mean and small.train_x.shape[1:] == ds.train_x.shape[1:]
