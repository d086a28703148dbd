"""The probe registry: metric names declared once, what each needs from a config, which probes a run gets."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from fltune.config import build_config
from fltune.engine.probes import LOOP_METRICS, Probe
from fltune.errors import FLTuneError
from fltune.metrics.probe import (
    all_probes,
    check_probes,
    metric_names,
    probe_of,
    register,
    unmeasured_protocols,
    unmet_need,
)
from fltune.tune.space import METRICS

TINY = ["data.dataset=synthetic", "federation.clients=4", "tracking.enabled=false"]
NO_HELD_OUT = "needs partition.eval_fraction > 0 or partition.test_per_client > 0 (per-client held-out data)"


def test_every_metric_is_declared_by_exactly_one_probe_or_the_loop() -> None:
    names = metric_names()
    assert len(names) == len(set(names))
    assert METRICS == names  # what a study may optimise is what the probes declare
    for name in names:
        assert (probe_of(name) is None) == (name in LOOP_METRICS), name


def test_a_probe_redeclaring_a_metric_is_refused() -> None:
    class Again(Probe):
        metrics = {"acc_global": "twice"}

    before = all_probes()
    with pytest.raises(ValueError, match="acc_global is declared twice"):
        register(Again)
    assert all_probes() == before


@pytest.mark.parametrize(("metric", "reduce", "overrides", "expected"), [
    ("train_loss", "final", [], None),
    ("acc_global", "final", ["metrics.protocols=[global]"], None),
    ("acc_all_model", "final", ["metrics.protocols=[global]"], "needs metrics.protocols to include all_model"),
    ("acc_personalized", "final", ["metrics.protocols=[personalized]"], "partition.eval_fraction > 0"),
    ("acc_global", "at_target", [], "needs metrics.target"),
    ("rounds_to_target", "final", [], "needs metrics.target"),
    ("rounds_to_target", "final", ["metrics.target=0.5"], None),
    ("rounds_to_target", "final", ["metrics.target=0.5", "metrics.protocols=[global]",
                                   "metrics.target_metric=acc_all_model"],
     "needs metrics.target_metric acc_all_model, which needs metrics.protocols to include all_model"),
    ("acc_global", "at_target", ["metrics.target=0.5", "metrics.target_metric=acc_personalized"],
     "needs metrics.target_metric acc_personalized, which needs partition.eval_fraction > 0"),
    ("acc_personalized_ft", "final", ["partition.eval_fraction=0.2"], "needs training.finetune_epochs > 0"),
    ("acc_personalized_ft", "final", ["partition.eval_fraction=0.2", "training.finetune_epochs=1"], None),
    ("hessian_trace", "final", [], "needs a Hessian probe"),
    ("hessian_hn", "final", ["metrics.hessian.at_end=true"], "metrics.hessian.clients ≥ 2"),
    ("hessian_hn", "final", ["metrics.hessian.at_end=true", "metrics.hessian.clients=2"], None),
    ("cost_stored_params", "final", [], None),
])
def test_unmet_need_names_what_the_config_lacks(metric: str, reduce: str, overrides: list[str],
                                                expected: str | None) -> None:
    need = unmet_need(metric, reduce, build_config(overrides=[*TINY, *overrides]))
    assert need == expected if expected is None else expected in need


@pytest.mark.parametrize(("overrides", "expected"), [
    ([], None),  # no target: nothing asked of rounds_to_target
    (["metrics.target=0.5"], None),
    (["metrics.target=0.5", "metrics.protocols=[global]", "metrics.target_metric=acc_personalized"],
     "metrics.target_metric: acc_personalized is never measured here: it needs metrics.protocols to include "
     "personalized; allowed here: global"),
    (["metrics.target=0.5", "metrics.target_metric=acc_personalized_ft", "partition.eval_fraction=0.2"],
     "metrics.target_metric: acc_personalized_ft is never measured here: it needs training.finetune_epochs > 0"),
])
def test_a_target_on_a_metric_the_run_never_measures_is_refused(overrides: list[str], expected: str | None) -> None:
    """Else the whole run would end with rounds_to_target and best_acc blank."""
    cfg = build_config(overrides=[*TINY, *overrides])
    if expected is None:
        check_probes(cfg)
    else:
        with pytest.raises(FLTuneError, match=re.escape(expected)):
            check_probes(cfg)


@pytest.mark.parametrize(("overrides", "expected"), [
    (["metrics.protocols=[global]"], "needs metrics.protocols to include personalized; allowed here: global"),
    ([], NO_HELD_OUT),
    (["partition.eval_fraction=0.2"], None),
])
def test_a_fine_tuning_nobody_scores_is_refused(overrides: list[str], expected: str | None) -> None:
    """``training.finetune_epochs`` exists for acc_personalized_ft: a run that never scores it is refused."""
    cfg = build_config(overrides=[*TINY, "training.finetune_epochs=1", *overrides])
    if expected is None:
        check_probes(cfg)
    else:
        with pytest.raises(FLTuneError, match=re.escape(
                f"training.finetune_epochs: 1 fine-tunes for acc_personalized_ft, which {expected}; allowed here: 0")):
            check_probes(cfg)


def test_the_config_chooses_the_probes() -> None:
    def enabled(*overrides: str) -> list[str]:
        cfg = build_config(overrides=[*TINY, *overrides])
        return [probe.name for probe in all_probes() if probe.enabled(cfg)]

    assert enabled("metrics.protocols=[global]") == ["cost", "global", "update_norm", "target"]  # best_acc
    everything = enabled("partition.eval_fraction=0.2", "metrics.hessian.every=2", "metrics.target=0.5")
    assert everything == ["cost", "global", "all_model", "personalized", "hessian", "update_norm", "target"]
    assert "personalized" not in enabled("partition.eval_fraction=0")  # no held-out splits to evaluate on


@pytest.mark.parametrize(("overrides", "expected"), [
    ([], [f"personalized: {NO_HELD_OUT}"]),
    (["partition.eval_fraction=0.2"], []),
    (["partition.val_fraction=0.2"], []),  # scored on the validation splits
    (["partition.test_per_client=50"], []),  # FedSOL's: held out of the test split
    (["metrics.protocols=[global]"], []),
])
def test_a_listed_protocol_the_run_cannot_measure_is_named_with_its_need(overrides: list[str],
                                                                          expected: list[str]) -> None:
    """The default lists all three protocols; without held-out splits ``run`` now says which one it drops
    and why, where it dropped it without a word."""
    assert unmeasured_protocols(build_config(overrides=[*TINY, *overrides])) == expected


def test_checking_the_probes_imports_no_torch() -> None:
    """``run`` checks every probe's settings before it starts Ray, and torch imports beside Ray's start on
    another thread: a probe module that imported torch would put its import on the command's main thread."""
    check = ("import sys; from fltune.config import build_config; "
             "from fltune.metrics.probe import check_probes, unmeasured_protocols; cfg = build_config(overrides=[]); "
             "check_probes(cfg); unmeasured_protocols(cfg); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
