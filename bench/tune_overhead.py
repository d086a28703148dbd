"""What does a Tune trial cost before its first round, and what does a whole small study take?

Workload: a FedProx study of ``--samples`` trials (default 4), one at a time, ``--rounds`` rounds each
(default 1), on ``--dataset`` (default synthetic; fmnist for the real thing) with the FedAvg CNN, 20
clients × 0.2, one local epoch; no scheduler, MLflow on a throw-away sqlite store. It prints:

* per trial, ``startup_s``: inside the trial, from the function's entry until every client actor
  answers (data and partition loading, model, ``ray.put`` of the data, actor start-up), and the work of
  its rounds (training + evaluation);
* ``overhead per trial``: with one trial at a time, the span from the first trial starting to the last
  result, minus all rounds' work, divided by the trials: everything a trial costs besides its rounds
  (placement group, process spawn, imports, ``startup_s``, checkpoints, teardown); results carry
  1 s timestamps, so this is ±1/trials s;
* ``before the first trial``: Ray start-up, validation, MLflow set-up;
* the study's wall time.

On a shared machine, run it when it is quiet: every figure is wall time.

    python bench/tune_overhead.py [--samples 4] [--rounds 1] [--dataset synthetic]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import yaml
from ray.tune import ExperimentAnalysis

from fltune.cli import main


def space(dataset: str, rounds: int, samples: int) -> dict:
    return {
        "method": "fedprox",
        "base": {"data": {"dataset": dataset}, "federation": {"clients": 20, "fraction": 0.2, "rounds": rounds},
                 "training": {"local_epochs": 1}, "metrics": {"protocols": ["global"]}},
        "params": {"method.mu": {"type": "loguniform", "low": 1.0e-4, "high": 1.0}},
        "objective": {"metric": "acc_global"}, "num_samples": samples, "scheduler": {"name": "none"},
        "max_concurrent": 1,
    }


def results(study: Path) -> list[tuple[float, list[dict]]]:
    """(Tune's RUNNING time, every result) per trial, in start order."""
    trials = ExperimentAnalysis(str(study)).trials
    rows = [(t.run_metadata.start_time, [json.loads(line) for line in (Path(t.path) / "result.json")
                                         .read_text().splitlines()]) for t in trials]
    return sorted(rows, key=lambda row: row[0])


def run(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "space.yaml").write_text(yaml.safe_dump(space(args.dataset, args.rounds, args.samples)))
        os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{folder / 'mlflow.db'}"
        start = time.time()
        code = main(["tune", "--space", str(folder / "space.yaml"), "--storage", str(folder), "--name", "bench"])
        wall = time.time() - start
        assert code == 0, f"study exited {code}"
        trials = results(folder / "bench")
        work = 0.0
        print(f"{'trial':10} {'startup_s':>10} {'rounds_s':>9}")
        for _, rows in trials:
            rounds_s = sum(r["round_s"] + r.get("eval_s", 0.0) for r in rows)
            work += rounds_s
            print(f"{rows[0]['trial_id']:10} {rows[0]['startup_s']:10.1f} {rounds_s:9.1f}")
        span = trials[-1][1][-1]["timestamp"] - trials[0][0]
        print(f"overhead per trial {(span - work) / len(trials):.1f} s; before the first trial "
              f"{trials[0][0] - start:.1f} s; study wall time {wall:.1f} s ({args.samples} trials × "
              f"{args.rounds} round(s), one at a time, {args.dataset})")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--dataset", default="synthetic")
    run(parser.parse_args())
