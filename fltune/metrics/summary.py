"""The run summary (``--json-out``, MLflow ``final_*``): the last accuracies (test and validation),
rounds-to-target, throughput, and the last cost and Hessian figures, all read back from the per-round
history."""

from __future__ import annotations

from typing import Any

from fltune.config import ExperimentConfig
from fltune.metrics.evaluation import ACCURACY_KEYS, VAL
from fltune.metrics.target import rounds_to_target


def _last(history: list[dict[str, float]], key: str) -> float | None:
    for row in reversed(history):
        if key in row:
            return row[key]
    return None


def run_summary(history: list[dict[str, float]], cfg: ExperimentConfig, status: str) -> dict[str, Any]:
    """The final summary written by ``--json-out``: last evaluated values plus run totals."""
    round_s = sum(row["round_s"] for row in history)
    samples = sum(row["samples"] for row in history)
    scores = (*ACCURACY_KEYS, "loss", *(VAL + key for key in (*ACCURACY_KEYS, "loss")))
    summary: dict[str, Any] = {key: _last(history, key) for key in scores}
    summary = {k: v for k, v in summary.items() if v is not None or k in ("acc_global", "loss")}
    target = cfg.metrics.target
    summary.update(
        best_acc=max((row[cfg.metrics.target_metric] for row in history if cfg.metrics.target_metric in row),
                     default=None),
        rounds_to_target=rounds_to_target(history, cfg.metrics.target_metric, target) if target else None,
        rounds=int(history[-1]["round"]) if history else 0,
        wall_s=sum(row["round_s"] + row.get("eval_s", 0.0) for row in history),
        round_s_mean=round_s / len(history) if history else None,
        samples_per_s=samples / round_s if round_s else None,
        status=status,
    )
    if history:
        summary.update({k: v for k, v in history[-1].items() if k.startswith("cost_cum")})
        probes = [row for row in history if "hessian_lambda_max" in row]
        if probes:
            summary.update({k: v for k, v in probes[-1].items() if k.startswith("hessian_")})
    if status == "diverged":
        summary["diverged_round"] = summary["rounds"]
    return summary
