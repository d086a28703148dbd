"""What a study produced, trial by trial, ranked, tabulated and plotted: one ``TrialRow`` per Tune ``Trial``,
built the same way for the board, MLflow and the final ranking, so they never disagree."""

from __future__ import annotations

import csv
import math
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ray.tune.experiment import Trial

from fltune.config import ExperimentConfig, build_config, set_fields
from fltune.text import counted
from fltune.metrics.figures import axis_label, new_figure, percent, round_axis
from fltune.tune.space import Choice, IntRange, LogUniform, SearchSpace
from fltune.tune.spec import StudySpec

if TYPE_CHECKING:
    from matplotlib.figure import Figure

ENDED = ("finished", "stopped", "diverged", "failed")
"""Final statuses: ran all rounds, stopped early by ASHA, NaN/inf, raised (after its retries)."""


@dataclass
class TrialRow:
    trial_id: str
    status: str
    params: dict[str, Any]
    round: int
    objective: float
    objective_std: float
    metrics: dict[str, Any] = field(default_factory=dict)
    created: int = 0
    """The trial's place in the order Tune created them (1, 2, …; 0 when unknown): breaks ties for best."""

    @property
    def scored(self) -> bool:
        """Finished and stopped trials compete for best; diverged and failed ones never do."""
        return self.status in ("finished", "stopped") and math.isfinite(self.objective)


def unfinished(rows: list[TrialRow], expected: int) -> bool:
    """Whether a Tune job has trials left to run: some have not ended, or fewer than ``expected`` exist."""
    return len(rows) < expected or any(r.status not in ENDED for r in rows)


def any_unscored(statuses: Iterable[str]) -> bool:
    """Whether a job of cells lost one (diverged or failed): it then exits 1 and its MLflow parent ends FAILED."""
    return any(s in ("diverged", "failed") for s in statuses)


def said_failed(rows: Iterable[TrialRow], what: str) -> int:
    """A Tune job's exit status once it printed its results: 1 when some of its ``what`` (trials, cells) raised, as
    a failed one may have been the best, after a last line naming them (the cell, else the trial id); else 0."""
    rows = list(rows)
    failed = [str(r.params.get("cell") or r.trial_id) for r in rows if r.status == "failed"]
    if failed:
        print(f"fltune: {len(failed)} of {len(rows)} {what} failed ({', '.join(failed)}); their errors are above",
              file=sys.stderr, flush=True)
    return 1 if failed else 0


_RAISED = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Exit)):(.*)$")
_FRAME = re.compile(r'^\s*File "(?:[^"]*/)?(fltune/[^"]+\.py)", line (\d+), in (\w+)')
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_COMPILING = ("torch/_dynamo/convert_frame.py", "torch/_inductor/")
"""Frames of torch's compiler at work (not ``eval_frame.py``, which also wraps uncompiled calls)."""


def error_line(trace: str) -> str:
    """Why a trial failed, in one line, from Tune's ``error.txt`` (last failure last): the last exception, with
    the last fltune frame it passed. Ray's wrappers are left out unless they are all there is (a dead worker):
    e.g. ``AssertionError (fltune/engine/batched.py:383, _take) in torch.compile (…)``."""
    lines = _ANSI.sub("", trace).rsplit("Failure # ", 1)[-1].splitlines()  # the last failure's
    raised = [line for line in lines if _RAISED.match(line)]
    own = [line for line in raised if not line.startswith("ray.")]  # Ray's re-raise of the cause, else Ray's
    if not raised:
        return next((line.strip() for line in reversed(lines) if line.strip()), "no trace")
    name, message = _RAISED.match((own or raised)[-1]).groups()
    frames = [m for m in map(_FRAME.match, lines) if m]
    where = f" ({frames[-1][1]}:{frames[-1][2]}, {frames[-1][3]})" if frames else ""
    compiling = any(part in line for line in lines for part in _COMPILING)
    return (f"{name.rsplit('.', 1)[-1]}{': ' + message.strip() if message.strip() else ''}{where}"
            + (" in torch.compile (resources.compile=false runs without it)" if compiling else ""))


def latest_trace(trial: Trial) -> str:
    """The traces Tune appended to the trial's ``error.txt`` so far: the driver's copy while the job runs, else
    the job folder's ("" when there is none, or its storage cannot be read)."""
    path = trial.error_file
    if path and Path(path).is_file():
        return Path(path).read_text(errors="replace")
    try:
        return trial.get_error() or ""
    except OSError:
        return ""


def failure_lines(traces: Sequence[tuple[str, str]], refused: Sequence[str] = ()) -> list[str]:
    """One line per distinct reason among failed trials, with a count. ``traces``: (folder, trace) of crashed
    trials (reason: ``error_line``; the first trace is named); ``refused``: reasons from ``failed_result``."""
    by_reason: dict[str, list[str | None]] = {}
    for folder, trace in traces:
        by_reason.setdefault(error_line(trace), []).append(folder)
    for reason in refused:
        by_reason.setdefault(reason, []).append(None)
    return [f"fltune: {len(where)} trial(s) failed: {reason}"
            + (f"; trace: {where[0]}/error.txt" if where[0] else "") for reason, where in by_reason.items()]


def failed_result(err: Exception) -> dict[str, Any]:
    """A refused trial's last result: NaN objective (ASHA and the searcher require one), no ``round`` (no rung)."""
    return {"status": "failed", "error": str(err), "objective": math.nan}


def classify(last: dict[str, Any], errored: bool) -> str:
    """fltune's status of a trial from its last result: its own ``status``, else Tune's ``done`` means a
    scheduler stopped it (Tune's TERMINATED also marks trials shut down on Ctrl-C)."""
    if errored:
        return "failed"
    if last.get("status") in ("finished", "diverged", "failed"):
        return last["status"]
    if last.get("done"):
        return "stopped"
    return "running" if last else "pending"


def make_row(trial_id: str, config: dict[str, Any], last: dict[str, Any] | None, errored: bool) -> TrialRow:
    last = last or {}
    counter = re.match(r"\d+", str(last.get("experiment_tag", "")))  # Tune's tag: "<counter>_<params>"
    return TrialRow(
        trial_id=trial_id, status=classify(last, errored), params=dict(config),
        round=int(last.get("round", 0)), objective=float(last.get("objective", math.nan)),
        objective_std=float(last.get("objective_std", math.nan)), metrics=last,
        created=int(counter.group()) if counter else 0,
    )


def trial_row(trial: Trial, failed: bool = False) -> TrialRow:
    """The row of a Tune trial; ``failed`` when Tune reports its error before marking it."""
    return make_row(trial.trial_id, trial.config or {}, trial.last_result, failed or trial.status == Trial.ERROR)


def trial_config(spec: StudySpec, params: dict[str, Any]) -> ExperimentConfig:
    """Base + ``params`` at the base seed and resources (not a trial's share): as YAML, a ``run --config`` file."""
    return build_config(set_fields(spec.base, params))


def rank(rows: list[TrialRow], mode: str) -> list[TrialRow]:
    """Best first: scored trials by objective (ties: more rounds, then earlier created, so the order does not
    depend on how Tune lists trials), then the rest."""
    sign = -1.0 if mode == "max" else 1.0
    return sorted(rows, key=lambda r: (not r.scored, sign * r.objective if r.scored else 0.0, -r.round, r.created,
                                       r.trial_id))


def best(rows: list[TrialRow], mode: str) -> TrialRow | None:
    ranked = rank(rows, mode)
    return ranked[0] if ranked and ranked[0].scored else None


CSV_METRICS = ("acc_global", "acc_personalized", "loss", "startup_s", "time_total_s", "worker_nodes")
"""Figures of a trial's last result beside its score in ``trials.csv`` (those some trial has)."""


def write_csv(rows: list[TrialRow], space: SearchSpace, path: Path) -> Path:
    """One line per trial, best first: status, score, parameters, and the ``CSV_METRICS`` some trial has."""
    names = list(space.params)
    extra = [k for k in CSV_METRICS if any(k in row.metrics for row in rows)]
    with path.open("w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(["rank", "trial_id", "status", "round", "objective", "objective_std", *names, *extra])
        for i, row in enumerate(rank(rows, space.objective.direction), 1):
            writer.writerow([
                i, row.trial_id, row.status, row.round, row.objective, row.objective_std,
                *(row.params.get(n, "") for n in names), *(row.metrics.get(k, "") for k in extra),
            ])
    return path


def objective_label(space: SearchSpace) -> str:
    return f"{axis_label(space.objective.metric)}, {space.objective.reduce}"


def sensitivity_figure(rows: list[TrialRow], space: SearchSpace, title: str) -> Figure:
    """Objective against each parameter (SimFAFL Table 4 style); ASHA-stopped trials hollow, labelled by round."""
    names = list(space.params)
    metric = space.objective.metric
    fig = new_figure(figsize=(4 * len(names), 3.5))
    axes = fig.subplots(1, len(names), squeeze=False)
    scored = [r for r in rows if r.scored]
    for ax, name in zip(axes[0], names):
        position = _positions(ax, space.params[name])
        for status, face, label in (("finished", "C0", "finished"), ("stopped", "none", "stopped early (ASHA)")):
            points = [(position(r.params[name]), percent(metric, r.objective), r.round)
                      for r in scored if r.status == status and name in r.params]
            if not points:
                continue
            xs, ys, _ = zip(*points)
            ax.scatter(xs, ys, facecolors=face, edgecolors="C0", label=label)
            if status == "stopped":
                for x, y, round_ in points:
                    ax.annotate(f"r{round_}", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
        ax.set(xlabel=name, ylabel=objective_label(space))
        ax.margins(x=0.1)  # room for the round labels of points at the ends
        ax.grid(alpha=0.3)
    if scored:
        axes[0][0].legend()
    fig.suptitle(f"{title}: sensitivity")
    fig.tight_layout()
    return fig


def _positions(ax: Any, dist: Any) -> Callable[[Any], Any]:
    """Set up ``ax``'s x axis for a parameter and map its values: numbers as they are, other choices to indices."""
    if isinstance(dist, Choice) and not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                            for v in dist.values):
        ax.set_xticks(range(len(dist.values)), [str(v) for v in dist.values])
        ax.set_xlim(-0.5, len(dist.values) - 0.5)
        return dist.values.index
    if isinstance(dist, LogUniform) or (isinstance(dist, IntRange) and dist.log):
        ax.set_xscale("log")
    if isinstance(dist, Choice):
        ax.set_xticks(sorted(dist.values))
    return lambda value: value


def trials_figure(curves: dict[str, dict[int, float]], best_trial: str | None, space: SearchSpace,
                  title: str) -> Figure:
    """Every trial's objective per round (trial id → {round: value}), the best trial thick and named."""
    metric = space.objective.metric
    fig = new_figure(figsize=(7, 4.5))
    ax = fig.subplots()
    for trial, curve in curves.items():
        rounds = sorted(curve)
        values = [percent(metric, curve[r]) for r in rounds]
        if trial == best_trial:
            ax.plot(rounds, values, color="C3", linewidth=2.5, marker="o", label=f"best: {trial}", zorder=3)
        else:
            ax.plot(rounds, values, color="0.55", linewidth=1, marker=".", alpha=0.7)
    round_axis(ax)
    ax.set(ylabel=objective_label(space), title=f"{title}: {counted(len(curves), 'trial')}, objective per round")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend()
    fig.tight_layout()
    return fig
