"""The job's frozen spec: the order its trials start in (longest first), kept for --resume."""

from __future__ import annotations

from pathlib import Path

from fltune.estimate import work
from fltune.reproduce.job import ReproSpec, new_spec
from fltune.reproduce.plan import plan
from fltune.reproduce.registry import get_table
from tests.conftest import needs_fmnist


def spec_at(scale: str, tmp_path: Path) -> ReproSpec:
    """Table 2's FedAvg and SimFAFL rows on FMNIST (4 trials): SimFAFL's VIB CNN costs about twice the
    FedAvg CNN a sample, at the same client-samples."""
    table = get_table("table2")
    planned = plan(table, scale, ["fmnist"], [], rows=["FedAvg", "SimFAFL"])
    return new_spec(table, scale, planned, seeds=1, storage=str(tmp_path / "jobs"), name=f"order-{scale}",
                    out=str(tmp_path / "out"), max_concurrent=None)


@needs_fmnist
def test_paper_scale_trials_start_longest_estimated_first_and_the_order_survives_a_resume(tmp_path: Path) -> None:
    spec = spec_at("paper", tmp_path)
    assert list(spec.trials) == ["FedAvg | FMNIST non-IID1", "FedAvg | FMNIST non-IID2",
                                 "SimFAFL | FMNIST non-IID1", "SimFAFL | FMNIST non-IID2"]
    seconds = [work(t, spec.cells[t].tree, 1).seconds for t in spec.trial_order]
    assert seconds == sorted(seconds, reverse=True)
    assert spec.trial_order[:2] == ["SimFAFL | FMNIST non-IID1", "SimFAFL | FMNIST non-IID2"]
    assert list(spec.trial_seconds) == list(spec.trials)  # the ETA's weights, every trial's
    assert [spec.trial_seconds[t] for t in spec.trial_order] == seconds  # calibrations are cached: equal
    spec.save()
    saved = ReproSpec.load(spec.path)
    assert (saved.trial_order, saved.trial_seconds) == (spec.trial_order, spec.trial_seconds)


@needs_fmnist
def test_quick_scale_trials_are_weighed_by_one_calibration_per_model(tmp_path: Path) -> None:
    """Quick scale: the same order and ETA weights, each model timed once without its method's additions."""
    spec = spec_at("quick", tmp_path)
    seconds = [work(t, spec.cells[t].tree, 1, as_built=False).seconds for t in spec.trial_order]
    assert seconds == sorted(seconds, reverse=True) and list(spec.trial_seconds) == list(spec.trials)
    assert spec.trial_order[:2] == ["SimFAFL | FMNIST non-IID1", "SimFAFL | FMNIST non-IID2"]
