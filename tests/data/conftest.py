"""Shared fixtures: the real Fashion-MNIST from Debian's dataset-fashion-mnist; the damaged-file check."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fltune.data.datasets import Dataset, load_dataset
from fltune.data.torchvision_sets import DEBIAN_FMNIST
from fltune.errors import DatasetCorrupt


def corrupt_line(name: str, root: Path, damaged: Path, says: str) -> str:
    """Loading ``name`` from ``root`` fails with one DatasetCorrupt line naming ``damaged`` and saying ``says``
    and how to get a good copy; returns the line."""
    with pytest.raises(DatasetCorrupt) as err:
        load_dataset(name, root=root)
    message = str(err.value)
    assert message.startswith(f"data.root: {damaged} ") and says in message and "\n" not in message
    assert "data.download=true" in message
    return message


@pytest.fixture(scope="session")
def fmnist() -> Dataset:
    if not (DEBIAN_FMNIST / "train-labels-idx1-ubyte.gz").is_file():
        pytest.skip(f"real Fashion-MNIST is not in {DEBIAN_FMNIST} (apt-get install dataset-fashion-mnist)")
    return load_dataset("fmnist")


@pytest.fixture(scope="session")
def pooled_labels(fmnist: Dataset) -> np.ndarray:
    """FMNIST train+test labels (70 000), the pool of SimFAFL's partitions."""
    return np.concatenate([fmnist.train_y.numpy(), fmnist.test_y.numpy()])

