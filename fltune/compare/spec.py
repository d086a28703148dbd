"""A comparison job as plain data, validated before Ray starts. Fair by construction: method trees differ only in
``method`` (and tuned ``method.*``/``training.*``), and partition and client sampling depend on (``federation.seed``,
round) alone (``fltune.data.partitions``, ``fltune.engine.rng``)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from functools import cached_property
from typing import Any

from fltune.catalog import method_names
from fltune.config import ExperimentConfig, build_config, set_fields
from fltune.errors import FLTuneError
from fltune.jobs.cells import CellSpec
from fltune.jobs.scaffold import CELL_CHECKPOINT_EVERY, CELL_CHECKPOINT_SECONDS
from fltune.jobs.storage import check_name
from fltune.metrics.probe import check_probes, unmet_need
from fltune.plugins import is_reference, normalised, plugins, unknown
from fltune.tracking.paths import outputs_dir
from fltune.tune.space import Objective

ACCURACY = {"global": "acc_global", "all_model": "acc_all_model", "personalized": "acc_personalized"}
"""Evaluation protocol (``metrics.protocols``) → the accuracy it reports."""
FINE_TUNED = "acc_personalized_ft"

TUNING_SEED_OFFSET = 1000
"""Studies run at ``federation.seed + 1000``: the reported seeds are fresh, never the one tuned on."""

TUNING_VAL_FRACTION = 0.1
"""Validation share of each client's training data during tuning when ``partition.val_fraction`` is 0."""

SHARED = ("data.", "partition.", "federation.", "metrics.", "model.", "resources.", "tracking.")
"""Settings every method shares: a search space may not tune them (only ``method.*`` and ``training.*``)."""


class CompareSpec(CellSpec):
    """Everything a comparison needs, frozen at its start (``--resume`` continues exactly this)."""

    methods: list[str]
    seeds: int
    base: dict[str, Any]
    """The user's setting (``--config`` + flags + ``--set``) without a method."""
    tune_budget: int | None
    trees: dict[str, dict[str, Any]]
    """Method → its cells' experiment tree at the base seed; empty until the studies end when tuning."""

    @property
    def base_seed(self) -> int:
        return self.config.federation.seed

    @cached_property
    def config(self) -> ExperimentConfig:
        return build_config(self.base)

    @property
    def primary(self) -> str:
        """The accuracy that ranks the methods: the first evaluation protocol's."""
        return ranking_accuracy(self.config)

    @property
    def accuracies(self) -> list[str]:
        """The ranking accuracy, then every other protocol's the setting measures on test data."""
        cfg = self.config
        measured = [ACCURACY[p] for p in cfg.metrics.protocols if unmet_need(ACCURACY[p], "final", cfg) is None]
        return list(dict.fromkeys([self.primary, *measured]))

    @property
    def finals(self) -> list[str]:
        """``accuracies``, then ``acc_personalized_ft`` when the setting fine-tunes (measured once, no best)."""
        tuned = unmet_need(FINE_TUNED, "final", self.config) is None
        return [*self.accuracies, *([FINE_TUNED] if tuned else [])]

    @property
    def cells(self) -> list[str]:
        """One cell per method × seed: ``<method>/seed<k>``, method-major (the table's order)."""
        return [f"{method}/seed{index}" for method in self.methods for index in range(self.seeds)]

    def cell_tree(self, key: str) -> dict[str, Any]:
        """A cell's experiment: its method's tree at seed base + k."""
        method, index = parse_cell(key)
        return set_fields(self.trees[method], {"federation.seed": self.base_seed + index})

    def trial(self, cell: str) -> tuple[dict[str, Any], int, list[Objective]]:
        """A cell, one seed, as a Tune trial: the ranking accuracy's final value first, then each protocol's best so
        far (``objective:best:<acc>``); with the final values, all the table needs."""
        return self.cell_tree(cell), 1, [Objective(metric=self.primary, reduce="final"),
                                         *(Objective(metric=acc, reduce="best") for acc in self.accuracies)]


def parse_cell(key: str) -> tuple[str, int]:
    method, seed = key.rsplit("/seed", 1)
    return method, int(seed)


def parse_methods(given: Sequence[str]) -> list[str]:
    """``--methods a,b,c``: at least two distinct registered methods; a file reference made absolute here, where
    the comparison is created, as its cells run in Tune's working folders."""
    methods = [normalised(m.strip()) for m in given if m.strip()]
    names = method_names()
    unknown_ones = [m for m in methods if m not in names and m not in plugins("method") and "+" not in m
                    and not is_reference(m)]
    if unknown_ones:
        raise unknown("method", unknown_ones[0], sorted(names), field="--methods")
    duplicates = sorted({m for m in methods if methods.count(m) > 1})
    if duplicates:
        raise FLTuneError(f"--methods: {duplicates[0]} is named twice; allowed: each method once")
    if len(methods) < 2:
        raise FLTuneError(f"--methods: {len(methods)} method(s); allowed: at least 2, comma-separated")
    return methods


def method_tree(base: dict[str, Any], method: str) -> dict[str, Any]:
    """The user's setting with ``method`` (at its defaults) in place of any method it names; validated."""
    tree = set_fields({k: v for k, v in base.items() if k != "method"}, {"method.name": method})
    build_config(tree)
    return tree


def ranking_accuracy(cfg: ExperimentConfig) -> str:
    """The first evaluation protocol's accuracy, which must be measured on the test data of every cell."""
    protocol = next((p for p in cfg.metrics.protocols if p in ACCURACY), None)
    if protocol is None:
        raise FLTuneError(f"metrics.protocols: none to rank by; allowed: {', '.join(ACCURACY)}")
    need = unmet_need(ACCURACY[protocol], "final", cfg)
    if need:
        raise FLTuneError(f"metrics.protocols: the ranking accuracy {ACCURACY[protocol]} {need}")
    return ACCURACY[protocol]


def new_spec(*, methods: list[str], base: dict[str, Any], seeds: int, tune_budget: int | None, storage: str,
             name: str | None, out: str | None, max_concurrent: int | None,
             checkpoint_every: int | None = None, checkpoint_seconds: float | None = None) -> CompareSpec:
    """A fresh comparison named ``compare-<time>`` unless ``--name``; trees filled now unless tuning."""
    name = check_name(name or f"compare-{time.strftime('%Y%m%d-%H%M%S')}")
    trees = {method: method_tree(base, method) for method in methods}
    cfg = build_config(trees[methods[0]])
    ranking_accuracy(cfg)  # the setting is the same for every method
    check_probes(cfg)
    return CompareSpec(
        name=name, storage=storage, methods=methods, seeds=seeds, base=base,
        tune_budget=tune_budget, trees={} if tune_budget else trees, workers=cfg.resources.workers or 1,
        gpus_per_worker=cfg.resources.gpus_per_worker, max_concurrent=max_concurrent,
        out=out or str(outputs_dir(cfg.tracking) / "compare" / name),
        checkpoint_every=checkpoint_every or CELL_CHECKPOINT_EVERY,
        checkpoint_seconds=checkpoint_seconds or CELL_CHECKPOINT_SECONDS,
    )
