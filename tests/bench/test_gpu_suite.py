"""bench/gpu_suite.py at tiny sizes on the CPU: every section reports a figure or says why it has none, and the
budget holds."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import needs_fmnist

SUITE = Path(__file__).resolve().parents[2] / "bench" / "gpu_suite.py"
sys.path.insert(0, str(SUITE.parent))
import gpu_suite  # noqa: E402

FIGURES = {"table_job": "extrapolated_min", "round_overhead": "ratio"}


def run_suite(out: Path, *args: str) -> tuple[dict, float]:
    """The suite's JSON and the process's wall seconds."""
    began = time.monotonic()
    subprocess.run([sys.executable, str(SUITE), "--tiny", "--out", str(out), *args], check=True, timeout=400)
    return json.loads((out / "suite.json").read_text()), time.monotonic() - began


def reported(result: dict, figure: str) -> bool:
    """A step reported its figure, or was skipped with a reason (an error is neither)."""
    return figure in result or result.get("skipped", "").startswith(("needs ~", "cut: the"))


@pytest.mark.slow
@needs_fmnist
@pytest.mark.extended
def test_tiny_suite_reports_every_section_within_three_minutes(tmp_path: Path) -> None:
    record, wall = run_suite(tmp_path)
    sections = record["sections"]
    assert record["sizes"] == "tiny" and record["budget_s"] == 150
    for name in ("W1", "W2"):
        assert all(reported(sections[name][path], "client_samples_per_s") for path in ("B0", "exact", "batched",
                                                                                       "compiled")), sections[name]
    for name, figure in FIGURES.items():
        assert reported(sections[name], figure), sections[name]
    for path in ("exact", "batched"):
        result = sections["profile"][path]
        assert reported(result, "trace"), result
        if "trace" in result:
            trace = json.loads((tmp_path / result["trace"]).read_text())
            assert trace["traceEvents"] and (tmp_path / result["tables"]).read_text().count("Self CPU") >= 2
    assert record["elapsed_s"] <= record["budget_s"] + 10
    assert wall <= 180 + 60  # the budget, plus the process's imports and exit on a shared machine


@pytest.mark.slow
@needs_fmnist
def test_a_small_budget_skips_later_sections_and_says_why(tmp_path: Path) -> None:
    record, _ = run_suite(tmp_path, "--budget-s", "3", "--sections", "W1", "round_overhead", "profile")
    sections = record["sections"]
    assert sections["W2"]["skipped"] == sections["table_job"]["skipped"] == "not asked for (--sections)"
    for result in (sections["W1"]["B0"], sections["round_overhead"], sections["profile"]["exact"],
                   sections["profile"]["batched"]):  # the cheapest step needs more than the whole budget
        assert result["skipped"].startswith("needs ~"), result
        assert "left of the 3 s budget" in result["skipped"]
    assert record["elapsed_s"] <= 3 + 10


def test_python_self_time_leaves_out_callees_ops_and_idle_threads(tmp_path: Path) -> None:
    """A frame's self time is its span less what ran directly inside it; a thread that ran no op (a log
    thread waiting) is left out, and so are the ops themselves."""
    def span(name: str, cat: str, ts: float, dur: float, tid: int = 1) -> dict:
        return {"ph": "X", "cat": cat, "name": name, "pid": 7, "tid": tid, "ts": ts, "dur": dur}

    events = [span("step", "python_function", 0, 10_000), span("forward", "python_function", 1_000, 4_000),
              span("aten::mm", "cpu_op", 2_000, 2_500), span("update", "python_function", 6_000, 3_000),
              span("aten::add_", "cpu_op", 6_500, 500), span("forward", "python_function", 9_500, 200),
              span("wait", "python_function", 0, 50_000, tid=2), {"ph": "i", "name": "marker", "ts": 3}]
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps({"traceEvents": events}))
    assert gpu_suite.python_self_ms(trace) == pytest.approx({"step": 2.8, "update": 2.5, "forward": 1.7})
