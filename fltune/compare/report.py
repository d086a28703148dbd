"""The comparison's results: one row per method over its seeds, the live board, the files. Figures come from the cells'
last Tune results (costs: ``cost_cum_*``, fltune/metrics/cost.py); each row's gap to the best is tested against seed
noise (``fltune.compare.stats``)."""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich import box
from rich.table import Table

from fltune.compare.spec import TUNING_SEED_OFFSET, CompareSpec, method_tree, parse_cell
from fltune.compare.stats import ALPHA, mean_std, welch_p
from fltune.config import build_config, flatten
from fltune.metrics.figures import new_figure, round_axis, save_png
from fltune.plugins import label
from fltune.text import counted
from fltune.tune.board import Planned, eta, params_text
from fltune.tune.results import ENDED, TrialRow
from fltune.tune.space import Objective
from fltune.tune.trainable import objective_key

COSTS = {"rounds_to_target": "rounds to target", "time_total_s": "wall s", "cost_cum_tflops": "train TFLOPs",
         "cost_cum_comm_gbit": "comm Gbit"}
"""Cost columns: the cell's last-result key → header."""


@dataclass
class MethodRow:
    """One method over its seeds."""

    method: str
    statuses: list[str]
    figures: dict[str, list[float]] = field(default_factory=dict)
    """Column → the value of every finished seed."""
    best: bool = False
    p_value: float | None = None
    running: list[int] = field(default_factory=list)
    """The round of each of its cells running now."""

    def stat(self, column: str) -> tuple[float, float]:
        return mean_std(self.figures.get(column, []))


def columns(spec: CompareSpec) -> list[str]:
    """``final <acc>`` per reported accuracy and ``best <acc>`` per protocol, then the costs."""
    return [*(f"final {acc}" for acc in spec.finals), *(f"best {acc}" for acc in spec.accuracies), *COSTS]


def cell_figures(spec: CompareSpec, row: TrialRow) -> dict[str, float]:
    """A cell's figures from its last result (NaN where it has none, e.g. a target never reached)."""
    last = row.metrics
    figures = {f"final {acc}": last.get(acc, math.nan) for acc in spec.finals}
    figures |= {f"best {acc}": last.get(f"objective:{objective_key(Objective(metric=acc, reduce='best'))}", math.nan)
                for acc in spec.accuracies}  # each accuracy's best so far (``CompareSpec.trial``)
    return figures | {key: float(last.get(key, math.nan)) for key in COSTS}


def results(spec: CompareSpec, rows: list[TrialRow]) -> list[MethodRow]:
    """One row per method (the spec's order); the best marked, the others tested against it."""
    by_cell = {row.params.get("cell"): row for row in rows}
    out = []
    for method in spec.methods:
        cells = [by_cell.get(key) for key in spec.cells if parse_cell(key)[0] == method]
        result = MethodRow(method, [c.status if c else "pending" for c in cells],
                           running=[c.round for c in cells if c is not None and c.status == "running"])
        for cell in (c for c in cells if c is not None and c.status == "finished"):
            for column, value in cell_figures(spec, cell).items():
                if math.isfinite(value):
                    result.figures.setdefault(column, []).append(float(value))
        out.append(result)
    mark_best(out, f"final {spec.primary}")
    return out


def mark_best(res: list[MethodRow], column: str) -> None:
    """The highest mean of ``column`` is best; every other row gets Welch's p against it."""
    scored = [r for r in res if r.figures.get(column)]
    if not scored:
        return
    top = max(scored, key=lambda r: r.stat(column)[0])
    top.best = True
    for r in scored:
        if r is not top:
            r.p_value = welch_p(r.figures[column], top.figures[column])


def verdict(r: MethodRow) -> str:
    """The significance column: best, or p and whether that is beyond seed noise at α."""
    if r.best:
        return "best"
    if r.p_value is None:
        return "n/a (< 2 seeds)" if r.figures else "—"
    return f"p={r.p_value:.3g} " + ("beyond noise" if r.p_value < ALPHA else "within noise")


def figure_text(spec: CompareSpec, r: MethodRow, column: str) -> str:
    """Accuracies in % ± std; costs as means; rounds to target over the seeds that reached it (R+: none did)."""
    if column == "rounds_to_target":
        reached = r.figures.get(column, [])
        done = sum(s == "finished" for s in r.statuses)
        if not reached:
            return "R+" if done and spec.config.metrics.target is not None else "—"
        return f"{sum(reached) / len(reached):.1f}" + (f" ({len(reached)}/{done})" if len(reached) < done else "")
    mean, std = r.stat(column)
    if math.isnan(mean):
        return "—"
    if column.startswith(("final", "best")):
        return f"{100 * mean:.2f}" + (f" ± {100 * std:.2f}" if spec.seeds > 1 else "")
    return f"{mean:.4g}"


def cells_text(r: MethodRow, rounds: int | None = None) -> str:
    """Seeds finished of seeds and the others' states; with ``rounds``, running seeds' rounds ("1/3 r4 r2/10")."""
    done = sum(s == "finished" for s in r.statuses)
    waiting = ("finished", "running", "pending") if rounds is not None else ("finished",)
    others = sorted({s for s in r.statuses if s not in waiting})
    text = f"{done}/{len(r.statuses)}" + (f" ({', '.join(others)})" if others else "")
    if rounds is not None and r.running:
        text += f" {' '.join(f'r{n}' for n in r.running)}/{rounds}"
    return text


def notes(spec: CompareSpec) -> list[str]:
    """What the table is: the shared setting, the seeds, the tuning, the test."""
    cfg = spec.config
    fed, part = cfg.federation, cfg.partition
    seeds = f"{spec.base_seed}" + (f"..{spec.base_seed + spec.seeds - 1}" if spec.seeds > 1 else "")
    lines = [
        f"{cfg.data.dataset}, {part.kind} partition (α={part.alpha:g}), {fed.clients} clients × {fed.fraction:g} "
        f"per round, {counted(fed.rounds, 'round')}; seeds {seeds}",
        "every method: the same partition and, per seed, the same client-sampling sequence "
        "(both functions of federation.seed and the round only)",
        f"best (★): highest mean final {spec.primary}; 'vs best' (vs ★): Welch's two-sided t-test of final "
        f"{spec.primary} over seeds against the best row, α = {ALPHA} (p < α, marked *: beyond seed noise)",
    ]
    if spec.tune_budget:
        lines.append(f"tuned: {spec.tune_budget} trials per method (search_spaces/<method>.yaml, Optuna), objective "
                     f"final val_{spec.primary} on a validation split held out of the training data, at seed "
                     f"{spec.base_seed + TUNING_SEED_OFFSET}; no test data in the studies; reported seeds are fresh")
    else:
        lines.append("fixed settings: every method at its defaults (no tuning)")
    return lines


def tuned_params(spec: CompareSpec, method: str) -> dict[str, Any]:
    """The values tuning changed from the method's defaults in the user's setting (dotted names)."""
    plain, tuned = flatten(method_tree(spec.base, method)), flatten(spec.trees[method])
    return {k: v for k, v in tuned.items() if plain.get(k) != v}


SHORT = {"acc_global": "global", "acc_all_model": "all-model", "acc_personalized": "pers.",
         "acc_personalized_ft": "pers.-FT"}
"""Terminal headers of the final accuracies (the files name them in full)."""


TERMINAL = {"rounds_to_target": "to target", "time_total_s": "wall s"}
"""The costs the terminal's table shows, with their headers there (the files show them all)."""


def rich_table(spec: CompareSpec, res: list[MethodRow], title: str, live: bool = False) -> Table:
    """The terminal's table, to read in 100 columns (the other figures are in compare.md and .csv); ``live``:
    the board's, with running cells' rounds."""
    costs = [c for c in TERMINAL if c != "rounds_to_target" or spec.config.metrics.target]
    heads = ["method", "seeds", *(f"{SHORT[acc]} %" for acc in spec.finals), *(TERMINAL[c] for c in costs), "vs ★"]
    rounds = spec.config.federation.rounds if live else None
    lines = [[("★ " if r.best else "") + r.method, cells_text(r, rounds),
              *(figure_text(spec, r, f"final {a}").replace(" ± ", "±") for a in spec.finals),
              *(figure_text(spec, r, c) for c in costs),
              short_verdict(r)] for r in res]
    table = Table(title=title, box=box.SIMPLE_HEAD, show_edge=False, collapse_padding=True, min_width=len(title),
                  caption=f"★ highest mean final {spec.primary}; vs ★: Welch's p over seeds, * below "
                          f"α = {ALPHA:g} (beyond seed noise)")
    for i, name in enumerate(heads):  # names and seeds whole; the figures never wrap
        table.add_column(name, justify="left" if i < 2 else "right", no_wrap=True,
                         min_width=max(len(line[i]) for line in lines) if i < 2 and lines else None)
    for r, line in zip(res, lines):
        table.add_row(*line, style="bold" if r.best else None)
    return table


def short_verdict(r: MethodRow) -> str:
    """The test against the best row in a few characters: "p=0.012 *" when beyond seed noise, "p<0.01" below."""
    if r.best or r.p_value is None:
        return "" if r.best else "n/a" if r.figures else "—"
    return ("p<0.01" if r.p_value < 0.01 else f"p={r.p_value:.2g}") + (" *" if r.p_value < ALPHA else "")


def live_board(spec: CompareSpec, rows: list[TrialRow], planned: Planned | None = None) -> Table:
    """The board while cells run (``TrialBoard`` renderer): the table so far, with an ETA."""
    done = sum(r.status in ENDED for r in rows)
    title = f"compare {spec.name}: {done}/{len(spec.cells)} cells done{eta(rows, len(spec.cells), planned=planned)}"
    return rich_table(spec, results(spec, rows), title, live=True)


def markdown(spec: CompareSpec, res: list[MethodRow]) -> str:
    head = ["method", "seeds done", *(COSTS.get(c, f"{c} %") for c in columns(spec)), f"vs best (Welch, α={ALPHA})"]
    lines = [f"# compare {spec.name}", "", *(f"- {n}" for n in notes(spec)), ""]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join([("★ " if r.best else "") + r.method, cells_text(r),
                                 *(figure_text(spec, r, c) for c in columns(spec)), verdict(r)]) + " |" for r in res]
    tuned = {m: tuned_params(spec, m) for m in spec.methods}
    if any(tuned.values()):
        lines += ["", "Tuned values:", *(f"- {m}: {params_text(p, '; ') or 'defaults'}" for m, p in tuned.items())]
    return "\n".join(lines) + "\n"

def write_csv(spec: CompareSpec, res: list[MethodRow], path: Path) -> Path:
    """One line per method: means and sample stds of every column, the test, the tuned values."""
    with path.open("w", newline="") as out:
        writer = csv.writer(out)
        names = [c.replace(" ", "_") for c in columns(spec)]
        writer.writerow(["method", "seeds", "seeds_finished", *(f"{n}_{s}" for n in names for s in ("mean", "std")),
                         "best", "welch_p", "beyond_noise", "tuned"])
        for r in res:
            stats = [_blank(v) for c in columns(spec) for v in r.stat(c)]
            writer.writerow([r.method, spec.seeds, sum(s == "finished" for s in r.statuses), *stats, int(r.best),
                             _blank(r.p_value), "" if r.p_value is None else int(r.p_value < ALPHA),
                             params_text(tuned_params(spec, r.method), "; ") or "defaults"])
    return path


def _blank(value: float | None) -> str:
    return "" if value is None or math.isnan(value) else repr(float(value))


def curves(spec: CompareSpec) -> dict[str, dict[int, float]]:
    """Cell → {round: ranking accuracy}: from MLflow when tracked (Tune's files of a restarted trial can miss
    rounds), else from Tune's result files."""
    return (spec.tracking.enabled and logged_curves(spec)) or tune_curves(spec)


def logged_curves(spec: CompareSpec) -> dict[str, dict[int, float]]:
    """Cell → {round: ranking accuracy} from the comparison's MLflow runs (empty if it has none)."""
    from fltune.tracking.mlflow_log import Tracker
    from fltune.tune.mlflow_runs import KIND_TAG, STUDY_TAG

    tracker = Tracker(spec.tracking)
    out = {}
    for parent in tracker.find({STUDY_TAG: spec.path, KIND_TAG: "compare"}):
        for child in tracker.find({"mlflow.parentRunId": parent.info.run_id}):
            curve = tracker.history(child.info.run_id, spec.primary)
            if "cell" in child.data.params and curve:
                out[child.data.params["cell"]] = curve
    return out


def tune_curves(spec: CompareSpec) -> dict[str, dict[int, float]]:
    """Cell → {round: ranking accuracy} from Tune's per-trial result files (empty if unreadable)."""
    from ray.tune import ExperimentAnalysis

    try:
        analysis = ExperimentAnalysis(spec.path)
        frames = analysis.trial_dataframes
    except (OSError, ValueError):
        return {}
    out = {}
    for trial in analysis.trials:
        frame = frames.get(trial.trial_id)
        if frame is not None and spec.primary in frame and "round" in frame:
            pairs = frame[["round", spec.primary]].dropna()
            out[trial.config["cell"]] = {int(r): float(a) for r, a in zip(pairs["round"], pairs[spec.primary])}
    return out


def overlay_png(spec: CompareSpec, path: Path) -> Path:
    """Ranking accuracy per round: each method's mean over seeds, its min–max band shaded."""
    per_cell = curves(spec)
    fig = new_figure(figsize=(7, 4.5))
    ax = fig.subplots()
    for i, method in enumerate(spec.methods):
        runs = [per_cell[key] for key in spec.cells if parse_cell(key)[0] == method and key in per_cell]
        rounds = sorted(set.intersection(*(set(run) for run in runs))) if runs else []
        if not rounds:
            continue
        values = [[run[r] for run in runs] for r in rounds]
        mean = [100 * sum(v) / len(v) for v in values]
        ax.plot(rounds, mean, color=f"C{i}", label=f"{method} ({len(runs)} seed(s))")
        ax.fill_between(rounds, [100 * min(v) for v in values], [100 * max(v) for v in values],
                        color=f"C{i}", alpha=0.2)
    round_axis(ax)
    ax.set(ylabel=f"{spec.primary} (%)", title=f"compare {spec.name}: mean over seeds, min–max band")
    ax.grid(alpha=0.3)
    if ax.lines:
        ax.legend()
    fig.tight_layout()
    return save_png(fig, path, dpi=100)


def write_outputs(spec: CompareSpec, res: list[MethodRow], folder: Path) -> list[Path]:
    """compare.csv, .md, .png and configs/<method>.yaml (for ``run --config``) under ``folder``."""
    (folder / "configs").mkdir(parents=True, exist_ok=True)
    md = folder / "compare.md"
    md.write_text(markdown(spec, res))
    paths = [write_csv(spec, res, folder / "compare.csv"), md, overlay_png(spec, folder / "compare.png")]
    for method in spec.methods:
        paths.append(folder / "configs" / f"{label(method)}.yaml")
        paths[-1].write_text(build_config(spec.trees[method]).to_yaml())
    return paths
