"""fltune/engine/builders.py: what the data built from a config must serve before Ray starts."""

from __future__ import annotations

import pytest
import torch

from fltune.cli import main
from fltune.config import build_config
from fltune.data.datasets import load_dataset
from fltune.engine.builders import load_data
from fltune.errors import FLTuneError

SMALL = ["data.dataset=synthetic", "partition.kind=iid", "federation.clients=10", "tracking.enabled=false"]


def test_drop_last_refuses_a_client_smaller_than_a_batch_and_names_it() -> None:
    data = load_data(build_config(overrides=SMALL))
    n = min(len(train) for train in data.client_train)
    assert load_data(build_config(overrides=[*SMALL, "training.drop_last=true", f"training.batch_size={n}"]))
    with pytest.raises(FLTuneError, match=rf"^training.drop_last: client \d+ has {n} training samples, fewer than "
                                          rf"training.batch_size {n + 1}, so it would train no step; allowed: "
                                          rf"training.batch_size ≤ {n}"):
        load_data(build_config(overrides=[*SMALL, "training.drop_last=true", f"training.batch_size={n + 1}"]))


def test_a_run_so_refused_is_one_line_before_ray(capsys) -> None:
    args = ["run", *[a for o in SMALL for a in ("--set", o)], "--set", "training.drop_last=true", "--set",
            "training.batch_size=100000"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fltune: training.drop_last: client "), err


def test_normalise_sets_the_inputs_mean_and_std_the_batches_use() -> None:
    """``data.normalise``: the dataset's constants, the whole train split's own (FedCR's EMNIST; before
    ``subsample``, so the statistics do not depend on the quick scale), or 0.5/0.5 (FedCR's FMNIST)."""
    tiny = ["data.dataset=fmnist", "data.subsample=0.02", "partition.kind=iid", "federation.clients=4"]
    assert (load_data(build_config(overrides=tiny)).mean, load_data(build_config(overrides=tiny)).std) == (
        (0.2860,), (0.3530,))
    half = load_data(build_config(overrides=[*tiny, "data.normalise=half"]))
    assert (half.mean, half.std) == ((0.5,), (0.5,))
    own = load_data(build_config(overrides=[*tiny, "data.normalise=train"]))
    pixels = load_dataset("fmnist").train_x.double().div(255)
    assert own.mean[0] == pytest.approx(pixels.mean().item(), abs=1e-6) and own.mean[0] != 0.2860
    assert own.std[0] == pytest.approx(pixels.std().item(), abs=1e-6)
    assert torch.equal(own.x, half.x)  # the images are the same uint8: only their normalisation differs
