"""The trials' checkpoint cadence: when it checkpoints, and that a trial restarted from a checkpoint some
rounds back ends with the numbers of an unbroken run."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest
from ray import tune
from rich.table import Table

from fltune.assembly import build_federation
from fltune.config import build_config
from fltune.tune.board import TrialBoard
from fltune.tune.space import Objective
from fltune.tune.trainable import Cadence, run_federations

ROUNDS = 6
TINY = [
    "data.dataset=synthetic", "model.name=mlp", "partition.kind=dirichlet_prior", "federation.clients=4",
    "federation.fraction=0.5", f"federation.rounds={ROUNDS}", "training.local_epochs=1", "training.batch_size=64",
    "metrics.protocols=[global]", "resources.workers=1", "tracking.enabled=false",
]


class Clock:
    """Seconds that pass only when the test says so."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def due_rounds(cadence: Cadence, clock: Clock, seconds_per_round: list[float], last: int) -> list[int]:
    out = []
    for round_, seconds in enumerate(seconds_per_round, start=1):
        clock.now += seconds
        if cadence.due(round_, finished=round_ == last):
            out.append(round_)
    return out


def test_cadence_by_rounds_by_seconds_and_always_at_the_end() -> None:
    clock = Clock()
    assert due_rounds(Cadence(3, None, clock), clock, [1.0] * 7, last=7) == [3, 6, 7]
    clock = Clock()  # 60 s since the last checkpoint (or the start), whichever round that falls on
    assert due_rounds(Cadence(None, 60.0, clock), clock, [25.0, 25.0, 25.0, 60.0, 5.0, 5.0], last=6) == [3, 4, 6]
    clock = Clock()  # both: whichever comes first, the seconds counted from the last checkpoint of either kind
    assert due_rounds(Cadence(4, 60.0, clock), clock, [50.0, 20.0, 1.0, 1.0, 59.0, 0.5, 0.5], last=7) == [2, 4, 7]
    clock = Clock()
    assert due_rounds(Cadence(1, None, clock), clock, [1.0] * 3, last=3) == [1, 2, 3]


class KillOnce(tune.Callback):
    """Kill the trial's process (SIGKILL, a lost node's worth) right after it reports round ``at``; ``seen``:
    every round the trial reported, in order. The callback runs in this process and sees each result as
    Tune gets it, whereas Tune's progress file of a restarted trial keeps only what its last sync to storage
    held before the restart (``metrics_dataframe`` lost rounds 1-4 once in CI), so the order is checked here."""

    def __init__(self, at: int) -> None:
        self.at, self.killed, self.seen = at, False, []

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
        self.seen.append(int(result["round"]))
        if not self.killed and int(result["round"]) == self.at:
            self.killed = True
            os.kill(result["pid"], signal.SIGKILL)


def cadence_board(spec: Any, rows: list, planned: Any) -> Table:
    return Table(title="cadence")


def cadence_trial(config: dict[str, Any]) -> None:
    run_federations([build_config(overrides=TINY)], Objective(metric="acc_global"), Cadence(config["every"]))


@pytest.mark.slow
@pytest.mark.extended
def test_a_trial_restarted_from_an_earlier_checkpoint_ends_as_an_unbroken_run(ray_session, tmp_path: Path,
                                                                               capsys) -> None:
    unbroken = build_federation(build_config(overrides=TINY))
    try:
        unbroken.run()
    finally:
        unbroken.close()

    # checkpoints after rounds 3 and 6: killed after reporting round 4, the trial restarts from round 3
    trainable = tune.with_resources(cadence_trial, tune.PlacementGroupFactory([{"CPU": 0}, {"CPU": 1}]))
    killer = KillOnce(at=4)
    tuner = tune.Tuner(trainable, param_space={"every": 3}, run_config=tune.RunConfig(
        name="cadence", storage_path=str(tmp_path), callbacks=[killer, TrialBoard(None, cadence_board)], verbose=0,
        failure_config=tune.FailureConfig(max_failures=1),
    ))
    result = tuner.fit()[0]
    assert result.error is None
    assert killer.seen == [1, 2, 3, 4, 4, 5, ROUNDS]  # round 4 replayed from the checkpoint of round 3
    restarts = [line for line in capsys.readouterr().err.splitlines() if "restarting" in line]
    assert len(restarts) == 1 and restarts[0].startswith(f"{result.metrics['trial_id']} (every=3): attempt 1 "
                                                         "failed, restarting from its last checkpoint: "), restarts
    final = unbroken.history[-1]
    assert (result.metrics["acc_global"], result.metrics["train_loss"]) == (final["acc_global"], final["train_loss"])
