"""Terminal output with rich: a live progress bar over rounds, then a summary table."""

from __future__ import annotations

import datetime
import os
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from rich.console import Console, RenderableType
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from fltune.engine.callbacks import Callback
from fltune.metrics.evaluation import ACCURACY_KEYS

if TYPE_CHECKING:
    from fltune.engine.federation import Federation

LOG_WIDTH = 400
"""Columns of a log, where Rich assumes 80 and would cut wide tables' figures to "61.…"; $COLUMNS wins."""


def _console(stderr: bool = True) -> Console:
    """stderr's (or stdout's) console: the terminal's width, or ``LOG_WIDTH`` when it is a file or a pipe."""
    out = Console(stderr=stderr)
    if not out.is_terminal and "COLUMNS" not in os.environ:
        out.width = LOG_WIDTH
    return out


console = _console()
"""Progress and diagnostics: stderr, so that a command's output can be piped while the user watches."""
listing = _console(stderr=False)
"""What a command is asked for (``methods``, ``tables``): stdout, for ``| grep`` and ``> file``."""


class RunProgress(Progress):
    """Rich's bar with each task's figures (``info``) on their own line under it, cut at the terminal's edge,
    so they do not squeeze the bar."""

    def get_renderables(self) -> Iterable[RenderableType]:
        yield self.make_tasks_table(self.tasks)
        for task in self.tasks:
            yield Text(f"  {task.fields.get('info', '')}", no_wrap=True, overflow="ellipsis")


class ProgressCallback(Callback):
    """Rounds done, pace, ETA and the latest accuracy / loss: a bar in a terminal, a line per round in a log."""

    def __init__(self, description: str) -> None:
        self.progress = RunProgress(
            TextColumn("[bold]{task.description}"), BarColumn(bar_width=30), MofNCompleteColumn(),
            TextColumn("{task.fields[pace]}"), TimeElapsedColumn(), console=console, transient=False,
            disable=not (console.is_terminal or console.is_jupyter),  # a log: on_round's lines alone
        )
        self.description = description
        self.task = None
        self.latest: dict[str, float] = {}
        self.info = ""
        """The last round's figures (shown after the name of the probe running, if any)."""
        self.clock: tuple[float, int] = (0.0, 0)
        """Since when, and which round, the pace is measured: this process's first round (a resume's earlier
        rounds took no time here), then its end, whose one-off costs would skew the ETA."""
        self.first_done = False

    def on_start(self, fed: Federation) -> None:
        self.progress.start()
        self.clock, self.first_done = (time.monotonic(), fed.round), False
        self.task = self.progress.add_task(
            self.description, total=fed.cfg.federation.rounds, completed=fed.round, info="training …", pace="",
        )

    def on_probe(self, fed: Federation, round_: int, probe: str) -> None:
        self.progress.update(self.task, info=f"round {round_}: {probe} … {self.info}")

    def on_round(self, fed: Federation, metrics: dict[str, float]) -> None:
        self.latest.update({k: v for k, v in metrics.items() if k in ACCURACY_KEYS})
        accs = " ".join(f"{k.removeprefix('acc_')}={v:.4f}" for k, v in self.latest.items())
        self.info = info = f"{accs} train_loss={metrics['train_loss']:.4f}"
        done, total = int(metrics["round"]), fed.cfg.federation.rounds
        # from the rounds this process ran; Rich's own ETA shows -:--:-- once a round outlasts its half-minute window
        since, since_round = self.clock
        per_round = (time.monotonic() - since) / (done - since_round)
        speed = f"{per_round:.1f} s/round, ETA {datetime.timedelta(seconds=round(per_round * (total - done)))}"
        if not self.first_done:
            self.clock, self.first_done = (time.monotonic(), done), True
        self.progress.update(self.task, completed=done, info=info, pace=speed)
        if not (console.is_terminal or console.is_jupyter):  # logs (CI, `ray job submit`): a line per round
            console.print(f"round {done}/{total} {speed} {info}", soft_wrap=True, markup=False, highlight=False)

    def on_end(self, fed: Federation, summary: dict[str, Any]) -> None:
        self.progress.stop()


def summary_table(summary: dict[str, Any], title: str) -> Table:
    table = Table(title=title, show_header=True)
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, value in summary.items():
        shown = f"{value:.4f}" if isinstance(value, float) else ("—" if value is None else str(value))
        table.add_row(key, shown)
    return table
