"""How well does ``tune`` tune? A tabular benchmark built from fltune's own runs (issue 76).

``--build`` runs two grids at quick scale with fltune's engine (the exact executor, a local Ray) and appends
every round's validation and test accuracy, per (configuration, seed), to ``bench/tables/<problem>.csv``;
it resumes where an interrupted build stopped. The replay (no flag) then answers Ray Tune trials from those
tables, so every tuner is the real scheduler and the real Optuna sampler, in seconds (docs/performance.md,
"Tuning quality").

    python bench/tuning_quality.py --build [--problems fedprox simfafl]
    python bench/tuning_quality.py [--studies 100 | --sweep]
"""

from __future__ import annotations

import argparse
import csv
import math
import subprocess
import time
from dataclasses import dataclass, replace
from pathlib import Path

TABLES = Path(__file__).resolve().parent / "tables"
SEEDS = (0, 1)
ROUNDS = 15


@dataclass(frozen=True)
class Problem:
    """One tuning problem: the fixed settings, the grid (config path → values) and the metric pair."""

    name: str
    base: tuple[str, ...]
    grid: dict[str, tuple[float, ...]]
    metric: str
    """the objective without its ``val_`` prefix: ``val_<metric>`` selects, ``<metric>`` is the test score"""
    space: dict[str, dict]
    """the tuners' distributions, as the method's search_spaces file has them (a value snaps to the grid)"""

    def table(self) -> Path:
        return TABLES / f"{self.name}.csv"


PROBLEMS = {p.name: p for p in (
    # FedProx on a strongly skewed split: μ matters most when clients drift (Li et al., 2020, §5.2).
    Problem("fedprox", (
        "method.name=fedprox", "data.dataset=fmnist", "data.subsample=0.2", "model.name=mlp",
        "partition.kind=dirichlet_prior", "partition.alpha=0.1", "partition.val_fraction=0.1",
        "federation.clients=20", "federation.fraction=0.5", f"federation.rounds={ROUNDS}",
        "training.local_epochs=2", "metrics.protocols=[global]",
    ), {"training.lr": (0.001, 0.003, 0.01, 0.03, 0.1), "method.mu": (0.001, 0.01, 0.1, 1.0, 10.0)},
        "acc_global", {"training.lr": {"type": "choice", "values": [0.001, 0.003, 0.01, 0.03, 0.1]},
                       "method.mu": {"type": "loguniform", "low": 0.001, "high": 10.0}}),
    # simfafl.yaml's setting on a tenth of FMNIST and the VIB MLP instead of the VIB CNN (cost).
    Problem("simfafl", (
        "method.name=simfafl", "data.dataset=fmnist", "data.subsample=0.1", "model.name=vib_mlp",
        "partition.kind=dirichlet_prior", "partition.alpha=0.5", "partition.eval_fraction=0.3",
        "partition.pool_test=true", "partition.val_fraction=0.1", "federation.clients=20",
        "federation.fraction=0.2", f"federation.rounds={ROUNDS}", "training.local_epochs=1",
        "training.batch_size=48", "training.lr=0.05", "training.momentum=0.0", "training.grad_clip=10.0",
        "metrics.protocols=[personalized]",
    ), {"method.beta1": (0.0001, 0.000316, 0.001, 0.00316, 0.01), "method.beta2": (0.0, 0.15, 0.3, 0.45, 0.6)},
        "acc_personalized", {"method.beta1": {"type": "loguniform", "low": 1.0e-4, "high": 1.0e-2},
                             "method.beta2": {"type": "uniform", "low": 0.0, "high": 0.6}}),
)}
COLUMNS = ("seed", "round", "client_samples", "val", "test", "status")


def grid_configs(problem: Problem) -> list[tuple[float, ...]]:
    """Every grid point, as values in ``problem.grid``'s key order."""
    configs: list[tuple[float, ...]] = [()]
    for values in problem.grid.values():
        configs = [(*c, v) for c in configs for v in values]
    return configs


# ---------------------------------------------------------------------------------------------- build
def finished_runs(path: Path, keys: int) -> set[tuple[float, ...]]:
    """(config values…, seed) of every run the table holds to its end (a run's rows are appended together)."""
    if not path.exists():
        return set()
    return {(*row[:keys], row[keys]) for row in read_rows(path) if row[-1] != "running"}


def read_rows(path: Path) -> list[list]:
    """The table's rows (comments skipped), numbers parsed; the header row names the columns."""
    with path.open() as f:
        rows = [r for r in csv.reader(line for line in f if not line.startswith("#"))][1:]
    return [[float(v) for v in r[:-1]] + [r[-1]] for r in rows]


def start_table(problem: Problem) -> None:
    """A new table's comment lines (command, commit, fixed settings) and column header."""
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=TABLES.parent).stdout.strip()
    TABLES.mkdir(exist_ok=True)
    with problem.table().open("w", newline="") as f:
        f.write(f"# python bench/tuning_quality.py --build --problems {problem.name}   (commit {commit})\n")
        f.write(f"# fixed: {' '.join(problem.base)} tracking.enabled=false\n")
        f.write(f"# metrics: val = val_{problem.metric}, test = {problem.metric}; client_samples = samples "
                "trained that round\n")
        csv.writer(f).writerow([*problem.grid, *COLUMNS])


def run_rows(problem: Problem, values: tuple[float, ...], seed: int, pool, data_cache: dict) -> list[list]:
    """One grid run through fltune's Federation on ``pool``: a row per round (NaN where a diverged round has
    no accuracy). ``data_cache`` keeps each seed's partition, which no grid value changes."""
    from fltune.assembly import build_federation
    from fltune.config import build_config
    from fltune.engine.builders import load_data

    cfg = build_config(overrides=[*problem.base, "tracking.enabled=false", f"federation.seed={seed}",
                                  *(f"{k}={v}" for k, v in zip(problem.grid, values))])
    if seed not in data_cache:
        data_cache[seed] = load_data(cfg)
    fed = build_federation(cfg, data_cache[seed], pool)
    rows = []
    try:
        for result in fed.rounds():
            m = result.metrics
            rows.append([*values, seed, result.round, m["samples"], m.get(f"val_{problem.metric}", math.nan),
                         m.get(problem.metric, math.nan), result.status])
    finally:
        fed.close()
    return rows


def build(names: list[str]) -> None:
    """Seed by seed, problem by problem, each missing grid run appended as it ends (an interrupted build
    keeps every finished run); the wall time of this invocation goes in as a comment line."""
    from fltune.engine.cluster import ensure_ray
    from fltune.engine.pool import InProcessPool

    start = time.perf_counter()
    ensure_ray(None)
    pool = InProcessPool(1)  # one client worker in this process: no actor start-up per run on a shared machine
    caches: dict[str, dict] = {name: {} for name in names}
    for name in names:
        if not PROBLEMS[name].table().exists():
            start_table(PROBLEMS[name])
    runs = 0
    for seed in SEEDS:
        for name in names:
            problem = PROBLEMS[name]
            done = finished_runs(problem.table(), len(problem.grid))
            for values in grid_configs(problem):
                if (*values, seed) in done:
                    continue
                t = time.perf_counter()
                rows = run_rows(problem, values, seed, pool, caches[name])
                with problem.table().open("a", newline="") as f:
                    csv.writer(f).writerows(rows)
                runs += 1
                print(f"{name} seed {seed} {values}: val {rows[-1][-3]:.4f} test {rows[-1][-2]:.4f} "
                      f"({time.perf_counter() - t:.1f} s)", flush=True)
    wall = time.perf_counter() - start
    for name in names:
        with PROBLEMS[name].table().open("a") as f:
            f.write(f"# build: {runs} runs over {', '.join(names)} in {wall:.0f} s wall on this invocation\n")
    print(f"build_wall_s {wall:.0f}")


# ---------------------------------------------------------------------------------------------- replay
@dataclass(frozen=True)
class Round:
    client_samples: float
    val: float
    test: float
    status: str


@dataclass
class SeedTable:
    """One seed's grid: each configuration's recorded rounds (a diverged run's stop at its divergence)."""

    curves: dict[tuple[float, ...], list[Round]]

    @property
    def rounds(self) -> int:
        return max(len(c) for c in self.curves.values())

    def budget(self) -> float:
        """The grid's cost: every configuration's every round, in client-samples."""
        return sum(r.client_samples for curve in self.curves.values() for r in curve)

    def final_test(self, key: tuple[float, ...]) -> float:
        """What the configuration delivers: its last round's test accuracy (0 where that is NaN, diverged)."""
        test = self.curves[key][-1].test
        return test if math.isfinite(test) else 0.0

    def winner(self, objective) -> tuple[float, ...]:
        """The grid's validation-selected configuration: best objective over its full run (ties: grid order)."""
        from fltune.tune.trainable import seed_score

        def score(key: tuple[float, ...]) -> float:
            value = seed_score([{objective.metric: r.val} for r in self.curves[key]], objective)
            return value if math.isfinite(value) else -math.inf

        return max(self.curves, key=score)


def load_tables(problem: Problem, path: Path | None = None) -> dict[int, SeedTable]:
    """The table's complete seeds (every grid configuration run to its end), by seed."""
    keys = len(problem.grid)
    by_seed: dict[int, dict[tuple[float, ...], list[Round]]] = {}
    for row in read_rows(path or problem.table()):
        curve = by_seed.setdefault(int(row[keys]), {}).setdefault(tuple(row[:keys]), [])
        curve.append(Round(*row[keys + 2:]))
    grid = set(grid_configs(problem))
    return {seed: SeedTable(curves) for seed, curves in sorted(by_seed.items())
            if grid <= {k for k, c in curves.items() if c[-1].status != "running"}}


def snap(problem: Problem, config: dict[str, float]) -> tuple[float, ...]:
    """The grid point nearest a sampled configuration, per parameter (on a log axis where the space's is)."""
    def nearest(name: str) -> float:
        log = problem.space[name]["type"] == "loguniform"
        scale = math.log if log else float
        return min(problem.grid[name], key=lambda v: abs(scale(v) - scale(config[name])))

    return tuple(nearest(name) for name in problem.grid)


@dataclass(frozen=True)
class Tuner:
    """A tuner as a study would be set: sampler, scheduler and their settings, all of them a space's own
    (``startup`` and ``multivariate`` None: the space's defaults)."""

    name: str
    sampler: str = "tpe"
    scheduler: str = "asha"
    grace: int = 2
    reduction: float = 2
    samples: int | None = None
    """trials per study; None = as many as the budget allows"""
    startup: int | None = None
    multivariate: bool | None = None
    reduce: str = "final"
    """the objective's ``reduce``: what a trial reports from its validation curve, what ASHA and TPE then see"""


def default_tuner() -> Tuner:
    """What ``tune`` does with a space file that leaves the settings out (``fltune.tune.space``'s defaults)."""
    from fltune.tune.space import Asha, Sampler, SearchSpace

    return Tuner("default", grace=Asha.model_fields["grace_period"].default,
                 reduction=Asha.model_fields["reduction_factor"].default,
                 samples=SearchSpace.model_fields["num_samples"].default,
                 startup=Sampler.model_fields["n_startup_trials"].default,
                 multivariate=Sampler.model_fields["multivariate"].default)


def shipped_tuner(problem: Problem) -> Tuner:
    """The settings of the method's shipped space (``fltune/search_spaces/<name>.yaml``): what ``fltune tune
    --method <name>`` runs, which may differ from the defaults where the replay chose so for that method."""
    from fltune.search_spaces import method_space
    from fltune.tune.space import Asha, parse_space

    space = parse_space(method_space(problem.name))
    asha = space.scheduler if isinstance(space.scheduler, Asha) else None
    return Tuner("shipped", sampler=space.sampler.name, scheduler=asha.name if asha else "none",
                 grace=asha.grace_period if asha else 2, reduction=asha.reduction_factor if asha else 2,
                 samples=space.num_samples, startup=space.sampler.n_startup_trials,
                 multivariate=space.sampler.multivariate, reduce=space.objective.reduce)


OLD_DEFAULT = Tuner("before #76", grace=2, reduction=3, samples=16, startup=10, multivariate=False)
"""the defaults before this replay chose any (independent TPE after 10 random trials, ASHA grace 2)"""


def tuners(problem: Problem) -> list[Tuner]:
    """The issue's five, the shipped space's settings, the defaults and those before #76 (each setting once, by
    its first name): random search (also selecting on last-3 means), TPE without early stopping, the shipped
    space, the defaults, Hyperband (Ray's synchronous ``HyperBandScheduler``, η = 3) on random search and under
    TPE multivariate (BOHB's pairing, Falkner et al. 2018; Tune's ``TuneBOHB`` needs ConfigSpace and hpbandster,
    which fltune does not install)."""
    listed = [Tuner("random", sampler="random", scheduler="none"),
              Tuner("random last_3", sampler="random", scheduler="none", reduce="last_3"),
              Tuner("TPE", scheduler="none"),
              shipped_tuner(problem), default_tuner(), OLD_DEFAULT,
              Tuner("HyperBand", sampler="random", scheduler="hyperband", reduction=3),
              Tuner("TPE-mv+HyperBand", scheduler="hyperband", reduction=3, multivariate=True, samples=16)]
    settings = [replace(tuner, name="") for tuner in listed]
    return [tuner for i, tuner in enumerate(listed) if settings[i] not in settings[:i]]


def study_space(problem: Problem, tuner: Tuner, seed: int):
    """The tuner's search space as fltune validates it (objective: validation accuracy, reduced as the tuner's
    ``reduce`` says)."""
    from fltune.tune.space import SearchSpace

    scheduler = {"name": "asha", "grace_period": tuner.grace, "reduction_factor": tuner.reduction} \
        if tuner.scheduler == "asha" else {"name": "none"}  # HyperBand: scheduler_for's own
    return SearchSpace.model_validate({
        "params": problem.space, "objective": {"metric": f"val_{problem.metric}", "reduce": tuner.reduce},
        "sampler": {"name": tuner.sampler, "seed": seed,
                    **({} if tuner.multivariate is None else {"multivariate": tuner.multivariate}),
                    **({} if tuner.startup is None else {"n_startup_trials": tuner.startup})},
        "scheduler": scheduler, "max_concurrent": 2})


def scheduler_for(space, tuner: Tuner, rounds: int):
    """fltune's scheduler (``fltune.tune.search.scheduler``: ASHA or FIFO), or Ray's synchronous HyperBand."""
    from types import SimpleNamespace

    from ray.tune.schedulers import HyperBandScheduler

    from fltune.tune.search import scheduler

    if tuner.scheduler == "hyperband":
        return HyperBandScheduler(time_attr="round", metric="objective", mode=space.objective.direction,
                                  max_t=rounds, reduction_factor=tuner.reduction)
    return scheduler(SimpleNamespace(space=space, rounds=rounds))


@dataclass
class Running:
    """A live trial: its Tune trial, grid point, rows so far and when its current round ends."""

    trial: object
    key: tuple[float, ...]
    history: list[dict[str, float]]
    ends: float = math.inf


class Controller:
    """The part of Tune's ``TuneController`` a scheduler calls: the trials in creation order and
    ``stop_trial``, which synchronous HyperBand uses on paused trials (a paused trial leaves the scheduler by
    ``on_trial_remove`` and the searcher with no result, as ``TuneController.stop_trial`` does)."""

    def __init__(self, searcher, scheduler) -> None:
        self.searcher, self.scheduler = searcher, scheduler
        self.live: dict[str, Running] = {}
        self.stopped: list[str] = []

    def get_trials(self) -> list:
        return [state.trial for state in self.live.values()]

    def stop_trial(self, trial) -> None:
        from ray.tune.experiment import Trial

        if trial.status == Trial.RUNNING:
            self.scheduler.on_trial_complete(self, trial, trial.last_result)
            self.searcher.on_trial_complete(trial.trial_id, trial.last_result)
        else:
            self.scheduler.on_trial_remove(self, trial)
            self.searcher.on_trial_complete(trial.trial_id)
        trial.set_status(Trial.TERMINATED)
        self.stopped.append(trial.trial_id)
        del self.live[trial.trial_id]


def replay(problem: Problem, table: SeedTable, tuner: Tuner, seed: int,
           fractions: list[float]) -> list[tuple[float, ...] | None]:
    """One study against the table; the configuration it would return at each budget fraction.

    Tune's controller is replaced by this event loop (Tuner.fit costs about a second a trial, a replay
    thousands of trials), calling the searcher and scheduler as ``TuneController`` does: at most
    ``max_concurrent`` live trials (Tune's ``ConcurrencyLimiter``: a paused trial holds its place), the
    scheduler's ``choose_trial_to_run`` starts or resumes one, a result goes to the scheduler, then (unless it
    stops the trial) to the searcher; an ending trial goes to both ``on_trial_complete``. Each round takes its
    client-samples in simulated time; the budget is the client-samples of finished rounds. At a budget, live
    trials count as stopped there (a study ended then), and fltune's ``best`` picks the result."""
    import numpy as np
    from ray.tune.experiment import Trial
    from ray.tune.schedulers import TrialScheduler

    from fltune.tune.results import TrialRow, best
    from fltune.tune.search import optuna_search
    from fltune.tune.trainable import seed_score

    np.random.seed(seed)  # ASHA draws each trial's bracket from NumPy's global generator
    space = study_space(problem, tuner, seed)
    searcher, scheduler = optuna_search(space), scheduler_for(space, tuner, table.rounds)
    tune = Controller(searcher, scheduler)
    objective, mode = space.objective, space.objective.direction
    budget = table.budget()
    rows: dict[str, TrialRow] = {}
    picks: list[tuple[float, ...] | None] = []
    spent, now = 0.0, 0.0

    def pick() -> tuple[float, ...] | None:
        ended = [r if r.status != "running" else TrialRow(r.trial_id, "stopped", r.params, r.round, r.objective,
                                                          0.0, created=r.created) for r in rows.values()]
        chosen = best(ended, mode)
        return None if chosen is None else snap(problem, chosen.params)

    def row(trial_id: str, status: str, result: dict) -> None:
        rows[trial_id] = TrialRow(trial_id, status, rows[trial_id].params, result["round"], result["objective"],
                                  0.0, created=rows[trial_id].created)

    while len(picks) < len(fractions):
        while len(tune.live) < space.max_concurrent and (tuner.samples is None or len(rows) < tuner.samples):
            trial_id = f"t{len(rows)}"
            config = searcher.suggest(trial_id)
            trial = Trial("table", config=config, trial_id=trial_id, stub=True)
            scheduler.on_trial_add(tune, trial)
            rows[trial_id] = TrialRow(trial_id, "running", config, 0, math.nan, 0.0, created=len(rows) + 1)
            tune.live[trial_id] = Running(trial, snap(problem, config), [])
        while (chosen := scheduler.choose_trial_to_run(tune)) is not None:
            state = tune.live[chosen.trial_id]
            chosen.set_status(Trial.RUNNING)
            state.ends = now + table.curves[state.key][len(state.history)].client_samples
        running = [t for t, state in tune.live.items() if state.trial.status == Trial.RUNNING]
        if not running:
            break
        trial_id = min(running, key=lambda t: (tune.live[t].ends, rows[t].created))
        state = tune.live[trial_id]
        this = table.curves[state.key][len(state.history)]
        while len(picks) < len(fractions) and spent + this.client_samples > fractions[len(picks)] * budget:
            picks.append(pick())
        now, spent = state.ends, spent + this.client_samples
        state.history.append({objective.metric: this.val})
        result = {"objective": seed_score(state.history, objective), "round": len(state.history),
                  "training_iteration": len(state.history), "status": this.status}
        state.trial.update_last_result(result)
        tune.stopped.clear()
        decision = scheduler.on_trial_result(tune, state.trial, result)
        for other in tune.stopped:  # paused trials HyperBand stopped while it processed this result
            rows[other] = TrialRow(other, "stopped", rows[other].params, rows[other].round, rows[other].objective,
                                   0.0, created=rows[other].created)
        if decision != TrialScheduler.STOP:
            searcher.on_trial_result(trial_id, result)
        if this.status == "running" and decision != TrialScheduler.STOP:
            row(trial_id, "running", result)
            if decision == TrialScheduler.PAUSE:
                state.trial.set_status(Trial.PAUSED)
            else:
                state.ends = now + table.curves[state.key][len(state.history)].client_samples
            continue
        row(trial_id, this.status if this.status != "running" else "stopped", result)
        tune.stop_trial(state.trial)
    return picks + [pick()] * (len(fractions) - len(picks))


def regrets(table: SeedTable, picks: list[tuple[float, ...] | None], objective) -> list[tuple[float, float]]:
    """(vs the validation-selected grid winner, vs the best test accuracy) in accuracy points, per pick:
    best-known test minus the pick's final test. No pick yet counts as the grid's worst configuration."""
    tests = {key: table.final_test(key) for key in table.curves}
    winner, oracle, worst = tests[table.winner(objective)], max(tests.values()), min(tests.values())
    out = []
    for key in picks:
        got = worst if key is None else tests[key]
        out.append((100 * (winner - got), 100 * (oracle - got)))
    return out


FRACTIONS = [0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5]
"""budget shares a study is read at (it stops at the last: past half the grid's cost, a grid is as cheap)"""
SHOWN = (0.1, 0.25, 0.5)
TUNER_SEEDS = 20


def study_regrets(problem: Problem, tables: dict[int, SeedTable], tuner: Tuner,
                  studies: int = TUNER_SEEDS) -> list[list[tuple[float, float]]]:
    """``studies`` studies of ``tuner`` (study k on the table's seed k mod n): per study, per fraction. The grid's
    winner is chosen on last-round validation whatever the tuner's ``reduce``: one reference for every tuner."""
    from fltune.tune.space import Objective

    objective = Objective(metric=f"val_{problem.metric}")
    seeds = sorted(tables)
    out = []
    for k in range(studies):
        table = tables[seeds[k % len(seeds)]]
        out.append(regrets(table, replay(problem, table, tuner, k, FRACTIONS), objective))
    return out


def quartiles(values: list[float]) -> tuple[float, float, float]:
    import numpy as np

    q1, med, q3 = np.percentile(values, [25, 50, 75])
    return float(q1), float(med), float(q3)


def medians(studies: list[list[tuple[float, float]]], which: int = 0) -> list[float]:
    """The median regret at each of ``FRACTIONS`` (``which`` 0: vs the grid winner, 1: vs the oracle)."""
    return [quartiles([s[i][which] for s in studies])[1] for i in range(len(FRACTIONS))]


def cell(studies: list[list[tuple[float, float]]], fraction: float) -> str:
    q1, med, q3 = quartiles([s[FRACTIONS.index(fraction)][0] for s in studies])
    return f"{med:.2f} ({q1:.1f},{q3:.1f})"


def budget_to_half_point(per_problem: list[list[float]]) -> float:
    """The least budget fraction from which the median regret stays ≤ 0.5 points on every problem (NaN: not
    by half the grid's cost)."""
    for i, fraction in enumerate(FRACTIONS):
        if all(max(m[i:]) <= 0.5 for m in per_problem):
            return fraction
    return math.nan


def rank_agreement(tables: dict[int, SeedTable], round_: int) -> tuple[list[float], float]:
    """Spearman's ρ between the configurations' validation accuracy at ``round_`` (where ASHA first stops)
    and at their last round, per seed; and between the two seeds' last-round values (what a rerun keeps of
    the ranking). A diverged run counts as 0."""
    from scipy.stats import spearmanr

    def vals(table: SeedTable, at: int | None) -> list[float]:
        out = [table.curves[k][min(at or len(c), len(c)) - 1].val for k, c in sorted(table.curves.items())]
        return [v if math.isfinite(v) else 0.0 for v in out]

    seeds = [tables[s] for s in sorted(tables)]
    early = [float(spearmanr(vals(t, round_), vals(t, None))[0]) for t in seeds]
    across = float(spearmanr(vals(seeds[0], None), vals(seeds[-1], None))[0]) if len(seeds) > 1 else math.nan
    return early, across


def available(names: list[str]) -> dict[str, dict[int, SeedTable]]:
    """Each named problem's complete seeds; a problem with none is named and left out."""
    out = {}
    for name in names:
        problem = PROBLEMS[name]
        tables = load_tables(problem) if problem.table().exists() else {}
        if tables:
            out[name] = tables
        else:
            print(f"{problem.table()}: no seed with the whole grid; run --build --problems {name}")
    return out


def report(names: list[str], studies: int = TUNER_SEEDS) -> None:
    """The regret table of every tuner on every problem, and the shipped spaces' ``budget_to_half_point``."""
    from rich import box
    from rich.console import Console
    from rich.table import Table

    tables = available(names)
    grid = Table(title=f"regret in accuracy points, median (q1, q3) of {studies} studies, vs the grid's "
                 "validation winner at a share of its client-samples; at 25 %: the median vs the best test, and the "
                 "share of studies within 0.5 points", box=box.SIMPLE_HEAD,
                 collapse_padding=True, pad_edge=False)
    for column in ("problem", "tuner", *(f"{f:.0%}" for f in SHOWN), "oracle", "25% ≤0.5"):
        grid.add_column(column, no_wrap=True)
    shipped_medians = []
    for name, seed_tables in tables.items():
        for tuner in tuners(PROBLEMS[name]):
            runs = study_regrets(PROBLEMS[name], seed_tables, tuner, studies)
            at25 = [s[FRACTIONS.index(0.25)][0] for s in runs]
            oracle = medians(runs, 1)[FRACTIONS.index(0.25)]
            grid.add_row(name, tuner.name, *(cell(runs, f) for f in SHOWN), f"{oracle:.2f}",
                         f"{sum(r <= 0.5 for r in at25) / len(at25):.0%}")
            if tuner.name == "shipped":
                shipped_medians.append(medians(runs))
    Console(width=100).print(grid)
    grace = default_tuner().grace
    for name, seed_tables in tables.items():
        early, across = rank_agreement(seed_tables, grace)
        print(f"rank_agreement {name}: Spearman rho(val round {grace}, final val) "
              f"{', '.join(f'{r:.2f}' for r in early)} by seed; across seeds {across:.2f}")
    print(f"budget_to_half_point {budget_to_half_point(shipped_medians) if shipped_medians else math.nan:g}")


def candidates() -> list[Tuner]:
    """Around the default: TPE start-up trials, independent or multivariate TPE, ASHA's grace period and
    reduction factor or no early stopping, selecting on the last round or the last-3 mean; 16 trials (the shipped
    spaces' budget)."""
    schedulers = [("asha", g, r) for g, r in ((2, 3), (3, 3), (3, 4), (4, 4), (4, 5))] + [("none", 2, 2)]
    return [Tuner(f"s{s}{' mv' if mv else ''} {name}{f' g{g} r{r}' if name == 'asha' else ''}"
                  f"{' l3' if reduce == 'last_3' else ''}", scheduler=name, grace=g, reduction=r, startup=s,
                  multivariate=mv, samples=16, reduce=reduce)
            for reduce in ("final", "last_3") for s in (4, 10) for mv in (False, True) for name, g, r in schedulers]


SWEEP_STUDIES = 100
"""studies per candidate in ``--sweep``: a median of 20 moves by a grid step (1.3 points on FedProx) between
neighbouring settings, so the choice is made on more"""


def sweep(names: list[str]) -> None:
    """Every candidate's median regret per problem (``SWEEP_STUDIES`` studies). For each problem (its shipped
    space) and for both at once (the defaults), the chosen one never trails random search's median at 10, 25 or
    50 % if any such exists, then has the least (worst-problem) median at 25 %, then the least mean regret."""
    tables = available(names)
    random = {name: medians(study_regrets(PROBLEMS[name], t, tuners(PROBLEMS[name])[0], SWEEP_STUDIES))
              for name, t in tables.items()}
    scored: dict[str, list] = {name: [] for name in [*tables, "both"]}
    for tuner in candidates():
        runs = {name: study_regrets(PROBLEMS[name], t, tuner, SWEEP_STUDIES) for name, t in tables.items()}
        per = {name: medians(studies) for name, studies in runs.items()}
        trails = {name: [f"{name} {f:.0%}" for f in SHOWN
                         if per[name][FRACTIONS.index(f)] > random[name][FRACTIONS.index(f)]] for name in per}
        means = {name: float(sum(r[0] for s in studies for r in s) / sum(len(s) for s in studies))
                 for name, studies in runs.items()}
        for name in per:
            scored[name].append((bool(trails[name]), per[name][FRACTIONS.index(0.25)], means[name], tuner))
        every = sum(trails.values(), [])
        mean = sum(means.values()) / len(means)
        scored["both"].append((bool(every), max(m[FRACTIONS.index(0.25)] for m in per.values()), mean, tuner))
        shown = "  ".join(f"{name} " + " ".join(f"{m[FRACTIONS.index(f)]:5.2f}" for f in SHOWN)
                          for name, m in per.items())
        print(f"{tuner.name:20} {shown}  mean {mean:4.2f}  {'trails random at ' + ', '.join(every) if every else 'ok'}",
              flush=True)
    print("random               " + "  ".join(f"{name} " + " ".join(f"{m[FRACTIONS.index(f)]:5.2f}" for f in SHOWN)
                                     for name, m in random.items()))
    for name, rows in scored.items():
        _, at25, mean, chosen = min(rows, key=lambda s: s[:3])
        print(f"chosen for {name}: {chosen.name} (median at 25 % {at25:.2f}, mean {mean:.2f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", action="store_true", help="run the grids and append to bench/tables/")
    parser.add_argument("--sweep", action="store_true", help="replay candidate defaults and choose one")
    parser.add_argument("--studies", type=int, default=TUNER_SEEDS, help="studies per tuner in the replay")
    parser.add_argument("--problems", nargs="+", choices=sorted(PROBLEMS), default=sorted(PROBLEMS))
    args = parser.parse_args()
    if args.build:
        build(args.problems)
    elif args.sweep:
        sweep(args.problems)
    else:
        report(args.problems, args.studies)


if __name__ == "__main__":
    main()
