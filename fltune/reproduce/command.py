"""``python cli.py tables`` and ``python cli.py reproduce TABLE``. Exit status: 0 every runnable cell finished (cells
without data are reported, not errors); 1 some cell diverged or failed; 2 bad input; 130 interrupted, 143 on SIGTERM
(continue with ``--resume``)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import MISSING, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from fltune.cli_args import JOB_STORAGE, RAY_ADDRESS, every_flag, flag, path_text, seconds_flag, set_flag
from fltune.jobs.scaffold import (
    CELL_CHECKPOINT_EVERY, CELL_CHECKPOINT_SECONDS, GridJob, JobOptions, check_counts, listed,
)
from fltune.process import say_resume
from fltune.text import invoked_as

if TYPE_CHECKING:  # Ray Tune and MLflow load only when the command runs
    from fltune.config import ExperimentConfig
    from fltune.estimate import Plan
    from fltune.reproduce.job import ReproSpec
    from fltune.reproduce.plan import PlannedCell
    from fltune.reproduce.table import PaperTable
    from fltune.tune.board import TrialBoard
    from fltune.tune.mlflow_runs import RunTree
    from fltune.tune.results import TrialRow


@dataclass(frozen=True, kw_only=True)
class ReproduceOptions(JobOptions):
    """A reproduction as ``fltune reproduce``'s flags or ``fltune.reproduce``'s keywords ask for it."""

    shortcuts: ClassVar[tuple[str, ...]] = ("data_root",)
    table: str = flag("e.g. table2 (= simfafl:table2), simfafl:table3; see `fltune tables`", MISSING, honoured=True)
    datasets: tuple[str, ...] | None = flag("comma-separated subset of the table's datasets, e.g. fmnist", read=listed)
    rows: tuple[str, ...] | None = flag("comma-separated subset of the table's rows, e.g. FedAvg,SimFAFL", read=listed)
    scale: str = flag("quick (fits a laptop) or paper (the paper's settings)", "quick")
    seeds: int = flag("seeds per cell; a cell shows mean ± std", 1)
    overrides: tuple[str, ...] = set_flag("override a field of every cell, e.g. --set federation.rounds=5 (repeatable)")
    max_concurrent: int | None = flag("cells at once (default: as many as the cluster fits)")
    address: str | None = flag(RAY_ADDRESS, honoured=True)
    checkpoint_every: int | None = every_flag(f"{CELL_CHECKPOINT_EVERY}")
    checkpoint_seconds: float | None = seconds_flag(f"{CELL_CHECKPOINT_SECONDS:g}")
    storage: str | None = flag(JOB_STORAGE, read=path_text, honoured=True)
    name: str | None = flag("job name (default: <paper>-<table>-<scale>-<time>)", honoured=True)
    out: str | None = flag("folder for table.csv and table.md (default: reproduce/<name> beside the sqlite store of "
                           "tracking.uri: mlruns/reproduce/<name>)", read=path_text, honoured=True)
    resume: bool = flag("continue an interrupted job (--name, else the newest job of TABLE)", False, honoured=True)
    plan: bool = flag("print the cells, their settings, client-samples and an estimated wall time; run nothing",
                      False, honoured=True)

    def checked(self) -> ReproduceOptions:
        return self

    def job(self) -> Reproduction:
        return Reproduction(self)

    def planned(self) -> Plan:
        """``--plan``: the cells with their settings and cost (fltune/estimate.py); writes nothing."""
        from fltune.estimate import Plan
        from fltune.reproduce.registry import get_table
        from fltune.reproduce.report import row_lines

        table = get_table(self.table)
        planned = selection(self, table)
        notes = row_lines(table, [p.cell.row for p in planned])
        notes += [f"{sum(not p.runnable for p in planned)} cell(s) without data are not counted"] * any(
            not p.runnable for p in planned)
        notes += list(dict.fromkeys(f"  {p.missing}" for p in planned if p.missing))
        notes += [f"{sum(p.fetched for p in planned)} cell(s) whose data data.download fetches when the job runs "
                  "are not counted"] * any(p.fetched for p in planned)
        cells = [(p.cell.key, p.tree, self.seeds) for p in planned if p.runnable and not p.fetched]
        return Plan.of(f"plan: {table.key} at {self.scale} scale, {len(cells)} runnable cell(s) × {self.seeds} "
                       "seed(s)", cells, self.address, self.max_concurrent, notes)


def cmd_tables(args: argparse.Namespace) -> int:
    from rich.table import Table

    from fltune.reproduce.plan import available
    from fltune.reproduce.registry import ALIASES, all_tables
    from fltune.reproduce.table import DATASET_NAMES
    from fltune.tracking.progress import listing

    short = {v: k for k, v in ALIASES.items()}
    out = Table(title=f"paper tables ({invoked_as()} reproduce NAME)", show_lines=True)
    for column in ("name", "table (source)", "cells", "datasets (✓ here)"):
        out.add_column(column)
    tables = all_tables()
    here = {d: available(d, None) is None for d in dict.fromkeys(d for t in tables for d in t.datasets)}
    for table in tables:
        data = ", ".join(f"{DATASET_NAMES.get(d, d)} {'✓' if here[d] else '✗'}" for d in table.datasets)
        name = table.key + (f"\n= {short[table.key]}" if table.key in short else "")
        out.add_row(name, f"{table.title} ({table.source})", str(len(table.cells)), data)
    listing.print(out)
    listing.print("scales: " + ", ".join(sorted({k for t in tables for k in t.scales}))
                  + " (--scale; `reproduce` prints what each means)")
    return 0


class Reproduction(GridJob["ReproSpec"]):
    """A paper table's cells as Tune trials."""

    options: ReproduceOptions

    def __init__(self, options: ReproduceOptions) -> None:
        from fltune.reproduce.registry import get_table

        super().__init__(options)
        self.table = get_table(options.table)
        self.command = f"reproduce {self.table.key}"

    def new_spec(self, storage: str) -> ReproSpec:
        """Validate and plan the cells (before Ray starts)."""
        from fltune.reproduce import job

        options = self.options
        return job.new_spec(self.table, options.scale, selection(options, self.table), seeds=options.seeds,
                            storage=storage, name=options.name, out=options.out, max_concurrent=options.max_concurrent,
                            checkpoint_every=options.checkpoint_every or CELL_CHECKPOINT_EVERY,
                            checkpoint_seconds=options.checkpoint_seconds or CELL_CHECKPOINT_SECONDS)

    def saved_spec(self, storage: str) -> ReproSpec:
        """``--name``, else the newest job of this table; ``--out`` may move its files (not part of the job)."""
        from fltune.reproduce.job import ReproSpec

        key = self.table.key
        spec = ReproSpec.resumed(storage, self.options.name, f"job of {key}", lambda saved: saved.table == key)
        return spec.model_copy(update={"out": self.options.out}) if self.options.out else spec

    def out(self, spec: ReproSpec) -> str | None:
        return spec.out

    def experiment(self, spec: ReproSpec) -> dict[str, Any]:
        return next(iter(spec.cells.values())).tree

    def trial_configs(self, spec: ReproSpec) -> list[ExperimentConfig]:
        from fltune.config import build_config

        return [build_config(run.tree) for run in spec.cells.values()]

    def entry(self) -> Callable[[dict[str, Any], ReproSpec], None]:
        from fltune.jobs.cells import run_cell

        return run_cell

    def cells(self, spec: ReproSpec) -> list[str]:
        """The distinct experiments, each run once (its seeds inside)."""
        return spec.trial_order or list(spec.trials)

    def board(self, spec: ReproSpec) -> TrialBoard:
        from fltune.reproduce.report import live_cells
        from fltune.tune.board import TrialBoard

        return TrialBoard(spec, live_cells)

    def run_tree(self) -> type[RunTree]:
        from fltune.reproduce.mlflow_runs import ReproLog

        return ReproLog

    def describe(self, spec: ReproSpec, nodes: int) -> str:
        """The header; at paper scale also its cost estimate (fltune/estimate.py)."""
        from fltune.reproduce.report import row_lines

        table = spec.paper_table
        subs = sorted({c.substituted for c in spec.cells.values() if c.substituted})
        header = (
            f"[bold]fltune reproduce[/] {'resuming ' if self.options.resume else ''}{table.key} ({table.source}) · "
            f"{spec.scale} scale: {table.scales[spec.scale].note} · {len(spec.cells)} cells"
            + (f" in {len(spec.trials)} runs" if len(spec.trials) < len(spec.cells) else "")
            + f" × {spec.seeds} seed(s)"
            + (f", {len(spec.missing)} without data" if spec.missing else "")
            + (f" · substituted {', '.join(subs)}, {spec.scale} scale" if subs else "")
            + f"\n  per cell: {spec.workers} client worker(s) on a {nodes}-node cluster · folder {spec.path}"
            + "".join(f"\n  {line}" for line in row_lines(table, [table.cell(key).row for key in spec.cells]))
        )
        if spec.scale != "paper":
            return header
        import ray

        from fltune.estimate import estimate, summary

        cells = [(key, run.tree, spec.seeds) for key, run in spec.cells.items()]
        reordered = spec.trial_order is not None and spec.trial_order != list(spec.trials)
        order = " · runs start longest first by this estimate" if reordered else ""
        return header + "\n  " + summary(estimate(cells, ray.cluster_resources(), spec.max_concurrent)) + order

    def conclude(self, spec: ReproSpec, rows: list[TrialRow]) -> int:
        """The side-by-side table, the files, what had no data, and the exit status."""
        from fltune.reproduce.report import results, rich_table, write_outputs
        from fltune.tracking.progress import console
        from fltune.tune.results import any_unscored, said_failed

        res = results(spec, rows)
        console.print(rich_table(spec, res))
        paths = write_outputs(spec, res, Path(spec.out))
        console.print(f"written: {', '.join(str(p) for p in paths)}")
        for dataset_note in sorted({r.note for r in res if r.status == "no data"}):
            console.print(f"[dim]no data:[/] {dataset_note}")
        diverged = [f"{r.cell.row} | {r.cell.dataset} {r.cell.column} (round {r.round})"
                    for r in res if r.status == "diverged"]
        if diverged:
            console.print(f"diverged (loss or weights NaN/inf; the number shown is the last evaluation before): "
                          f"{'; '.join(diverged)}")
        if any(r.status in ("running", "pending") for r in res):
            say_resume("job interrupted", self.resume_command(spec))
            return 130
        return said_failed(rows, "cells") or (1 if any_unscored(r.status for r in res) else 0)


def selection(options: ReproduceOptions, table: PaperTable) -> list[PlannedCell]:
    """The cells of ``datasets`` and ``rows`` planned with every override."""
    from fltune.reproduce.plan import plan

    check_counts(options)
    return plan(table, options.scale, options.datasets, options.overrides, options.rows)

