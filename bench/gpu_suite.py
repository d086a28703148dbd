"""Issue 61's GPU figures from one command, in a fixed order and within a hard total time budget.

Sections, in this order (one JSON of every figure; a summary table puts each beside its target):
  W1, W2          ``gpu_throughput.py``'s workloads, rows B0, exact, batched and batched with its step compiled
                  (``resources.compile``): client-samples/s (median over the timed rounds) and each row's
                  ratio to B0 (targets: exact ≥ 3× B0 on W1 and ≥ 5× on W2, batched ≥ 10× on W1);
  table_job       ``table_job.py``: a short SimFAFL Table 2 FMNIST job on the batched executor, extrapolated to
                  the paper's 500 rounds (target ≤ 30 min on one GPU);
  round_overhead  ``round_overhead.py``: fltune's round against its tight loop on the same device;
  profile         ``torch.profiler`` over 20 steady exact steps (one client of 600 samples at B 30, after a
                  warm-up round) and 20 batched group steps (one group of K such clients): Chrome traces (open
                  in ui.perfetto.dev or chrome://tracing) and ``key_averages`` tables sorted by self time
                  (device time on a GPU), by op and by op and its 5 innermost Python frames.
Budget: before each step (a row, the job, the overhead pair, a profile) the time it needs (a rough estimate,
or the time the row before it took when longer) is checked against what is left of ``--budget-s``; what
would overrun is skipped and the JSON and table say so. A step still running when the budget ends is stopped
there (SIGALRM; the table job by SIGTERM, ``STOP_S`` before the end) and marked cut.
On CPU (or with ``--tiny``) the same sequence runs at tiny sizes (1 % of the data, one worker, E = 1, 1 warm-up
+ 1 timed round, a 3-round quick-scale job of one row on 4 clients, K = 2) within a 150 s budget, as a check
that the suite works (a compiled row needs minutes of inductor's C++ compile on a CPU: skipped there): its
figures say nothing about the targets, which print as "GPU-only".
Output under ``--out`` (default ``$OUT`` when set, else ``bench/out/``, git-ignored): ``suite.json`` (written
after every step), ``profile_exact.json`` / ``profile_batched.json`` (Chrome traces) and ``.txt`` (tables).

    python bench/gpu_suite.py [--out DIR] [--budget-s 480] [--tiny] [--sections W1 W2 ...] [--set K=V ...]

The device command. A session lent the GPU machine (15 min in all, its start included) makes one call;
~2 min of start, 420 s of budget and ~40 s of imports and exit leave room for one rerun of what failed
(e.g. ``--sections profile --budget-s 150`` with ``timeout_s=200``). FMNIST is not on that machine: copy
it into the git-ignored ``bench/out/fmnist`` here first and carry it:

    here:  mkdir -p bench/out/fmnist && cp /usr/share/datasets/fashion-mnist/*.gz bench/out/fmnist/
    run(carry=["bench/out/fmnist"], timeout_s=480, command='nvidia-smi -L && PYTHONPATH=$PWD python
        bench/gpu_suite.py --out "$OUT" --budget-s 420 --set data.root=$PWD/bench/out/fmnist')
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the bench scripts whose functions run the sections
import batched_throughput  # noqa: E402
import gpu_throughput  # noqa: E402
import round_overhead  # noqa: E402
import table_job  # noqa: E402

from fltune.errors import FLTuneError  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SECTIONS = ("W1", "W2", "table_job", "round_overhead", "profile")
ROWS = ("B0", "exact", "batched", "compiled")
TARGETS = {("W1", "exact"): 3.0, ("W2", "exact"): 5.0, ("W1", "batched"): 10.0}
"""Issue 61's targets: a row's client-samples/s at least this many times B0's (the tight GPU loop)."""
TABLE_TARGET_MIN = 30.0
PROFILE_BATCH = 30
"""The profiled steps' batch size: a client of 600 samples (IID, all the data) trains 20 steps an epoch."""
STOP_S = 30.0
"""Seconds the table job is given to stop (SIGTERM, then its process group is killed) within the budget."""


@dataclass(frozen=True)
class Sizes:
    """How big each section runs, and the seconds each step is expected to need (rough: for skipping)."""

    scale: float
    warmup: int
    rounds: int
    extra: tuple[str, ...]
    table_scale: str
    table_rounds: int
    table_rows: str | None
    table_extra: tuple[str, ...]
    full_rounds: int
    overhead_rounds: int
    group: int
    budget_s: float
    need: dict[str, float]


FULL = Sizes(
    scale=1.0, warmup=2, rounds=3, extra=(), table_scale="paper", table_rounds=11, table_rows=None, table_extra=(),
    full_rounds=500, overhead_rounds=3, group=10, budget_s=480,
    need={"B0": 20, "row": 40, "compiled": 90, "table_job": 150, "round_overhead": 40, "profile": 30},
)
TINY = Sizes(
    scale=0.01, warmup=1, rounds=1, extra=("resources.workers=1", "training.local_epochs=1"), table_scale="quick",
    table_rounds=3, table_rows="SimFAFL", table_extra=("data.subsample=0.01", "federation.clients=4"),
    full_rounds=20, overhead_rounds=1, group=2, budget_s=150,
    need={"B0": 5, "row": 15, "compiled": 200, "table_job": 60, "round_overhead": 20, "profile": 10},
)


class OverBudget(Exception):
    """The suite's budget ended while a step ran."""


class Budget:
    """The suite's hard time limit: admits a step that fits in what is left, stops one that runs past it."""

    def __init__(self, seconds: float) -> None:
        self.seconds, self.end = seconds, time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()

    def refusal(self, need: float) -> str | None:
        """Why a step needing ``need`` seconds is skipped, or None when it fits."""
        left = self.left()
        if need <= left:
            return None
        return f"needs ~{need:.0f} s, {max(left, 0):.0f} s left of the {self.seconds:g} s budget"

    @contextmanager
    def deadline(self) -> Iterator[None]:
        """Raise :class:`OverBudget` in the step running when the budget ends."""

        def fire(signum: int, frame: FrameType | None) -> None:
            raise OverBudget

        previous = signal.signal(signal.SIGALRM, fire)
        signal.setitimer(signal.ITIMER_REAL, max(self.left(), 0.01))
        try:
            yield
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)


class Suite:
    """Runs the steps in order under one budget and keeps every result in one JSON-able record."""

    def __init__(self, budget: Budget, out: Path, record: dict[str, Any]) -> None:
        self.budget, self.out, self.record = budget, out, record

    def step(self, section: str, key: str | None, need: float, work: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """Run ``work`` if ``need`` seconds fit in the budget; store what it returned (or why it did not run,
        or its error in one line) with its seconds under ``section`` (and ``key``), and write the JSON."""
        began = time.monotonic()
        result: dict[str, Any]
        if (reason := self.budget.refusal(need)) is not None:
            result = {"skipped": reason}
        else:
            try:
                with self.budget.deadline():
                    result = work()
            except (Exception, SystemExit) as err:  # a failed step is recorded; the next ones still run
                # the deadline's exception raised inside a C call surfaces as that call's SystemError
                cut = isinstance(err, (OverBudget, subprocess.TimeoutExpired)) or self.budget.left() <= 0
                result = ({"skipped": f"cut: the {self.budget.seconds:g} s budget ended during it"} if cut
                          else {"error": " ".join(f"{type(err).__name__}: {err}".split())[:300]})
            result["s"] = round(time.monotonic() - began, 1)
        label = section if key is None else f"{section} {key}"
        print(f"[gpu_suite] {label}: {json.dumps(result)}", flush=True)
        sections = self.record["sections"]
        if key is None:
            sections[section] = result
        else:
            sections.setdefault(section, {})[key] = result
        self.save()
        return result

    def save(self) -> None:
        """Write the record as it stands (after every step: a suite stopped from outside keeps its figures)."""
        self.record["elapsed_s"] = round(self.budget.seconds - self.budget.left(), 1)
        (self.out / "suite.json").write_text(json.dumps(self.record, indent=2) + "\n")


def throughput(suite: Suite, name: str, sizes: Sizes, device: torch.device, extra: tuple[str, ...]) -> None:
    """One workload's rows (``gpu_throughput.row_rate``), each as a step, then each row's ratio to B0."""
    rounds = sizes.warmup + sizes.rounds
    exact = gpu_throughput.workload_config(name, rounds, sizes.scale, "exact", extra)
    configs = {
        "B0": exact, "exact": exact,
        "batched": gpu_throughput.workload_config(name, rounds, sizes.scale, "batched", extra),
        "compiled": gpu_throughput.workload_config(
            name, rounds, sizes.scale, "batched", (*extra, "resources.compile=true")),
    }
    data: list[Any] = []
    threads = (os.cpu_count() or 1) if device.type == "cuda" else 1  # a shared CPU: one thread spins least

    def row(path: str) -> Callable[[], dict[str, Any]]:
        def work() -> dict[str, Any]:
            if not data:
                data.append(gpu_throughput.load_data(configs["B0"]))
            rate = gpu_throughput.row_rate(path, configs[path], data[0], sizes.warmup, device, threads)
            return {"client_samples_per_s": round(rate, 1)}
        return work

    last_row = 0.0
    for path in ROWS:
        need = sizes.need.get(path if path in ("B0", "compiled") else "row", sizes.need["row"])
        if path == "batched":
            need = max(need, last_row)
        done = suite.step(name, path, need, row(path))
        last_row = done.get("s", 0.0) if path == "exact" else last_row
    rows = suite.record["sections"][name]
    base = rows["B0"].get("client_samples_per_s")
    rows["ratio_to_B0"] = {path: round(rows[path]["client_samples_per_s"] / base, 3) for path in ROWS[1:]
                           if base and "client_samples_per_s" in rows[path]}
    suite.save()


def table(sizes: Sizes, extra: tuple[str, ...], budget: Budget) -> dict[str, Any]:
    """``table_job.py``'s short job on the batched executor and its extrapolation to ``full_rounds``."""
    with tempfile.TemporaryDirectory() as tmp:
        job, wall = table_job.run_job(
            Path(tmp), "table2", "fmnist", sizes.table_scale, sizes.table_rounds, sizes.table_rows,
            ("resources.executor=batched", *sizes.table_extra, *extra), timeout=budget.left() - STOP_S)
        trials = table_job.read_job(job)
        minutes = table_job.report(trials, sizes.full_rounds, TABLE_TARGET_MIN, wall)
    return {"extrapolated_min": round(minutes, 2), "full_rounds": sizes.full_rounds, "scale": sizes.table_scale,
            "short_rounds": sizes.table_rounds, "short_job_s": round(wall, 1), "trials": len(trials)}


def overhead(sizes: Sizes, device: torch.device, extra: tuple[str, ...]) -> dict[str, Any]:
    """``round_overhead.py``'s pair: fltune's rounds and the tight loop's, the warm-up round dropped."""
    cfg = round_overhead.workload(sizes.overhead_rounds + 1, (f"data.subsample={sizes.scale}", *extra))
    ours = round_overhead.fltune_round_seconds(cfg)[1:]
    tight = round_overhead.tight_round_seconds(cfg, device)[0][1:]
    return {"fltune_s_per_round": round(sum(ours) / len(ours), 3),
            "tight_s_per_round": round(sum(tight) / len(tight), 3), "ratio": round(sum(ours) / sum(tight), 3)}


def profile(path: str, sizes: Sizes, device: torch.device, extra: tuple[str, ...], out: Path) -> dict[str, Any]:
    """``torch.profiler`` over one steady epoch of ``path`` at B ``PROFILE_BATCH`` (``batched_throughput.Setup``'s
    round: exact trains one client, batched one group of K; 20 steps each): the Chrome trace, the tables and
    the top 5 ops and Python frames by self time."""
    torch.set_num_threads(1)  # a worker's one CPU (resources.cpus_per_worker)
    setup = batched_throughput.Setup("fedavg", sizes.group, device, extra=[f"training.batch_size={PROFILE_BATCH}",
                                                                           *extra])
    take = 1 if path == "exact" else sizes.group
    warm, clients, _ = setup.round(1)
    setup.train[path](warm, clients[:take])  # allocations, first-call work: not steady
    inputs, clients, _ = setup.round(2)
    counts = [-(-len(setup.data.client_train[c]) // PROFILE_BATCH) for c in clients[:take]]
    steps = max(counts) if path == "batched" else sum(counts)  # a group steps as long as its longest client
    gpu = device.type == "cuda"
    activities = [torch.profiler.ProfilerActivity.CPU, *([torch.profiler.ProfilerActivity.CUDA] if gpu else [])]
    with torch.profiler.profile(activities=activities, with_stack=True) as prof:
        setup.train[path](inputs, clients[:take])
        if gpu:
            torch.cuda.synchronize()
    trace, tables = out / f"profile_{path}.json", out / f"profile_{path}.txt"
    prof.export_chrome_trace(str(trace))
    sort = "self_device_time_total" if gpu else "self_cpu_time_total"
    by_op = prof.key_averages()
    frames = python_self_ms(trace)
    host = f"\n\nops sorted by self_cpu_time_total (host)\n\n{by_op.table(sort_by='self_cpu_time_total', row_limit=30)}"
    tables.write_text(f"{path}: {steps} steps, {take} client(s), ops sorted by {sort}\n\n"
                      + by_op.table(sort_by=sort, row_limit=30) + (host if gpu else "")
                      + "\n\nPython frames by self time (host CPU)\n\n"
                      + "\n".join(f"{ms:12.3f} ms  {name}" for name, ms in list(frames.items())[:30]) + "\n")
    top = sorted(by_op, key=lambda e: getattr(e, sort), reverse=True)[:5]
    return {"steps": steps, "clients": take, "trace": trace.name, "tables": tables.name,
            "top_self_ms": {e.key: round(getattr(e, sort) / 1000, 3) for e in top},
            "top_python_self_ms": {name: round(ms, 3) for name, ms in list(frames.items())[:5]}}


def python_self_ms(trace: Path) -> dict[str, float]:
    """Each Python function's self time in a Chrome trace (ms, most first): its frames' durations less
    those of the events directly inside them on the same thread (the functions it called, the ops it ran),
    i.e. the host time spent in its own bytecode, which on a GPU is time the device may wait for. Only the
    threads that ran ops count (not, e.g., Ray's log thread, blocked in a wait all along)."""
    spans = [e for e in json.loads(trace.read_text())["traceEvents"] if e.get("ph") == "X" and "dur" in e]
    working = {(e["pid"], e["tid"]) for e in spans if e.get("cat") == "cpu_op"}
    events = sorted((e for e in spans if (e["pid"], e["tid"]) in working),
                    key=lambda e: (str(e["pid"]), str(e["tid"]), e["ts"], -e["dur"]))
    totals: dict[str, float] = {}
    open_: list[list[Any]] = []  # [event, time of its direct children] on the current thread, outermost first
    thread = None

    def close(entry: list[Any]) -> None:
        if entry[0].get("cat") == "python_function":
            totals[entry[0]["name"]] = totals.get(entry[0]["name"], 0.0) + max(entry[0]["dur"] - entry[1], 0.0) / 1e3

    for event in events:
        if (event["pid"], event["tid"]) != thread:
            thread = (event["pid"], event["tid"])
            while open_:
                close(open_.pop())
        while open_ and open_[-1][0]["ts"] + open_[-1][0]["dur"] <= event["ts"]:
            close(open_.pop())
        if open_:
            open_[-1][1] += event["dur"]
        open_.append([event, 0.0])
    while open_:
        close(open_.pop())
    return dict(sorted(totals.items(), key=lambda kv: -kv[1]))


def summary(record: dict[str, Any], gpu: bool) -> Table:
    """Each figure beside its target (on CPU: "GPU-only"); skipped or failed steps say why."""
    grid = Table(title=f"gpu_suite · {record['device']} · {record['elapsed_s']:.0f} s of {record['budget_s']:g}")
    for column in ("section", "figure", "value", "target"):
        grid.add_column(column, overflow="fold")
    sections = record["sections"]

    def target(text: str, value: float | None, met: Callable[[float], bool]) -> str:
        if not gpu:
            return "GPU-only"
        return text if value is None else f"{text} {'met' if met(value) else 'missed'}"

    for name in ("W1", "W2"):
        rows = sections.get(name, {})
        for path in ROWS:
            got = rows.get(path, rows if "skipped" in rows else {})  # a section not asked for: its reason
            ratio = rows.get("ratio_to_B0", {}).get(path)
            value = (f"{got['client_samples_per_s']:.0f} /s" + (f", {ratio:.2f}× B0" if ratio is not None else "")
                     if "client_samples_per_s" in got else _why(got))
            goal = TARGETS.get((name, path))
            grid.add_row(name, path, value, "" if goal is None else target(f"≥ {goal:g}× B0", ratio,
                                                                           lambda x, g=goal: x >= g))
    job = sections.get("table_job", {})
    minutes = job.get("extrapolated_min")
    grid.add_row("table_job", f"job at {record['table_full_rounds']} rounds",
                 _why(job) if minutes is None else f"{minutes:.1f} min",
                 target(f"≤ {TABLE_TARGET_MIN:g} min", minutes, lambda x: x <= TABLE_TARGET_MIN))
    rounds = sections.get("round_overhead", {})
    grid.add_row("round_overhead", "fltune / tight",
                 _why(rounds) if "ratio" not in rounds else f"{rounds['ratio']:.3f}", "")
    for path in ("exact", "batched"):
        profiles = sections.get("profile", {})
        prof = profiles.get(path, profiles if "skipped" in profiles else {})
        top = next(iter(prof.get("top_self_ms", {}).items()), None)
        grid.add_row("profile", path, _why(prof) if top is None else f"{prof['trace']}; top {top[0]} {top[1]:.1f} ms",
                     "")
    return grid


def _why(result: dict[str, Any]) -> str:
    return result.get("skipped") or result.get("error") or "not run"


def commit() -> str:
    """The checkout's commit (the device machine's copy may have no git)."""
    try:
        return subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or REPO / "bench" / "out"))
    parser.add_argument("--budget-s", type=float, help=f"hard total limit (default {FULL.budget_s:g}; tiny "
                        f"{TINY.budget_s:g})")
    parser.add_argument("--tiny", action="store_true", help="tiny sizes (automatic without CUDA)")
    parser.add_argument("--sections", nargs="+", default=list(SECTIONS), choices=SECTIONS,
                        help="a subset, run in the fixed order (e.g. a rerun of what failed)")
    parser.add_argument("--set", dest="extra", action="append", default=[], metavar="KEY=VALUE",
                        help="a config override for every section, e.g. data.root=DIR")
    args = parser.parse_args()
    gpu = torch.cuda.is_available()
    sizes = TINY if args.tiny or not gpu else FULL
    budget = Budget(args.budget_s if args.budget_s is not None else sizes.budget_s)
    if budget.seconds <= 0:
        parser.error("--budget-s: allowed: a positive number of seconds")
    extra = (*sizes.extra, *args.extra)
    try:  # a bad --set fails here, in one line, before anything runs
        gpu_throughput.workload_config("W1", 1, sizes.scale, "batched", (*extra, "resources.compile=true"))
    except FLTuneError as err:
        parser.error(str(err))
    args.out.mkdir(parents=True, exist_ok=True)
    device = torch.device("cuda" if gpu else "cpu")
    record: dict[str, Any] = {
        "device": torch.cuda.get_device_name() if gpu else "cpu", "torch": torch.__version__, "commit": commit(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "sizes": "full" if sizes is FULL else "tiny",
        "budget_s": budget.seconds, "table_full_rounds": sizes.full_rounds, "overrides": list(args.extra),
        "elapsed_s": 0.0,
        "sections": {name: {"skipped": "not asked for (--sections)"} for name in SECTIONS if name not in args.sections},
    }
    suite = Suite(budget, args.out, record)
    for name in (s for s in SECTIONS if s in args.sections):
        if name in ("W1", "W2"):
            throughput(suite, name, sizes, device, extra)
        elif name == "table_job":
            suite.step(name, None, sizes.need[name], lambda: table(sizes, extra, budget))
        elif name == "round_overhead":
            suite.step(name, None, sizes.need[name], lambda: overhead(sizes, device, extra))
        else:
            for path in ("exact", "batched"):
                suite.step(name, path, sizes.need[name],
                           lambda path=path: profile(path, sizes, device, extra, args.out))
    Console(width=100).print(summary(record, gpu))
    print(f"[gpu_suite] {args.out / 'suite.json'}")


if __name__ == "__main__":
    main()
