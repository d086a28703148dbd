"""``python cli.py tables`` and ``python cli.py reproduce TABLE``.

``reproduce`` re-runs a paper table's cells as Ray Tune trials and prints the paper's numbers beside the
measured ones (rich table, ``table.csv``/``table.md`` under ``--out``, MLflow parent + child runs).
Exit status: 0 every runnable cell finished (cells without data are reported, not errors); 1 some cell
diverged or failed; 2 bad input; 130 interrupted (continue with ``--resume``).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from typing import TYPE_CHECKING

from fltune.errors import FLTuneError

if TYPE_CHECKING:  # Ray Tune and MLflow load only when the command runs
    from ray.tune import Tuner

    from fltune.reproduce.job import ReproSpec
    from fltune.tune.results import TrialRow

RESUME_HINT = "python cli.py reproduce {table} --name {name} --storage {storage} --resume"


def add_parsers(sub: argparse._SubParsersAction) -> None:
    sub.add_parser("tables", help="paper tables that `reproduce` can re-run, with their sources and data")
    p = sub.add_parser("reproduce", help="re-run a paper table (Ray Tune trials) beside the paper's numbers")
    p.add_argument("table", help="e.g. table2 (= simfafl:table2), simfafl:table3; see `cli.py tables`")
    p.add_argument("--datasets", help="comma-separated subset of the table's datasets, e.g. fmnist")
    p.add_argument("--rows", help="comma-separated subset of the table's rows, e.g. FedAvg,SimFAFL")
    p.add_argument("--scale", default="quick", help="quick (fits a laptop) or paper (the paper's settings)")
    p.add_argument("--seeds", type=int, default=1, help="seeds per cell; a cell shows mean ± std")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                   help="override a field of every cell, e.g. --set federation.rounds=5 (repeatable)")
    p.add_argument("--data-root", help="= --set data.root=DIR (torchvision's files)")
    p.add_argument("--max-concurrent", type=int, help="cells at once (default: as many as the cluster fits)")
    p.add_argument("--address", help="join a running Ray cluster ('auto', host:port; default: $RAY_ADDRESS or local)")
    p.add_argument("--storage", help="job folder root, local or a URI (default: ./studies)")
    p.add_argument("--name", help="job name (default: <paper>-<table>-<scale>-<time>)")
    p.add_argument("--out", help="folder for table.csv and table.md (default: mlruns/reproduce/<name>)")
    p.add_argument("--resume", action="store_true", help="continue an interrupted job (needs --name)")
    p.add_argument("--plan", action="store_true",
                   help="print the cells, their settings, client-samples and an estimated wall time; run nothing")


def cmd_tables(args: argparse.Namespace) -> int:
    from rich.table import Table

    from fltune.reproduce.plan import available
    from fltune.reproduce.registry import ALIASES, DATASET_NAMES, all_tables
    from fltune.tracking.console import console

    short = {v: k for k, v in ALIASES.items()}
    out = Table(title="paper tables (python cli.py reproduce NAME)", show_lines=True)
    for column in ("name", "table (source)", "cells", "datasets (✓ here)"):
        out.add_column(column)
    tables = all_tables()
    here = {d: available(d, None) is None for d in dict.fromkeys(d for t in tables for d in t.datasets)}
    for table in tables:
        data = ", ".join(f"{DATASET_NAMES.get(d, d)} {'✓' if here[d] else '✗'}" for d in table.datasets)
        name = table.key + (f"\n= {short[table.key]}" if table.key in short else "")
        out.add_row(name, f"{table.title} ({table.source})", str(len(table.cells)), data)
    console.print(out)
    console.print("scales: " + ", ".join(sorted({k for t in tables for k in t.scales}))
                  + " (--scale; `reproduce` prints what each means)")
    return 0


def cmd_reproduce(args: argparse.Namespace) -> int:
    from ray.tune import ExperimentAnalysis

    from fltune.tune.results import trial_row

    if args.plan:
        return show_plan(args)
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # the board is the output, as for `tune`
    os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
    spec, tuner = prepare(args)
    try:
        tuner.fit()
    except BaseException:
        if spec.tracking.enabled:
            from fltune.tune.tracking import close_open_runs

            close_open_runs(spec.tracking, spec.path, "killed")
        raise
    rows = [trial_row(trial) for trial in ExperimentAnalysis(spec.path).trials]
    return conclude(spec, rows)


def prepare(args: argparse.Namespace) -> tuple[ReproSpec, Tuner]:
    """Validate and plan (before Ray starts), join or start Ray, size the trials, create or restore."""
    from fltune.engine.pool import ensure_ray
    from fltune.reproduce import job
    from fltune.reproduce.plan import plan
    from fltune.reproduce.registry import get_table
    from fltune.tracking.console import console
    from fltune.tune import study

    table = get_table(args.table)
    if args.seeds < 1:
        raise FLTuneError(f"--seeds: {args.seeds}; allowed: ≥ 1")
    if args.max_concurrent is not None and args.max_concurrent < 1:
        raise FLTuneError(f"--max-concurrent: {args.max_concurrent}; allowed: ≥ 1 (or leave it out: as many as fit)")
    storage = study.storage_root(study.StudyRequest(space=None, storage=args.storage))
    if args.resume:
        if not args.name:
            raise FLTuneError("--resume: name the job with --name (its folder under --storage)")
        spec = job.ReproSpec.load(f"{storage.rstrip('/')}/{args.name}")
        if args.out:  # where the files go is not part of the job: a resumed job may write them elsewhere
            spec = spec.model_copy(update={"out": args.out})
    else:
        datasets, rows, overrides = selection(args)
        planned = plan(table, args.scale, datasets, overrides, rows)
        spec = job.new_spec(table, args.scale, planned, seeds=args.seeds, storage=storage, name=args.name,
                            out=args.out, max_concurrent=args.max_concurrent, datasets=datasets)
        if study.exists(spec.path):
            raise FLTuneError(f"--name {spec.name}: job {spec.path} already exists; add --resume to continue it")
    address = args.address or build_address(spec)
    try:
        ensure_ray(address)
    except ConnectionError as err:
        raise FLTuneError(f"--address {address or '$RAY_ADDRESS'}: {err}") from None
    cluster, node_cpus = study.cluster_shape()
    spec = with_gpu_share(spec, cluster)
    first = next(iter(spec.cells.values())).tree
    resources = study.placement(first, spec.workers, spec.gpus_per_worker, cluster, node_cpus)
    if args.resume:
        tuner = job.restored_tuner(spec, resources)
    else:
        spec.save()
        tuner = job.new_tuner(spec, resources, callbacks(spec))
    console.print(describe(spec, len(node_cpus), args.resume))
    if spec.scale == "paper":
        from fltune.estimate import estimate, summary

        cells = [(key, run.tree, spec.seeds) for key, run in spec.cells.items()]
        console.print("  " + summary(estimate(cells, cluster, spec.max_concurrent)), highlight=False)
    return spec, tuner


def selection(args: argparse.Namespace) -> tuple[list[str] | None, list[str] | None, list[str]]:
    """--datasets, --rows and the overrides (--data-root first, then every --set)."""
    overrides = [*([f"data.root={args.data_root}"] if args.data_root else []), *args.overrides]
    return (args.datasets.split(",") if args.datasets else None, args.rows.split(",") if args.rows else None,
            overrides)


def show_plan(args: argparse.Namespace) -> int:
    """``--plan``: the job's cells with their settings and cost (see fltune/estimate.py); nothing is written."""
    from fltune.estimate import print_plan
    from fltune.reproduce.plan import plan
    from fltune.reproduce.registry import get_table
    from fltune.reproduce.report import row_lines

    table = get_table(args.table)
    datasets, rows, overrides = selection(args)
    planned = plan(table, args.scale, datasets, overrides, rows)
    notes = row_lines(table, [p.cell.row for p in planned])
    notes += [f"{sum(not p.runnable for p in planned)} cell(s) without data are not counted"] * any(
        not p.runnable for p in planned)
    cells = [(p.cell.key, p.tree, args.seeds) for p in planned if p.runnable]
    return print_plan(f"plan: {table.key} at {args.scale} scale, {len(cells)} runnable cell(s) × {args.seeds} seed(s)",
                      cells, args.address, args.max_concurrent, notes)


def build_address(spec: ReproSpec) -> str | None:
    """The cells' ``resources.address`` (from ``--set``), when ``--address`` is not given."""
    from fltune.config import build_config

    return build_config(next(iter(spec.cells.values())).tree).resources.address


def with_gpu_share(spec: ReproSpec, cluster: dict[str, float]) -> ReproSpec:
    """Unset ``gpus_per_worker`` → the cluster's GPUs shared by the trials its CPUs fit at once."""
    if spec.gpus_per_worker is not None:
        return spec
    gpus = cluster.get("GPU", 0.0)
    fit = max(1, int(cluster.get("CPU", 1.0) // spec.workers))
    return spec.model_copy(update={"gpus_per_worker": min(1.0, gpus / (spec.workers * fit)) if gpus else 0.0})


def callbacks(spec: ReproSpec) -> list:
    from fltune.reproduce.report import live_cells
    from fltune.reproduce.tracking import ReproLog
    from fltune.tune.board import TrialBoard
    from fltune.tune.tracking import MLflowStudyCallback

    tracked = [MLflowStudyCallback(spec, ReproLog)] if spec.tracking.enabled else []
    return [TrialBoard(spec, live_cells), *tracked]


def describe(spec: ReproSpec, nodes: int, resumed: bool) -> str:
    from fltune.reproduce.report import row_lines

    table = spec.paper_table
    subs = sorted({c.substituted for c in spec.cells.values() if c.substituted})
    return (
        f"[bold]fltune reproduce[/] {'resuming ' if resumed else ''}{table.key} ({table.source}) · "
        f"{spec.scale} scale: {table.scales[spec.scale].note} · {len(spec.cells)} cells"
        + (f" in {len(spec.trials)} runs" if len(spec.trials) < len(spec.cells) else "")
        + f" × {spec.seeds} seed(s)"
        + (f", {len(spec.missing)} without data" if spec.missing else "")
        + (f" · substituted {', '.join(subs)}, {spec.scale} scale" if subs else "")
        + f"\n  per cell: {spec.workers} client worker(s) on a {nodes}-node cluster · folder {spec.path}"
        + "".join(f"\n  {line}" for line in row_lines(table, [table.cell(key).row for key in spec.cells]))
    )


def conclude(spec: ReproSpec, rows: list[TrialRow]) -> int:
    """The side-by-side table, the files, what had no data, and the exit status."""
    from fltune.reproduce.report import results, rich_table, write_outputs
    from fltune.tracking.console import console

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
        console.print("fltune: job interrupted; continue it with: "
                      + RESUME_HINT.format(table=spec.table, name=spec.name, storage=spec.storage))
        return 130
    return 1 if any(r.status in ("diverged", "failed") for r in res) else 0
