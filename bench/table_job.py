"""A whole ``reproduce`` job's wall time at full length, from a short run of it (issue 12: paper-scale SimFAFL
Table 2 FMNIST in ≤ 30 min on one GPU).

Runs ``python cli.py reproduce <table> --datasets <d> --scale <s> --set federation.rounds=<N>`` (MLflow off,
every other setting the table's), or reads a job folder it or ``reproduce`` wrote (``--job``), and takes
each trial's per-round times from its ``result.json``:

- ``first``: round 1, start-up included;
- ``steady``: the median of the rounds after it that evaluated nothing and were not the last;
- ``eval``: the median evaluation time (``eval_s``) of the evaluated rounds before the last;
- ``last``: the last round less a steady round (the final evaluation and fine-tuning pass, as at full length).

A trial of R rounds then takes first + (R − 2)·steady + (evaluations before round R)·eval + steady + last.
The trials are dealt in the order the job started them (Tune's trial index: at paper scale longest
estimated first, ``reproduce.job.start_order``) to as many slots as the short run kept busy at once, at the
per-round times measured with that many trials sharing the machine; a run it made adds the short job's
time outside its trials (start-up, the table) once. Pick N so that
an evaluation falls before the last round (N > ``metrics.every``: 11 at paper scale). Last lines:
``extrapolated_min`` and ``ratio <extrapolated / --target-min>`` (goal ≤ 1).

    python bench/table_job.py [--table table2] [--datasets fmnist] [--scale paper] [--rows R1,R2] [--rounds 11]
                              [--full-rounds 500] [--set K=V ...] [--job DIR] [--target-min 30]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Trial:
    """One trial's measured round times (seconds) and its evaluation cadence."""

    name: str
    first: float
    steady: float
    eval: float
    last: float
    every: int
    started: float
    ended: float
    done: bool

    def at(self, rounds: int) -> float:
        """Its wall time at ``rounds`` rounds."""
        evaluations = (rounds - 1) // self.every
        return self.first + (rounds - 2) * self.steady + evaluations * self.eval + self.steady + self.last


def read_trial(folder: Path, every: int) -> Trial | None:
    """The trial in ``folder`` (None when it reported fewer than three rounds)."""
    reports = [json.loads(line) for line in (folder / "result.json").read_text().splitlines() if line.strip()]
    # a trial Tune restarted (FailureConfig) reports its rounds again from its checkpoint: the last report of
    # each round stands
    rows = sorted({r["training_iteration"]: r for r in reports}.values(), key=lambda r: r["training_iteration"])
    if len(rows) < 3:
        return None
    final, inner = rows[-1], rows[1:-1]
    quiet = [r["time_this_iter_s"] for r in inner if "eval_s" not in r] or [r["time_this_iter_s"] for r in inner]
    steady = statistics.median(quiet)
    evals = [r["eval_s"] for r in inner if "eval_s" in r]  # none: the last one's (fine-tuning included) stands in
    return Trial(
        name=re.sub(r"_\d{4}-\d{2}-\d{2}_\d{2}-\d{2}-\d{2}$", "", folder.name.split("cell=", 1)[-1]),
        first=rows[0]["time_this_iter_s"], steady=steady,
        eval=statistics.median(evals) if evals else final.get("eval_s", 0.0), last=final["time_this_iter_s"] - steady,
        every=every, started=rows[0]["timestamp"] - rows[0]["time_this_iter_s"], ended=final["timestamp"],
        done=final.get("status") != "running",  # fltune's own status: finished or diverged
    )


def read_job(job: Path) -> list[Trial]:
    """Every trial of the job folder, in the order the job started them (Tune's trial index)."""
    spec = json.loads((job / "fltune_study.json").read_text())
    every = next(iter(spec["cells"].values()))["tree"].get("metrics", {}).get("every", 1)
    folders = sorted(job.glob("run_cell_*"), key=lambda f: int(f.name.split("_")[3]))
    if failed := [f.name for f in folders if (f / "error.txt").exists()]:
        print(f"table_job: {len(failed)} trial(s) raised an error (their error.txt), e.g. {failed[0]}", file=sys.stderr)
    return [t for t in (read_trial(f, every) for f in folders if (f / "result.json").exists()) if t]


def busy_slots(trials: list[Trial]) -> int:
    """The most trials that ran at the same moment."""
    events = sorted([(t.started, 1) for t in trials] + [(t.ended, -1) for t in trials])
    running = most = 0
    for _, step in events:
        running += step
        most = max(most, running)
    return most


def makespan(durations: list[float], slots: int) -> float:
    """Trials dealt in order, each to the slot that frees first."""
    free = [0.0] * max(1, slots)
    for duration in durations:
        free[free.index(min(free))] += duration
    return max(free)


def run_job(
    storage: Path, table: str, datasets: str, scale: str, rounds: int, rows: str | None = None,
    extra: tuple[str, ...] = (), timeout: float | None = None,
) -> tuple[Path, float]:
    """The short job, as a user runs it: its folder and its wall time (start-up and shutdown included).

    Past ``timeout`` seconds (or on any exception here, e.g. a caller's deadline) the job is stopped as a
    user stops it, by SIGTERM (reproduce shuts its Ray down), and killed with its process group 30 s later."""
    name = f"bench-{time.strftime('%Y%m%d-%H%M%S')}"
    cmd = [sys.executable, str(REPO / "cli.py"), "reproduce", table, "--datasets", datasets,
           "--scale", scale, "--set", f"federation.rounds={rounds}", "--set", "tracking.enabled=false",
           "--storage", str(storage), "--name", name, "--out", str(storage / "out"),
           *(["--rows", rows] if rows else []), *(arg for item in extra for arg in ("--set", item))]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, start_new_session=True)
    try:
        code = proc.wait(timeout)
    except BaseException:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        raise
    if code:
        sys.exit(code)  # reproduce has said why on stderr
    return storage / name, time.perf_counter() - start


def completed(trials: list[Trial]) -> list[Trial]:
    """Trials cut before their last round (a job stopped early) take the finished trials' median evaluation
    and last round."""
    finished = [t for t in trials if t.done]
    if not finished:
        return trials
    last, evaluation = (statistics.median(getattr(t, k) for t in finished) for k in ("last", "eval"))
    return [t if t.done else replace(t, last=last, eval=evaluation) for t in trials]


def report(trials: list[Trial], full_rounds: int, target_min: float, wall: float | None = None) -> float:
    """Each trial at ``full_rounds``, the job's extrapolated minutes (returned) and the ratio to the target;
    with the short job's ``wall``, the part of it outside the trials (Ray's start, data, the table) is added
    once."""
    if not trials:
        sys.exit("table_job: no trial reported three rounds; allowed: a job whose trials ran --rounds ≥ 3")
    slots = busy_slots(trials)
    print(f"{'trial':28s} {'first':>6s} {'steady':>7s} {'eval':>6s} {'last':>6s} {'at ' + str(full_rounds):>9s}")
    for t in completed(trials):
        print(f"{t.name:28s} {t.first:6.1f} {t.steady:7.2f} {t.eval:6.1f} {t.last:6.1f} "
              f"{t.at(full_rounds) / 60:7.1f} m{'' if t.done else '  (cut: eval and last from the finished)'}")
    outside = 0.0 if wall is None else max(0.0, wall - (max(t.ended for t in trials) - min(t.started for t in trials)))
    minutes = (makespan([t.at(full_rounds) for t in completed(trials)], slots) + outside) / 60
    print(f"{len(trials)} trials, {slots} at once" + (f"; short job {wall:.0f} s, {outside:.0f} s of it outside "
                                                      "the trials" if wall is not None else ""))
    print(f"extrapolated_min {minutes:.1f}  (the job at {full_rounds} rounds)")
    print(f"ratio {minutes / target_min:.3f}")
    return minutes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table", default="table2")
    parser.add_argument("--datasets", default="fmnist")
    parser.add_argument("--scale", default="paper")
    parser.add_argument("--rows", help="a subset of the table's rows (comma-separated; default: all)")
    parser.add_argument("--rounds", type=int, default=11, help="rounds of the short run")
    parser.add_argument("--full-rounds", type=int, default=500, help="rounds to extrapolate to (the paper's)")
    parser.add_argument("--set", dest="extra", action="append", default=[], metavar="KEY=VALUE",
                        help="a config override for every cell, e.g. resources.executor=batched")
    parser.add_argument("--job", type=Path, help="read this job folder instead of running one")
    parser.add_argument("--target-min", type=float, default=30.0)
    args = parser.parse_args()
    if args.job:
        if not (args.job / "fltune_study.json").exists():
            parser.error(f"--job: {args.job} holds no reproduce job (no fltune_study.json)")
        report(read_job(args.job), args.full_rounds, args.target_min)
        return
    with tempfile.TemporaryDirectory() as tmp:
        job, wall = run_job(Path(tmp), args.table, args.datasets, args.scale, args.rounds, args.rows,
                            tuple(args.extra))
        report(read_job(job), args.full_rounds, args.target_min, wall)


if __name__ == "__main__":
    main()
