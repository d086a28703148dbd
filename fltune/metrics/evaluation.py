"""The three evaluation protocols (docs/methods.md §0; personalized: SimFAFL Table 2) and rounds-to-target (FedAlign
Table 8) as round probes. With ``partition.val_fraction > 0`` each also scores the validation split (``val_<metric>``);
``metrics.test: false`` leaves only those (``FederatedData.without_test``).
"""

from __future__ import annotations

import math
from abc import abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from fltune.data.partitions import check_held_out
from fltune.engine.probes import Probe, RoundView, RunView, last_value
from fltune.errors import FLTuneError
from fltune.metrics.probe import register, unmet_need

if TYPE_CHECKING:
    from fltune.config import ExperimentConfig
    from fltune.data.federated import FederatedData
    from fltune.methods.base import State

ACCURACY_KEYS = ("acc_global", "acc_all_model", "acc_personalized", "acc_personalized_ft")
VAL = "val_"
"""Prefix of a metric measured on the validation split rather than the test data."""
TAIL = 0.1
"""The share of clients that ``_worst10`` and ``_best10`` average over."""
SPREAD = {"std": "standard deviation over clients of", "worst10": "mean of the lowest-scoring 10 % of clients in",
          "best10": "mean of the highest-scoring 10 % of clients in"}
"""The suffixes of a personalised accuracy's spread, with what each is."""


def with_val(metrics: dict[str, str]) -> dict[str, str]:
    """A protocol's metrics and their validation twins (``val_<name>``)."""
    return {**metrics, **{VAL + name: f"{text}, on the validation split" for name, text in metrics.items()}}


def splits(cfg: ExperimentConfig) -> list[str]:
    """The data the protocols score on: test (unless ``metrics.test`` is off), val (with a validation split)."""
    return ["test"] * cfg.metrics.test + ["val"] * (cfg.partition.val_fraction > 0)


def own_splits(cfg: ExperimentConfig) -> dict[str, tuple[str, float]]:
    """Of the ``splits`` scored, those each client holds a part of, with the field holding it out."""
    part = cfg.partition
    test = ("partition.test_per_client", part.test_per_client) if part.test_per_client else (
        "partition.eval_fraction", part.eval_fraction)
    fields = {"test": test, "val": ("partition.val_fraction", part.val_fraction)}
    return {split: fields[split] for split in splits(cfg) if fields[split][1] > 0}


def prefixed(split: str, figures: dict[str, float]) -> dict[str, float]:
    return figures if split == "test" else {VAL + name: value for name, value in figures.items()}


def client_figures(name: str, accuracies: list[float], losses: list[float]) -> dict[str, float]:
    """``acc_<name>`` and ``loss_<name>``, the means over clients, and the spread over clients that pFL papers report
    beside the mean (Ditto, Li et al. ICML 2021, Table 1's worst 10 %): the population std, and the means of the
    ⌈10 %⌉ worst and best clients."""
    ranked = np.sort(accuracies)
    tail = max(1, math.ceil(TAIL * len(ranked)))
    return {f"acc_{name}": float(np.mean(accuracies)), f"loss_{name}": float(np.mean(losses)),
            f"acc_{name}_std": float(np.std(accuracies)), f"acc_{name}_worst10": float(np.mean(ranked[:tail])),
            f"acc_{name}_best10": float(np.mean(ranked[-tail:]))}


def with_spread(metrics: dict[str, str]) -> dict[str, str]:
    """``metrics`` with each accuracy's spread (:func:`client_figures`) after it."""
    out = {}
    for name, about in metrics.items():
        out[name] = about
        if name.startswith(("acc_", VAL + "acc_")):
            out.update({f"{name}_{part}": f"{what} {name}" for part, what in SPREAD.items()})
    return out


class _Protocol(Probe):
    """An evaluation protocol: measured on evaluation rounds, when ``metrics.protocols`` lists it."""

    clock: ClassVar[str | None] = "eval_s"
    summarized: ClassVar[tuple[str, ...]]
    """Its test figures the run summary names (their validation twins too, when measured)."""

    def due(self, view: RoundView) -> bool:
        """Every ``metrics.every`` rounds and at the last."""
        cfg = view.run.cfg
        return view.running and (view.round % cfg.metrics.every == 0 or view.round == cfg.federation.rounds)

    @classmethod
    def enabled(cls, cfg: ExperimentConfig) -> bool:
        return cls.protocol in cfg.metrics.protocols

    @classmethod
    def unmet(cls, metric: str, cfg: ExperimentConfig) -> str | None:
        if cls.protocol not in cfg.metrics.protocols:
            return (f"needs metrics.protocols to include {cls.protocol}; "
                    f"allowed here: {', '.join(cfg.metrics.protocols)}")
        if metric.startswith(VAL) and cfg.partition.val_fraction == 0:
            return "needs partition.val_fraction > 0 (a validation split)"
        if not metric.startswith(VAL) and not cfg.metrics.test:
            return "needs metrics.test: true (this run evaluates only its validation split)"
        return None

    def summary(self, run: RunView) -> dict[str, Any]:
        """The last value of each ``summarized`` figure and of its validation twin, of those measured."""
        keys = (*self.summarized, *(VAL + key for key in self.summarized))
        return {key: value for key in keys if (value := last_value(run.history, key)) is not None}


class _OneModel(_Protocol):
    """A protocol that scores one model (the server's) on the pooled test data and validation split."""

    keys: ClassVar[tuple[str, str]]
    """Its (accuracy, loss) metric names."""

    @abstractmethod
    def state(self, view: RoundView) -> State:
        """The weights to score."""

    def measure(self, view: RoundView) -> dict[str, float]:
        state, out = self.state(view), {}
        for split in splits(view.run.cfg):
            out.update(prefixed(split, dict(zip(self.keys, view.run.evaluate(state, split)))))
        return out


@register
class GlobalAccuracy(_OneModel):
    """The global model on the test set."""

    name = "global"
    order = 10
    protocol = "global"
    metrics = with_val({"acc_global": "global model's test accuracy", "loss": "global model's mean test loss"})
    keys = summarized = ("acc_global", "loss")

    def state(self, view: RoundView) -> State:
        return view.global_state

    def summary(self, run: RunView) -> dict[str, Any]:
        """Its test figures, blank when not measured: every summary names them."""
        return {"acc_global": None, "loss": None, **super().summary(run)}


@register
class AllModelAccuracy(_OneModel):
    """The average of every client's latest local model (FedDyn's "all-clients" model) on the test set."""

    name = "all_model"
    order = 20
    protocol = "all_model"
    metrics = with_val({"acc_all_model": "all-clients average model's test accuracy",
                        "loss_all_model": "all-clients average model's mean test loss"})
    keys = ("acc_all_model", "loss_all_model")
    summarized = ("acc_all_model",)
    keeps_local_models = True

    def state(self, view: RoundView) -> State:
        """Average of every client's latest local model (initial if never sampled), FedDyn-style, weighted as
        the method weights updates (docs/methods.md §0); summed in client order: worker-count free."""
        run = view.run
        initial = run.initial_state
        by_samples = run.method.weighted_by_samples
        weights = [float(run.sizes[c]) if by_samples else 1.0 for c in range(run.cfg.federation.clients)]
        total = math.fsum(weights)
        acc = {k: np.zeros(v.shape, np.float64) for k, v in initial.items()}
        for cid, weight in enumerate(weights):
            for key, value in run.latest.get(cid, initial).items():
                acc[key] += weight * value
        return {k: (acc[k] / total).astype(initial[k].dtype) for k in acc}


@register
class PersonalizedAccuracy(_Protocol):
    """Each client's own model on its own held-out split, and after the last round with the head tuned, each mean
    with its spread over clients (:func:`client_figures`)."""

    name = "personalized"
    order = 30
    protocol = "personalized"
    summarized = tuple(f"{name}{part}" for name in ("acc_personalized", "acc_personalized_ft")
                       for part in ("", *(f"_{suffix}" for suffix in SPREAD)))
    metrics = with_spread({
        "acc_personalized": "mean over clients of their own model's accuracy on their held-out split",
        "loss_personalized": "the same clients' mean held-out loss",
        "acc_personalized_ft": "acc_personalized after fine-tuning each head (last round only)",
        "loss_personalized_ft": "loss_personalized after fine-tuning each head (last round only)",
        "val_acc_personalized": "mean over clients of their own model's accuracy on their validation split",
        "val_loss_personalized": "the same clients' mean validation loss",
    })

    @classmethod
    def check_data(cls, cfg: ExperimentConfig, data: FederatedData) -> None:
        """Refuse a split that leaves some client nothing to be scored on: the figure is a mean over all."""
        for split, (field, fraction) in own_splits(cfg).items():
            check_held_out(field, fraction, *data.held_out(split),
                           each_client="the personalized protocol scores every client on its own")

    @classmethod
    def enabled(cls, cfg: ExperimentConfig) -> bool:
        """Needs per-client held-out or validation splits."""
        return super().enabled(cfg) and bool(own_splits(cfg))

    @classmethod
    def unmet(cls, metric: str, cfg: ExperimentConfig) -> str | None:
        unmet = super().unmet(metric, cfg)
        if unmet is None and not metric.startswith(VAL) and "test" not in own_splits(cfg):
            return "needs partition.eval_fraction > 0 or partition.test_per_client > 0 (per-client held-out data)"
        if unmet is None and "_ft" in metric and cfg.training.finetune_epochs == 0:
            return "needs training.finetune_epochs > 0 (it scores the fine-tuned heads)"
        return unmet

    @classmethod
    def check(cls, cfg: ExperimentConfig) -> None:
        """Refuse ``training.finetune_epochs`` in a run that never scores ``acc_personalized_ft``."""
        epochs = cfg.training.finetune_epochs
        if epochs and (need := cls.unmet("acc_personalized_ft", cfg)):
            raise FLTuneError(f"training.finetune_epochs: {epochs} fine-tunes for acc_personalized_ft, which {need}; "
                              "allowed here: 0")

    def measure(self, view: RoundView) -> dict[str, float]:
        """Held-out and validation scores; fine-tuned only on held-out data after the last round (a tuning
        objective reads the plain validation score)."""
        run, out = view.run, {}
        last = view.round == run.cfg.federation.rounds
        for split in own_splits(run.cfg):
            out.update(prefixed(split, client_figures("personalized", *run.evaluate_clients(False, split))))
            if split == "test" and last and run.cfg.training.finetune_epochs:
                out.update(client_figures("personalized_ft", *run.evaluate_clients(True, "test")))
        return out


def rounds_to_target(history: list[dict[str, float]], metric: str, target: float) -> int | None:
    """First round whose ``metric`` ≥ target (docs/methods.md §0); None means "R+" (never within R rounds)."""
    for row in history:
        if row.get(metric, float("-inf")) >= target:
            return int(row["round"])
    return None


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
        """Every round from the one it was reached on, so a Tune trial can report it."""
        metrics = view.run.cfg.metrics
        reached = rounds_to_target([*view.run.history, dict(view.metrics)], metrics.target_metric, metrics.target)
        return {} if reached is None else {"rounds_to_target": float(reached)}

    def summary(self, run: RunView) -> dict[str, Any]:
        """The run's best ``metrics.target_metric`` and the round it first reached ``metrics.target``."""
        metrics = run.cfg.metrics
        best = max((row[metrics.target_metric] for row in run.history if metrics.target_metric in row), default=None)
        reached = rounds_to_target(run.history, metrics.target_metric, metrics.target) if metrics.target else None
        return {"best_acc": best, "rounds_to_target": reached}
