"""fltune.workarounds: the corrections of Ray's behaviour that can be checked without a cluster."""

from __future__ import annotations

import pytest

from fltune.workarounds import mute_published_errors_after_a_stop


def test_published_errors_are_muted_only_after_a_stop(monkeypatch: pytest.MonkeyPatch,
                                                        capfd: pytest.CaptureFixture[str]) -> None:
    """A stop sent to the group kills Ray's autoscaler monitor too, whose death Ray publishes and the driver prints as
    ``(raylet) The autoscaler failed …`` after fltune's last line; the driver's lines from workers are left alone."""
    import ray._private.worker as worker

    printer = worker.print_to_stdstream  # restored after the test; unwrapped, should a command here have wrapped it
    monkeypatch.setattr(worker, "print_to_stdstream", getattr(printer, "__wrapped__", printer))
    stopped: list[bool] = []
    mute_published_errors_after_a_stop(lambda: bool(stopped))
    mute_published_errors_after_a_stop(lambda: True)  # a second call keeps the first wrapper
    published = {"lines": ["The autoscaler failed with the following error:"], "pid": "raylet", "is_err": False}
    from_worker = {"lines": ["a worker's line"], "pid": 1234, "ip": "10.0.0.1", "is_err": False,
                   "task_name": "train", "actor_name": "", "job": ""}

    worker.print_to_stdstream(published, ignore_prefix=False)
    assert "autoscaler failed" in capfd.readouterr().out
    stopped.append(True)
    worker.print_to_stdstream(published, ignore_prefix=False)
    worker.print_to_stdstream(from_worker, ignore_prefix=False)
    out = capfd.readouterr().out
    assert "autoscaler failed" not in out and "a worker's line" in out
