"""bench/tuning_quality.py: the replay's regret arithmetic on a hand-made two-configuration table."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest

from fltune.tune.space import Objective
from fltune.tune.trainable import seed_score

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
import tuning_quality as tq  # noqa: E402

# lr 0.01 wins on validation (0.9) but tests at 0.6; lr 0.1 tests best (0.7); every round costs 100 samples.
TABLE = """# hand-made
training.lr,seed,round,client_samples,val,test,status
0.01,0,1,100,0.5,0.4,running
0.01,0,2,100,0.9,0.6,finished
0.1,0,1,100,0.6,0.5,running
0.1,0,2,100,0.8,0.7,finished
0.1,1,1,100,0.6,0.5,running
"""
OBJECTIVE = Objective(metric="val_acc_global", reduce="best")


def approx(pairs: list[tuple[float, float]]) -> list:
    """Regret pairs compared to float rounding (pytest.approx takes no nested tuples)."""
    return [pytest.approx(pair) for pair in pairs]


def toy(tmp_path: Path, values: list[float]) -> tuple[tq.Problem, dict[int, tq.SeedTable]]:
    """The table's problem, its tuners restricted to the lr ``values`` (a choice snaps to itself)."""
    problem = tq.Problem("toy", (), {"training.lr": (0.01, 0.1)}, "acc_global",
                         {"training.lr": {"type": "choice", "values": values}})
    path = tmp_path / "toy.csv"
    path.write_text(TABLE)
    return problem, tq.load_tables(problem, path)


def test_complete_seeds_only_and_the_grid_winner(tmp_path: Path) -> None:
    """Seed 1 lacks a configuration and is left out; the winner is chosen on validation, not test."""
    _, tables = toy(tmp_path, [0.1])
    assert list(tables) == [0]
    table = tables[0]
    assert table.budget() == 400 and table.rounds == 2
    assert table.winner(OBJECTIVE) == (0.01,)
    assert tq.regrets(table, [(0.01,), (0.1,), None], OBJECTIVE) == approx([(0.0, 10.0), (-10.0, 0.0), (0.0, 10.0)])


def test_replay_picks_by_budget(tmp_path: Path) -> None:
    """Two trials of lr 0.1 run at once. By 10 % (40 samples) no round has ended: no pick, charged the worst
    configuration (0.6). By 50 % (200) both have one round, and the study ended there returns lr 0.1: 10 points
    better than the grid's validation winner, level with the oracle; so too at 100 %."""
    problem, tables = toy(tmp_path, [0.1])
    tuner = tq.Tuner("random", sampler="random", scheduler="none")
    picks = tq.replay(problem, tables[0], tuner, seed=3, fractions=[0.1, 0.5, 1.0])
    assert picks == [None, (0.1,), (0.1,)]
    assert tq.regrets(tables[0], picks, OBJECTIVE) == approx([(0.0, 10.0), (-10.0, 0.0), (-10.0, 0.0)])


def test_default_tuner_replays_with_asha(tmp_path: Path) -> None:
    """The shipped default's sampler (TPE + ASHA, fltune's own searcher and scheduler), its grace period cut to
    the table's first round, runs on the table; seen both configurations, it returns the validation winner."""
    problem, tables = toy(tmp_path, [0.01, 0.1])
    tuner = replace(tq.default_tuner(), grace=1)
    picks = tq.replay(problem, tables[0], tuner, seed=0, fractions=[1.0])
    assert picks in ([(0.01,)], [(0.1,)])
    studies = tq.study_regrets(problem, tables, tuner)
    assert len(studies) == tq.TUNER_SEEDS and all(len(s) == len(tq.FRACTIONS) for s in studies)
    assert min(s[-1][0] for s in studies) >= -10.0 - 1e-9


# lr 0.01 ends highest on validation (0.8) after a flat 0.6, 0.6; lr 0.1 holds 0.75 for its last three rounds.
LAST_3_CURVES = {0.01: ((0.5, 0.6, 0.6, 0.8), (0.4, 0.5, 0.5, 0.6)),
                 0.1: ((0.6, 0.75, 0.75, 0.75), (0.5, 0.65, 0.7, 0.7))}


def one_seed_table(curves: dict[float, tuple[tuple[float, ...], tuple[float, ...]]]) -> str:
    """The table of ``{lr: (validation by round, test by round)}`` on seed 0, every round 100 client-samples."""
    rows = [f"{lr},0,{r + 1},100,{v},{t},{'finished' if r == len(val) - 1 else 'running'}"
            for lr, (val, test) in curves.items() for r, (v, t) in enumerate(zip(val, test))]
    return "\n".join(["training.lr,seed,round,client_samples,val,test,status", *rows, ""])


def test_last_3_selects_on_the_mean_of_the_last_three_validation_rounds(tmp_path: Path) -> None:
    """By the last round lr 0.01 wins (0.8 > 0.75); by the last-3 mean lr 0.1 does ((0.6 + 0.6 + 0.8) / 3 = 0.667 <
    0.75). The grid and a replayed study (seed 0 samples both) score the table's validation as a trial reports
    it; the study's pick on last-3 tests 10 points above the last-round grid winner, level with the oracle."""
    problem = tq.Problem("toy", (), {"training.lr": (0.01, 0.1)}, "acc_global",
                         {"training.lr": {"type": "choice", "values": [0.01, 0.1]}})
    path = tmp_path / "toy.csv"
    path.write_text(one_seed_table(LAST_3_CURVES))
    table = tq.load_tables(problem, path)[0]
    last_3 = Objective(metric="val_acc_global", reduce="last_3")
    assert seed_score([{"val_acc_global": r.val} for r in table.curves[(0.01,)]], last_3) == pytest.approx(2 / 3)
    assert (table.winner(Objective(metric="val_acc_global")), table.winner(last_3)) == ((0.01,), (0.1,))
    picks = {reduce: tq.replay(problem, table, tq.Tuner("random", sampler="random", scheduler="none", reduce=reduce),
                               seed=0, fractions=[1.0]) for reduce in ("final", "last_3")}
    assert picks == {"final": [(0.01,)], "last_3": [(0.1,)]}
    assert tq.regrets(table, picks["last_3"], Objective(metric="val_acc_global")) == approx([(-10.0, 0.0)])


def test_a_resumed_build_skips_only_runs_that_ended(tmp_path: Path) -> None:
    """Seed 0's two runs ended (finished); seed 1's lr 0.1 has rows but no end, so a resumed build reruns it.
    A comment line after the rows (the build's wall time) is read past."""
    path = tmp_path / "toy.csv"
    path.write_text(TABLE + "# build: 2 runs in 1 s\n")
    assert tq.finished_runs(path, keys=1) == {(0.01, 0), (0.1, 0)}


def test_synchronous_hyperband_at_two_live_trials_stops_none() -> None:
    """On the committed FedProx table, Ray's HyperBandScheduler pauses trials at its rungs and the replay resumes
    them (``choose_trial_to_run``); with two live trials a rung keeps both, so each study returns what random
    search without stopping returns at every budget (a paused trial never resumed would end the study early)."""
    problem = tq.PROBLEMS["fedprox"]
    tables = tq.load_tables(problem)
    random, hyperband = (next(t for t in tq.tuners(problem) if t.name == name) for name in ("random", "HyperBand"))
    for seed in (0, 1):
        picks = tq.replay(problem, tables[seed], hyperband, seed, tq.FRACTIONS + [1.0])
        assert picks == tq.replay(problem, tables[seed], random, seed, tq.FRACTIONS + [1.0])


def test_the_shipped_row_is_the_methods_space_file() -> None:
    """The replay's *shipped* tuner, rebuilt as the study's space, samples and stops as the method's space file does
    (per-space settings differ from the defaults) and selects on the same score; and no tuner setting is replayed
    twice under two names."""
    from fltune.search_spaces import method_space
    from fltune.tune.space import parse_space

    for name, problem in tq.PROBLEMS.items():
        space, tuner = parse_space(method_space(name)), tq.shipped_tuner(problem)
        replayed = tq.study_space(problem, tuner, seed=space.sampler.seed)
        assert (replayed.sampler, replayed.scheduler, tuner.samples) == (space.sampler, space.scheduler,
                                                                         space.num_samples)
        assert (replayed.objective.metric, replayed.objective.reduce, replayed.objective.direction) == (
            space.objective.metric, space.objective.reduce, space.objective.direction)
        settings = [replace(t, name="") for t in tq.tuners(problem)]
        assert len(settings) == len(set(settings))
