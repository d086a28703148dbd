"""The Ray Tune function trainable: one trial = one configuration, run for every seed in lockstep. Each round reports
seed means, so ASHA compares trials round by round. A restored trial replays the rounds after its checkpoint exactly:
every random number derives from (seed, round, client id)."""

from __future__ import annotations

import math
import pickle
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import ray
from ray import tune

from fltune.assembly import build_federation
from fltune.config import ExperimentConfig, build_config, set_fields
from fltune.engine.federation import Federation, lockstep, open_all
from fltune.tune.space import Objective, without_test
from fltune.tune.spec import StudySpec

STATE_FILE = "federations.pkl"
CHECKPOINT_PROTOCOL = 5
"""Pickle protocol of a trial's checkpoint: arrays written from their own buffers (PEP 574)."""


def seed_configs(tree: dict[str, Any], seeds: int, workers: int, gpus_per_worker: float) -> list[ExperimentConfig]:
    """One configuration per seed (base seed + i), each reserving 1/seeds of the worker bundles the seeds share;
    MLflow off (the driver's)."""
    base = build_config(tree)
    return [build_config(set_fields(tree, {
        "federation.seed": base.federation.seed + index,
        "resources.workers": workers,
        "resources.cpus_per_worker": base.resources.cpus_per_worker / seeds,
        "resources.gpus_per_worker": gpus_per_worker / seeds,
        "tracking.enabled": False,
    })) for index in range(seeds)]


def seed_score(history: list[dict[str, float]], objective: Objective,
               constants: dict[str, float] | None = None) -> float:
    """One seed's objective so far (NaN before any value): the metric's last finite value, the mean of its last
    3 (``last_3``: Ray Tune's ``last-3-avg`` scope, so a trial's rank is not one round's noise), its best or mean,
    or its value at the first round reporting ``rounds_to_target``. A run constant (``constants``:
    ``Federation.static_costs``) is its own value whatever the reduction."""
    if constants is not None and objective.metric in constants:
        return float(constants[objective.metric])
    if objective.reduce == "at_target":
        reached = [row for row in history if "rounds_to_target" in row]
        value = reached[0].get(objective.metric, math.nan) if reached else math.nan
        return value if math.isfinite(value) else math.nan
    values = [row[objective.metric] for row in history if math.isfinite(row.get(objective.metric, math.nan))]
    if not values:
        return math.nan
    if objective.reduce == "best":
        return max(values) if objective.direction == "max" else min(values)
    window = {"final": 1, "last_3": 3, "mean": len(values)}[objective.reduce]
    return float(np.mean(values[-window:]))


def objective_key(objective: Objective) -> str:
    """Key of an extra objective (``objective:<key>``, ``objective_std:<key>``): one run scores several cells."""
    return f"{objective.reduce}:{objective.metric}"


def last_good(history: list[dict[str, float]]) -> dict[str, float]:
    """Every metric's latest finite value (carried over non-evaluation rounds and NaN/inf ones)."""
    latest: dict[str, float] = {}
    for row in history:
        latest.update({k: v for k, v in row.items() if math.isfinite(v)})
    return latest


def trial_result(feds: list[Federation], objective: Objective, extra: Sequence[Objective] = ()) -> dict[str, Any]:
    """One round's report: seed means of every metric, the objective's mean and std, the status, and the
    ``extra`` objectives under ``objective_key``."""
    per_seed = [last_good(fed.history) for fed in feds]
    shared = set.intersection(*(set(row) for row in per_seed))
    result: dict[str, Any] = {key: float(np.mean([row[key] for row in per_seed])) for key in sorted(shared)}
    constants = [fed.static_costs() for fed in feds]
    for index, scored in enumerate((objective, *extra)):
        scores = [seed_score(fed.history, scored, const) for fed, const in zip(feds, constants)]
        mean, std = float(np.mean(scores)), float(np.std(scores))
        if index == 0:
            result["objective"], result["objective_std"] = mean, std
        if extra:
            result[f"objective:{objective_key(scored)}"], result[f"objective_std:{objective_key(scored)}"] = mean, std
    result["round"] = float(max(fed.round for fed in feds))
    result["diverged"] = float(any(fed.status == "diverged" for fed in feds))
    result["status"] = "diverged" if result["diverged"] else ("finished" if done(feds) else "running")
    return result


def done(feds: list[Federation]) -> bool:
    return any(fed.status != "running" for fed in feds) or all(
        fed.round >= fed.cfg.federation.rounds for fed in feds
    )


@dataclass
class Cadence:
    """When a trial checkpoints: every ``rounds``-th round, once ``seconds`` passed since the last, and at the end."""

    rounds: int | None = 1
    seconds: float | None = None
    clock: Callable[[], float] = time.monotonic
    _last: float = field(init=False)

    def __post_init__(self) -> None:
        self._last = self.clock()

    def due(self, round_: int, finished: bool) -> bool:
        """Whether to checkpoint after ``round_`` (``finished``: the last round); yes restarts the seconds."""
        now = self.clock()
        due = (finished or (self.rounds is not None and round_ % self.rounds == 0)
               or (self.seconds is not None and now - self._last >= self.seconds))
        if due:
            self._last = now
        return due


def restore(feds: list[Federation]) -> None:
    """Load every seed's state from the trial's latest checkpoint, if Tune gave it one."""
    checkpoint = tune.get_checkpoint()
    if checkpoint is None:
        return
    with checkpoint.as_directory() as folder:
        states = read_states(Path(folder))
    for fed, state in zip(feds, states):
        fed.load_state_dict(state)


def write_states(folder: Path, states: list[dict[str, Any]]) -> None:
    """Every seed's state streamed into ``folder``'s checkpoint file with protocol 5, which writes each array
    from its own buffer instead of a second in-memory copy; the round waits on it (docs/performance.md,
    "Streaming checkpoints"). An array comes back as it was (read-only stays read-only)."""
    with open(folder / STATE_FILE, "wb") as out:
        pickle.dump(states, out, protocol=CHECKPOINT_PROTOCOL)


def read_states(folder: Path) -> list[dict[str, Any]]:
    """The states ``write_states`` wrote, read as a stream (checkpoints of older jobs, protocol 4, too)."""
    with open(folder / STATE_FILE, "rb") as saved:
        return pickle.load(saved)


def report(result: dict[str, Any], feds: list[Federation], with_checkpoint: bool) -> None:
    """``tune.report`` the round, with a checkpoint of every seed's full state when asked."""
    if not with_checkpoint:
        tune.report(result)
        return
    with tempfile.TemporaryDirectory() as folder:
        write_states(Path(folder), [fed.state_dict() for fed in feds])
        tune.report(result, checkpoint=tune.Checkpoint.from_directory(folder))


def worker_nodes(feds: list[Federation]) -> str:
    """Node ids (short) hosting this trial's client actors: where the trial's work really runs."""
    refs = [actor.node_id.remote() for fed in feds if fed.pool for actor in fed.pool.actors]
    return ",".join(sorted({node[:8] for node in ray.get(refs)}))


def client_folder() -> Path:
    """Where this trial's client stores keep their logs (``engine/store.py``): in a path storage, so a restart on
    any node finds them; with a URI storage, the trial's folder on its node."""
    context = tune.get_context()
    storage = Path(context.get_storage().trial_fs_path)
    return (storage if storage.is_absolute() else Path(context.get_trial_dir())) / "clients"


def run_trial(config: dict[str, Any], spec: StudySpec) -> None:
    """Tune entry point: ``config`` holds the sampled parameters under their dotted names; a search that selects
    on validation trains without test data."""
    base = without_test(spec.base) if spec.space.on_validation else spec.base
    cfgs = seed_configs(set_fields(base, config), spec.space.seeds, spec.workers, spec.gpus_per_worker or 0.0)
    cadence = Cadence(spec.space.checkpoint_every, spec.space.checkpoint_seconds)
    run_federations(cfgs, spec.space.objective, cadence, extra=spec.space.trade_off)


def run_federations(cfgs: list[ExperimentConfig], objective: Objective, cadence: Cadence,
                    extra: Sequence[Objective] = (), at_end: Callable[[list[Federation]], None] | None = None) -> None:
    """The body of every fltune trial: one ``Federation`` per seed in lockstep, a report per round, a
    checkpoint when ``cadence`` says; ``extra`` objectives reported beside the main one; ``at_end`` then."""
    start = time.perf_counter()
    folder = client_folder()
    feds = [build_federation(cfg, folder=folder / f"seed{cfg.federation.seed}") for cfg in cfgs]
    try:
        restore(feds)
        open_all(feds)
        nodes = worker_nodes(feds)  # also waits until every client actor is up
        placement = {"startup_s": time.perf_counter() - start, "worker_nodes": nodes}
        if done(feds):  # restored from the final checkpoint: report the end again so Tune sees it
            report({**trial_result(feds, objective, extra), **placement}, feds, with_checkpoint=False)
            return
        for _ in lockstep(feds):
            result = {**trial_result(feds, objective, extra), **placement}
            report(result, feds, with_checkpoint=cadence.due(int(result["round"]), done(feds)))
        if at_end is not None:
            at_end(feds)
    finally:
        for fed in feds:
            fed.close()
