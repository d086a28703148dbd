"""bench/whole_command.py's reading of a run's timeline: phases that add up to the wall time, a table of them,
the driver's imports by package."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import whole_command  # noqa: E402
from whole_command import Run  # noqa: E402

ADDITIVE = ("to_ray", "ray", "ready", "round1", "steady", "after")


def command_run() -> Run:
    lines = [(3.0, "fltune run fedavg on fmnist (iid), 100 clients × 0.1, 3 rounds"), (4.0, "round 1/3 acc 0.5"),
             (5.0, "round 2/3 acc 0.6"), (6.5, "round 3/3 acc 0.7"), (7.0, "   fedavg · fmnist · finished   ")]
    return Run(10.0, 1.0, 0.5, lines, {}, spawn_epoch=1000.0, marks={"gcs": 1.0, "worker": 2.0, "actor": 2.5})


def test_command_phases_add_up_to_its_wall_time() -> None:
    phases = whole_command.command_phases(command_run(), {"start": 3.2, "end": 6.8, "step 1": 4.0})
    assert phases == pytest.approx({"to_ray": 1.0, "ray": 1.0, "ready": 1.0, "round1": 1.0, "mlflow_start": 0.2,
                                    "steady": 2.5, "steady_median": 1.25, "after": 3.5, "mlflow_end": 0.3,
                                    "close": 0.2, "exit": 3.0, "total": 10.0})
    assert sum(phases[k] for k in ADDITIVE) == pytest.approx(phases["total"])
    assert phases["mlflow_end"] + phases["close"] + phases["exit"] == pytest.approx(phases["after"])


def test_without_mlflow_the_close_counts_from_the_last_round() -> None:
    phases = whole_command.command_phases(command_run(), {})
    assert phases["mlflow_start"] is None and phases["mlflow_end"] is None
    assert phases["close"] == pytest.approx(0.5) and phases["exit"] == pytest.approx(3.0)


def test_reference_phases_match_the_commands_rows() -> None:
    lines = [(1.5, "imported"), (2.0, "data"), (2.2, "model"), (3.0, "round 1/2 acc_global=0.5 loss=1.0"),
             (3.7, "round 2/2 acc_global=0.6 loss=0.9"), (3.8, "independent True")]
    phases = whole_command.reference_phases(Run(4.0, 0.5, 0.4, lines, {}, spawn_epoch=0.0))
    assert phases["ray"] is None and phases["mlflow_end"] is None and phases["exit"] is None
    assert phases["to_ray"] == 1.5 and phases["ready"] == pytest.approx(0.7)
    assert sum(phases[k] or 0.0 for k in ADDITIVE) == pytest.approx(4.0)
    table = whole_command.phase_table([whole_command.command_phases(command_run(), {})], [phases]).splitlines()
    total = next(row for row in table if row.startswith("total"))
    assert total.split()[-3:] == ["10.00", "4.00", "6.00"]
    ray = next(row for row in table if row.startswith("Ray start"))
    assert ray.split()[-3:] == ["1.00", "—", "1.00"]


def test_a_timeline_without_rounds_is_one_line_not_a_traceback() -> None:
    run = Run(5.0, 1.0, 0.5, [(3.0, "fltune run fedavg")], {}, spawn_epoch=0.0, marks={"gcs": 1.0, "worker": 2.0})
    with pytest.raises(SystemExit, match="lacks a mark"):
        whole_command.command_phases(run, {})


def test_import_times_sums_top_level_imports_by_package() -> None:
    line = whole_command.import_times([sys.executable, "-c", "import json.decoder, email.message"], dict(os.environ))
    names = line.split("s): total ", 1)[1].split()[1::2]
    assert {"json", "email"} <= set(names)


def test_only_a_memory_run_samples_memory_and_a_timed_run_still_reads_its_lines():
    """Timed runs are not slowed by reading every process's ``smaps_rollup``: memory comes from runs of its own."""
    quick = [sys.executable, "-c", "import time; print('round 1/1', flush=True); time.sleep(0.6)"]
    timed = whole_command.measure(quick, dict(os.environ))
    sampled = whole_command.measure(quick, dict(os.environ), memory=True, watch=False)
    assert timed.rss == timed.pss == 0.0 and not timed.parts
    assert sampled.rss > 0.0 and sampled.pss > 0.0 and sampled.parts["driver"] > 0.0
    assert [line for _, line in timed.lines] == [line for _, line in sampled.lines] == ["round 1/1"]
    assert 0.0 <= timed.observer < timed.wall
