"""Rounds-to-target (docs/methods.md §0, FedAlign Table 8): the first round an accuracy reached ``metrics.target``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fltune.engine.probes import Probe, RoundView, RunView
from fltune.errors import FLTuneError
from fltune.metrics.probe import register, unmet_need

if TYPE_CHECKING:
    from fltune.config import ExperimentConfig


def rounds_to_target(history: list[dict[str, float]], metric: str, target: float) -> int | None:
    """First round whose ``metric`` ≥ target (docs/methods.md §0); None means "R+" (never within R rounds)."""
    for row in history:
        if row.get(metric, float("-inf")) >= target:
            return int(row["round"])
    return None


def reached_target(history: list[dict[str, float]], metric: str, target: float | None) -> dict[str, float]:
    """``{"rounds_to_target": r}`` once ``metric`` has reached ``target`` (every round from then on, so a
    Tune trial can report it), else ``{}``."""
    reached = rounds_to_target(history, metric, target) if target is not None else None
    return {} if reached is None else {"rounds_to_target": float(reached)}


@register
class RoundsToTarget(Probe):
    """Runs last, every round; on in every run, since every summary names ``best_acc`` and
    ``rounds_to_target`` (null: never reached, or no target)."""

    name = "target"
    order = 90
    metrics = {"rounds_to_target": "first round metrics.target_metric reached metrics.target (from then on)"}

    @classmethod
    def unmet(cls, metric: str, cfg: ExperimentConfig) -> str | None:
        """Needs ``metrics.target`` and a ``metrics.target_metric`` the run measures."""
        if cfg.metrics.target is None:
            return "needs metrics.target (the accuracy to reach)"
        need = unmet_need(cfg.metrics.target_metric, "final", cfg)
        return None if need is None else f"needs metrics.target_metric {cfg.metrics.target_metric}, which {need}"

    @classmethod
    def check(cls, cfg: ExperimentConfig) -> None:
        """Refuse a target on a metric the run never measures (blank figures after the whole run)."""
        if cfg.metrics.target is not None and (need := unmet_need(cfg.metrics.target_metric, "final", cfg)):
            raise FLTuneError(f"metrics.target_metric: {cfg.metrics.target_metric} is never measured here: it {need}")

    def due(self, view: RoundView) -> bool:
        return view.run.cfg.metrics.target is not None

    def measure(self, view: RoundView) -> dict[str, float]:
        metrics = view.run.cfg.metrics
        return reached_target([*view.run.history, dict(view.metrics)], metrics.target_metric, metrics.target)

    def summary(self, run: RunView) -> dict[str, Any]:
        """The run's best ``metrics.target_metric`` and the round it first reached ``metrics.target``."""
        metrics = run.cfg.metrics
        best = max((row[metrics.target_metric] for row in run.history if metrics.target_metric in row), default=None)
        reached = rounds_to_target(run.history, metrics.target_metric, metrics.target) if metrics.target else None
        return {"best_acc": best, "rounds_to_target": reached}
