"""The run summary: what ``--json-out`` writes and MLflow logs as ``final_*``."""

from __future__ import annotations

from fltune.config import build_config
from fltune.metrics.summary import run_summary


def row(round_: int, **scores: float) -> dict[str, float]:
    return {"round": round_, "round_s": 2.0, "samples": 100, **scores}


def test_the_last_validation_scores_are_summed_up_beside_the_test_ones():
    """A run with ``partition.val_fraction`` (a tuning base, or a study's best config re-run) logs
    ``val_acc_*`` every evaluation round; the summary kept only the test figures, so ``--json-out`` lacked
    the very scores the study chose by."""
    cfg = build_config(overrides=["partition.val_fraction=0.1"])
    history = [row(1, acc_global=0.2, loss=2.0, val_acc_global=0.25, val_loss=1.9, val_acc_personalized=0.3),
               row(2, acc_global=0.4, loss=1.5, val_acc_global=0.45, val_loss=1.4, val_acc_personalized=0.5)]
    summary = run_summary(history, cfg, "finished")
    assert {k: summary[k] for k in ("acc_global", "loss", "val_acc_global", "val_acc_personalized", "val_loss")} == {
        "acc_global": 0.4, "loss": 1.5, "val_acc_global": 0.45, "val_acc_personalized": 0.5, "val_loss": 1.4}
    assert "val_acc_all_model" not in summary and "acc_personalized" not in summary  # never measured: left out


def test_a_run_that_scores_only_validation_still_names_its_test_figures_blank():
    """``metrics.test: false`` (compare's tuning trials): acc_global and loss stay, as None, so every
    summary has them."""
    cfg = build_config(overrides=["partition.val_fraction=0.1", "metrics.test=false"])
    summary = run_summary([row(1, val_acc_global=0.3, val_loss=2.0)], cfg, "finished")
    assert summary["acc_global"] is None and summary["loss"] is None and summary["val_acc_global"] == 0.3
    assert list(summary)[:4] == ["acc_global", "loss", "val_acc_global", "val_loss"]
