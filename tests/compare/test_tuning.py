"""A comparison's tuning studies: the user's setting on a validation split, no test data, nothing asked of it."""

from __future__ import annotations

from fltune.compare.spec import new_spec
from fltune.compare.tuning import study_spec, tuning_tree
from fltune.config import build_config, set_fields


def test_a_setting_with_a_target_and_a_fine_tuning_is_tuned_without_either(tmp_path):
    """Both score the test data, which tuning trials never hold: kept, each would refuse the trials' config
    (a target metric no protocol of the trial measures, a fine-tuning nobody scores)."""
    base = set_fields({}, {"data.dataset": "synthetic", "federation.clients": 4, "partition.eval_fraction": 0.2,
                           "metrics.target": 0.5, "metrics.target_metric": "acc_personalized",
                           "training.finetune_epochs": 1})
    spec = new_spec(methods=["fedavg", "fedprox"], base=base, seeds=1, tune_budget=1, storage=str(tmp_path),
                    name="c", out=str(tmp_path / "out"), max_concurrent=None)
    cfg = build_config(tuning_tree(spec, "fedprox"))
    assert not cfg.metrics.test and cfg.partition.val_fraction > 0 and cfg.metrics.protocols == ["global"]
    assert cfg.metrics.target is None and cfg.training.finetune_epochs == 0
    assert study_spec(spec, "fedprox").space.objective.metric == "val_acc_global"
