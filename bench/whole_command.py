"""The whole ``python cli.py run …`` command against an independent plain-PyTorch run, start to exit.

Workload (issue 12, item 4; issue 64): FedAvg, FMNIST IID, 100 clients × 600, 10 per round, E = 1, B = 50,
global evaluation every round, 5 rounds. The reference is ``bench/plain_reference.py``: the same work
(client-samples, model, optimiser, evaluations, 2 threads) in plain PyTorch, importing nothing from fltune,
so no part of fltune's own start-up is paid on both sides. Both are timed as subprocesses from spawn to exit,
in pairs run back to back after one uncounted warm-up run of each (its wall time printed: the files in the page
cache, the command's MLflow store created, which every later run reuses as a user's runs do).

Memory is measured in the warm-up runs, not the timed ones: the process tree's resident memory (the process
plus every descendant: Ray's GCS, raylet and workers) is sampled from /proc every 0.2 s, and reading a
process's ``smaps_rollup`` makes the kernel walk its page tables, a cost per process that would handicap
the side with more processes (docs/performance.md, "Start-up of ``run``"). A timed run is watched only for its output lines and, for the command, for the ``MARKS``
below until all have shown (the reference: its lines alone); each pair line prints what that watching
cost (``observer``, CPU seconds of this process). Last lines: ``ratio <command/reference>`` (the median of
the pairs' ratios; goal ≤ 1.10), ``memory_ratio`` (peak tree RSS), ``memory_ratio_pss`` (peak tree PSS,
shared pages counted once: see ``tree_memory``) and ``memory_pss_gb`` (the command's peak tree PSS in 10^9
bytes; goal ≤ 2). Sizes elsewhere print in GiB (2^30 bytes). At the command's peak, its PSS is also split by
part (``part``): the driver, the client workers and Ray's own services.

Where the command's extra seconds go, from its timeline as seen from outside the package: when its lines
appear (the header after start-up, each round's line), when Ray's GCS, the first worker process and the
first client actor appear in its process tree, when its driver holds the FMNIST files open (/proc, every
0.2 s), when MLflow's sqlite store says the run started, each round's metrics were stamped and the run ended;
and, from one more run under ``python -X importtime``, the driver's imports by package. The phase table puts
each phase beside the reference's matching one (its ``imported``, ``data``, ``model`` and round lines).

    python bench/whole_command.py [--pairs 3] [--rounds 5] [--before /path/to/older/checkout] [--set K=V ...]
                                  [--no-imports]

``--before``: also time that checkout's command in every pair (a third run, same conditions), so a change
is measured before and after in one run on a shared machine (``ratio_before``). ``--set``: a config
override added to the command (and to ``--before``'s), to weigh a setting such as the resources plan.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PAGE = os.sysconf("SC_PAGE_SIZE")
REFERENCE = REPO / "bench" / "plain_reference.py"
DATA_FILES = "fashion-mnist"
"""A path holding this is an FMNIST file (Debian's folder; the reference and the command read the same)."""


def command(rounds: int, mlflow_uri: str, repo: Path = REPO, extra: tuple[str, ...] = ()) -> list[str]:
    """The issue's CPU workload as a user types it (in the checkout ``repo``), plus ``--set`` overrides
    ``extra`` (e.g. a resources setting to weigh)."""
    return [
        sys.executable, str(repo / "cli.py"), "run", "--method", "fedavg", "--dataset", "fmnist", "--partition",
        "iid", "--clients", "100", "--fraction", "0.1", "--rounds", str(rounds), "--local-epochs", "1",
        "--batch-size", "50", "--seed", "0", "--set", "metrics.protocols=[global]", "--set", "metrics.every=1",
        "--set", f"tracking.uri={mlflow_uri}", *(arg for item in extra for arg in ("--set", item)),
    ]


def tree(root: int) -> list[int]:
    """``root`` and all its descendants (read from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def tree_memory(root: int, pids: list[int]) -> tuple[int, int, dict[str, int]]:
    """(RSS, PSS, PSS by part) bytes of the tree ``pids`` under ``root`` (vanished processes count 0).

    RSS counts a page shared by several processes once per process: every Ray worker maps the same torch
    libraries (~0.5 GB resident each for the CUDA build), so the summed RSS overstates what the tree holds.
    PSS splits each shared page among its sharers: its sum is the memory the tree really occupies."""
    rss, parts = 0, dict.fromkeys(("driver", "workers", "ray"), 0)
    for pid in pids:
        try:
            rss += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE
            parts[_part(pid, root)] += _pss_kib(Path(f"/proc/{pid}/smaps_rollup").read_text()) * 1024
        except OSError:
            pass
    return rss, sum(parts.values()), parts


def _part(pid: int, root: int) -> str:
    """The command's own process, a Ray worker process (client actors, and idle workers Ray keeps ready
    to become one) or one of Ray's services (GCS, raylet, dashboard, agents, monitors)."""
    if pid == root:
        return "driver"
    name = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
    return "workers" if name.startswith((b"ray::ClientWorker", b"ray::IDLE")) else "ray"


def _pss_kib(smaps_rollup: str) -> int:
    return next((int(line.split()[1]) for line in smaps_rollup.splitlines() if line.startswith("Pss:")), 0)


MARKS = {"gcs": (b"gcs_server",), "raylet": (b"/raylet",),
         "worker": (b"default_worker.py", b"ray::IDLE", b"ray::ClientWorker"), "actor task": (b"ray::ClientWorker.",)}
"""Processes whose first appearance in the tree marks a phase: Ray's GCS (Ray starting), its raylet, a
worker process (the raylet spawning workers; renamed ``ray::IDLE`` once it runs), a client actor running a
task (named ``ray::ClientWorker.<method>`` while it does)."""


def _seen(root: int, pids: list[int], now: float, marks: dict[str, float], files: list[float]) -> None:
    """Note the first time each of ``MARKS`` shows in a process of the tree, and whether the driver ``root``
    (the one process that reads the dataset's files) holds an FMNIST file open now."""
    for pid in pids:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            for mark, needles in MARKS.items():
                if mark not in marks and any(needle in cmdline for needle in needles):
                    marks[mark] = now
            if pid == root and any(DATA_FILES in os.readlink(f"/proc/{pid}/fd/{fd}")
                                   for fd in os.listdir(f"/proc/{pid}/fd")):
                files.append(now)
        except OSError:
            continue


@dataclass
class Run:
    """One process's run: its wall time, peak memory, output lines and the marks seen from outside."""

    wall: float
    rss: float
    pss: float
    lines: list[tuple[float, str]]
    parts: dict[str, float]
    spawn_epoch: float
    marks: dict[str, float] = field(default_factory=dict)
    files: list[float] = field(default_factory=list)
    observer: float = 0.0
    """CPU seconds this process spent watching the run (its sampling and reading the run's output)."""

    def at(self, prefix: str) -> float | None:
        """When its first line starting with ``prefix`` arrived (seconds since spawn)."""
        return next((t for t, line in self.lines if line.startswith(prefix)), None)

    def rounds(self) -> list[float]:
        """When each ``round r/R`` line arrived."""
        return [t for t, line in self.lines if re.match(r"round \d+/\d+", line)]


def measure(argv: list[str], env: dict[str, str], memory: bool = False, watch: bool = True) -> Run:
    """Run ``argv`` from spawn to exit: its wall seconds and output lines with their arrival times; with ``watch``,
    ``MARKS`` and FMNIST files open seen every 0.2 s until every mark has shown; with ``memory``, its peak tree
    RSS and PSS in GiB (every 0.2 s) and the PSS by part at the PSS peak."""
    lines: list[tuple[float, str]] = []
    observer = _cpu()
    spawn_epoch, start = time.time(), time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=REPO, text=True)

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append((time.perf_counter() - start, line.rstrip()))

    reader = threading.Thread(target=read)
    reader.start()
    peak_rss = peak_pss = 0
    peak_parts: dict[str, int] = {}
    marks: dict[str, float] = {}
    files: list[float] = []
    while proc.poll() is None:
        watching = watch and len(marks) < len(MARKS)
        if memory or watching:
            pids, now = tree(proc.pid), time.perf_counter() - start
        if watching:
            _seen(proc.pid, pids, now, marks, files)
        if memory:
            rss, pss, parts = tree_memory(proc.pid, pids)
            peak_rss = max(peak_rss, rss)
            if pss > peak_pss:
                peak_pss, peak_parts = pss, parts
        time.sleep(0.2)
    wall = time.perf_counter() - start
    reader.join()
    if proc.returncode != 0:
        sys.exit(f"{argv[1]} exited {proc.returncode}:\n" + "\n".join(line for _, line in lines[-20:]))
    return Run(wall, peak_rss / 2**30, peak_pss / 2**30, lines, {k: v / 2**30 for k, v in peak_parts.items()},
               spawn_epoch, marks, files, _cpu() - observer)


def _cpu() -> float:
    """CPU seconds this process has used (every thread)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def timeline(run: Run) -> str:
    """When the header and each round's line appeared, and the exit: where the command's time goes."""
    marks = [f"{'header' if line.startswith('fltune run') else line.split()[1]} {t:.1f}"
             for t, line in run.lines if line.startswith(("fltune run", "round "))]
    return "  ".join([*marks, f"exit {run.wall:.1f}"])


def mlflow_times(uri: str, spawn_epoch: float) -> dict[str, float]:
    """From the sqlite store's newest run, in seconds since the command's spawn: the run's start and end and when
    each round's metrics were stamped (``step r``, the earliest of the step's metrics); empty without a run
    (tracking off)."""
    path = Path(uri.removeprefix("sqlite:///"))
    if not path.exists():
        return {}
    with sqlite3.connect(path) as db:
        run = db.execute("SELECT run_uuid, start_time, end_time FROM runs ORDER BY start_time DESC LIMIT 1").fetchone()
        steps = db.execute("SELECT step, MIN(timestamp) FROM metrics WHERE step > 0 AND run_uuid = ? GROUP BY step",
                           run[:1]).fetchall() if run else []
    if run is None or run[2] is None:
        return {}
    out = {"start": run[1] / 1000 - spawn_epoch, "end": run[2] / 1000 - spawn_epoch}
    out.update({f"step {step}": stamp / 1000 - spawn_epoch for step, stamp in steps})
    return out


Phases = dict[str, float | None]


def command_phases(run: Run, mlflow: dict[str, float]) -> Phases:
    """The command's timeline cut into phases (seconds; None where it has no such phase). The rows without
    indent add up to its wall time; the indented ones split the row above them."""
    header, rounds = run.at("fltune run"), run.rounds()
    gcs, worker = run.marks.get("gcs"), run.marks.get("worker")
    if header is None or not rounds or gcs is None or worker is None:
        sys.exit(f"whole_command: the command's timeline lacks a mark (header {header}, rounds {len(rounds)}, "
                 f"Ray's GCS {gcs}, a worker {worker}); its output:\n" + "\n".join(line for _, line in run.lines[-20:]))
    table = next((t for t, line in run.lines if t > rounds[-1] and line.strip()), run.wall)  # the summary's title
    ended = mlflow["end"] if mlflow else None
    return {
        "to_ray": gcs, "ray": worker - gcs, "ready": header - worker, "round1": rounds[0] - header,
        "mlflow_start": mlflow["start"] - header if mlflow else None,
        "steady": rounds[-1] - rounds[0], "steady_median": _median_gap(rounds), "after": run.wall - rounds[-1],
        "mlflow_end": None if ended is None else ended - rounds[-1], "close": table - (ended or rounds[-1]),
        "exit": run.wall - table, "total": run.wall,
    }


def reference_phases(run: Run) -> Phases:
    """The reference's timeline cut into the same phases."""
    imported, model, rounds = run.at("imported"), run.at("model"), run.rounds()
    if imported is None or model is None or not rounds:
        sys.exit("whole_command: the reference printed no imported/model/round lines")
    return {
        "to_ray": imported, "ray": None, "ready": model - imported, "round1": rounds[0] - model, "mlflow_start": None,
        "steady": rounds[-1] - rounds[0], "steady_median": _median_gap(rounds), "after": run.wall - rounds[-1],
        "mlflow_end": None, "close": None, "exit": None, "total": run.wall,
    }


def _median_gap(times: list[float]) -> float | None:
    return statistics.median(b - a for a, b in zip(times, times[1:])) if len(times) > 1 else None


ROWS = (
    ("to_ray", "spawn → Ray starting (cmd) / → `imported` (ref)"),
    ("ray", "Ray start: its GCS → a worker process"),
    ("ready", "→ round 1 starts: workers, data (cmd) / data, model (ref)"),
    ("round1", "round 1: train + evaluate"),
    ("mlflow_start", "  of which header → MLflow run created"),
    ("steady", "rounds 2..R"),
    ("steady_median", "  one steady round (median)"),
    ("after", "last round → exit"),
    ("mlflow_end", "  last round → MLflow run ended"),
    ("close", "  → summary table (fed close, pool shutdown)"),
    ("exit", "  summary table → exit (the process ends)"),
    ("total", "total: spawn → exit"),
)


def phase_table(command: list[Phases], reference: list[Phases]) -> str:
    """Each phase's median over the pairs, the command's beside the reference's, and the difference."""

    def med(runs: list[Phases], key: str) -> float | None:
        values = [r[key] for r in runs if r[key] is not None]
        return statistics.median(values) if values else None

    def cell(value: float | None) -> str:
        return f"{value:8.2f}" if value is not None else f"{'—':>8s}"

    out = [f"{'phase (median s over pairs)':60s} {'command':>8s} {'ref':>8s} {'extra':>8s}"]
    for key, label in ROWS:
        c, r = med(command, key), med(reference, key)
        out.append(f"{label:60s} {cell(c)} {cell(r)} {cell(None if c is None else c - (r or 0.0))}")
    return "\n".join(out)


def side_notes(runs: list[Run], mlflows: list[dict[str, float]]) -> str:
    """What the command's timeline shows beside the phases: the FMNIST files open (overlapped with Ray's
    start, on a thread), when each of ``MARKS`` appeared, when MLflow's run began and each round's metric lag."""
    last = runs[-1]
    files = f"{min(last.files):.1f}–{max(last.files):.1f} s" if last.files else "not seen (open < 0.2 s)"
    lags = [m[f"step {i}"] - t for run, m in zip(runs, mlflows) for i, t in enumerate(run.rounds(), 1)
            if f"step {i}" in m]
    header = last.at("fltune run") or 0.0
    marks = "; ".join(f"{mark} seen {t:.1f} s" for mark, t in last.marks.items())
    created = f"MLflow run created {mlflows[-1]['start']:.1f} s" if mlflows[-1] else "MLflow off"
    lag = f"; a round's metrics stamped {statistics.median(lags):+.2f} s from its line (median)" if lags else ""
    return f"command (last pair): FMNIST files open {files}; {marks}; header {header:.1f} s; {created}{lag}"


def import_times(argv: list[str], env: dict[str, str]) -> str:
    """The command's driver imports by top-level package, from one more run under ``python -X importtime``:
    the cumulative times of the imports made at top level, so a package is charged with what it is the first
    to import (fltune's own modules with the torch or pydantic they pull in first). The data thread imports
    beside the main thread: a sum of import work, not a span of wall time."""
    done = subprocess.run([argv[0], "-X", "importtime", *argv[1:]], capture_output=True, text=True, env=env, cwd=REPO)
    if done.returncode:
        return f"imports: the -X importtime run exited {done.returncode}"
    totals: dict[str, float] = {}
    for line in done.stderr.splitlines():
        match = re.match(r"import time:\s+\d+ \|\s+(\d+) \| (\S.*)$", line)  # no indent: a top-level import
        if match:
            root = match.group(2).split(".")[0]
            totals[root] = totals.get(root, 0.0) + int(match.group(1)) / 1e6
    top = sorted(totals.items(), key=lambda kv: -kv[1])
    shown = "  ".join(f"{name} {s:.2f}" for name, s in top[:8])
    return f"imports (command's driver, -X importtime, s): total {sum(totals.values()):.2f}  {shown}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--before", type=Path, help="another checkout whose command joins every pair")
    parser.add_argument("--set", dest="extra", action="append", default=[], metavar="KEY=VALUE",
                        help="a config override for the command (and --before's), e.g. resources.workers=1")
    parser.add_argument("--no-imports", action="store_true", help="skip the extra -X importtime run")
    args = parser.parse_args()
    if args.pairs < 1 or args.rounds < 2:
        parser.error("allowed: --pairs ≥ 1, --rounds ≥ 2")
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    runs: dict[str, list[Run]] = {"command": [], "reference": [], "before": []}
    mlflows: list[dict[str, float]] = []
    extra = tuple(args.extra)
    reference = [sys.executable, str(REFERENCE), "--rounds", str(args.rounds)]
    with tempfile.TemporaryDirectory() as tmp:
        uri = f"sqlite:///{tmp}/mlflow.db"
        before_env = {**env, "PYTHONPATH": f"{args.before.resolve()}{os.pathsep}{env['PYTHONPATH']}"} if args.before \
            else env
        before = command(args.rounds, f"{uri}.before", args.before.resolve(), extra) if args.before else []
        warm = {"command": measure(command(args.rounds, uri, extra=extra), env, memory=True),
                "reference": measure(reference, env, memory=True)}
        if args.before:
            warm["before"] = measure(before, before_env, memory=True)
        print("warm-up (not counted; the command's MLflow store new; memory sampled): "
              + "  ".join(f"{name} {run.wall:.1f} s RSS {run.rss:.2f} GiB PSS {run.pss:.2f} GiB"
                          for name, run in warm.items()), flush=True)
        for pair in range(args.pairs):
            if args.before:
                runs["before"].append(measure(before, before_env))
            runs["command"].append(measure(command(args.rounds, uri, extra=extra), env))
            mlflows.append(mlflow_times(uri, runs["command"][-1].spawn_epoch))
            runs["reference"].append(measure(reference, env, watch=False))
            if (last := runs["reference"][-1].lines[-1][1]) != "independent True":
                sys.exit(f"whole_command: the reference loaded a module of fltune: {last}")
            for name, done in runs.items():
                if done:
                    run = done[-1]
                    print(f"pair {pair + 1} {name:9s} {run.wall:5.1f} s observer {run.observer:4.1f} s  {timeline(run)}",
                          flush=True)
        imports = None if args.no_imports else import_times(command(args.rounds, uri,
                                                                    extra=extra), env)
    final = [line for _, line in runs["command"][-1].lines if line.startswith(f"round {args.rounds}/")]
    print("command's last round:", final[-1] if final else "(not shown)")
    print(phase_table([command_phases(r, m) for r, m in zip(runs["command"], mlflows)],
                      [reference_phases(r) for r in runs["reference"]]))
    print(side_notes(runs["command"], mlflows))
    if imports:
        print(imports)
    wall = {name: statistics.median(r.wall for r in done) for name, done in runs.items() if done}
    rss = {name: run.rss for name, run in warm.items()}
    pss = {name: run.pss for name, run in warm.items()}
    for name in wall:
        print(f"{name:9s} wall {wall[name]:.1f} s (median)  peak tree RSS {rss[name]:.2f} GiB  PSS {pss[name]:.2f} GiB "
              "(warm-up run)")
    parts = warm["command"].parts
    print("part " + "  ".join(f"{k} {v:.2f} GiB" for k, v in parts.items()) + "  (the command's PSS at its peak)")
    ratios = [c.wall / r.wall for c, r in zip(runs["command"], runs["reference"])]
    if args.before:
        before = statistics.median(b.wall / r.wall for b, r in zip(runs["before"], runs["reference"]))
        print(f"ratio_before {before:.3f}")
        print(f"memory_ratio_before {rss['before'] / rss['reference']:.3f}")
    print(f"pair ratios {' '.join(f'{x:.3f}' for x in ratios)}  (best {min(ratios):.3f}, worst {max(ratios):.3f})")
    print(f"ratio {statistics.median(ratios):.3f}")
    print(f"memory_ratio {rss['command'] / rss['reference']:.3f}")
    print(f"memory_ratio_pss {pss['command'] / pss['reference']:.3f}")
    print(f"memory_pss_gb {pss['command'] * 2**30 / 1e9:.3f}  (the command's peak tree PSS in 10^9 bytes; goal ≤ 2)")


if __name__ == "__main__":
    main()
