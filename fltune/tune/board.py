"""The study in the terminal: a live rich table of trials while it runs, the ranking when it ends."""

from __future__ import annotations

import math
import time
from typing import Any

from ray.tune import Callback
from ray.tune.experiment import Trial
from rich.live import Live
from rich.table import Table

from fltune.tracking.console import console
from fltune.tune.results import ENDED, TrialRow, rank, trial_row
from fltune.tune.spec import StudySpec

STYLE = {"finished": "green", "stopped": "yellow", "diverged": "red", "failed": "red", "running": "cyan",
         "pending": "dim", "killed": "magenta"}


def shown(value: Any) -> str:
    if isinstance(value, float):
        return "—" if math.isnan(value) else f"{value:.4g}"
    return str(value)


def trials_table(rows: list[TrialRow], spec: StudySpec, title: str, ranked: bool = False) -> Table:
    """State, parameters, round and objective per trial; with ``ranked``, best first and numbered."""
    table = Table(title=title, show_lines=False)
    if ranked:
        table.add_column("#", justify="right")
    table.add_column("trial")
    table.add_column("state")
    for name in spec.space.params:
        table.add_column(name, justify="right")
    table.add_column("round", justify="right")
    objective = spec.space.objective
    table.add_column(f"{objective.metric} ({objective.reduce}, {objective.direction})", justify="right")
    if spec.space.seeds > 1:
        table.add_column("± std", justify="right")
    table.add_column("nodes")
    for i, row in enumerate(rank(rows, objective.direction) if ranked else rows, 1):
        cells = [str(i)] if ranked else []
        cells += [row.trial_id, f"[{STYLE.get(row.status, '')}]{row.status}[/]"]
        cells += [shown(row.params.get(name, "—")) for name in spec.space.params]
        cells += [f"{row.round}/{spec.rounds}", shown(row.objective)]
        if spec.space.seeds > 1:
            cells.append(shown(row.objective_std))
        cells.append(str(row.metrics.get("worker_nodes", "")))
        table.add_row(*cells)
    return table


class TrialBoard(Callback):
    """Tune callback redrawing the trials table at most twice a second (driver side). Holds only the
    spec when pickled into the study folder; the rich Live display is created in ``setup``."""

    def __init__(self, spec: StudySpec) -> None:
        self.spec = spec
        self.live: Live | None = None
        self.drawn = 0.0

    def __getstate__(self) -> dict[str, Any]:
        return {"spec": self.spec, "live": None, "drawn": 0.0}

    def setup(self, **info: Any) -> None:
        self.live = Live(console=console, refresh_per_second=2, transient=True)
        self.live.start()

    def on_step_end(self, iteration: int, trials: list[Trial], **info: Any) -> None:
        if time.monotonic() - self.drawn >= 0.5:
            self.draw(trials)

    def draw(self, trials: list[Trial]) -> None:
        rows = [trial_row(t) for t in trials]
        done = sum(r.status in ENDED for r in rows)
        title = f"study {self.spec.name}: {done}/{self.spec.space.num_samples} trials done"
        self.live.update(trials_table(rows, self.spec, title))
        self.drawn = time.monotonic()

    def on_experiment_end(self, trials: list[Trial], **info: Any) -> None:
        self.live.stop()
