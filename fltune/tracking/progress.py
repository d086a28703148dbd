"""Terminal output with rich: a live progress bar over rounds, then a summary table."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from fltune.engine.callbacks import Callback

if TYPE_CHECKING:
    from fltune.engine.federation import Federation

LOG_WIDTH = 400
"""Columns of a log, where Rich assumes 80: the tables (a comparison's is ~200 wide) would cut every figure
to "61.…". Tables keep their natural width below it; $COLUMNS still wins."""


def _console() -> Console:
    """stderr's console: the terminal's width, or ``LOG_WIDTH`` when stderr is a file or a pipe."""
    out = Console(stderr=True)
    if not out.is_terminal and "COLUMNS" not in os.environ:
        out.width = LOG_WIDTH
    return out


console = _console()


class ProgressCallback(Callback):
    """Rounds done, ETA, and the latest accuracy / loss / s per round."""

    def __init__(self, description: str) -> None:
        self.progress = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.fields[info]}"), TimeElapsedColumn(), TimeRemainingColumn(), console=console,
            transient=False, disable=not (console.is_terminal or console.is_jupyter),  # a log: on_round's lines
        )
        self.description = description
        self.task = None
        self.latest: dict[str, float] = {}
        self.info = ""
        """The last round's figures (shown after the name of the probe running, if any)."""

    def on_start(self, fed: Federation) -> None:
        self.progress.start()
        self.task = self.progress.add_task(
            self.description, total=fed.cfg.federation.rounds, completed=fed.round, info="training …",
        )

    def on_probe(self, fed: Federation, round_: int, probe: str) -> None:
        self.progress.update(self.task, info=f"round {round_}: {probe} … {self.info}")

    def on_round(self, fed: Federation, metrics: dict[str, float]) -> None:
        self.latest.update({k: v for k, v in metrics.items() if k.startswith("acc_") or k == "loss"})
        accs = " ".join(f"{k.removeprefix('acc_')}={v:.4f}" for k, v in self.latest.items() if k.startswith("acc_"))
        self.info = info = f"{accs} train_loss={metrics['train_loss']:.4f} {metrics['round_s']:.1f}s/round"
        self.progress.update(self.task, completed=int(metrics["round"]), info=info)
        if not (console.is_terminal or console.is_jupyter):  # logs (CI, `ray job submit`): a line per round
            console.print(f"round {int(metrics['round'])}/{fed.cfg.federation.rounds} {info}", soft_wrap=True)

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
