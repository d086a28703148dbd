"""``build_federation``: a config's run with the probes it turns on, and the run summary they make up
(what ``--json-out`` writes and MLflow logs as ``final_*``)."""

from __future__ import annotations

from fltune.assembly import build_federation
from fltune.config import build_config
from fltune.engine.federation import Federation

TINY = ["data.dataset=synthetic", "data.subsample=0.25", "federation.clients=4", "tracking.enabled=false"]


def row(round_: int, **scores: float) -> dict[str, float]:
    return {"round": round_, "round_s": 2.0, "samples": 100, "train_loss": 1.0, **scores}


def summarised(history: list[dict[str, float]], *overrides: str) -> tuple[Federation, dict]:
    """The summary of a run built (not opened: no worker starts) whose history is ``history``."""
    fed = build_federation(build_config(overrides=[*TINY, *overrides]))
    fed.history[:] = history  # in place: the probes read this list
    return fed, fed.summary()


def test_the_config_chooses_the_probes_the_run_gets():
    fed = build_federation(build_config(overrides=[*TINY, "metrics.protocols=[global]"]))
    assert [probe.name for probe in fed.probes] == ["cost", "global", "update_norm", "target"]
    assert fed.pool is None and fed.run_ref is None  # its own workers start as it opens


def test_each_probe_adds_its_own_summary_entries_then_the_loop_its_totals():
    """The cost totals of the last round, the last Hessian measurement, the last scores; then rounds, time
    (evaluations counted, the Hessian a diagnostic left out) and status. The engine names none of the keys."""
    history = [row(1, acc_global=0.2, loss=2.0, cost_cum_tflops=1.0, hessian_lambda_max=3.0, hessian_s=0.5),
               row(2, acc_global=0.4, loss=1.5, cost_cum_tflops=2.0, eval_s=1.0)]
    fed, summary = summarised(history, "metrics.protocols=[global]", "metrics.hessian.every=1",
                              "metrics.target=0.3")
    assert summary == {"cost_cum_tflops": 2.0, "acc_global": 0.4, "loss": 1.5, "hessian_lambda_max": 3.0,
                       "hessian_s": 0.5, "best_acc": 0.4, "rounds_to_target": 2, "rounds": 2, "wall_s": 5.0,
                       "round_s_mean": 2.0, "samples_per_s": 50.0, "status": "running"}
    fed.status = "diverged"
    assert fed.summary()["diverged_round"] == 2


def test_a_run_without_a_target_still_names_best_acc_and_rounds_to_target():
    _, summary = summarised([row(1, acc_global=0.2, loss=2.0), row(2, acc_global=0.1, loss=2.1)])
    assert summary["best_acc"] == 0.2 and summary["rounds_to_target"] is None


def test_the_last_validation_scores_are_summed_up_beside_the_test_ones():
    """A run with ``partition.val_fraction`` (a tuning base, or a study's best config re-run) logs
    ``val_acc_*`` every evaluation round; the summary kept only the test figures, so ``--json-out`` lacked
    the very scores the study chose by."""
    history = [row(1, acc_global=0.2, loss=2.0, val_acc_global=0.25, val_loss=1.9, val_acc_personalized=0.3),
               row(2, acc_global=0.4, loss=1.5, val_acc_global=0.45, val_loss=1.4, val_acc_personalized=0.5)]
    _, summary = summarised(history, "partition.val_fraction=0.1")
    assert {k: summary[k] for k in ("acc_global", "loss", "val_acc_global", "val_acc_personalized", "val_loss")} == {
        "acc_global": 0.4, "loss": 1.5, "val_acc_global": 0.45, "val_acc_personalized": 0.5, "val_loss": 1.4}
    assert "val_acc_all_model" not in summary and "acc_personalized" not in summary  # never measured: left out


def test_a_run_that_scores_only_validation_still_names_its_test_figures_blank():
    """``metrics.test: false`` (compare's tuning trials): acc_global and loss stay, as None, so every
    summary has them."""
    _, summary = summarised([row(1, val_acc_global=0.3, val_loss=2.0)], "partition.val_fraction=0.1",
                            "metrics.test=false")
    assert summary["acc_global"] is None and summary["loss"] is None and summary["val_acc_global"] == 0.3
    scores = [key for key in summary if "acc" in key or "loss" in key]
    assert scores[:4] == ["acc_global", "loss", "val_acc_global", "val_loss"]
