"""``--plan`` and the cost estimate (fltune/estimate.py): client-samples by hand, a real calibration, and
the commands printing a plan without running or writing anything."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import fltune
from fltune.cli import main
from fltune.config import build_config
from fltune.data.datasets import load_dataset
from fltune.errors import FLTuneError
from fltune.estimate import Plan, calibrate, client_samples, estimate, longest_first, run_seconds, work
from tests.conftest import FMNIST_DIR, needs_fmnist
from tests.plugin_helpers import TINY


def synthetic(*overrides: str):
    return build_config({"data": {"dataset": "synthetic"}, "partition": {"kind": "iid"},
                         "federation": {"clients": 10, "fraction": 0.5, "rounds": 3},
                         "training": {"local_epochs": 2}}, list(overrides))


def tuned_overrides() -> tuple[str, ...]:
    return "training.finetune_epochs=1", "partition.eval_fraction=0.5", "metrics.protocols=[personalized]"


def test_client_samples_are_rounds_times_clients_times_epochs_times_samples_per_client() -> None:
    per_client = len(load_dataset("synthetic").train_y) / 10
    assert client_samples(synthetic()) == round(3 * 5 * 2 * per_client)
    # a final personal round: every client, finetune_epochs more passes over its training share
    tuned = synthetic(*tuned_overrides())
    assert client_samples(tuned) == round((3 * 5 * 2 + 10 * 1) * per_client * 0.5)
    # Per-FedAvg: 2·E·⌈n_b/E⌉ batches a round, ~2 passes whatever E; its fine-tuning 2τ/E
    meta = synthetic("method.name=perfedavg", *tuned_overrides(), "training.local_epochs=4")
    assert client_samples(meta) == round((3 * 5 * 2 + 10 * 2 / 4) * per_client * 0.5)
    # drop_last: a client trains its full batches only, floor(n/B)·B of the mean client
    assert client_samples(synthetic("training.drop_last=true", "training.batch_size=7")) == (
        3 * 5 * 2 * (round(per_client) // 7 * 7))


def test_estimate_is_positive_and_counts_a_shared_experiment_once() -> None:
    cfg = synthetic()
    assert calibrate(cfg) > 0
    tree = cfg.model_dump(mode="json")
    est = estimate([("a", tree, 2), ("b", tree, 2)], {"CPU": 2.0, "GPU": 0.0})
    assert len(est.work) == 1 and est.samples == 2 * client_samples(cfg) and est.wall_s > 0


@pytest.fixture()
def wide(monkeypatch: pytest.MonkeyPatch) -> None:
    """A console wide enough that no table cell wraps, whatever $COLUMNS says."""
    from fltune.tracking.progress import console, listing

    monkeypatch.setattr(console, "width", 300)
    monkeypatch.setattr(listing, "width", 300)


def plan_output(capsys) -> str:
    """What ``--plan`` printed: on stdout, so ``> plan.txt`` holds it."""
    return " ".join(capsys.readouterr().out.split())


def assert_wrote_nothing(tmp_path: Path) -> None:
    assert not (tmp_path / "jobs").exists() and not (tmp_path / "out").exists()
    assert not (tmp_path / "mlflow.db").exists()


@needs_fmnist
def test_reproduce_plan_prints_cells_settings_and_estimate_and_writes_nothing(mlflow_uri, wide, tmp_path,
                                                                              capsys) -> None:
    args = ["reproduce", "table2", "--datasets", "fmnist", "--rows", "FedAvg,FedPer", "--plan",
            "--storage", str(tmp_path / "jobs"), "--out", str(tmp_path / "out")]
    assert main(args) == 0
    out = plan_output(capsys)
    assert "FedAvg | FMNIST non-IID1" in out and "FedPer | FMNIST non-IID2" in out
    assert "sgd lr 0.01 mom 0, clip 10" in out and "FedPer: fedper, lr 0.01, last round" in out
    found = re.search(r"estimate: ([\d.]+)([kMG]?) client-samples to train, ~([\d.]+) (s|min|h|days) wall", out)
    assert found and float(found.group(1)) > 0 and float(found.group(3)) > 0
    assert_wrote_nothing(tmp_path)


@needs_fmnist
def test_a_plan_with_download_counts_the_data_here_and_names_the_data_to_fetch(mlflow_uri, wide, tmp_path,
                                                                                capsys) -> None:
    """A plan fetches nothing: cells whose data ``data.download`` would fetch are named, not estimated."""
    args = ["reproduce", "table2", "--datasets", "fmnist,cifar10", "--rows", "FedAvg", "--plan", "--set",
            "data.download=true", "--set", f"data.root={tmp_path / 'data'}", "--storage", str(tmp_path / "jobs"),
            "--out", str(tmp_path / "out")]
    (tmp_path / "data").mkdir()
    for gz in FMNIST_DIR.glob("*.gz"):
        (tmp_path / "data" / gz.name).symlink_to(gz)
    assert main(args) == 0
    out = plan_output(capsys)
    assert "FedAvg | FMNIST non-IID1" in out and "CIFAR" not in out  # its two cells are not in the table
    assert "2 cell(s) whose data data.download fetches when the job runs are not counted" in out
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == sorted(p.name for p in FMNIST_DIR.glob("*.gz"))
    assert_wrote_nothing(tmp_path)


@pytest.mark.parametrize(("flag", "value"), [("--seeds", "0"), ("--max-concurrent", "0")])
def test_reproduce_plan_refuses_bad_counts_like_the_job(flag, value, tmp_path, capsys) -> None:
    assert main(["reproduce", "table2", "--plan", flag, value, "--storage", str(tmp_path / "jobs")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"fltune: {flag}: 0; allowed: ≥ 1")
    assert_wrote_nothing(tmp_path)


def test_tune_plan_prints_trials_and_estimate_and_writes_nothing(mlflow_uri, wide, tmp_path, capsys) -> None:
    space = Path(__file__).parents[1] / "fltune" / "search_spaces" / "fedavg.yaml"
    args = ["tune", "--space", str(space), "--set", "data.dataset=synthetic", "--num-samples", "3", "--plan",
            "--storage", str(tmp_path / "jobs")]
    assert main(args) == 0
    out = plan_output(capsys)
    assert "fedavg: 3 trial(s) × 1 seed(s)" in out and "searched: training.lr" in out
    assert re.search(r"estimate: [\d.]+[kMG]? client-samples to train, ~[\d.]+ (s|min|h|days) wall", out)
    assert_wrote_nothing(tmp_path)


def test_a_tune_plan_on_data_still_to_fetch_says_so_in_one_line(tmp_path, capsys) -> None:
    """Not the loader's "not found …; or --set data.download=true": the flag is set, and a plan fetches nothing."""
    space = Path(__file__).parents[1] / "fltune" / "search_spaces" / "fedavg.yaml"
    args = ["tune", "--space", str(space), "--plan", "--set", "data.dataset=cifar10", "--set", "data.download=true",
            "--set", f"data.root={tmp_path / 'data'}", "--storage", str(tmp_path / "jobs")]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["fltune: --plan: data.dataset cifar10 is not here yet; data.download fetches it when the job runs, "
                   "and a plan fetches nothing: run the job, or get the data first"]
    assert not (tmp_path / "data").exists()
    assert_wrote_nothing(tmp_path)


def test_run_plan_prints_the_run_and_estimate_and_writes_nothing(mlflow_uri, wide, tmp_path, capsys) -> None:
    args = ["run", "--dataset", "synthetic", "--partition", "iid", "--clients", "10", "--fraction", "0.5",
            "--rounds", "3", "--json-out", str(tmp_path / "out" / "run.json"), "--plan"]
    assert main(args) == 0
    out = plan_output(capsys)
    assert "plan: run fedavg" in out and "fedavg · fedavg_cnn · 3 rounds × 5/10 clients × E 5" in out, out
    assert "not measured: personalized: needs partition.eval_fraction > 0" in out  # said here, not by every run
    assert re.search(r"estimate: [\d.]+[kMG]? client-samples to train, ~[\d.]+ (s|min|h|days) wall", out)
    assert_wrote_nothing(tmp_path)


def test_compare_plan_prints_studies_and_cells_and_writes_nothing(mlflow_uri, wide, tmp_path, capsys) -> None:
    args = ["compare", "--methods", "fedavg,fedprox", "--seeds", "2", "--tune-budget", "3", "--set",
            "data.dataset=synthetic", "--plan", "--storage", str(tmp_path / "jobs"), "--out", str(tmp_path / "out")]
    assert main(args) == 0
    out = plan_output(capsys)
    for row in ("fedavg: tuning, 3 trial(s)", "fedavg: 2 seed(s)", "fedprox: tuning, 3 trial(s)", "fedprox: 2 seed(s)"):
        assert row in out, out
    assert re.search(r"estimate: [\d.]+[kMG]? client-samples to train, ~[\d.]+ (s|min|h|days) wall", out)
    assert_wrote_nothing(tmp_path)


def test_compare_plan_refuses_bad_input_like_the_job(tmp_path, capsys) -> None:
    assert main(["compare", "--methods", "fedavg", "--plan", "--storage", str(tmp_path / "jobs")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fltune: --methods"), err
    assert_wrote_nothing(tmp_path)


def test_longest_first_orders_labels_by_estimated_time_and_keeps_ties_in_order() -> None:
    """Three rounds against nine (three times the client-samples, the same model); two equal trees stay in
    the order given."""
    short, long = (synthetic(f"federation.rounds={r}").model_dump(mode="json") for r in (3, 9))
    other = synthetic("federation.seed=1").model_dump(mode="json")  # another tree, the same cost
    assert longest_first(run_seconds([("a", short, 1), ("b", long, 1), ("c", other, 1)])) == ["b", "a", "c"]
    assert longest_first(run_seconds([("c", other, 1), ("b", long, 1), ("a", short, 1)])) == ["b", "c", "a"]


def test_a_methods_passes_per_step_is_read_from_its_parameters() -> None:
    """GradAug's passes per step are 1 + n (its sub-networks), a property of the method's parameters: a plan or
    a paper-scale start order of a FedAlign table (GradAug rows) read them off the class and raised."""
    cfgs = [synthetic("method.name=gradaug", f"method.n={n}", "model.name=resnet56",
                      "model.options={blocks: 1}") for n in (1, 3)]
    works = [work(str(cfg.method.params.n), cfg.model_dump(mode="json"), 1) for cfg in cfgs]
    assert [w.seconds / (w.samples * calibrate(cfg)) for w, cfg in zip(works, cfgs)] == pytest.approx([2.0, 4.0])


IMPOSSIBLE_SPLIT = ["--set", "data.dataset=synthetic", "--set", "partition.kind=dirichlet", "--set",
                    "partition.alpha=0.001", "--set", "partition.min_size=50"]


@pytest.mark.parametrize("command", [
    ["run"], ["tune", "--space", str(Path(__file__).parents[1] / "fltune" / "search_spaces" / "fedavg.yaml")],
    ["compare", "--methods", "fedavg,fedprox"], ["reproduce", "table2", "--datasets", "fmnist", "--rows", "FedAvg"]])
def test_a_plan_of_a_job_its_data_checks_refuse_is_refused_with_the_jobs_line(command, tmp_path, capsys) -> None:
    """A plan partitions the data as the job would before Ray: a split no client draw can serve is the job's one
    line and exit 2, not a plan of a job that cannot start."""
    if command[0] == "reproduce" and not FMNIST_DIR.exists():
        pytest.skip("needs FMNIST")
    storage = [] if command[0] == "run" else ["--storage", str(tmp_path / "jobs")]
    split = IMPOSSIBLE_SPLIT[2:] if command[0] == "reproduce" else IMPOSSIBLE_SPLIT  # the table's own dataset
    assert main([*command, "--plan", *split, *storage]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fltune: partition.alpha/partition.min_size: no split with every "
                                               "client ≥ 50 samples"), err
    assert_wrote_nothing(tmp_path)


def test_a_plan_with_no_data_here_names_what_is_missing_and_how_to_get_it(mlflow_uri, wide, tmp_path, capsys) -> None:
    """No cell has its data: the plan says where the loader looked and the flag that fetches it, and that there
    is nothing to estimate, not "0 client-samples, ~0 s"."""
    (tmp_path / "data").mkdir()
    args = ["reproduce", "fedalign:table2", "--scale", "paper", "--plan", "--set", f"data.root={tmp_path / 'data'}",
            "--storage", str(tmp_path / "jobs"), "--out", str(tmp_path / "out")]
    assert main(args) == 0
    out = plan_output(capsys)
    assert "24 cell(s) without data are not counted" in out
    assert out.count("data.dataset: cifar100 not found in") == 1 and "--set data.download=true" in out, out
    assert "estimate: nothing to train here (no run has its data; see above)" in out
    assert_wrote_nothing(tmp_path)


def test_a_model_timed_without_its_methods_additions_is_timed_once_for_every_method() -> None:
    """``as_built=False`` (a quick job's weights): MOON's projector left out, one calibration per model."""
    fedavg, moon = synthetic(), synthetic("method.name=moon")
    assert calibrate(moon, as_built=False) == calibrate(fedavg, as_built=False) == calibrate(fedavg)
    assert calibrate(moon) != calibrate(fedavg)  # timed with its projector


def plan_calls(job: str, tmp_path: Path) -> tuple[Callable[..., Any], list[str]]:
    """The job as Python calls it with ``plan=True`` (the function, ``plan`` left to give) and as flags."""
    storage = ["--storage", str(tmp_path / "jobs")]
    space = str(Path(__file__).parents[1] / "fltune" / "search_spaces" / "fedavg.yaml")
    if job == "run":
        return (lambda **k: fltune.run(fltune.Config(**TINY), **k),
                ["run", *(f for key, value in TINY.items() for f in ("--set", f"{key}={value}"))])
    if job == "tune":
        return (lambda **k: fltune.tune(space, set={"data.dataset": "synthetic"}, num_samples=3,
                                        storage=str(tmp_path / "jobs"), **k),
                ["tune", "--space", space, "--set", "data.dataset=synthetic", "--num-samples", "3", *storage])
    if job == "compare":
        return (lambda **k: fltune.compare(["fedavg", "fedprox"], seeds=1, set=["data.dataset=synthetic"],
                                           storage=str(tmp_path / "jobs"), out=tmp_path / "out", **k),
                ["compare", "--methods", "fedavg,fedprox", "--seeds", "1", "--set", "data.dataset=synthetic", *storage,
                 "--out", str(tmp_path / "out")])
    return (lambda **k: fltune.reproduce("table2", datasets=["fmnist"], rows=["FedAvg"],
                                         storage=str(tmp_path / "jobs"), **k),
            ["reproduce", "table2", "--datasets", "fmnist", "--rows", "FedAvg", *storage])


@pytest.mark.parametrize("job", ["run", "tune", "compare", "reproduce"])
def test_plan_true_returns_the_plan_the_command_prints(job, mlflow_uri, wide, tmp_path, capsys) -> None:
    """``fltune.compare([...], seeds=1, plan=True)`` runs nothing and returns what ``--plan`` prints."""
    if job == "reproduce" and not FMNIST_DIR.exists():
        pytest.skip("needs FMNIST")
    call, flags = plan_calls(job, tmp_path)
    plan = call(plan=True)
    title = "plan: " + ("simfafl:table2" if job == "reproduce" else job)
    assert isinstance(plan, Plan) and plan.title.startswith(title)
    assert main([*flags, "--plan"]) == 0
    assert capsys.readouterr().out == str(plan) and plan.estimate.samples > 0
    assert_wrote_nothing(tmp_path)


@pytest.mark.parametrize("job", ["run", "tune", "compare"])
def test_a_plan_and_a_job_check_the_data_first(job, tmp_path) -> None:
    """The data pre-check of the command runs in Python too, planned or not: one line, before Ray."""
    missing = {"data.dataset": "cifar10", "data.root": str(tmp_path / "nowhere")}
    calls = {"run": lambda **k: fltune.run(fltune.Config(**{**TINY, **missing}), **k),
             "tune": lambda **k: fltune.tune(Path(__file__).parents[1] / "fltune" / "search_spaces" / "fedavg.yaml", set=missing,
                                             storage=str(tmp_path / "jobs"), **k),
             "compare": lambda **k: fltune.compare("fedavg,fedprox", set=missing, storage=str(tmp_path / "jobs"), **k)}
    for plan in (True, False):
        with pytest.raises(FLTuneError, match=r"cifar10.*not"):
            calls[job](plan=plan, progress=False)
    assert not (tmp_path / "jobs").exists()
