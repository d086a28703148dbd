"""Shared fixtures: the real Fashion-MNIST from Debian's dataset-fashion-mnist."""

from __future__ import annotations

import numpy as np
import pytest

from fltune.data.datasets import DEBIAN_FMNIST, Dataset, load_dataset


@pytest.fixture(scope="session")
def fmnist() -> Dataset:
    if not (DEBIAN_FMNIST / "train-labels-idx1-ubyte.gz").is_file():
        pytest.skip(f"real Fashion-MNIST is not in {DEBIAN_FMNIST} (apt-get install dataset-fashion-mnist)")
    return load_dataset("fmnist")


@pytest.fixture(scope="session")
def pooled_labels(fmnist: Dataset) -> np.ndarray:
    """FMNIST train+test labels (70 000), the pool of SimFAFL's partitions."""
    return np.concatenate([fmnist.train_y.numpy(), fmnist.test_y.numpy()])

