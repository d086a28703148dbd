"""A job's data, checked before it starts Ray."""

from __future__ import annotations

import pytest

from fltune.config import build_config
from fltune.errors import FLTuneError
from fltune.preflight import check_data, split_setting


def test_a_jobs_data_are_checked_as_its_trials_would_check_them_before_ray_starts():
    """``check_data`` partitions each distinct setting of a job's trials and asks the probes each turns on:
    a split that the personalized protocol can't score (some client holds out nothing) is one line here,
    where every trial used to fail with Tune's traceback, retried."""
    from tests.metrics.test_evaluation import SKEWED

    scored_globally = build_config(overrides=[*SKEWED, "partition.eval_fraction=0.015", "metrics.protocols=[global]"])
    scored_per_client = build_config(overrides=[*SKEWED, "partition.eval_fraction=0.015"])
    check_data([scored_globally])
    with pytest.raises(FLTuneError, match=r"^partition\.eval_fraction: 0\.015 holds out no sample of \d of 10 "
                                          r"clients, and the personalized protocol scores every client"):
        check_data([scored_globally, scored_per_client])


def test_runs_that_differ_only_in_method_or_training_share_one_data_check():
    fedavg = build_config(overrides=["method.name=fedavg"])
    assert split_setting(fedavg) == split_setting(build_config(overrides=["method.name=fedprox", "training.lr=0.1"]))
    assert split_setting(fedavg) != split_setting(build_config(overrides=["federation.seed=1"]))
