"""Search-space files (``search_spaces/<method>.yaml``): the pydantic schema and its validation. Everything is checked
before Ray starts, against the real config model: a parameter must be a field of the method's ``Params`` (``method.*``)
or of the experiment config, and both ends of its range (every choice) must validate there, so no trial can fail on a
bad value."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from fltune.config import ExperimentConfig, build_config, describe_validation_error, read_yaml, set_fields
from fltune.errors import FLTuneError
from fltune.text import allowed
from fltune.methods import get_method
from fltune.metrics.probe import check_probes, metric_names, probe_of, unmet_need
from fltune.plugins import normalised

Scalar = Union[bool, int, float, str, None]
METRICS: tuple[str, ...] = metric_names()
"""Metrics a study can optimise or a cell compare: the round loop's and every probe's (``fltune.metrics.probe``),
per round or run constants (``Federation.static_costs``)."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Distribution(_Strict):
    when: dict[str, Scalar | list[Scalar]] | None = Field(
        None, description="sample only when every named parameter has this value (or one of these values)",
    )

    def applies(self, chosen: dict[str, Any]) -> bool:
        """Whether the condition holds for the values sampled so far (absent parameters fail it)."""
        return all(name in chosen and chosen[name] in (wanted if isinstance(wanted, list) else [wanted])
                   for name, wanted in (self.when or {}).items())


class _Range(_Distribution):
    low: float
    high: float

    @model_validator(mode="after")
    def _non_empty(self) -> _Range:
        if not self.low < self.high:
            raise ValueError(f"empty range [{self.low}, {self.high}]; allowed: low < high")
        return self


class Uniform(_Range):
    type: Literal["uniform"]

    def suggest(self, trial: Any, name: str) -> float:
        return trial.suggest_float(name, self.low, self.high)


class LogUniform(_Range):
    type: Literal["loguniform"]
    low: float = Field(gt=0)

    def suggest(self, trial: Any, name: str) -> float:
        return trial.suggest_float(name, self.low, self.high, log=True)


class IntRange(_Range):
    type: Literal["int"]
    low: int
    high: int
    log: bool = False

    def suggest(self, trial: Any, name: str) -> int:
        return trial.suggest_int(name, self.low, self.high, log=self.log)


class Choice(_Distribution):
    type: Literal["choice"]
    values: list[Scalar] = Field(min_length=1)

    def suggest(self, trial: Any, name: str) -> Scalar:
        return trial.suggest_categorical(name, self.values)


Distribution = Annotated[Union[Uniform, LogUniform, IntRange, Choice], Field(discriminator="type")]


class Objective(_Strict):
    metric: Literal[METRICS]  # type: ignore[valid-type]
    mode: Literal["max", "min"] | None = Field(None, description="default: max for accuracies, min for losses")
    reduce: Literal["final", "last_3", "best", "mean", "at_target"] = Field(
        "final", description="last value, mean of the last 3 evaluated values (a noisy validation score smoothed "
        "over rounds), best over the rounds, mean over the rounds, or the value at the round metrics.target was "
        "first reached")

    @property
    def direction(self) -> str:
        return self.mode or ("max" if self.metric.removeprefix("val_").startswith("acc_") else "min")


class Confirm(_Strict):
    """The search's top configurations trained again on fresh seeds: the winner by their mean, a seed's luck
    told apart from a real difference (``fltune.tune.confirm``)."""

    top: int = Field(3, ge=1, description="configurations re-run, best first")
    seeds: int = Field(3, ge=1, description="fresh seeds each, after the ones the search used")


class Sampler(_Strict):
    name: Literal["tpe", "random"] = "tpe"
    seed: int = 0
    n_startup_trials: int = Field(4, ge=0, description="TPE's random trials before it models the objective")
    multivariate: bool = Field(True, description="TPE over the parameters jointly (BOHB's model), not one by one")


class Asha(_Strict):
    name: Literal["asha"]
    grace_period: int = Field(3, ge=1, description="rounds every trial runs before it can be stopped")
    reduction_factor: float = Field(3, gt=1)


class NoScheduler(_Strict):
    name: Literal["none"]


class SearchSpace(_Strict):
    """One search-space file, exactly as written (before ``--set`` and the CLI flags)."""

    method: str | None = None
    base: dict[str, Any] | str = Field(default_factory=dict)
    overrides: list[str] = Field(default_factory=list, description="--set style edits applied to base")
    params: dict[str, Distribution] = Field(min_length=1)
    objective: Objective
    trade_off: list[Objective] = Field(default_factory=list, description="the further objectives of a "
                                       "multi-objective study: `objective` written as a list puts its second and "
                                       "later items here")
    num_samples: int = Field(16, ge=1)
    sampler: Sampler = Field(default_factory=Sampler)
    scheduler: Annotated[Union[Asha, NoScheduler], Field(discriminator="name")] = Field(
        default_factory=lambda: NoScheduler(name="none"),
    )
    max_concurrent: int = Field(1, ge=1)
    seeds: int = Field(1, ge=1)
    confirm: Confirm | Literal["none"] = Field("none", description="re-run the top configurations on fresh seeds "
                                              "(``{top: 3, seeds: 3}``), or none")
    checkpoint_every: int | None = Field(1, ge=1, description="rounds between trial checkpoints (always at the end; "
                                         "null: by checkpoint_seconds alone)")
    checkpoint_seconds: float | None = Field(None, gt=0, description="also checkpoint a trial once this many "
                                             "seconds have passed since its last checkpoint")

    @model_validator(mode="before")
    @classmethod
    def _objective_list(cls, tree: Any) -> Any:
        """``objective: [a, b, …]`` is a multi-objective study: ``a`` ranks its table, all make its Pareto front."""
        if isinstance(tree, dict) and isinstance(tree.get("objective"), list) and tree["objective"]:
            first, *rest = tree["objective"]
            tree = {**tree, "objective": first, "trade_off": rest}
        return tree

    @model_validator(mode="after")
    def _one_winner_to_rank(self) -> SearchSpace:
        """ASHA and the confirmation rank trials by one number; a Pareto front has several best trials."""
        if self.trade_off and isinstance(self.scheduler, Asha):
            raise ValueError("scheduler: asha stops trials by one objective's rank; allowed with a list of "
                             "objectives: {name: none}")
        if self.trade_off and self.confirm != "none":
            raise ValueError("confirm: a list of objectives has a Pareto front, not one winner to confirm; "
                             "allowed: none")
        return self

    @property
    def objectives(self) -> list[Objective]:
        """Every objective, the ranking one first."""
        return [self.objective, *self.trade_off]

    @model_validator(mode="after")
    def _conditions_refer_back(self) -> SearchSpace:
        """A ``when`` may only name a parameter listed before it (the sampling order)."""
        seen: list[str] = []
        for name, dist in self.params.items():
            unknown = [other for other in dist.when or {} if other not in seen]
            if unknown:
                raise ValueError(
                    f"params.{name}.when: {unknown[0]} is not a parameter listed above it; {allowed(unknown[0], seen)}"
                )
            seen.append(name)
        return self

    @property
    def on_validation(self) -> bool:
        """Whether the search selects on the validation split; otherwise it looks at test data every round."""
        return self.objective.metric.startswith("val_")


def is_space_setting(override: str) -> bool:
    """Whether ``--set key=value`` edits the search (a field of the space besides its experiment's)."""
    key = override.split("=", 1)[0].strip().split(".")[0]
    return key in SearchSpace.model_fields and key not in ("method", "base", "overrides", "params")


def parse_space(path: str | Path) -> SearchSpace:
    """Read and validate a search-space file; every problem becomes one line naming the file."""
    tree = read_yaml(path)
    try:
        return SearchSpace.model_validate(tree)
    except ValidationError as err:
        raise FLTuneError(f"{path}: {describe_validation_error(err, model=SearchSpace)}") from None


def base_tree(space: SearchSpace, space_path: str | Path, method: str) -> dict[str, Any]:
    """The base experiment as a plain tree: inline, or a YAML file relative to the space file (or cwd)."""
    if isinstance(space.base, str):
        candidates = [Path(space_path).parent / space.base, Path(space.base)]
        found = next((c for c in candidates if c.is_file()), candidates[0])
        tree = read_yaml(found)
    else:
        tree = copy.deepcopy(space.base)
    method_section = tree.setdefault("method", {})
    if not isinstance(method_section, dict):
        raise FLTuneError(f"{space_path}: base.method must be a section")
    method_section["name"] = method
    return tree


def space_method(space: SearchSpace, space_path: str | Path) -> str | None:
    """The space's ``method:``; a file reference (``./mine.py:Mine``) is relative to the space file when there,
    else to the working folder, and made absolute: trials run in Tune's working folders."""
    where, _, attr = (space.method or "").rpartition(":")
    if not where.endswith(".py"):
        return space.method
    beside = Path(space_path).parent / where
    return normalised(f"{beside if beside.is_file() else where}:{attr}")


def without_test(tree: dict[str, Any]) -> dict[str, Any]:
    """The experiment as a validation-scored search trains it: no test data, so no rounds-to-target and no final
    fine-tuning (both measured on test data). A study's confirmation runs, and ``run``, keep the test data."""
    return set_fields(tree, {"metrics.test": False, "metrics.target": None, "training.finetune_epochs": 0})


def check_params(space: SearchSpace, tree: dict[str, Any], method: str) -> None:
    """Each parameter is a real field and both ends of its range (every choice) validate in the config."""
    fields = get_method(method).Params.model_fields
    for name, dist in space.params.items():
        param = name.removeprefix("method.")
        if name.startswith("method.") and param not in fields:
            raise FLTuneError(f"params.{name}: not a parameter of {method}; "
                              f"{allowed(param, fields, 'none (the method has no parameters)')}")
        probes = dist.values if isinstance(dist, Choice) else [dist.low, dist.high]
        for value in probes:
            try:
                build_config(set_fields(tree, {name: value}))
            except FLTuneError as err:
                raise FLTuneError(f"params.{name} = {value!r}: {str(err).removeprefix('config error: ')}") from None


def check_objective(space: SearchSpace, cfg: ExperimentConfig) -> None:
    """Every objective's metric is one the base experiment produces, and ASHA sees it before its first rung."""
    check_probes(cfg)
    for objective in space.objectives:
        if need := unmet_need(objective.metric, objective.reduce, cfg):
            raise FLTuneError(f"objective.metric: {objective.metric} {need}")
    metric = space.objective.metric
    if metric.endswith("_ft") and isinstance(space.scheduler, Asha):
        raise FLTuneError(f"objective.metric: {metric} exists only after the final fine-tuning; it needs "
                          "scheduler: none (ASHA would see no value)")
    if isinstance(space.scheduler, Asha):
        rounds, every = cfg.federation.rounds, cfg.metrics.every
        if space.scheduler.grace_period >= rounds:
            raise FLTuneError(
                f"scheduler.grace_period: {space.scheduler.grace_period} ≥ federation.rounds {rounds}; "
                + (f"allowed: {'1..' if rounds > 2 else ''}{rounds - 1} (--set scheduler.grace_period={rounds - 1}), "
                   "or no early stopping "
                   "(--set scheduler.name=none)" if rounds > 1 else
                   "ASHA needs federation.rounds ≥ 2 to stop a trial early; with 1 round use "
                   "--set scheduler.name=none")
            )
        if space.scheduler.grace_period < every and getattr(probe_of(metric), "protocol", None) is not None:
            raise FLTuneError(
                f"scheduler.grace_period: {space.scheduler.grace_period} < metrics.every {every}: ASHA would "
                f"compare trials before their first evaluation; allowed: ≥ {every}"
            )

