"""A reproduced table in the paper's layout: paper value, measured mean ± std over seeds, Δ or ranks. Δ against the
paper is shown only at paper scale on the paper's dataset; elsewhere the check is the ordering: each row's rank in its
column beside the paper's, and per column Kendall's τ-b (ties never inflate it)."""

from __future__ import annotations

import csv
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from rich.table import Table
from scipy.stats import kendalltau

from fltune.reproduce.job import CellRun, ReproSpec
from fltune.reproduce.table import DATASET_NAMES, Cell, PaperTable
from fltune.tune.board import Planned, eta
from fltune.tune.results import ENDED, TrialRow
from fltune.tune.space import Objective
from fltune.tune.trainable import objective_key

CSV_COLUMNS = ("table", "method", "dataset", "partition", "paper", "measured", "std", "delta", "rank", "paper_rank",
               "kendall_tau", "seeds", "scale", "status", "note")


@dataclass(frozen=True)
class CellResult:
    cell: Cell
    status: str
    """finished / diverged / failed / running / pending / killed, or 'no data'."""
    measured: float | None
    std: float | None
    round: int = 0
    note: str = ""
    unreached: bool = False
    """Finished without reaching metrics.target: rounds-to-target shows 'R+' (MAN Table 1's '500+')."""
    ordering: bool = False
    """Quick scale or a substituted dataset: compare ranks, not values (no Δ)."""
    rank: int | None = None
    paper_rank: int | None = None
    """1 = the column's largest value, measured and printed, among the cells that have both; ties share."""

    @property
    def delta(self) -> float | None:
        if self.measured is None or self.cell.paper is None or self.ordering:
            return None
        return self.measured - self.cell.paper


def results(spec: ReproSpec, rows: list[TrialRow]) -> list[CellResult]:
    """Every cell in table order: its final objective as the paper prints it (``PaperTable.factor``), ranked."""
    table = spec.paper_table
    by_cell = {cell: row for row in rows for cell in spec.trials.get(row.params.get("cell"), [])}  # a trial's cells
    out = []
    for cell in table.cells:
        if cell.key in spec.missing:
            out.append(CellResult(cell, "no data", None, None, note=spec.missing[cell.key]))
        elif cell.key in spec.cells:
            run = spec.cells[cell.key]
            row = by_cell.get(cell.key)
            note = f"substituted {run.substituted}" if run.substituted else ""
            if row is None:
                out.append(CellResult(cell, "pending", None, None, note=note))
                continue
            value, std = cell_objective(row, run)
            factor = table.factor(cell)
            std = std if value is not None and spec.seeds > 1 else None
            needs_target = run.metric == "rounds_to_target" or run.reduce == "at_target"
            unreached = value is None and row.status == "finished" and needs_target
            out.append(CellResult(cell, row.status, None if value is None else value * factor,
                                  None if std is None else std * factor, row.round, note, unreached,
                                  ordering=spec.scale != "paper" or run.substituted is not None))
    return ranked(out)


def ranked(res: list[CellResult]) -> list[CellResult]:
    """Each result with its and the paper's rank within its (dataset, column), over the cells with both values."""
    out = list(res)
    for members in _by_column(res).values():
        for i in members:
            others = [out[j] for j in members]
            out[i] = replace(out[i], rank=1 + sum(o.measured > out[i].measured for o in others),
                             paper_rank=1 + sum(o.cell.paper > out[i].cell.paper for o in others))
    return out


def _by_column(res: list[CellResult]) -> dict[tuple[str, str], list[int]]:
    """Indices of the comparable results (measured and printed values) of each (dataset, column)."""
    groups: dict[tuple[str, str], list[int]] = {}
    for i, r in enumerate(res):
        if r.measured is not None and r.cell.paper is not None:
            groups.setdefault((r.cell.dataset, r.cell.column), []).append(i)
    return groups


def kendall_tau_b(xs: list[float], ys: list[float]) -> float | None:
    """Kendall's τ-b, (C − D) / √((n0 − n_x)(n0 − n_y)) (``scipy.stats.kendalltau``'s default); None when
    either side has no untied pair."""
    tau = kendalltau(xs, ys).statistic if len(xs) > 1 else math.nan
    return None if math.isnan(tau) else float(tau)


def column_taus(res: list[CellResult]) -> dict[tuple[str, str], float | None]:
    """Kendall's τ-b between measured and printed values per (dataset, column) with at least one result."""
    groups = _by_column(res)
    taus: dict[tuple[str, str], float | None] = {}
    for col in dict.fromkeys((r.cell.dataset, r.cell.column) for r in res):
        members = groups.get(col, [])
        taus[col] = kendall_tau_b([res[i].measured for i in members], [res[i].cell.paper for i in members])
    return taus


def tau_metrics(res: list[CellResult]) -> dict[str, float]:
    """``kendall_tau/<dataset> <column>`` for MLflow (characters MLflow refuses become '_')."""
    return {re.sub(r"[^A-Za-z0-9_\-. /]", "_", f"kendall_tau/{DATASET_NAMES.get(d, d)} {c}"): tau
            for (d, c), tau in column_taus(res).items() if tau is not None}


def cell_objective(row: TrialRow, run: CellRun) -> tuple[float | None, float | None]:
    """(mean, std) over seeds of the cell's objective (its ``objective_key`` if present); None when not finite."""
    key = objective_key(Objective(metric=run.metric, reduce=run.reduce))
    value = float(row.metrics.get(f"objective:{key}", row.objective))
    std = float(row.metrics.get(f"objective_std:{key}", row.objective_std))
    if not math.isfinite(value):
        return None, None
    return value, std if math.isfinite(std) else None


def _fmt(value: float | None, fmt: str = ".2f", none: str = "—") -> str:
    """``value`` formatted by ``fmt``, else ``none``."""
    return none if value is None else format(value, fmt)


def paper_text(cell: Cell, fmt: str = ".2f", none: str = "—") -> str:
    """The paper's entry as printed ('500+' where it prints no number)."""
    return cell.paper_text if cell.paper is None and cell.paper_text else _fmt(cell.paper, fmt, none)


def unreached_text(result: CellResult) -> str:
    """'R+' for rounds-to-target (the paper's notation), 'not reached' for a value taken at the target."""
    return f"{result.round}+" if result.cell.metric == "rounds_to_target" else "not reached"


def cell_text(result: CellResult, seeds: int) -> str:
    """'measured ± std (paper p, Δ d)' or, ordering, '… (rank r; paper p, rank q)'; else the status."""
    if result.unreached:
        return f"{unreached_text(result)} (paper {paper_text(result.cell)})"
    if result.measured is None:
        return result.status
    spread = f" ± {_fmt(result.std)}" if seeds > 1 and result.std is not None else ""
    if result.ordering:
        return (f"{_fmt(result.measured)}{spread}{diverged_text(result)} (rank {_fmt(result.rank, 'd')}; "
                f"paper {paper_text(result.cell)}, rank {_fmt(result.paper_rank, 'd')})")
    return (f"{_fmt(result.measured)}{spread}{diverged_text(result)} "
            f"(paper {paper_text(result.cell)}, Δ {_fmt(result.delta, '+.2f')})")


def diverged_text(result: CellResult) -> str:
    """' diverged r7' for a cell whose run stopped on NaN/inf: its number is the last evaluation before."""
    return f" diverged r{result.round}" if result.status == "diverged" else ""


def layout(res: list[CellResult], render: Callable[[CellResult], str]
           ) -> tuple[list[tuple[str, str]], list[list[str]], list[str] | None]:
    """The paper's layout: its (dataset, column) columns, each row's label and cells drawn by ``render`` ('' where
    it has none), and the Kendall τ-b row (None when no column has a τ)."""
    cols = list(dict.fromkeys((r.cell.dataset, r.cell.column) for r in res))
    grid = {(r.cell.row, r.cell.dataset, r.cell.column): r for r in res}
    body = [[row, *(render(grid[row, *col]) if (row, *col) in grid else "" for col in cols)]
            for row in dict.fromkeys(r.cell.row for r in res)]
    taus = column_taus(res)
    shown = [_fmt(taus.get(col), "+.2f") for col in cols]
    return cols, body, shown if any(tau is not None for tau in taus.values()) else None


def rich_table(spec: ReproSpec, res: list[CellResult], title: str | None = None) -> Table:
    """The paper's layout; each cell shows measured (± std), the paper's value and Δ on three lines."""
    table = spec.paper_table
    cols, body, taus = layout(res, lambda r: _rich_cell(r, spec.seeds, table.factor(r.cell) == 100.0))
    out = Table(title=title or f"{table.title} — {spec.scale} scale, {spec.seeds} seed(s)", show_lines=True)
    out.add_column("method")
    for dataset, column in cols:
        out.add_column(f"{DATASET_NAMES.get(dataset, dataset)}\n{column}", justify="right")
    for cells in body:
        out.add_row(*cells)
    if taus:
        out.add_row("Kendall τ-b\n[dim]vs the paper's order[/]", *taus)
    return out


def _rich_cell(r: CellResult, seeds: int, percent: bool) -> str:
    """Measured (± std), paper, Δ; coloured by Δ for accuracies only (lower is better for the rest)."""
    if r.unreached:
        return f"[bold]{unreached_text(r)}[/]\n[dim]paper {paper_text(r.cell)}[/]"
    if r.measured is None:
        return f"[dim]{r.status}[/]"
    spread = f" ± {_fmt(r.std)}" if seeds > 1 and r.std is not None else ""
    colour = "green" if (r.delta or 0) >= -1 else ("yellow" if (r.delta or 0) >= -5 else "red")
    live = f"[red]{diverged_text(r)}[/]" if r.status == "diverged" else ""
    live = live if r.status in ("finished", "diverged") else f" [dim]r{r.round}[/]"
    if r.ordering:
        return (f"[bold]{_fmt(r.measured)}[/]{spread}{live}\n[dim]paper {paper_text(r.cell)}[/]\n"
                f"rank {_fmt(r.rank, 'd')} [dim](paper {_fmt(r.paper_rank, 'd')})[/]")
    delta = f"[{colour}]Δ {_fmt(r.delta, '+.2f')}[/]" if percent else f"Δ {_fmt(r.delta, '+.2f')}"
    return f"[bold]{_fmt(r.measured)}[/]{spread}{live}\n[dim]paper {paper_text(r.cell)}[/]\n{delta}"


def live_cells(spec: ReproSpec, rows: list[TrialRow], planned: Planned | None = None) -> Table:
    """The job's board while it runs (``TrialBoard`` renderer)."""
    res = results(spec, rows)
    done = sum(r.status in ENDED for r in res)
    title = f"{spec.table} ({spec.scale}): {done}/{len(spec.cells)} cells done"
    title += eta(rows, len(spec.trials), spec.trial_seconds, planned)
    return rich_table(spec, res, title)


def markdown(spec: ReproSpec, res: list[CellResult]) -> str:
    table = spec.paper_table
    cols, body, taus = layout(res, lambda r: cell_text(r, spec.seeds))
    head = ["method", *(f"{DATASET_NAMES.get(d, d)} {c}" for d, c in cols)]
    lines = [f"## {table.title}", "",
             f"{table.value}; measured at `{spec.scale}` scale, mean ± std over {spec.seeds} seed(s); "
             f"source: {table.source}.", f"`{spec.scale}` scale: {table.scales[spec.scale].note}.", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(cells) + " |" for cells in body]
    if taus:
        lines.append("| Kendall τ-b vs the paper's order | " + " | ".join(taus) + " |")
    if any(r.ordering for r in res):
        lines += ["", "Quick scale or substituted data: ranks within each column (1 = highest) beside the "
                  "paper's, and Kendall's τ-b between the two orders, instead of Δ."]
    notes = sorted({r.note for r in res if r.note})
    if notes:
        lines += ["", *(f"- {n}" for n in notes)]
    if table.row_settings:
        lines += ["", "Each row's settings and their source:", *(f"- {line}" for line in row_lines(table, [cells[0] for cells in body]))]
    if table.unknowns:
        lines += ["", "Settings the paper leaves open ([U]) and fltune's choice:", *(f"- {u}" for u in table.unknowns)]
    return "\n".join(lines) + "\n"


def row_lines(table: PaperTable, rows: list[str]) -> list[str]:
    """'row: its own settings — source' for each of ``rows`` the table describes ([U] marked)."""
    return [f"{row}: {table.row_settings[row]}" for row in dict.fromkeys(rows) if row in table.row_settings]


def write_csv(spec: ReproSpec, res: list[CellResult], path: Path) -> Path:
    taus = column_taus(res)
    with path.open("w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(CSV_COLUMNS)
        for r in res:
            writer.writerow([
                spec.table, r.cell.row, DATASET_NAMES.get(r.cell.dataset, r.cell.dataset), r.cell.column,
                paper_text(r.cell, ".4f", ""), unreached_text(r) if r.unreached else _fmt(r.measured, ".4f", ""),
                _fmt(r.std, ".4f", ""), _fmt(r.delta, ".4f", ""), _fmt(r.rank, "d", ""), _fmt(r.paper_rank, "d", ""),
                _fmt(taus.get((r.cell.dataset, r.cell.column)), ".4f", ""), spec.seeds, spec.scale, r.status, r.note,
            ])
    return path


def write_outputs(spec: ReproSpec, res: list[CellResult], folder: Path) -> list[Path]:
    """``table.csv`` and ``table.md`` under ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    md = folder / "table.md"
    md.write_text(markdown(spec, res))
    return [write_csv(spec, res, folder / "table.csv"), md]
