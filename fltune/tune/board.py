"""The study in the terminal: a live rich table of trials while it runs, the ranking when it ends."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import ray
from ray.tune import Callback
from ray.tune.experiment import Trial
from rich.live import Live
from rich.table import Table

from fltune.tracking.progress import console
from fltune.tune.results import ENDED, TrialRow, error_line, latest_trace, rank, trial_row
from fltune.tune.spec import StudySpec

STYLE = {"finished": "green", "stopped": "yellow", "diverged": "red", "failed": "red", "running": "cyan",
         "pending": "dim", "killed": "magenta"}


def shown(value: Any) -> str:
    if isinstance(value, float):
        return "—" if math.isnan(value) else f"{value:.4g}"
    return str(value)


def config_table(title: str, names: Iterable[str], columns: Iterable[str],
                 rows: Iterable[tuple[Mapping[str, Any], Iterable[str]]]) -> Table:
    """One line per configuration (its parameters ``names``, "—" where it has none, then its cells), every
    column right-aligned: the confirmation's and the Pareto front's tables."""
    names = list(names)
    table = Table(title=title)
    for name in [*names, *columns]:
        table.add_column(name, justify="right")
    for params, cells in rows:
        table.add_row(*(shown(params.get(name, "—")) for name in names), *cells)
    return table


def params_text(params: dict[str, Any], sep: str = ", ") -> str:
    """Each parameter as ``name=value`` (floats to 4 significant digits): a trial's in a log, the best's."""
    return sep.join(f"{name}={shown(value)}" for name, value in params.items())


def trials_table(rows: list[TrialRow], spec: StudySpec, title: str, ranked: bool = False) -> Table:
    """State, parameters, round, objective (and nodes, on several) per trial; ``ranked``: best first."""
    nodes = {node["NodeID"][:8]: node["NodeManagerAddress"]  # as ``trainable.worker_nodes`` names them
             for node in (ray.nodes() if ray.is_initialized() else []) if node.get("Alive")}
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
    if len(nodes) > 1:
        table.add_column("nodes")
    for i, row in enumerate(rank(rows, objective.direction) if ranked else rows, 1):
        cells = [str(i)] if ranked else []
        cells += [row.trial_id, f"[{STYLE.get(row.status, '')}]{row.status}[/]"]
        cells += [shown(row.params.get(name, "—")) for name in spec.space.params]
        cells += [f"{row.round}/{spec.rounds}", shown(row.objective)]
        if spec.space.seeds > 1:
            cells.append(shown(row.objective_std))
        if len(nodes) > 1:
            ids = str(row.metrics.get("worker_nodes", "")).split(",")
            cells.append(",".join(nodes.get(node, node) for node in ids))
        table.add_row(*cells)
    return table


def trial_label(row: TrialRow) -> str:
    """A trial as a log names it: the cell of a reproduce or compare job, a confirmation's configuration (its
    cell is the parameters' JSON), else its id and parameters."""
    cell = str(row.params.get("cell", ""))
    if cell.startswith("{"):
        return params_text(json.loads(cell))
    return cell or f"{row.trial_id} ({params_text(row.params)})"


def live_table(spec: StudySpec, rows: list[TrialRow], planned: Planned | None = None) -> Table:
    """The study's board while it runs."""
    done, total = sum(r.status in ENDED for r in rows), spec.space.num_samples
    return trials_table(rows, spec, f"study {spec.name}: {done}/{total} trials done{eta(rows, total, planned=planned)}")


Planned = tuple[float, float]
"""When the job's trials started (``time.time()``) and the seconds ``fltune.estimate`` planned for them all."""


def eta(rows: list[TrialRow], trials: int, costs: Mapping[str, float] | None = None,
        planned: Planned | None = None) -> str:
    """', ETA ~m min': the ``trials`` left over how many ran at once, at the finished ones' pace; before any ends,
    ``planned_eta``, else blank. How many ran at once comes from the finished spans, not Tune's "running" (it
    starts a whole grid). Training trials count half; ``costs`` (label → estimated seconds) weigh the trials."""
    ended = [r for r in rows if r.status in ENDED and {"time_total_s", "timestamp"} <= r.metrics.keys()]
    if not ended:
        return planned_eta(planned) if planned else ""
    spans = [(r.metrics["timestamp"] - r.metrics["time_total_s"], r.metrics["timestamp"]) for r in ended]

    def cost(row: TrialRow) -> float:
        return costs.get(str(row.params.get("cell")), 1.0) if costs else 1.0

    training = [r for r in rows if r.status == "running" and r.round > 0]
    total = sum(costs.values()) if costs else trials
    left = max(0.0, total - sum(map(cost, ended)) - sum(map(cost, training)) / 2)
    pace = sum(end - start for start, end in spans) / sum(map(cost, ended))
    return f", ETA ~{left * pace / most_at_once(spans) / 60:.0f} min"


def planned_eta(planned: Planned) -> str:
    """', ETA ~m min (plan)'; the plan is a lower bound (no evaluation), so once passed it says so."""
    started, seconds = planned
    left = seconds - (time.time() - started)
    if left < 30:
        return f", past the plan's ~{seconds / 60:.0f} min"
    return f", ETA ~{max(1, round(left / 60))} min (plan)"


def most_at_once(spans: list[tuple[float, float]]) -> int:
    """The most (start, end) spans overlapping by over a second (Tune's ``timestamp`` is whole seconds)."""
    events = sorted([(start + 1.0, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    most = now = 0
    for _, step in events:  # at equal times ends (-1) sort first: spans that only touch don't overlap
        now += step
        most = max(most, now)
    return max(most, 1)


Render = Callable[[Any, list[TrialRow], Planned | None], Table]


class TrialBoard(Callback):
    """Tune callback redrawing ``render(spec, rows, planned)`` at most twice a second. Pickles only the spec,
    the module-level renderer and ``planned_s``; the Live display is created in ``setup``."""

    def __init__(self, spec: Any, render: Render = live_table, planned_s: float | None = None) -> None:
        self.spec, self.render, self.planned_s = spec, render, planned_s

    def __getstate__(self) -> dict[str, Any]:
        return {"spec": self.spec, "render": self.render, "planned_s": self.planned_s}

    def setup(self, **info: Any) -> None:
        self.planned: Planned | None = (time.time(), self.planned_s) if self.planned_s else None
        self.drawn = 0.0
        self.ending: set[str] = set()
        self.logged: set[str] = set()
        self.live = Live(console=console, refresh_per_second=2, transient=True)
        self.live.start()

    def on_step_end(self, iteration: int, trials: list[Trial], **info: Any) -> None:
        if time.monotonic() - self.drawn >= 0.5:
            self.draw(trials)

    def draw(self, trials: list[Trial]) -> None:
        """The live table in a terminal; in a log, where Rich shows no live display, the trials that ended."""
        if console.is_terminal:
            self.live.update(self.render(self.spec, [trial_row(t) for t in trials], self.planned))
        else:
            self.log_ended(trials)
        self.drawn = time.monotonic()

    def on_trial_complete(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        self.ending.add(trial.trial_id)

    on_trial_error = on_trial_complete

    def log_ended(self, trials: list[Trial]) -> None:
        """In a log, a line per trial that ended in this process (a resumed job repeats none)."""
        rows = [trial_row(t) for t in trials]
        ended = [row for row in rows
                 if row.status in ENDED and row.trial_id in self.ending and row.trial_id not in self.logged]
        if not ended:
            return
        title = self.render(self.spec, rows, self.planned).title
        for row in ended:
            self.logged.add(row.trial_id)
            console.print(f"{title} · {trial_label(row)} {row.status} at round {row.round}, objective "
                          f"{shown(row.objective)}", markup=False, highlight=False, soft_wrap=True)

    def on_trial_recover(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        """A crashed trial restarting: one line saying why (Tune's traceback is off: ``jobs.scaffold.JOB_ENV``)."""
        console.print(f"{trial_label(trial_row(trial))}: attempt {trial.run_metadata.num_failures} failed, "
                      f"restarting from its last checkpoint: {error_line(latest_trace(trial))}",
                      markup=False, highlight=False, soft_wrap=True)

    def on_experiment_end(self, trials: list[Trial], **info: Any) -> None:
        if not console.is_terminal:
            self.log_ended(trials)
        self.live.stop()
