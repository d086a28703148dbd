"""How well does ``tune`` tune? A tabular benchmark built from fltune's own runs (issue 76).

``--build`` runs two grids at quick scale with fltune's engine (the exact executor, a local Ray) and appends
every round's validation and test accuracy, per (configuration, seed), to ``bench/tables/<problem>.csv``;
it resumes where an interrupted build stopped. The replay (no flag) then answers Ray Tune trials from those
tables, so every tuner is the real scheduler and the real Optuna sampler, in seconds (docs/performance.md,
"Tuning quality").

    python bench/tuning_quality.py --build [--problems fedprox simfafl]
    python bench/tuning_quality.py [--sweep]
"""

from __future__ import annotations

import argparse
import csv
import math
import subprocess
import time
from dataclasses import dataclass
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
        "acc_global"),
    # simfafl.yaml's setting on a tenth of FMNIST and the VIB MLP instead of the VIB CNN (cost).
    Problem("simfafl", (
        "method.name=simfafl", "data.dataset=fmnist", "data.subsample=0.1", "model.name=vib_mlp",
        "partition.kind=dirichlet_prior", "partition.alpha=0.5", "partition.eval_fraction=0.3",
        "partition.pool_test=true", "partition.val_fraction=0.1", "federation.clients=20",
        "federation.fraction=0.2", f"federation.rounds={ROUNDS}", "training.local_epochs=1",
        "training.batch_size=48", "training.lr=0.05", "training.momentum=0.0", "training.grad_clip=10.0",
        "metrics.protocols=[personalized]",
    ), {"method.beta1": (0.0001, 0.000316, 0.001, 0.00316, 0.01), "method.beta2": (0.0, 0.15, 0.3, 0.45, 0.6)},
        "acc_personalized"),
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", action="store_true", help="run the grids and append to bench/tables/")
    parser.add_argument("--problems", nargs="+", choices=sorted(PROBLEMS), default=sorted(PROBLEMS))
    args = parser.parse_args()
    if args.build:
        build(args.problems)


if __name__ == "__main__":
    main()
